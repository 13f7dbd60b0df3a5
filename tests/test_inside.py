"""attention_lab.interp.inside (one head written out step by step) and attention_lab.interp.lens (the logit lens),
each against the model's own forward pass, for every positional encoding and every model option.

What the model computes is read with hooks on an independent forward pass: the block's input (a forward
pre-hook on the block), c_attn's output (q, k, v before any norm or rotation), c_proj's input (every head's
output side by side), the attention module's output y, and the weights `return_attention` hands back.
Tolerances: the recomputation runs in float64, the model in float32 (rounding ~1e-7): weights within 1e-6 as
asked, vectors within 1e-5 (atol; rtol 1e-4), while a missing norm, rotation, bias or mix moves them by far more.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention_lab.interp.inside import step_inside
from attention_lab.interp.lens import logit_lens
from model import GPT, POSITION_ENCODINGS, GPTConfig

V, BLOCK, LAYERS, HEADS, EMBD = 64, 16, 3, 4, 32
HS = EMBD // HEADS
T = 12  # shorter than BLOCK: the model sees no more tokens than given

# every option of GPTConfig away from its default, one at a time, then all together
OPTIONS = {
    "default": {},
    "no_bias": dict(bias=False),
    "qk_norm": dict(qk_norm=True),
    "value_residual": dict(value_residual=True),
    "zero_init_proj": dict(zero_init_proj=True),
    "relu2": dict(mlp_act="relu2"),
    "softcap": dict(logit_softcap=2.0),
    "untied": dict(tie_embeddings=False),
}
OPTIONS["all"] = {k: v for opts in OPTIONS.values() for k, v in opts.items()}
# the attention variants (model/attention.py, model/linear_attention.py); linear attention takes no RoPE or ALiBi
VARIANTS = {
    "grouped_query": dict(n_kv_head=2),
    "multi_query": dict(n_kv_head=1, qk_norm=True),
    "window": dict(window=4, window_pattern="LG"),
    "sinks": dict(attn_sinks=True, n_kv_head=2),
    "linear": dict(attention="linear"),
    "linear_raw": dict(attention="linear", linear_denominator=False, linear_out_norm=True, value_residual=True),
}
OPTIONS.update(VARIANTS)
# (layer, head, query): the first block (no value mix), query 0 (one key), the last query, heads at both ends
POINTS = [(0, 0, 0), (0, 3, T - 1), (1, 2, 5), (2, 1, 0), (2, 3, T - 1)]


def build(pos: str, seed: int = 0, **options) -> GPT:
    """A tiny seeded model, every parameter moved away from its init: zero projections, unit LayerNorm gains
    and 0.5 value mixes would hide the steps they gate."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=V, block_size=BLOCK, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD, pos_encoding=pos,
                    attn_backend="sdpa", **options)
    model = GPT(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # q and k large enough that attention is far from uniform; the rest modest, so the stream stays O(1)
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if name.endswith("c_attn.weight") else 0.1))
    return model


def tokens(t: int = T, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, V, (t,), generator=torch.Generator().manual_seed(seed))


def close(actual, expected, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=rtol,
                               msg=lambda m: f"{what}\n{m}")


def model_pieces(model: GPT, idx: torch.Tensor, layer: int) -> dict:
    """What the model itself computes in block `layer` over idx (T,), read with hooks: batch row 0 of each."""
    seen = {}
    block = model.transformer.h[layer]
    hooks = [
        block.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0][0])),
        block.attn.c_attn.register_forward_hook(lambda m, args, out: seen.__setitem__("qkv", out[0])),
        block.attn.c_proj.register_forward_pre_hook(lambda m, args: seen.__setitem__("heads", args[0][0])),
        block.attn.register_forward_hook(lambda m, args, out: seen.__setitem__("y", out[0][0])),
    ]
    try:
        with torch.no_grad():
            out = model(idx[None], return_attention=True)
    finally:
        for h in hooks:
            h.remove()
    return seen | {"weights": out.attentions[layer][0]}  # (nh, T, T)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("pos", POSITION_ENCODINGS)
