"""The claims' measurements (attention_lab/interp/measures.py) on hand-built models whose answers are known.

The data is a counter, x_t = (start + t) mod V, so "the next token" is known and each fake model below reads a
known part of its context: the numbers each measure must give follow from the model's rule alone.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attention_lab.interp import measures as M
from attention_lab.interp.capture import residual_streams
from model import GPT, GPTConfig

V, T, B = 16, 12, 6
BIG = 30.0  # a logit so large that softmax puts ~all mass on it: loss ~ 0


def counter(b: int = B, t: int = T) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.arange(b)[:, None] * 5
    seq = (starts + torch.arange(t + 1)[None]) % V
    return seq[:, :-1], seq[:, 1:]


class Rule(torch.nn.Module):
    """logits[b, t] = BIG on rule(x, t) (a token, or -1 for "no idea": uniform)."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule
        self.config = SimpleNamespace(block_size=64)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # eval_mode needs a module; no parameter is used

    def forward(self, x):
        b, t = x.shape
        logits = torch.zeros(b, t, V)
        for i in range(t):
            guess = self.rule(x, i)  # (b,) int, -1 = uniform
            known = guess >= 0
            logits[known, i, guess[known]] = BIG
        return SimpleNamespace(logits=logits)


def test_position_losses_follow_how_much_context_a_model_reads():
    # predicts x_{t-1} + 2 (needs one earlier token), else nothing: position 0 pays log V, the rest ~0
    model = Rule(lambda x, i: (x[:, i - 1] + 2) % V if i >= 1 else torch.full((x.size(0),), -1))
    x, y = counter()
    curve = M.position_losses(model, x, y, batch_size=4)
    assert curve.shape == (T,), curve.shape
    assert curve[0] == pytest.approx(math.log(V), abs=1e-4), f"position 0 has no earlier token: {curve[0]}"
    assert np.all(curve[1:] < 1e-6), f"positions >= 1 are predicted exactly: {curve}"


def test_prefix_shuffle_costs_an_order_reading_model_and_not_a_bag_of_tokens():
    last = 4
    cut = T - last
    # order: reads the token `last` positions back (inside the shuffled prefix for targets >= cut)
    order = Rule(lambda x, i: (x[:, i - last] + last + 1) % V if i >= last else torch.full((x.size(0),), -1))
    x, y = counter()
    r = M.prefix_shuffle(order, x, y, last=last, seed=0)
    assert r.ordered < 1e-6, f"in order the rule is exact on the last {last} targets: {r.ordered}"
    # shuffled: each of the last targets is right only if the permutation kept position i - last in place
    assert r.shuffled > 1.0 and r.jump == pytest.approx(r.shuffled - r.ordered)
    # a bag of tokens (the prediction depends on the prefix's multiset only) cannot tell the difference
    bag = Rule(lambda x, i: (x[:, : i + 1].sum(1) * 7) % V)
    s = M.prefix_shuffle(bag, x, y, last=last, seed=0)
    assert s.jump == pytest.approx(0.0, abs=1e-6), f"a bag of tokens has no order to lose: {s}"
    # the last `last` inputs and every target stay: a model reading only x_i itself is unaffected
    own = Rule(lambda x, i: (x[:, i] + 1) % V)
    assert M.prefix_shuffle(own, x, y, last=last).jump == pytest.approx(0.0, abs=1e-6)
    assert cut > 0
    # exactly the last `last` targets are scored: a model right at even positions only scores their mean
    alternate = Rule(lambda x, i: (x[:, i] + 1) % V if i % 2 == 0 else torch.full((x.size(0),), -1))
    want = M.position_losses(alternate, x, y)[-3:].mean()
    assert M.prefix_shuffle(alternate, x, y, last=3).ordered == pytest.approx(want, abs=1e-6), "the scored tail"
    with pytest.raises(ValueError, match="last"):
        M.prefix_shuffle(own, x, y, last=T)


def test_honest_loss_hides_the_future_that_a_leaking_model_reads():
    # cheats: reads the next input x_{t+1} (which is the target) when the window holds it
    cheat = Rule(lambda x, i: x[:, i + 1] if i + 1 < x.size(1) else torch.full((x.size(0),), -1))
    x, y = counter()
    leaky = M.position_losses(cheat, x, y)
    honest = M.honest_position_losses(cheat, x, y, batch_size=4)
    assert np.all(leaky[:-1] < 1e-6), f"with the future in view every position but the last is exact: {leaky}"
    assert honest == pytest.approx(np.full(T, math.log(V)), abs=1e-4), f"cut off, it knows nothing: {honest}"
    # a causal rule scores the same either way
    fair = Rule(lambda x, i: (x[:, i] + 1) % V)
    assert M.honest_position_losses(fair, x, y) == pytest.approx(M.position_losses(fair, x, y), abs=1e-9)


def test_honest_loss_equals_the_ordinary_loss_for_a_causal_gpt():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()
    x, y = counter()
    assert M.honest_position_losses(model, x, y) == pytest.approx(M.position_losses(model, x, y), abs=1e-5)


def gpt(pos: str = "none", seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=V, block_size=32, n_layer=2, n_head=2, n_embd=16, pos_encoding=pos)).eval()


