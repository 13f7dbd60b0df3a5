"""attention_lab.training.evaluate: whole-split scoring covers every token once and agrees with the model's own loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_lab.training.evaluate import EVAL_TOKENS, split_nats, tiling_windows, windows_per_pass
from model import GPT, GPTConfig

T = 16


@pytest.mark.parametrize("n", [T + 1, T + 2, 2 * T, 2 * T + 1, 2 * T + 2, 5 * T + 7, 7 * T + 1])
def test_tiling_scores_every_target_once(n):
    starts, first = tiling_windows(n, T)
    scored = []
    for s, f in zip(starts, first):
        assert 0 <= s and s + T + 1 <= n, f"window at {s} reads past the {n} tokens"
        scored += range(s + 1 + f, s + T + 1)  # targets this window predicts and counts
    assert sorted(scored) == list(range(1, n)), f"n={n}: targets not covered exactly once"
    assert (first[:-1] == 0).all(), "only the last window may skip targets"
    assert (np.diff(starts[:-1] if first[-1] else starts) == T).all(), "full windows must not overlap"


def test_tiling_refuses_a_split_shorter_than_a_window():
    with pytest.raises(ValueError, match="less than one window"):
        tiling_windows(T, T)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, block_size=T, n_layer=2, n_head=2, n_embd=32))
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return m.eval()


def tokens(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50, n).astype(np.uint16)


def test_whole_windows_match_the_models_own_mean_loss(model):
    toks = tokens(4 * T + 1)
    total, count = split_nats(model, toks, batch_size=3)
    x = torch.from_numpy(toks[:-1].astype(np.int64)).view(4, T)
    y = torch.from_numpy(toks[1:].astype(np.int64)).view(4, T)
    with torch.no_grad():
        expected = model(x, y).loss.item()
    assert count == 4 * T
    assert total / count == pytest.approx(expected, rel=1e-5), "whole-split nats differ from the model's loss"


def test_partial_last_window_scores_only_new_targets(model):
    extra = 5
    toks = tokens(3 * T + 1 + extra)
    total, count = split_nats(model, toks, batch_size=2)
    head_total, head_count = split_nats(model, toks[:3 * T + 1], batch_size=2)
    # the last window reads the final T+1 tokens; only its last `extra` targets are new
    window = torch.from_numpy(toks[-(T + 1):].astype(np.int64))
    with torch.no_grad():
        logits = model(window[None, :-1]).logits[0]
    tail = F.cross_entropy(logits[-extra:], window[1:][-extra:], reduction="sum").item()
    assert count == head_count + extra == len(toks) - 1
    assert total == pytest.approx(head_total + tail, rel=1e-5)


@pytest.mark.parametrize("batch_size", [1, 4, 100, None])
def test_batch_size_does_not_change_the_score(model, batch_size):
    toks = tokens(6 * T + 9, seed=2)
    reference = split_nats(model, toks, batch_size=2)
    total, count = split_nats(model, toks, batch_size=batch_size)
    assert count == reference[1]
    assert math.isclose(total, reference[0], rel_tol=1e-5), f"batch {batch_size}: {total} vs {reference[0]}"


def test_the_default_batch_is_about_eval_tokens_of_windows_and_never_under_eight():
    """A short context is batched up to EVAL_TOKENS tokens a pass (its 8 windows a pass spent seconds of Python on a
    split); the 256-token default keeps 16, a long context never drops under 8."""
    assert windows_per_pass(32) == EVAL_TOKENS // 32 == 128
    assert windows_per_pass(256) == 16 and windows_per_pass(1024) == 8 and windows_per_pass(100_000) == 8