def test_every_step_matches_the_models_own_forward(pos, option):
    if OPTIONS[option].get("attention") == "linear" and pos in ("rope", "alibi"):
        pytest.skip("linear attention has no softmax scores to rotate or bias (GPTConfig refuses it)")
    model = build(pos, **OPTIONS[option])
    idx = tokens()
    refs = {layer: model_pieces(model, idx, layer) for layer in range(LAYERS)}
    for layer, head, i in POINTS:
        got = step_inside(model, idx, layer, head, i)
        ref = refs[layer]
        at = f"{pos}/{option} layer {layer} head {head} query {i}"
        nkv = model.config.kv_heads
        kv = head // (HEADS // nkv)
        n, hs, kvs = i + 1, slice(head * HS, (head + 1) * HS), slice(kv * HS, (kv + 1) * HS)
        assert got.x.shape == (n, EMBD) and got.k.shape == (n, HS) and got.weights.shape == (T,), at
        close(got.x, ref["x"][:n], f"block input x, {at}")
        close(got.q_proj, ref["qkv"][i, hs], f"q straight from c_attn, {at}")
        close(got.k_proj, ref["qkv"][:n, EMBD:][:, kvs], f"k straight from c_attn (kv head {kv}), {at}")
        close(got.v_own, ref["qkv"][:n, EMBD + nkv * HS :][:, kvs], f"v straight from c_attn (kv head {kv}), {at}")
        close(got.weights, ref["weights"][head, i], f"attention weights, {at}", atol=1e-6, rtol=0)
        assert np.all(got.weights[n:] == 0) and np.all(np.isneginf(got.masked[n:])), f"future keys visible, {at}"
        close(got.head_out, ref["heads"][i, hs], f"head output (c_proj's input channels of the head), {at}")
        w_proj = model.transformer.h[layer].attn.c_proj.weight.detach()  # (C, C)
        shares = [ref["heads"][i, h * HS : (h + 1) * HS] @ w_proj[:, h * HS : (h + 1) * HS].T for h in range(HEADS)]
        close(got.shares, torch.stack(shares), f"every head's share, {at}")
        close(got.attn_out, ref["y"][i], f"attention output at the query, {at}")
        close(got.attn_out, got.shares.sum(0) + got.proj_bias, f"shares + bias add up to the output, {at}")


@pytest.mark.parametrize("pos", POSITION_ENCODINGS)
def test_each_option_does_what_it_says_at_its_step(pos):
    """The steps an option owns change where it is on and are the identity where it is off."""
    idx = tokens()
    plain = step_inside(build(pos), idx, 2, 1, T - 1)
    assert np.array_equal(plain.q_normed, plain.q_proj) and np.array_equal(plain.k_normed, plain.k_proj)
    assert plain.v_first is None and plain.value_lambda is None and np.array_equal(plain.v, plain.v_own)
    close(plain.scaled, plain.dots / math.sqrt(HS), "scaled = dots / sqrt(hs)")
    if pos == "rope":  # a rotation keeps every norm and moves every position but 0
        close(np.linalg.norm(plain.k, axis=-1), np.linalg.norm(plain.k_normed, axis=-1), "RoPE keeps |k|")
        close(plain.k[0], plain.k_normed[0], "position 0 is not turned")
        assert not np.allclose(plain.q, plain.q_normed), "RoPE did not turn the query"
    else:
        assert np.array_equal(plain.q, plain.q_normed) and np.array_equal(plain.k, plain.k_normed)
    if pos == "alibi":  # head 1 of 4: slope 2^(-8/4 * 2) = 1/16, times the distance j - i
        close(plain.bias, (np.arange(T) - (T - 1)) / 16.0, "ALiBi bias of head 1")
    else:
        assert np.all(plain.bias == 0)

    normed = step_inside(build(pos, qk_norm=True), idx, 2, 1, T - 1)
    close(np.sqrt((normed.k_normed**2).mean(-1)), np.ones(T), "QK-norm gives every key RMS 1", atol=1e-6)
    mixed = step_inside(build(pos, value_residual=True), idx, 2, 1, T - 1)
    lam = mixed.value_lambda
    assert lam is not None and lam != 0.5, "value_lambda should be read from the (perturbed) weights"
    close(mixed.v, lam * mixed.v_own + (1 - lam) * mixed.v_first, "v mixes in the first block's values")
    assert step_inside(build(pos, value_residual=True), idx, 0, 1, T - 1).v_first is None, "block 0 mixes nothing"