def test_residual_streams_are_the_models_own_stream():
    model = gpt("learned")
    x, _ = counter(3, 10)
    stream = residual_streams(model, x)
    assert stream.shape == (3, 3, 10, 16), stream.shape
    emb = model.transformer.wte(x) + model.transformer.wpe.weight[:10]
    torch.testing.assert_close(stream[:, 0], emb, msg="row 0 is the embedding")
    logits = model.lm_head(model.transformer.ln_f(stream[:, -1]))
    torch.testing.assert_close(logits, model(x).logits, msg="the last row is what ln_f reads")


def test_residual_streams_of_a_model_left_training_with_dropout_are_its_eval_streams():
    """The measures read a model the trainer may hand over in training mode (every evaluation): with dropout on, a
    stream recorded in training mode would be a random draw, different at each call."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=32, n_layer=2, n_head=2, n_embd=16, pos_encoding="learned",
                          dropout=0.5))
    x, _ = counter(3, 10)
    model.eval()
    want = residual_streams(model, x)
    model.train()
    got = [residual_streams(model, x) for _ in range(2)]
    assert model.training, "residual_streams gives the model back in training mode"
    for stream in got:
        torch.testing.assert_close(stream, want, msg="recorded in eval mode: no dropout, the same at every call")


def test_contextual_similarity_is_one_at_the_embedding_without_positions_and_subtracts_the_baseline():
    model = gpt("none")
    x = torch.randint(V, (12, 20), generator=torch.Generator().manual_seed(1))
    sim = M.contextual_similarity(model, x, n_tokens=5, pairs_per_token=20)
    # without positions the embedding of a token is the same vector in every context
    assert sim.self_similarity[0] == pytest.approx(1.0, abs=1e-6), sim.self_similarity
    assert sim.baseline[0] < 0.9, f"random pairs of different tokens are not parallel: {sim.baseline}"
    np.testing.assert_allclose(sim.contextual, sim.self_similarity - sim.baseline)
    # a drift every vector shares makes raw cosines ~1; the difference to random pairs removes it
    with torch.no_grad():
        model.transformer.wte.weight += 50.0
    drift = M.contextual_similarity(model, x, n_tokens=5, pairs_per_token=20)
    assert drift.baseline[0] > 0.99, drift.baseline
    assert drift.contextual[0] == pytest.approx(0.0, abs=0.01), drift.contextual


def test_contextual_similarity_by_hand():
    """Token 5 occurs twice, in windows 0 and 2, every other token once: the one same-token pair is known."""
    model = gpt("learned", seed=3)
    others = iter([t for t in range(V) if t != 5])
    x = torch.tensor([[next(others) for _ in range(5)] for _ in range(3)])
    x[0, 3], x[2, 1] = 5, 5
    sim = M.contextual_similarity(model, x, n_tokens=1, pairs_per_token=10, seed=5)
    assert sim.tokens == [5], sim.tokens
    stream = residual_streams(model, x)  # (B, L+1, T, C)
    for layer in range(3):
        want = torch.nn.functional.cosine_similarity(stream[0, layer, 3], stream[2, layer, 1], dim=0).item()
        assert sim.self_similarity[layer] == pytest.approx(want, abs=1e-5), f"layer {layer}"


def test_nearest_in_context_finds_the_same_token_without_positions():
    model = gpt("none")
    x = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 3, 9, 10, 11]])
    near = M.nearest_in_context(model, x, (0, 2), k=1, layer=0)  # token 3 in window 0, at the embedding
    assert near[0][2] == 3 and near[0][:2] == (1, 2) and near[0][3] == pytest.approx(1.0, abs=1e-6), near


def test_attention_stats_read_the_models_own_scores():
    """The largest pre-softmax score equals q.k * scale recomputed from the layer's own projections (layer 0, learned
    positions, no QK-norm); the entropy of uniform attention is 1 and of a one-hot one 0."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=2, n_head=2, n_embd=16, bias=False)).eval()
    x, _ = counter(3, 10)
    stats = M.attention_stats(model, x)
    emb = model.transformer.wte(x) + model.transformer.wpe.weight[:10]
    h = model.transformer.h[0].ln_1(emb)
    q, k, _ = model.transformer.h[0].attn.c_attn(h).split(16, dim=-1)
    q, k = q.view(3, 10, 2, 8).transpose(1, 2), k.view(3, 10, 2, 8).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    scores = scores.masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), float("-inf"))
    assert stats.max_score[0] == pytest.approx(scores.max().item(), abs=1e-5), (stats.max_score, scores.max())
    assert stats.entropy.shape == (2,) and np.all((stats.entropy > 0) & (stats.entropy <= 1)), stats.entropy
    with torch.no_grad():  # zero queries and keys: every score 0, uniform attention, entropy exactly 1
        for block in model.transformer.h:
            block.attn.c_attn.weight[:32] = 0.0
    flat = M.attention_stats(model, x)
    assert flat.entropy == pytest.approx(np.ones(2), abs=1e-6) and flat.max_score == pytest.approx(np.zeros(2))


def test_attention_stats_of_linear_attention_have_entropy_and_no_softmax_score():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="linear",
                          pos_encoding="learned")).eval()
    stats = M.attention_stats(model, counter(2, 8)[0])
    assert np.all(np.isnan(stats.max_score)) and np.all((stats.entropy > 0) & (stats.entropy <= 1 + 1e-9)), stats
