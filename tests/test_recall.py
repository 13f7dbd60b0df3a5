"""data/recall.py: the delayed-copy task is solved by attention that looks back d tokens and by nothing that sees
only the last k < d (the claims' distance task, issue 35); the recall of one item holds the load constant across d
(the claim's task since issue 43)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from data.recall import copy_task, item_task, load_bits, main, write_text


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


# --- the task as a corpus (data.source=recall) and its measure (claims/measure.py recall_scores) ---------------------


class HandSet(torch.nn.Module):
    """A hand-set "language model" over the task's token ids: `rule(x)` -> (B, T, V) logits; it says how far it sees
    only through what `rule` reads."""

    def __init__(self, rule, vocab_size: int, block_size: int):
        super().__init__()
        self.rule, self.vocab_size = rule, vocab_size
        self.config = type("Config", (), {"block_size": block_size})()

    def forward(self, x):
        return type("Output", (), {"logits": self.rule(x)})()


def recall_part(tmp_path, distance: int, part: str = "test", task: str = "copy"):
    """The held-out part of the prepared task at `distance`: its tokens, the separator, the letters' token ids and
    the vocabulary size."""
    from data.config import DataConfig
    from data.prepare import prepare_data

    cfg = DataConfig(source="recall", name="recall", tokenizer="char", distance=distance, train_tokens=4000,
                     val_examples=64, cache_dir=str(tmp_path / "cache"), recall_task=task)
    data = prepare_data(cfg, log=lambda *_: None)
    letters = [data.tokenizer.encode(c)[0] for c in "abcdefghijklmnop"]
    return data.held_out(part).tokens, data.tokenizer.eot_id, letters, data.tokenizer.vocab_size


def look_back_model(distance: int, vocab_size: int, block_size: int) -> HandSet:
    """Predicts, at position t, the token at t + 1 - distance (confidently): what the copy needs."""
    def rule(x):
        logits = torch.zeros(*x.shape, vocab_size)
        t = torch.arange(x.shape[1])
        src = t + 1 - distance
        ok = src >= 0
        logits[:, t[ok]] = 30 * torch.nn.functional.one_hot(x[:, src[ok]], vocab_size).float()
        return logits
    return HandSet(rule, vocab_size, block_size)


def window_model(k: int, letters: list[int], vocab_size: int, block_size: int, cache: bool) -> HandSet:
    """Sees only the last k tokens: uniform over the letters (cache=False), or each letter weighted by 1 + 4 x its
    count in the window (cache=True, a model that bets on what it just saw)."""
    def rule(x):
        logits = torch.full((*x.shape, vocab_size), -1e9)
        letter_ids = torch.tensor(letters)
        counts = torch.zeros(*x.shape, vocab_size)
        if cache:
            for j in range(k):  # the token j back, where there is one
                shifted = torch.nn.functional.pad(x, (j, 0), value=-1)[:, :x.shape[1]]
                counts += torch.nn.functional.one_hot(shifted.clamp(min=0), vocab_size) * (shifted >= 0)[..., None]
        logits[..., letter_ids] = torch.log1p(4 * counts[..., letter_ids])
        return logits
    return HandSet(rule, vocab_size, block_size)


@pytest.mark.parametrize("distance", [8, 32])
def test_the_recall_measure_gives_0_bits_to_a_look_back_of_d_and_log2_symbols_to_a_window_of_k(tmp_path, distance):
    from attention_lab.claims.measure import recall_scores

    tokens, eot, letters, vocab = recall_part(tmp_path, distance)
    assert (tokens == eot).sum() == 32, "64 held-out examples, every other one in the test part"
    exact = recall_scores(look_back_model(distance, vocab, 2 * distance), tokens, eot)
    assert exact["copy_bits"] < 1e-6 and exact["copy_accuracy"] == 1.0, \
        f"a model that looks back exactly d={distance} tokens copies every letter, got {exact}"
    off_by_one = recall_scores(look_back_model(distance - 1, vocab, 2 * distance), tokens, eot)
    assert off_by_one["copy_accuracy"] < 0.2, f"looking back d - 1 is not the copy, got {off_by_one}"
    for k in (1, distance // 2, distance - 1):
        uniform = recall_scores(window_model(k, letters, vocab, 2 * distance, cache=False), tokens, eot)
        assert uniform["copy_bits"] == pytest.approx(math.log2(16), abs=1e-4), \
            f"uniform over the 16 letters is log2(16) = 4 bits a copied letter, got {uniform}"
        bets = recall_scores(window_model(k, letters, vocab, 2 * distance, cache=True), tokens, eot)
        n = 32 * distance
        assert bets["copy_bits"] > math.log2(16) - 0.05, \
            f"nothing in the last k={k} < d tokens tells the copied letter, so no bet beats 4 bits: {bets}"
        assert bets["copy_accuracy"] < 1 / 16 + 4 * math.sqrt(1 / 16 * 15 / 16 / n), (k, bets)


@pytest.mark.parametrize("distance", [8, 32, 128, 512])
def test_the_item_task_holds_one_item_at_every_distance_so_its_load_is_constant(distance):
    """The recall of one item: exactly one item letter precedes the scored token, which repeats it from exactly d
    back; everything between is filler and the marker. So what must be held is one letter (4 bits) at every d,
    where the delayed copy asks for all d letters (4d bits)."""
    symbols = 16
    x, scored = item_task(300, distance, symbols, seed=distance)
    assert x.shape == (300, distance + 1) and np.flatnonzero(scored).tolist() == [distance - 1], "one scored token"
    before = x[:, :distance]
    assert ((before < symbols).sum(axis=1) == 1).all() and (before[:, 0] < symbols).all(), "one item, at the start"
    assert np.array_equal(x[:, distance], x[:, 0]), "the scored token is the item, exactly d back"
    assert (x[:, distance - 1] == 25).all() and ((x[:, 1:distance - 1] >= symbols) & (x[:, 1:distance - 1] < 25)).all()
    assert len(np.unique(x[:, 0])) == symbols, "every item letter occurs"
    assert load_bits("item", distance, symbols) == 4.0 == load_bits("item", 8, symbols)
    assert load_bits("copy", distance, symbols) == 4.0 * distance


def test_the_recall_claim_trains_on_the_item_task_at_every_distance():
    from attention_lab.claims import CLAIMS

    settings = CLAIMS["recall"].variable.settings
    assert all("data.recall_task=item" in overrides for _, overrides in settings), settings
    assert CLAIMS["recall"].expect[0].metric == "recall_bits" and CLAIMS["recall"].expect[0].chance == 4.0


@pytest.mark.parametrize("distance", [8, 32])
def test_the_item_measure_gives_0_bits_to_a_look_back_of_d_and_4_to_a_window_of_k(tmp_path, distance):
    from attention_lab.claims.measure import recall_scores

    tokens, eot, letters, vocab = recall_part(tmp_path, distance, task="item")
    assert (tokens == eot).sum() == 32 and len(tokens) == 32 * (distance + 2)
    exact = recall_scores(look_back_model(distance, vocab, distance + 1), tokens, eot, "item")
    assert exact["recall_bits"] < 1e-6 and exact["recall_accuracy"] == 1.0, exact
    off = recall_scores(look_back_model(distance - 1, vocab, distance + 1), tokens, eot, "item")
    assert off["recall_accuracy"] < 0.2, f"looking back d - 1 reads a filler letter, got {off}"
    for k in (1, distance - 1):
        bets = recall_scores(window_model(k, letters, vocab, distance + 1, cache=True), tokens, eot, "item")
        assert bets["recall_bits"] == pytest.approx(4.0, abs=1e-4), f"no item letter in the last {k}: {bets}"
    with pytest.raises(ValueError, match="the recall needs"):
        recall_scores(look_back_model(distance, vocab, distance), tokens, eot, "item")


def test_the_recall_measure_refuses_a_model_that_cannot_see_the_whole_example(tmp_path):
    from attention_lab.claims.measure import recall_scores

    tokens, eot, _, vocab = recall_part(tmp_path, 8)
    with pytest.raises(ValueError, match=r"sees 12 tokens, the delayed copy needs 16 .*model.block_size >= 16"):
        recall_scores(look_back_model(8, vocab, 12), tokens, eot)
    with pytest.raises(ValueError, match="examples of one even length"):
        recall_scores(look_back_model(8, vocab, 16), np.concatenate([tokens, [3, 3, 3, eot]]), eot)


def test_the_recall_corpus_is_aligned_examples_of_the_task(tmp_path):
    """Every held-out example is one document of 2d letters whose second half repeats its first; the two held-out
    parts share no example; the training text holds about data.train_tokens tokens."""
    from data.config import DataConfig
    from data.prepare import prepare_data

    cfg = DataConfig(source="recall", name="recall", tokenizer="char", distance=5, train_tokens=1100, val_examples=10,
                     cache_dir=str(tmp_path / "cache"))
    data = prepare_data(cfg, log=lambda *_: None)
    assert data.meta["train"]["tokens"] == 1100, "100 examples of 5 + 5 letters and a separator"
    parts = {}
    for part in ("choose", "test"):
        tokens = data.held_out(part).tokens
        docs = np.split(tokens, np.flatnonzero(tokens == data.tokenizer.eot_id)[:-1] + 1)
        texts = [data.tokenizer.decode(int(t) for t in d[:-1]) for d in docs]
        assert len(texts) == 5 and all(len(t) == 10 and t[:5] == t[5:] for t in texts), texts
        parts[part] = set(texts)
    assert not parts["choose"] & parts["test"]


@pytest.mark.parametrize("overrides, message", [
    ({"distance": 0}, r"data\.distance=0 must be an integer >= 1 for source=recall"),
    ({"distance": 8, "tokenizer": "bpe"}, r"data\.tokenizer=char"),
    ({"distance": 8, "symbols": 27}, r"data\.symbols=27 must be in 2-26"),
    ({"distance": 8, "train_tokens": 10}, r"data\.train_tokens=10 holds no example of 17 tokens"),
    ({"distance": 8, "val_examples": 1}, r"data\.val_examples=1 must be >= 2"),
    ({"distance": 8, "val_docs": ["x"]}, r"leave data\.files and data\.val_docs empty"),
])
def test_the_recall_data_config_refuses_bad_values(overrides, message):
    from data.config import DataConfig

    with pytest.raises(ValueError, match=message):
        DataConfig(**{"source": "recall", "name": "recall", "tokenizer": "char", **overrides})
    with pytest.raises(ValueError, match=r"data\.distance=8 is for source=recall"):
        DataConfig(distance=8)


def test_a_bad_distance_at_the_entry_point_is_one_error_line(capsys):
    """train.py composes the config inside cli.run (train._main): the same composition here, in-process."""
    from attention_lab.runtime import cli
    from attention_lab.training.config import compose

    assert cli.run(lambda: compose(["data=recall", "data.distance=-3"]) and None) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "data.distance=-3 must be an integer >= 1 for source=recall" in errors[0], errors
    cfg = compose(["data=recall", "data.distance=64", "model.block_size=128"])
    assert (cfg.data.source, cfg.data.distance, cfg.data.tokenizer) == ("recall", 64, "char"), cfg.data


def test_the_recall_claim_runs_end_to_end_quick_along_the_distance(tmp_path, monkeypatch):
    """`python -m attention_lab.claims recall --quick` at two of its distances (a real `train.py -m`): each run
    trains on the task at its own distance with the whole example in view, and is scored by copy_bits on the
    held-out examples of its own distance (not those of the first run measured); one comparison per distance and
    one trend along it."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from attention_lab.claims import CLAIMS, experiment, select

    scored = {}  # run folder -> the length of the held-out examples it was scored on
    real_measure = experiment.measure

    def spy(claim, run_dir, held, quick):
        ends = np.flatnonzero(held.part.tokens == held.part.tokens[-1])  # the separator ends the part
        scored[run_dir.name] = int(ends[1] - ends[0] - 1)
        return real_measure(claim, run_dir, held, quick)

    monkeypatch.setattr(experiment, "measure", spy)
    claim = select(CLAIMS["recall"], seeds=(1,))
    claim = replace(claim, variable=replace(claim.variable, settings=claim.variable.settings[:2]))  # d = 8, 32
    out = tmp_path / "recall"
    experiment.run_claim(claim, out, quick=True, log=lambda *a: None, progress=False,
                         overrides=(f"data.cache_dir={tmp_path / 'cache'}", "data.train_tokens=20000",
                                    "train.peak_flops=1e11"))
    doc = json.loads((out / "results.json").read_text())
    assert doc["variable"] == "distance" and sorted(set(doc["at"])) == [8, 32], doc["at"]
    assert [c["metric"] for c in doc["comparisons"]] == ["recall_bits", "recall_bits"], doc["comparisons"]
    assert len(doc["trends"]) == 1, doc["trends"]
    below = [d for d in (8, 32) if doc["results"][f"lstm, distance={d}"][0]["recall_bits"] < 0.95 * 4.0]
    assert doc["trends"][0]["values"] == below, "the trend only where the LSTM is not at chance (24 steps: rarely)"
    for arm, rows in doc["results"].items():
        d = int(arm.rsplit("=", 1)[1])
        cfg = json.loads((out / rows[0]["run"] / "config.json").read_text())
        assert (cfg["data"]["source"], cfg["data"]["distance"], cfg["model"]["block_size"]) == ("recall", d, 2 * d), \
            (arm, cfg["data"], cfg["model"]["block_size"])
        assert cfg["model"]["arch"] == ("lstm" if arm.startswith("lstm") else "gpt"), (arm, cfg["model"])
        assert scored[Path(rows[0]["run"]).name] == d + 1, f"{arm} scored on examples of another distance: {scored}"
        assert cfg["data"]["recall_task"] == "item", cfg["data"]
        assert 0 <= rows[0]["recall_bits"] and 0 <= rows[0]["recall_accuracy"] <= 1, (arm, rows[0])
        assert rows[0]["step"] == 24, "--quick's steps beat the claim's own 1,000"


