"""The experiment switches (GPTConfig.attn_scale, causal_mask, qk_tied, attend_self, qk_init, attention="uniform"): off, the model is today's bit for bit;
on, each computes its formula, written out here in float64, in both backends, through generation, training and
resume; the tools that cannot show them refuse clearly.

The reference (`reference_attention`) is the textbook formula with its own split of c_attn's rows, its own
scale table and its own softmax: it shares no code with model/attention.py. Weights are drawn larger than the
GPT-2 init (std 0.3 on c_attn) so that attention is far from uniform and a wrong scale or mask moves the output
by much more than the float32 rounding the tolerances allow (1e-5).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

import model.attention as attention_module
import train as train_mod
from attention_lab.interop.convert import FIELD_ROLES, plan_export
from attention_lab.interop.hf import export_pretrained
from attention_lab.interp.inside import step_inside, steppable
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.config import compose
from attention_lab.viewer.report import dump_attention
from data.tokenizer import Tokenizer
from model import GPT, GPTConfig, generate, num_params

V, BLOCK, LAYERS, HEADS, EMBD = 32, 12, 2, 2, 16
HS = EMBD // HEADS
T = 8
DEFAULTS = dict(attn_scale="sqrt", causal_mask="before_softmax", qk_tied=False, attend_self=True, qk_init="normal")

# each switch away from its default, then together, and with the variants they combine with (sinks, GQA)
SWITCHES = {
    "scale_none": dict(attn_scale="none"),
    "scale_inverse": dict(attn_scale="inverse"),
    "after_softmax": dict(causal_mask="after_softmax"),
    "mask_none": dict(causal_mask="none"),
    "qk_tied": dict(qk_tied=True),
    "all": dict(attn_scale="inverse", causal_mask="after_softmax", qk_tied=True),
    "none_tied_sinks": dict(causal_mask="none", qk_tied=True, attn_sinks=True, attn_scale="none"),
    "inverse_sinks_gqa": dict(attn_scale="inverse", attn_sinks=True, n_kv_head=1),
    "after_sinks_gqa": dict(causal_mask="after_softmax", attn_sinks=True, n_kv_head=1),
    "no_self": dict(attend_self=False),
    "no_self_tied_sinks": dict(attend_self=False, qk_tied=True, attn_sinks=True, attn_scale="none"),
    "no_self_gqa": dict(attend_self=False, n_kv_head=1, attn_scale="inverse"),
    "uniform": dict(attention="uniform"),
    "uniform_no_self_gqa": dict(attention="uniform", attend_self=False, n_kv_head=1),
}


def config(**overrides) -> GPTConfig:
    return GPTConfig(**(dict(vocab_size=V, block_size=BLOCK, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD) | overrides))


def build(seed: int = 0, **overrides) -> GPT:
    """A tiny seeded model with c_attn drawn large (std 0.3; the rest at GPT-2's init) and sink logits of 1 and 2."""
    torch.manual_seed(seed)
    model = GPT(config(**overrides)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_attn.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif name.endswith("attn.sink"):
                p.copy_(torch.linspace(1.0, 2.0, p.numel()))
    return model


def twin(model: GPT, **overrides) -> GPT:
    """The same weights in a model whose config differs in `overrides` (the backend, say)."""
    other = GPT(GPTConfig(**(model.config.to_dict() | overrides))).eval()
    other.load_state_dict(model.state_dict())
    return other


def tokens(t: int = T, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, V, (1, t), generator=torch.Generator().manual_seed(seed))


def logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(idx).logits


def close(actual, expected, what: str, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=lambda m: f"{what}\n{m}")


# ------------------------------------------------------------------------------------- off: today's model


# logits of GPT(config(attn_backend=...)) at GPT-2's init (no build()), seeded 1234, on PINNED_IDS, recorded from
# the code before the switches existed (torch 2.13.0+cpu, float32): logits[0, (0, 3, 7), (1, 5, 20)] and the sum
# of |logits|. Another CPU or BLAS may differ by ~1e-7; a change to the model's math moves them by far more.
PINNED_IDS = [[3, 14, 15, 29, 6, 22, 16, 9]]
PINNED = {
    "math": ([-0.012062371708452702, 0.03172110766172409, -0.052533067762851715], 17.413025998859666),
    "sdpa": ([-0.012062371708452702, 0.03172110393643379, -0.05253307893872261], 17.413026058638934),
}
PINNED_PARAMS = 7296


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_the_defaults_are_todays_model_bit_for_bit(backend):
    torch.manual_seed(1234)
    plain = GPT(config(attn_backend=backend)).eval()
    torch.manual_seed(1234)
    spelled = GPT(config(attn_backend=backend, **DEFAULTS)).eval()
    a, b = dict(plain.named_parameters()), dict(spelled.named_parameters())
    assert list(a) == list(b), f"parameter names differ: {list(a)} vs {list(b)}"
    for name in a:
        assert a[name].shape == b[name].shape and torch.equal(a[name], b[name]), f"{name} differs at init"
    idx = torch.tensor(PINNED_IDS)
    got = logits(plain, idx)
    assert torch.equal(got, logits(spelled, idx)), "the switches at their defaults changed the logits"

    want, abs_sum = PINNED[backend]
    assert sum(p.numel() for p in plain.parameters()) == PINNED_PARAMS, "the default model's size changed"
    close(got[0, [0, 3, 7], [1, 5, 20]].double(), torch.tensor(want, dtype=torch.float64),
          f"{backend}: the default model's logits moved from the numbers recorded before the switches existed",
          atol=1e-7, rtol=1e-6)
    assert abs(got.double().abs().sum().item() - abs_sum) < 1e-5, (
        f"{backend}: sum |logits| {got.double().abs().sum().item()!r} != recorded {abs_sum!r}")


@pytest.mark.parametrize("field, value", [("attn_scale", "cosine"), ("causal_mask", "later"), ("qk_tied", "yes"),
                                          ("attend_self", "no"), ("attend_self", 0), ("qk_init", "xavier"),
                                          ("attention", "uniformly")])
def test_a_bad_switch_value_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"GPTConfig.{field} must be"):
        config(**{field: value})


@pytest.mark.parametrize("overrides, words", [
    (dict(attention="linear", causal_mask="after_softmax"), "no softmax and no scale"),
    (dict(attention="linear", attn_scale="none"), "no softmax and no scale"),
    (dict(causal_mask="none", window=4), "window=4"),
    (dict(causal_mask="after_softmax", pos_encoding="alibi"), "pos_encoding=alibi"),
    (dict(qk_tied=True, n_kv_head=1), "qk_tied"),
    (dict(attend_self=False, causal_mask="none"), "causal_mask=none"),
    (dict(attend_self=False, causal_mask="after_softmax"), "causal_mask=after_softmax"),
    (dict(attend_self=False, attention="linear"), "attention=linear"),
    (dict(attention="uniform", pos_encoding="alibi"), "pos_encoding=alibi"),
    (dict(attention="uniform", attn_sinks=True), "attn_sinks=true"),
    (dict(attention="uniform", causal_mask="after_softmax"), "causal_mask=after_softmax"),
    (dict(attention="uniform", attn_scale="none"), "attn_scale=none"),
    (dict(attention="uniform", qk_tied=True), "qk_tied=true"),
    (dict(attention="uniform", qk_init="unit"), "qk_init=unit"),
])
def test_combinations_without_a_meaning_are_refused(overrides, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        config(**overrides)


# ------------------------------------------------------------------------------ on: the written-out formula


def reference_attention(attn, x: torch.Tensor, cfg: GPTConfig) -> torch.Tensor:
    """One attention layer in float64 from the formula: c_attn's rows [q | k | v] ([q | v] and k = q when tied),
    scores = s q k^T with s = 1/sqrt(hs), 1 or 1/hs (all 0 for uniform attention), then the mask before the
    softmax, after it, or none; without attend_self the diagonal is -inf too, except row 0 (its only key);
    a sink logit joins the denominator; kv head h // (nh / nkv) serves query head h. x (B, T, C) -> (B, T, C)."""
    b, t, c = x.shape
    nh, nkv = cfg.n_head, cfg.n_kv_head or cfg.n_head
    hs = c // nh
    w = attn.c_attn.weight.double()
    bias = attn.c_attn.bias.double()
    out = x.double() @ w.T + bias
    if cfg.qk_tied:
        q, v = out[..., : nh * hs], out[..., nh * hs :]
        k = q
    else:
        q, k, v = out[..., : nh * hs], out[..., nh * hs : (nh + nkv) * hs], out[..., (nh + nkv) * hs :]
    s = {"sqrt": 1 / math.sqrt(hs), "none": 1.0, "inverse": 1 / hs}[cfg.attn_scale]
    future = torch.ones(t, t).triu(1).bool()
    hidden = future | (torch.eye(t).bool() if not cfg.attend_self else torch.zeros(t, t).bool())
    hidden[0, 0] = False  # row 0 sees only its own key: it keeps it
    heads = []
    for h in range(nh):
        g = h // (nh // nkv)
        qh, kh, vh = q[..., h * hs : (h + 1) * hs], k[..., g * hs : (g + 1) * hs], v[..., g * hs : (g + 1) * hs]
        scores = s * (qh @ kh.transpose(-2, -1))  # (B, T, T)
        if cfg.attention == "uniform":
            scores = torch.zeros_like(scores)
        if cfg.causal_mask == "before_softmax":
            scores = scores.masked_fill(hidden, -math.inf)
        m = scores.max(-1, keepdim=True).values
        e = torch.exp(scores - m)
        denominator = e.sum(-1, keepdim=True)
        if cfg.attn_sinks:
            denominator = denominator + torch.exp(attn.sink[h].double() - m)
        weights = e / denominator
        if cfg.causal_mask == "after_softmax":
            weights = weights.masked_fill(future, 0.0)
        heads.append(weights @ vh)
    y = torch.cat(heads, dim=-1)
    return y @ attn.c_proj.weight.double().T + attn.c_proj.bias.double()


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_each_switch_in_the_math_backend_is_the_written_out_formula(switch):
    model = build(pos_encoding="none", attn_backend="math", **SWITCHES[switch])
    attn = model.transformer.h[0].attn
    x = torch.randn(2, T, EMBD, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        y, _, _ = attn(x, model.transformer.wpe, None, torch.arange(T))
    close(y.double(), reference_attention(attn, x, model.config), f"{switch}: math attention != the formula")


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_sdpa_equals_math_for_each_switch(switch):
    math_model = build(pos_encoding="rope", attn_backend="math", **SWITCHES[switch])
    sdpa_model = twin(math_model, attn_backend="sdpa")
    idx = torch.randint(0, V, (2, BLOCK), generator=torch.Generator().manual_seed(1))
    close(logits(sdpa_model, idx), logits(math_model, idx), f"{switch}: sdpa logits != math logits")


@pytest.mark.parametrize("switch", ["scale_none", "scale_inverse", "inverse_sinks_gqa", "no_self", "no_self_gqa",
                                    "no_self_tied_sinks", "uniform", "uniform_no_self_gqa"])
def test_cached_decoding_with_another_scale_equals_the_full_forward(switch):
    """The scale reaches every sdpa path decoding takes (the prefill, one query per step, one_query_gqa)."""
    model = build(pos_encoding="rope", attn_backend="sdpa", **SWITCHES[switch])
    idx = tokens(BLOCK)
    cache = model.new_kv_cache()
    with torch.no_grad():
        steps = [model(idx[:, :6], kv_cache=cache).logits]
        steps += [model(idx[:, i : i + 1], kv_cache=cache).logits for i in range(6, BLOCK)]
    close(torch.cat(steps, dim=1), logits(model, idx), f"{switch}: cached decoding != the full forward")


def test_another_scale_changes_the_model():
    """The switch is not ignored: the same weights give other logits under each scale."""
    base = build(pos_encoding="none")
    idx = tokens()
    for scale in ("none", "inverse"):
        gap = (logits(twin(base, attn_scale=scale), idx) - logits(base, idx)).abs().max().item()
        assert gap > 1e-3, f"attn_scale={scale} moved the logits by only {gap:.2e}: is the switch read?"


# ------------------------------------------------------------------------------------- what each mask does


def layer0_weights(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(idx, return_attention=True).attentions[0][0]  # (nh, T, T)


def test_after_softmax_rows_sum_below_one_and_keep_the_full_softmax_weights():
    after = build(pos_encoding="learned", causal_mask="after_softmax")
    idx = tokens()
    w = layer0_weights(after, idx)
    sums = w.sum(-1)  # (nh, T)
    assert (sums[:, :-1] < 1 - 1e-4).all(), f"after_softmax rows before the last must lose the future's mass: {sums}"
    close(sums[:, -1], torch.ones(HEADS), "the last row sees every key: it sums to 1")
    assert (w.triu(1) == 0).all(), "after_softmax: the future keys' weights must be exactly 0"
    # layer 0 sees the same input in both models: its weights are the full softmax's with the future zeroed
    full = layer0_weights(twin(after, causal_mask="none"), idx)
    future = torch.ones(T, T).triu(1).bool()
    assert (full[:, future] > 0).all(), "without a mask every key has weight"
    close(w, full.tril(), "after_softmax's visible weights != the softmax over every key", atol=1e-7)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_before_softmax_rows_sum_to_one(backend):
    w = layer0_weights(build(attn_backend=backend), tokens())
    close(w.sum(-1), torch.ones(HEADS, T), "before_softmax rows must sum to 1", atol=1e-6)
    assert (w.triu(1) == 0).all(), "before_softmax: the future keys' weights must be exactly 0"


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("mask", ["before_softmax", "after_softmax", "none"])
def test_a_later_token_reaches_earlier_positions_only_without_the_causal_mask(mask, backend):
    model = build(causal_mask=mask, attn_backend=backend)
    idx = tokens()
    changed = idx.clone()
    changed[0, -1] = (idx[0, -1] + 1) % V
    gap = (logits(model, changed)[0, :-1] - logits(model, idx)[0, :-1]).abs().max().item()
    if mask == "before_softmax":
        assert gap < 1e-6, f"before_softmax: changing the last token moved earlier logits by {gap:.2e}"
    else:
        assert gap > 1e-4, f"causal_mask={mask}: the last token must reach earlier positions, moved {gap:.2e}"


def test_without_mask_and_positions_the_model_is_permutation_equivariant():
    model = build(pos_encoding="none", causal_mask="none")
    idx = tokens()
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(4))
    close(logits(model, idx[:, perm]), logits(model, idx)[:, perm], "permuting the tokens must permute the logits")
    masked = twin(model, causal_mask="before_softmax")
    gap = (logits(masked, idx[:, perm]) - logits(masked, idx)[:, perm]).abs().max().item()
    assert gap > 1e-3, f"with the causal mask the order must matter, but permuting moved the logits by {gap:.2e}"


# ---------------------------------------------------------------------------------------------------- qk_tied


def test_qk_tied_scores_are_symmetric_before_positions(monkeypatch):
    """The q and k that reach the scores (recorded at math_attention's call) are one tensor: q k^T is symmetric."""
    seen = []
    real = attention_module.math_attention
    monkeypatch.setattr(attention_module, "math_attention",
                        lambda q, k, *a, **kw: seen.append((q, k)) or real(q, k, *a, **kw))
    for tied in (True, False):
        seen.clear()
        model = build(pos_encoding="none", attn_backend="math", qk_tied=tied)
        logits(model, tokens())
        assert len(seen) == LAYERS, "math_attention must run once per layer"
        for q, k in seen:
            scores = q @ k.transpose(-2, -1)  # (B, nh, T, T)
            symmetric = torch.allclose(scores, scores.transpose(-2, -1), atol=1e-6)
            assert symmetric == tied, f"qk_tied={tied}: the scores q k^T are {'' if symmetric else 'not '}symmetric"


def test_qk_tied_has_fewer_parameters_by_the_key_projection():
    untied, tied = build(), build(qk_tied=True)
    assert num_params(untied) - num_params(tied) == LAYERS * (EMBD * EMBD + EMBD), (
        f"qk_tied must drop the key rows of c_attn (C*C weights and C biases a layer): "
        f"{num_params(untied)} -> {num_params(tied)}")
    shape = tuple(tied.transformer.h[0].attn.c_attn.weight.shape)
    assert shape == (2 * EMBD, EMBD), f"tied c_attn must be [q | v], (2C, C); got {shape}"
    assert [n for n, _ in untied.named_parameters()] == [n for n, _ in tied.named_parameters()], "GPT-2 names kept"


def test_qk_tied_with_linear_attention_runs_and_drops_the_key_rows():
    tied = build(attention="linear", qk_tied=True)
    assert num_params(build(attention="linear")) - num_params(tied) == LAYERS * (EMBD * EMBD + EMBD)
    assert torch.isfinite(logits(tied, tokens())).all(), "linear attention with qk_tied gave non-finite logits"


# ------------------------------------------------------------------------- attend_self (Reformer's shared-QK rule)


def alone_rows(window: int | None) -> torch.Tensor:
    """(BLOCK,) bool: the rows whose only visible key is their own (position 0; every row with a window of 1)."""
    alone = torch.zeros(BLOCK, dtype=torch.bool)
    alone[0 if window != 1 else slice(None)] = True
    return alone


@pytest.mark.parametrize("overrides", [{}, dict(qk_tied=True), dict(n_kv_head=1), dict(window=3), dict(window=1),
                                       dict(pos_encoding="alibi", attn_scale="none")])
def test_without_attend_self_a_query_sees_its_own_key_only_when_it_has_no_other(overrides):
    model = build(attend_self=False, **overrides)
    idx = tokens(BLOCK)
    with torch.no_grad():
        weights = model(idx, return_attention=True).attentions
    alone = alone_rows(overrides.get("window"))
    for layer, w in enumerate(weights):
        diag = w[0].diagonal(dim1=-2, dim2=-1)  # (nh, T)
        assert (diag[:, ~alone] == 0).all(), f"{overrides} layer {layer}: a query saw its own key: {diag}"
        close(diag[:, alone], torch.ones_like(diag[:, alone]),
              f"{overrides} layer {layer}: a row whose only key is its own must keep it (weight 1)")
        close(w[0].sum(-1), torch.ones(HEADS, BLOCK), f"{overrides} layer {layer}: rows must sum to 1", atol=1e-6)
        assert (w[0].triu(1) == 0).all(), f"{overrides} layer {layer}: a future key has weight"
    with torch.no_grad():
        seen = twin(model, attend_self=True)(idx, return_attention=True).attentions[0][0]
    assert (seen.diagonal(dim1=-2, dim2=-1) > 0).all(), "with attend_self the diagonal carries weight"


@pytest.mark.parametrize("overrides", [dict(attend_self=False, window=3), dict(attend_self=False, window=1),
                                       dict(attend_self=False, window=3, n_kv_head=1, attn_sinks=True),
                                       dict(attention="uniform", window=3),
                                       dict(attention="uniform", attend_self=False, window=5)])
def test_windowed_sdpa_and_the_ring_buffer_equal_the_math_path(overrides):
    """BLOCK > W: the sdpa model runs local_attention's blocks, and decoding the ring buffer's out-of-order keys."""
    math_model = build(pos_encoding="rope", attn_backend="math", **overrides)
    sdpa_model = twin(math_model, attn_backend="sdpa")
    idx = tokens(BLOCK)
    want = logits(math_model, idx)
    close(logits(sdpa_model, idx), want, f"{overrides}: sdpa (local_attention) logits != math logits")
    for model, name in ((sdpa_model, "sdpa"), (math_model, "math")):
        cache = model.new_kv_cache()
        with torch.no_grad():
            steps = [model(idx[:, :5], kv_cache=cache).logits]
            steps += [model(idx[:, i : i + 1], kv_cache=cache).logits for i in range(5, BLOCK)]
        close(torch.cat(steps, dim=1), want, f"{overrides}: {name} cached decoding != the full forward")


def test_without_attend_self_the_hooked_pattern_has_an_empty_diagonal():
    """The explicit path that hooks force (a read of the scores) takes the rule too; an edit sees -inf there."""
    from model import run_with_cache

    model = build(attend_self=False)
    _, cache = run_with_cache(model, tokens())
    for layer in range(LAYERS):
        pattern, scores = cache["pattern", layer][0], cache["scores", layer][0]  # (nh, T, T)
        assert (pattern.diagonal(dim1=-2, dim2=-1)[:, 1:] == 0).all(), f"layer {layer}: hooked pattern sees self"
        assert torch.isinf(scores.diagonal(dim1=-2, dim2=-1)[:, 1:]).all(), f"layer {layer}: self score not -inf"


# ----------------------------------------------------------------------------------- qk_init (unit-variance q, k)


def qkv_variance(model: GPT, n: int = 4096) -> torch.Tensor:
    """Per-channel variance of c_attn's output on block 0's ln_1 of standard-normal input: (3C,) or (2C,)."""
    attn, ln = model.transformer.h[0].attn, model.transformer.h[0].ln_1
    x = torch.randn(n, model.config.n_embd, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return attn.c_attn(ln(x)).var(0)


@pytest.mark.parametrize("tied", [False, True])
def test_qk_init_unit_starts_q_and_k_at_unit_variance_and_leaves_the_rest(tied):
    c = 128  # the claims' width: with N(0, 0.02) the variance is 0.0004 * 128 = 0.05
    sizes = dict(n_embd=c, n_head=4, n_layer=1, qk_tied=tied)
    torch.manual_seed(0)
    normal = GPT(config(**sizes)).eval()
    torch.manual_seed(0)
    unit = GPT(config(qk_init="unit", **sizes)).eval()
    qk = c if tied else 2 * c  # [q | v] tied, [q | k | v] untied
    var_unit, var_normal = qkv_variance(unit), qkv_variance(normal)
    assert 0.85 < var_unit[:qk].mean() < 1.15, f"qk_init=unit: q/k channel variance {var_unit[:qk].mean():.3f}, want ~1"
    # each channel's variance is sum_c w_c^2 ~ chi2(C) / C: sd sqrt(2 / C) = 0.125, so 256 channels span ~0.6-1.4
    assert 0.5 < var_unit[:qk].min() and var_unit[:qk].max() < 1.6, "qk_init=unit: every q/k channel near 1"
    want = 0.0004 * c
    for name, var in (("normal", var_normal[:qk]), ("unit's v", var_unit[qk:]), ("normal's v", var_normal[qk:])):
        assert 0.85 * want < var.mean() < 1.15 * want, f"{name}: channel variance {var.mean():.4f}, want ~{want}"
    a, b = dict(normal.named_parameters()), dict(unit.named_parameters())
    for name in a:
        if name.endswith("c_attn.weight"):
            assert torch.equal(a[name][qk:], b[name][qk:]), f"qk_init=unit changed the v rows of {name}"
        else:
            assert torch.equal(a[name], b[name]), f"qk_init=unit changed {name}"


def test_qk_init_unit_reaches_linear_attention_q_and_k_rows():
    model = GPT(config(attention="linear", qk_init="unit", n_embd=64, n_head=2, n_layer=1))
    w = model.transformer.h[0].attn.c_attn.weight
    assert 0.8 < w[: 2 * 64].std().item() * math.sqrt(64) < 1.2, "linear attention's q/k rows must be N(0, 1/C)"
    assert abs(w[2 * 64 :].std().item() - 0.02) < 0.004, "linear attention's v rows keep GPT-2's 0.02"


def test_qk_init_unit_with_grouped_query_heads_draws_q_and_k_rows_only():
    """4 query heads, 2 key/value heads of 32: c_attn's rows are [q: 128 | k: 64 | v: 64]; unit init reaches the
    first 192 rows and leaves the 64 value rows at GPT-2's 0.02."""
    torch.manual_seed(0)
    w = GPT(config(n_embd=128, n_head=4, n_kv_head=2, n_layer=1, qk_init="unit")).transformer.h[0].attn.c_attn.weight
    assert w.shape[0] == 256
    assert 0.9 < w[:192].std().item() * math.sqrt(128) < 1.1, "q and k rows: N(0, 1/C)"
    assert abs(w[192:].std().item() - 0.02) < 0.002, "the value rows keep 0.02"


# ----------------------------------------------------------------------------- attention="uniform" (the control)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("overrides, denominator", [
    ({}, lambda i: i + 1),
    (dict(window=3), lambda i: min(i + 1, 3)),
    (dict(attend_self=False), lambda i: max(i, 1)),
    (dict(n_kv_head=1, pos_encoding="rope", qk_norm=True), lambda i: i + 1),
])
def test_uniform_weights_are_one_over_the_keys_a_query_sees(backend, overrides, denominator):
    model = build(attention="uniform", attn_backend=backend, **overrides)
    idx = tokens(BLOCK)
    with torch.no_grad():
        weights = model(idx, return_attention=True).attentions
    for layer, w in enumerate(weights):
        for i in range(BLOCK):
            row = w[0, :, i]  # (nh, T)
            seen = row > 0
            close(row[seen], torch.full_like(row[seen], 1.0 / denominator(i)),
                  f"{overrides} layer {layer} row {i}: weights != 1/{denominator(i)}")
            assert int(seen.sum()) == HEADS * denominator(i), f"{overrides} row {i}: {int(seen.sum())} keys seen"
            assert not seen[:, i + 1 :].any(), f"{overrides} row {i}: a future key has weight"


def test_uniform_attention_averages_the_values_of_the_prefix():
    """Layer 0's output at i is c_proj(mean_{j<=i} v_j): the block averages the values."""
    model = build(attention="uniform", pos_encoding="none")
    attn = model.transformer.h[0].attn
    x = torch.randn(1, T, EMBD, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        y, _, v = attn(x, model.transformer.wpe, None, torch.arange(T))
        mean = v.cumsum(2) / torch.arange(1, T + 1).view(1, 1, T, 1)  # (B, nh, T, hs)
        want = attn.c_proj(mean.transpose(1, 2).reshape(1, T, EMBD))
    close(y, want, "uniform attention != c_proj of the prefix mean of the values")


def test_uniform_attention_gives_q_and_k_no_gradient_and_v_one():
    model = build(attention="uniform").train()
    softmax = build(attention="softmax")
    assert num_params(model) == num_params(softmax), "uniform keeps the q/k rows: the parameter count is softmax's"
    idx = tokens(BLOCK)
    model(idx, targets=torch.roll(idx, -1, 1)).loss.backward()
    for layer, block in enumerate(model.transformer.h):
        grad = block.attn.c_attn.weight.grad  # rows [q | k | v], C each
        assert grad is not None, f"layer {layer}: c_attn got no gradient at all"
        assert (grad[: 2 * EMBD] == 0).all(), f"layer {layer}: the q/k rows got a gradient under uniform attention"
        assert grad[2 * EMBD :].abs().sum() > 0, f"layer {layer}: the v rows got no gradient"
        assert (block.attn.c_attn.bias.grad[: 2 * EMBD] == 0).all(), f"layer {layer}: the q/k biases got a gradient"


def test_uniform_attention_ignores_the_q_and_k_weights():
    model = build(attention="uniform")
    idx = tokens()
    before = logits(model, idx)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[: 2 * EMBD].normal_(0, 1.0)
    close(logits(model, idx), before, "uniform attention's logits moved when q/k weights changed", atol=0, rtol=0)
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight[2 * EMBD :].mul_(2.0)
    assert (logits(model, idx) - before).abs().max() > 1e-4, "the v rows must matter"


def test_learner_attention_refuses_the_new_switches():
    from attention_lab.exercises.learner import refuse_unsupported

    for overrides, words in ((dict(attend_self=False), "attend_self=false"), (dict(attention="uniform"), "softmax")):
        with pytest.raises(ValueError, match=words):
            refuse_unsupported(config(**overrides))


# ------------------------------------------------------------------------------------------------ generation


@pytest.mark.parametrize("mask", ["after_softmax", "none"])
def test_generation_sees_the_prefix_and_runs_past_block_size(mask):
    """Each generated token is the argmax at the end of the context the model has (the last block_size tokens),
    with use_cache as given or not; the context slides past block_size."""
    model = build(causal_mask=mask)
    prompt, new = tokens(4), BLOCK + 4
    got = generate(model, prompt, new, greedy=True)
    nocache = generate(model, prompt, new, greedy=True, use_cache=False)
    want = prompt
    for _ in range(new):
        nxt = logits(model, want[:, -BLOCK:])[:, -1].argmax(-1, keepdim=True)
        want = torch.cat([want, nxt], dim=1)
    assert torch.equal(got, want), f"causal_mask={mask}: generate() != the argmax of model(prefix) at each step"
    assert torch.equal(nocache, want), f"causal_mask={mask}: generate(use_cache=False) differs"


# -------------------------------------------------------------------------------- the tools around the model


def test_step_inside_follows_the_scale_and_tied_keys_and_refuses_the_masks():
    model = build(pos_encoding="rope", attn_scale="inverse", qk_tied=True)
    idx = tokens()
    inside = step_inside(model, idx[0], layer=1, head=1, query=T - 1)
    np.testing.assert_allclose(inside.k_proj[-1], inside.q_proj, rtol=0, atol=0,
                               err_msg="qk_tied: the query's own key straight from c_attn must be its query")
    np.testing.assert_allclose(inside.scaled, inside.dots / HS, rtol=1e-12, err_msg="attn_scale=inverse: dots / hs")
    with torch.no_grad():
        model_weights = model(idx, return_attention=True).attentions[1][0, 1, T - 1]
    np.testing.assert_allclose(inside.weights, model_weights.double().numpy(), atol=1e-6,
                               err_msg="step inside's weights != the model's own")
    for mask in ("after_softmax", "none"):
        with pytest.raises(ValueError, match=f"causal_mask='{mask}'"):
            step_inside(build(causal_mask=mask), idx[0], layer=0, head=0, query=2)


@pytest.mark.parametrize("overrides", [dict(attend_self=False, qk_tied=True, pos_encoding="rope"),
                                       dict(attend_self=False, window=3), dict(attend_self=False, window=1),
                                       dict(attention="uniform", pos_encoding="rope")])
def test_step_inside_follows_attend_self_and_uniform_attention(overrides):
    model = build(**overrides)
    idx = tokens(BLOCK)
    with torch.no_grad():
        model_weights = model(idx, return_attention=True).attentions[1][0]  # (nh, T, T)
    for query in (0, 1, 5, BLOCK - 1):
        inside = step_inside(model, idx[0], layer=1, head=1, query=query)
        np.testing.assert_allclose(inside.weights, model_weights[1, query].double().numpy(), atol=1e-6,
                                   err_msg=f"{overrides} query {query}: step inside's weights != the model's own")
        if overrides.get("attention") == "uniform":
            assert not inside.q.any() and not inside.q_proj.any(), "uniform: step inside must show q = 0"
            np.testing.assert_allclose(inside.weights[: query + 1], 1.0 / (query + 1), rtol=1e-12)
        elif query > 0 and overrides.get("window") != 1:
            assert inside.weights[query] == 0 and np.isneginf(inside.masked[query]), f"query {query} saw itself"
        else:
            assert inside.weights[query] == 1, f"{overrides} query {query}: its only key must keep weight 1"
    if not overrides.get("attend_self", True):
        assert "attend_self=false" in steppable(model.config), "the page's panel must leave attend_self=False out"


ISLAND = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.S)


@pytest.mark.parametrize("overrides, panel", [({}, True), (dict(attn_scale="none", qk_tied=True), True),
                                              (dict(causal_mask="after_softmax"), False),
                                              (dict(attend_self=False), False), (dict(attention="uniform"), True)])
def test_the_page_offers_step_inside_only_where_it_is_right(tmp_path, overrides, panel):
    text = "to be or not to be, that is the question. " * 2
    tok = Tokenizer.train_char([[text]])
    torch.manual_seed(0)
    model = GPT(config(vocab_size=tok.vocab_size, **overrides)).eval()
    dump_attention(model, tok, tok.encode(text)[:BLOCK], tmp_path)
    data = json.loads(ISLAND.search((tmp_path / "attention.html").read_text(encoding="utf-8")).group(1))
    assert ("inside" in data) == panel, f"{overrides}: the step-inside panel {'missing' if panel else 'offered'}"
    if panel:
        assert data["inside"]["scale"] == model.config.score_scale, "the panel must scale by the model's scale"


@pytest.mark.parametrize("field, value", [("attn_scale", "none"), ("causal_mask", "after_softmax"),
                                          ("qk_tied", True), ("attend_self", False), ("attention", "uniform")])
def test_export_refuses_a_switch_naming_it(tmp_path, field, value):
    assert field in FIELD_ROLES, f"{field} must be listed in FIELD_ROLES"
    cfg = config(**{field: value})
    with pytest.raises(ValueError, match=f"cannot export: .*{field}={value!r}"):
        plan_export(cfg)
    with pytest.raises(ValueError, match=field):
        export_pretrained(GPT(cfg), tmp_path / "out")
    assert not (tmp_path / "out").exists(), "a refused export must write nothing"


def test_qk_init_exports_it_is_initialisation_only():
    """qk_init changes where training starts, not the function the weights compute: GPT-2 runs it."""
    assert plan_export(config(qk_init="unit")).target == "gpt2", "a qk_init=unit model must export as GPT-2"
    assert plan_export(config(qk_init="unit", qk_norm=True)).target == "remote", "and through the remote code"


# ------------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("switch", [["model.attn_scale=none"], ["model.causal_mask=after_softmax"],
                                    ["model.causal_mask=none", "model.attn_scale=inverse"], ["model.qk_tied=true"],
                                    ["model.attend_self=false", "model.qk_tied=true", "model.qk_init=unit"],
                                    ["model.attention=uniform", "model.attend_self=false"]])
def test_a_debug_run_with_each_switch_trains_saves_and_resumes(switch, tmp_path, data_cache):
    run = tmp_path / "run"
    common = ["experiment=debug", f"data.cache_dir={data_cache}", "train.eval_interval=2", "train.sample_tokens=4",
              "train.probe_batch=2", *switch]
    first = train_mod.train(compose([*common, "train.max_steps=2"]), run)
    final = train_mod.train(compose([*common, "train.max_steps=3"]), run)  # resumes from step 2
    assert first["step"] == 2 and final["step"] == 3 and math.isfinite(final["val_loss"]), (first, final)
    ckpt = load_checkpoint(run, "latest")
    assert ckpt.step == 3, f"latest checkpoint at step {ckpt.step}, expected 3"
    cfg = ckpt.config
    for override in switch:
        name, value = override.removeprefix("model.").split("=")
        assert str(getattr(cfg, name)).lower() == value, f"the checkpoint lost {override}: {cfg}"
    assert torch.isfinite(logits(ckpt.build_model("cpu"), tokens(4) % cfg.vocab_size)).all()
