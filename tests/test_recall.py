"""data/recall.py: the delayed-copy task is solved by attention that looks back d tokens and by nothing that sees
only the last k < d (the claims' distance task, issue 35)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from data.recall import copy_task, main, write_text


def look_back(x: torch.Tensor, distance: int, symbols: int) -> torch.Tensor:
    """Hand-set causal attention: query t puts all its weight on key t + 1 - distance (the token its next token
    copies); values are one-hot tokens; -> the attended token at every position (-1 where no such key)."""
    t = x.shape[1]
    q = torch.arange(t)[:, None]
    k = torch.arange(t)[None, :]
    scores = torch.where(k == q + 1 - distance, 50.0, 0.0).masked_fill(k > q, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (T, T)
    values = torch.nn.functional.one_hot(x, symbols).float()  # (n, T, V)
    out = weights @ values  # (n, T, V)
    return torch.where(out.max(-1).values > 0.99, out.argmax(-1), -1)


def window_table_accuracy(train: np.ndarray, test: np.ndarray, scored: np.ndarray, k: int) -> float:
    """The best any model seeing only the last k tokens can do, estimated: a lookup table from each k-token window
    to its most frequent next token, fit on `train`, scored on `test` at the scored positions."""
    def windows(x):
        for t in np.flatnonzero(scored):
            if t + 1 - k < 0:
                continue
            for row in x:
                yield tuple(row[t + 1 - k:t + 1]), row[t + 1]

    table: dict[tuple, Counter] = {}
    for w, y in windows(train):
        table.setdefault(w, Counter())[y] += 1
    hits = [table[w].most_common(1)[0][0] == y if w in table else False for w, y in windows(test)]
    return float(np.mean(hits))


@pytest.mark.parametrize("distance", [1, 4, 9])
def test_the_copy_is_the_token_distance_back_and_only_the_copy_is_scored(distance):
    x, scored = copy_task(5, distance, 16, seed=1)
    assert x.shape == (5, 2 * distance) and scored.sum() == distance
    for t in np.flatnonzero(scored):
        assert t + 1 >= distance and np.array_equal(x[:, t + 1], x[:, t + 1 - distance])
    assert not scored[-1], "the last input has no next token"


@pytest.mark.parametrize("distance", [3, 8, 32])
def test_attention_that_looks_back_d_solves_it(distance):
    symbols = 16
    x, scored = copy_task(64, distance, symbols, seed=2)
    pred = look_back(torch.from_numpy(x), distance, symbols)
    target = torch.from_numpy(x[:, 1:])
    hits = (pred[:, :-1] == target)[:, torch.from_numpy(scored[:-1])]
    assert hits.float().mean().item() == 1.0


def test_a_model_that_sees_only_the_last_k_tokens_cannot_and_one_that_sees_d_can():
    distance, symbols = 4, 4
    train, scored = copy_task(4000, distance, symbols, seed=3)
    test, _ = copy_task(1000, distance, symbols, seed=4)
    chance = 1 / symbols
    n = 1000 * distance
    for k in (1, 2, 3):  # k < distance: the copied token is outside the window
        acc = window_table_accuracy(train, test, scored, k)
        assert acc < chance + 4 * math.sqrt(chance * (1 - chance) / n), (k, acc)
    wide = window_table_accuracy(train, test, scored, distance)  # the window holds the copied token
    assert wide > 0.95, wide


def test_write_text_and_its_errors(tmp_path, capsys):
    train, val = write_text(tmp_path, 5, n_train=3, n_val=2, symbols=4)
    lines = train.read_text().splitlines()
    assert len(lines) == 3 and all(len(line) == 10 and line[:5] == line[5:] for line in lines)
    assert set("".join(lines)) <= set("abcd") and len(val.read_text().splitlines()) == 2
    assert main(["--distance", "3", "--out", str(tmp_path / "d3")]) == 0
    assert main(["--distance", "3", "--out", str(tmp_path / "bad"), "--symbols", "40"]) == 2
    assert "error: write_text has 26 letters" in capsys.readouterr().err
    with pytest.raises(ValueError, match="distance >= 1"):
        copy_task(1, 0)


def test_the_validation_examples_are_not_the_training_examples(tmp_path):
    """The held-out text must be other blocks than the training text's, or a model could pass it by memorising
    the training lines instead of looking back d tokens."""
    train, val = write_text(tmp_path, distance=8, n_train=200, n_val=50)
    train_lines = set(train.read_text().splitlines())
    val_lines = val.read_text().splitlines()
    seen = sum(line in train_lines for line in val_lines)
    assert seen <= 2, f"{seen} of {len(val_lines)} validation examples are training examples"