def test_the_recall_claims_arms_have_equal_parameters_steps_and_tokens_and_its_notes_say_so():
    """What the claim's notes state, read from the configs its jobs compose to: at every distance both arms see the
    whole example (2d tokens), 4,096 tokens a step, the same steps, and parameter counts within 1% (the LSTM's width
    matched to the transformer, at the task's vocabulary: 16 letters, the separator and the unknown character)."""
    from attention_lab.claims import CLAIMS, runs
    from attention_lab.claims.catalog import BASE, BASE_LR, along
    from attention_lab.training.config import compose
    from model import build_model

    claim = along(CLAIMS["recall"])
    notes = " ".join(claim.notes)
    assert [v for v, _ in claim.variable.settings] == [8, 32, 128, 512]
    by_distance: dict[int, dict] = {}
    for arm in claim.arms:
        cfg = compose([*BASE, *claim.overrides, *runs.job(arm, 1, BASE_LR).overrides])
        d = cfg.data.distance
        assert cfg.model.block_size == 2 * d, "the whole example in view"
        assert cfg.train.batch_size * cfg.model.block_size == 4096 and "4,096 tokens a step" in notes
        assert f"the same {cfg.train.max_steps:,} steps" in notes and cfg.train.max_steps == 1000
        with torch.device("meta"):
            net = cfg.model.network(vocab_size=28)  # 26 letters (items, filler, marker), separator, unknown
            params = sum(p.numel() for p in build_model(net).parameters())
        if cfg.model.arch == "lstm":
            assert f"the LSTM {net.n_layer} layers {net.n_embd} wide" in notes, (net, notes)
        by_distance.setdefault(d, {})[cfg.model.arch] = (params, cfg.train.max_steps, cfg.optim.lr)
    for d, arms in by_distance.items():
        (gpt, steps, lr), (lstm, lstm_steps, lstm_lr) = arms["gpt"], arms["lstm"]
        assert abs(lstm - gpt) / gpt < 0.01 and steps == lstm_steps and lr == lstm_lr, (d, arms)