def test_ids_are_cropped_to_the_last_block_size_and_lists_work():
    model = build("learned")
    long = tokens(BLOCK + 5).tolist()
    got = step_inside(model, long, 1, 2, -1)
    assert got.ids.tolist() == long[-BLOCK:] and got.query == BLOCK - 1 and got.weights.shape == (BLOCK,)
    ref = model_pieces(model, torch.tensor(long[-BLOCK:]), 1)
    close(got.weights, ref["weights"][2, BLOCK - 1], "weights over the cropped sequence", atol=1e-6, rtol=0)


def test_block_zero_input_is_token_plus_position_embedding():
    """An independent check of the stream's first row, written out from the embedding tables."""
    model = build("learned")
    idx = tokens()
    got = step_inside(model, idx, 0, 0, T - 1)
    expected = model.transformer.wte.weight[idx] + model.transformer.wpe.weight[:T]
    close(got.x, expected.detach(), "x entering block 0 = wte[ids] + wpe[0..T-1]")


def test_model_mode_is_restored_and_bad_arguments_raise():
    model = build("rope").train()
    step_inside(model, tokens(), 0, 0, 0)
    assert model.training, "step_inside must put the model back in training mode"
    for kwargs, match in [(dict(layer=LAYERS), "layer must be in"), (dict(head=-1), "head must be in"),
                          (dict(query=T), "query must index")]:
        args = dict(layer=0, head=0, query=0) | kwargs
        with pytest.raises(ValueError, match=match):
            step_inside(model, tokens(), **args)
    with pytest.raises(ValueError, match="one non-empty sequence"):
        step_inside(model, [], 0, 0, 0)


# ------------------------------------------------------------------------------------------------ logit lens


@pytest.mark.parametrize("option", ["default", "softcap", "all"])
@pytest.mark.parametrize("pos", POSITION_ENCODINGS)
def test_logit_lens_last_row_is_the_models_prediction(pos, option):
    model = build(pos, **OPTIONS[option])
    idx = tokens()
    lens = logit_lens(model, idx, k=5)
    assert lens.ids.shape == lens.probs.shape == (LAYERS + 1, T, 5)
    with torch.no_grad():
        probs = torch.softmax(model(idx[None]).logits[0].float(), dim=-1)  # (T, V)
    top = probs.topk(5, dim=-1)
    assert np.array_equal(lens.ids[-1], top.indices.numpy()), f"{pos}/{option}: top-5 ids differ from the model's"
    close(lens.probs[-1], top.values, f"{pos}/{option}: top-5 probabilities")
    assert np.all(np.diff(lens.probs, axis=-1) <= 0), "most probable first"


def test_logit_lens_first_row_reads_the_embeddings():
    """Row 0 written out independently: (wte[ids] + wpe) through ln_f and the unembedding, no blocks at all."""
    model = build("learned", **OPTIONS["softcap"])
    idx = tokens()
    lens = logit_lens(model, idx, k=3)
    with torch.no_grad():
        x = model.transformer.wte(idx) + model.transformer.wpe.weight[:T]
        logits = 2.0 * torch.tanh(model.lm_head(model.transformer.ln_f(x)) / 2.0)
        top = torch.softmax(logits, dim=-1).topk(3, dim=-1)
    assert np.array_equal(lens.ids[0], top.indices.numpy())
    close(lens.probs[0], top.values, "row 0 probabilities")
