"""Invariants of the GPT that hold for any weights: shapes, loss, causality, masking, backend parity, config
validation, initialisation statistics, tying, parameter and FLOP counts.

Tolerances: both attention backends and the capture path compute the same float32 function with different
kernels (different summation orders); measured here they differ by ~1e-7 in logits and gradients (gradients
reach ~0.4). assert_close uses atol=1e-5, rtol=1e-4 for logits and atol=1e-6, rtol=1e-4 for gradients: headroom
for other CPUs and BLAS builds, while a real bug (a missing scale, a leaked future key, a wrong mask alignment)
moves them by orders of magnitude more.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from model import ATTENTION_BACKENDS, GPT, POSITION_ENCODINGS, GPTConfig, flops_per_token, num_params

V, BLOCK, LAYERS, HEADS, EMBD = 64, 16, 2, 4, 32


def tiny(**overrides) -> GPTConfig:
    return GPTConfig(
        **{"vocab_size": V, "block_size": BLOCK, "n_layer": LAYERS, "n_head": HEADS, "n_embd": EMBD, **overrides}
    )


def build(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny(**overrides)).eval()


def tokens(b: int = 2, t: int = BLOCK, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------- shapes, loss


@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_output_shapes(pos_encoding):
    model = build(pos_encoding=pos_encoding)
    idx = tokens(3, 10)
    out = model(idx, targets=idx, return_attention=True)
    assert out.logits.shape == (3, 10, V), f"logits shape {tuple(out.logits.shape)}, expected (B, T, V)"
    assert out.loss is not None and out.loss.shape == (), f"loss should be a scalar, got {out.loss!r}"
    assert len(out.attentions) == LAYERS, f"expected one attention tensor per layer, got {len(out.attentions)}"
    for i, a in enumerate(out.attentions):
        assert a.shape == (3, HEADS, 10, 10), f"layer {i} attention shape {tuple(a.shape)}, expected (B, nh, T, T)"

    plain = model(idx)
    assert plain.loss is None and plain.attentions is None, "no targets / no capture should give loss=attentions=None"

    # after 6 cached tokens, 3 new queries see S = 9 keys
    cache = model.new_kv_cache()
    model(idx[:, :6], kv_cache=cache)
    out = model(idx[:, 6:9], kv_cache=cache, return_attention=True)
    assert out.logits.shape == (3, 3, V)
    assert out.attentions[0].shape == (3, HEADS, 3, 9), f"cached attention shape {tuple(out.attentions[0].shape)}"


def test_loss_is_mean_next_token_cross_entropy():
    model = build()
    idx = tokens(2, 12)
    targets = tokens(2, 12, seed=2)
    targets[0, :3] = -1  # ignored positions
    out = model(idx, targets)
    logp = torch.log_softmax(out.logits.double(), dim=-1)  # (B, T, V)
    keep = targets != -1
    manual = -logp[keep].gather(-1, targets[keep][:, None]).mean()
    torch.testing.assert_close(
        out.loss.double(), manual, atol=1e-6, rtol=1e-6, msg=lambda m: f"loss != mean CE over non-ignored targets\n{m}"
    )


# ------------------------------------------------------------------------------------------- causality, masking


@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_causality_future_tokens_do_not_change_past_logits(pos_encoding, backend):
    model = build(pos_encoding=pos_encoding, attn_backend=backend)
    idx = tokens(2, BLOCK)
    base = model(idx).logits
    for t in (0, 7, BLOCK - 2):
        changed = idx.clone()
        changed[:, t + 1 :] = (idx[:, t + 1 :] + 1 + torch.arange(BLOCK - t - 1)) % V  # every later token differs
        out = model(changed).logits
        torch.testing.assert_close(
            out[:, : t + 1],
            base[:, : t + 1],
            atol=1e-6,
            rtol=0,
            msg=lambda m: f"{pos_encoding}/{backend}: changing tokens after position {t} changed logits at <= {t}\n{m}",
        )
        # the test could not fail if the later positions ignored their input
        assert (out[:, t + 1 :] - base[:, t + 1 :]).abs().max() > 1e-4, "later logits should change with later tokens"


@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_masked_attention_weights_are_zero_and_rows_sum_to_one(pos_encoding):
    model = build(pos_encoding=pos_encoding)
    idx = tokens(2, BLOCK)
    visible = torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril()
    for i, w in enumerate(model(idx, return_attention=True).attentions):
        assert torch.equal(w[..., ~visible], torch.zeros_like(w[..., ~visible])), (
            f"{pos_encoding}: layer {i} gives non-zero weight to future keys"
        )
        assert (w[..., visible] > 0).all(), f"{pos_encoding}: layer {i} has a zero weight on a visible key"
        torch.testing.assert_close(
            w.sum(-1),
            torch.ones(2, HEADS, BLOCK),
            atol=1e-6,
            rtol=0,
            msg=lambda m: f"{pos_encoding}: layer {i} attention rows do not sum to 1\n{m}",
        )

    # with a cache the T queries are the last T of S positions: the mask is aligned bottom-right
    cache = model.new_kv_cache()
    model(idx[:, :5], kv_cache=cache)
    w = model(idx[:, 5:9], kv_cache=cache, return_attention=True).attentions[0]  # (B, nh, 4, 9)
    visible = torch.ones(4, 9, dtype=torch.bool).tril(diagonal=5)
    assert torch.equal(w[..., ~visible], torch.zeros_like(w[..., ~visible])), "cached queries see future keys"
    assert (w[..., visible] > 0).all(), "cached queries lost a visible key (mask aligned top-left?)"


# ------------------------------------------------------------------------------------------------- backend parity


@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_math_and_sdpa_backends_agree_forward_and_backward(pos_encoding):
    math_model = build(pos_encoding=pos_encoding, attn_backend="math").train()  # dropout=0: train mode is exact
    sdpa_model = build(pos_encoding=pos_encoding, attn_backend="sdpa").train()
    sdpa_model.load_state_dict(math_model.state_dict())
    idx, targets = tokens(2, BLOCK), tokens(2, BLOCK, seed=2)

    out_m, out_s = math_model(idx, targets), sdpa_model(idx, targets)
    torch.testing.assert_close(
        out_s.logits, out_m.logits, atol=1e-5, rtol=1e-4, msg=lambda m: f"{pos_encoding}: sdpa logits != math\n{m}"
    )
    out_m.loss.backward()
    out_s.loss.backward()
    grads_m = dict(math_model.named_parameters())
    for name, p in sdpa_model.named_parameters():
        torch.testing.assert_close(
            p.grad,
            grads_m[name].grad,
            atol=1e-6,
            rtol=1e-4,
            msg=lambda m: f"{pos_encoding}: sdpa gradient of {name} != math\n{m}",
        )



@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
def test_dropout_drops_while_training_and_never_in_eval(backend):
    """model.dropout>0 (attention weights, residual and MLP outputs, embeddings) is random in training only: in
    eval two passes give the same logits as the same weights at dropout 0, so validation loss, sampling and the
    ideas are not random. Planted bug: attn_dropout_in_eval."""
    idx = tokens()
    plain = build(attn_backend=backend)
    dropped = build(dropout=0.5, attn_backend=backend)
    dropped.load_state_dict(plain.state_dict())
    with torch.no_grad():
        want = plain(idx).logits
        for seed in (1, 2):
            torch.manual_seed(seed)
            torch.testing.assert_close(dropped(idx).logits, want, atol=0, rtol=0,
                                       msg=lambda m: f"{backend}, eval: dropout=0.5 changed the logits\n{m}")
        dropped.train()
        torch.manual_seed(1)
        assert not torch.equal(dropped(idx).logits, want), "a control: in training dropout=0.5 must change the logits"

@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
def test_the_tutorials_reference_equals_the_models_attention(backend):
    """model/attention.py's first function, reference_attention (the formula a learner reads first), computes what
    CausalSelfAttention computes for one layer without positions or QK-norm, on both backends: so the text on the
    file's first screen is the model's own arithmetic, not a second story."""
    from model.attention import reference_attention

    model = build(pos_encoding="none", attn_backend=backend)
    attn = model.transformer.h[0].attn
    x = torch.randn(2, BLOCK, EMBD, generator=torch.Generator().manual_seed(3))
    pos = torch.arange(BLOCK)
    y_model, _, _ = attn(x, model.transformer.wpe, None, pos)
    y_ref = reference_attention(x, attn.c_attn.weight, attn.c_proj.weight, HEADS, attn.c_attn.bias, attn.c_proj.bias)
    torch.testing.assert_close(y_ref, y_model, atol=1e-5, rtol=1e-4,
                               msg=lambda m: f"{backend}: reference_attention != CausalSelfAttention\n{m}")


@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_math_and_sdpa_agree_with_a_kv_cache(pos_encoding):
    """The fused path has three mask cases with a cache: empty cache (is_causal), T=1, and T>1 after a cache."""
    math_model = build(pos_encoding=pos_encoding, attn_backend="math")
    sdpa_model = build(pos_encoding=pos_encoding, attn_backend="sdpa")
    idx = tokens(2, 10)
    caches = {"math": math_model.new_kv_cache(), "sdpa": sdpa_model.new_kv_cache()}
    for start, end in ((0, 4), (4, 5), (5, 10)):
        out_m = math_model(idx[:, start:end], kv_cache=caches["math"]).logits
        out_s = sdpa_model(idx[:, start:end], kv_cache=caches["sdpa"]).logits
        torch.testing.assert_close(
            out_s, out_m, atol=1e-5, rtol=1e-4, msg=lambda m: f"{pos_encoding}: tokens {start}:{end} with cache\n{m}"
        )


@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_attention_capture_gives_the_fused_logits(pos_encoding):
    model = build(pos_encoding=pos_encoding, attn_backend="sdpa")
    idx = tokens(2, BLOCK)
    torch.testing.assert_close(
        model(idx, return_attention=True).logits,
        model(idx).logits,
        atol=1e-5,
        rtol=1e-4,
        msg=lambda m: f"{pos_encoding}: return_attention=True changed the logits\n{m}",
    )


# ---------------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "overrides, names",
    [
        ({"n_embd": 30, "n_head": 4}, ["n_embd", "n_head", "divisible"]),
        ({"vocab_size": -1}, ["vocab_size"]),
        ({"block_size": 0}, ["block_size"]),
        ({"n_layer": -2}, ["n_layer"]),
        ({"n_head": 0}, ["n_head"]),
        ({"n_embd": -32}, ["n_embd"]),
        ({"mlp_ratio": 0}, ["mlp_ratio"]),
        ({"n_layer": 2.0}, ["n_layer"]),
        ({"dropout": 1.0}, ["dropout"]),
        ({"pos_encoding": "xpos"}, ["pos_encoding", "'xpos'", "learned", "sinusoidal", "rope", "alibi", "none"]),
        ({"attn_backend": "flash"}, ["attn_backend", "'flash'", "math", "sdpa"]),
        ({"pos_encoding": "rope", "n_embd": 12, "n_head": 4}, ["pos_encoding", "rope", "head size", "even"]),
        ({"rope_base": 0.0}, ["rope_base"]),
        ({"layer_norm_eps": -1e-5}, ["layer_norm_eps"]),
    ],
)
def test_invalid_config_raises_value_error_naming_the_field(overrides, names):
    with pytest.raises(ValueError) as excinfo:
        tiny(**overrides)
    message = str(excinfo.value)
    for name in names:
        assert name in message, f"ValueError for {overrides} should mention {name!r}; message was: {message}"


def test_unknown_config_field_is_rejected():
    with pytest.raises(ValueError, match=re.escape("n_embedding")):
        GPTConfig.from_dict({**tiny().to_dict(), "n_embedding": 32})
    assert GPTConfig.from_dict(tiny().to_dict()) == tiny(), "to_dict/from_dict should round-trip"


# ----------------------------------------------------------------------------------------------------------- init


def _assert_normal(name: str, values: torch.Tensor, std: float) -> None:
    """values ~ N(0, std): the sample std and mean lie within 5 standard errors (SE of a std ~ std / sqrt(2n))."""
    n = values.numel()
    got_std, got_mean = values.std().item(), values.mean().item()
    std_tol, mean_tol = 5 * std / math.sqrt(2 * n), 5 * std / math.sqrt(n)
    assert abs(got_std - std) < std_tol, f"{name}: std {got_std:.5f}, expected {std:.5f} +- {std_tol:.5f} (n={n})"
    assert abs(got_mean) < mean_tol, f"{name}: mean {got_mean:.6f}, expected 0 +- {mean_tol:.6f} (n={n})"


def test_gpt2_initialisation_statistics():
    n_layer = 4
    model = build(n_layer=n_layer, n_embd=64, tie_embeddings=False)
    params = dict(model.named_parameters())
    residual = [p for n, p in params.items() if n.endswith("c_proj.weight")]
    other_linear = [p for n, p in params.items() if n.endswith(("c_attn.weight", "c_fc.weight", "lm_head.weight"))]
    assert len(residual) == 2 * n_layer and len(other_linear) == 2 * n_layer + 1

    _assert_normal("residual c_proj weights", torch.cat([p.flatten() for p in residual]), 0.02 / math.sqrt(2 * n_layer))
    _assert_normal("c_attn/c_fc/lm_head weights", torch.cat([p.flatten() for p in other_linear]), 0.02)
    _assert_normal("wte", params["transformer.wte.weight"].flatten(), 0.02)
    _assert_normal("wpe", params["transformer.wpe.weight"].flatten(), 0.02)
    for name, p in params.items():
        if name.endswith(".bias"):
            assert torch.equal(p, torch.zeros_like(p)), f"{name} should start at 0"
        if ".ln_" in name and name.endswith(".weight"):
            assert torch.equal(p, torch.ones_like(p)), f"{name} (LayerNorm gain) should start at 1"


def test_tied_embeddings_share_storage():
    model = build(tie_embeddings=True)
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    assert head is wte and head.data_ptr() == wte.data_ptr(), "tied lm_head must be the embedding tensor itself"
    with torch.no_grad():
        wte[3, 5] = 7.0
    assert head[3, 5].item() == 7.0, "writing the embedding should change the head"
    assert sum(p is wte for p in model.parameters()) == 1, "parameters() should yield the tied matrix once"

    untied = build(tie_embeddings=False)
    assert untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()


# ------------------------------------------------------------------------------------------------ params, FLOPs

# hand count for V=64, block=16, L=2, C=32, mlp_ratio=4, biases on:
#   wte 64*32 = 2048, wpe 16*32 = 512, ln_f 2*32 = 64
#   per block: ln_1 64 + c_attn (32*96 + 96 = 3168) + attn c_proj (32*32 + 32 = 1056)
#              + ln_2 64 + c_fc (32*128 + 128 = 4224) + mlp c_proj (128*32 + 32 = 4128) = 12704
#   tied total = 2048 + 512 + 2*12704 + 64 = 28032; an untied head adds 64*32 = 2048
HAND_TOTAL = 28032


@pytest.mark.parametrize(
    "overrides, total, non_embedding",
    [
        ({}, HAND_TOTAL, HAND_TOTAL - 512),  # non-embedding drops wpe, keeps wte (it is also the head)
        ({"tie_embeddings": False}, HAND_TOTAL + 2048, HAND_TOTAL + 2048 - 512),
        ({"pos_encoding": "rope"}, HAND_TOTAL - 512, HAND_TOTAL - 512),  # no position parameters at all
        ({"pos_encoding": "sinusoidal"}, HAND_TOTAL - 512, HAND_TOTAL - 512),  # the table is a buffer
    ],
)
def test_num_params_matches_hand_count(overrides, total, non_embedding):
    model = build(**overrides)
    assert num_params(model, non_embedding=False) == total, f"{overrides}: total {num_params(model, False)} != {total}"
    assert num_params(model) == non_embedding, f"{overrides}: non-embedding {num_params(model)} != {non_embedding}"


def test_flops_per_token_matches_hand_count():
    cfg, n = tiny(), HAND_TOTAL - 512
    # training: 6N + 12 * L * C * T = 6*27520 + 12*2*32*16 = 165120 + 12288
    assert flops_per_token(cfg, n) == 177408
    # forward only: 2N + 4 * L * C * T = 55040 + 4096
    assert flops_per_token(cfg, n, training=False) == 59136
    # a shorter context: 165120 + 12*2*32*8
    assert flops_per_token(cfg, n, seq_len=8) == 171264
