"""The recipe options of GPTConfig: qk_norm, mlp_act, logit_softcap, zero_init_proj, value_residual.

Each option is checked against an independent computation of what it claims (written out here from the weights,
not by calling the code under test), and every option, alone and all together, keeps the model causal and gives
the same logits through the KV cache as in one full forward.

Tolerances as in test_model_invariants.py: float32, different kernels and summation orders differ by ~1e-7;
atol 1e-5 / rtol 1e-4 leave headroom while a missing norm, cap or mix moves the numbers by far more.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model import ATTENTION_BACKENDS, GPT, GPTConfig

V, BLOCK, LAYERS, HEADS, EMBD = 64, 16, 3, 4, 32
HS = EMBD // HEADS

# every option away from its default, one at a time, then all together
OPTIONS = {
    "qk_norm": dict(qk_norm=True),
    "relu2": dict(mlp_act="relu2"),
    "softcap": dict(logit_softcap=2.0),
    "zero_init_proj": dict(zero_init_proj=True),
    "value_residual": dict(value_residual=True),
    "untied": dict(tie_embeddings=False),
}
OPTIONS["all"] = {k: v for opts in OPTIONS.values() for k, v in opts.items()}


def tiny(**overrides) -> GPTConfig:
    return GPTConfig(
        **{"vocab_size": V, "block_size": BLOCK, "n_layer": LAYERS, "n_head": HEADS, "n_embd": EMBD, "bias": False,
           **overrides}
    )


def build(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny(**overrides)).eval()


def shake(model: GPT, seed: int = 3, std: float = 0.05) -> GPT:
    """Perturb every parameter: zero-initialised projections and 0.5 mixes would hide what they gate."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return model


def tokens(b: int = 2, t: int = BLOCK, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def close(actual, expected, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=lambda m: f"{what}\n{m}")


# ------------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("mlp_act", "swish", "mlp_act must be one of gelu, relu2"),
        ("logit_softcap", -1.0, "logit_softcap must be >= 0"),
        ("qk_norm", "yes", "qk_norm must be true or false"),
        ("zero_init_proj", 1, "zero_init_proj must be true or false"),
        ("value_residual", None, "value_residual must be true or false"),
    ],
)
def test_bad_option_values_raise_naming_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        tiny(**{field: value})


def test_defaults_are_gpt2s_behaviour():
    cfg = GPTConfig()
    assert (cfg.qk_norm, cfg.mlp_act, cfg.logit_softcap, cfg.zero_init_proj, cfg.value_residual) == (
        False, "gelu", 0.0, False, False
    ), "new options must default to the behaviour the project had before them"
    assert GPTConfig.from_dict(tiny(**OPTIONS["all"]).to_dict()) == tiny(**OPTIONS["all"]), "options must round-trip"


# ------------------------------------------------------------------------------------------------------ qk_norm


def layer0_weights_reference(model: GPT, idx: torch.Tensor, qk_norm: bool) -> torch.Tensor:
    """Layer 0's attention weights written out from wte, ln_1 and c_attn (pos_encoding none): (B, nh, T, T)."""
    block = model.transformer.h[0]
    x = block.ln_1(model.transformer.wte(idx))  # (B, T, C)
    q, k, _ = block.attn.c_attn(x).split(EMBD, dim=-1)
    q = q.view(*idx.shape, HEADS, HS).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(*idx.shape, HEADS, HS).transpose(1, 2)
    if qk_norm:
        q = q / q.pow(2).mean(-1, keepdim=True).add(torch.finfo(q.dtype).eps).sqrt()
        k = k / k.pow(2).mean(-1, keepdim=True).add(torch.finfo(k.dtype).eps).sqrt()
    scores = q @ k.transpose(-2, -1) / math.sqrt(HS)
    t = idx.size(1)
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_qk_norm_normalises_q_and_k_rows_before_the_scores(qk_norm):
    model = build(qk_norm=qk_norm, pos_encoding="none")
    with torch.no_grad():  # large q/k weights: sharp attention without the norm, so with and without differ
        model.transformer.h[0].attn.c_attn.weight.mul_(20.0)
    idx = tokens()
    got = model(idx, return_attention=True).attentions[0]
    close(got, layer0_weights_reference(model, idx, qk_norm), f"qk_norm={qk_norm}: layer-0 attention weights "
          "differ from softmax(norm(q) norm(k)^T / sqrt(hs)) written out from c_attn")
    other = layer0_weights_reference(model, idx, not qk_norm)
    assert (got - other).abs().max() > 1e-2, "the reference cannot tell qk_norm on from off; the test proves nothing"


def test_qk_norm_bounds_the_scores_whatever_the_weights():
    model = build(qk_norm=True, pos_encoding="rope")
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(1000.0)
    weights = model(tokens(), return_attention=True).attentions[0]  # (B, nh, T, T)
    # |q.k| / sqrt(hs) <= |q| |k| / sqrt(hs) = sqrt(hs) for unit-RMS rows: the last query's weights can spread
    # between two keys by at most a factor exp(2 sqrt(hs))
    last = weights[:, :, -1]  # (B, nh, T)
    ratio = last.max(-1).values / last.min(-1).values
    assert ratio.max() <= math.exp(2 * math.sqrt(HS)) * 1.001, f"scores exceed the qk_norm bound: ratio {ratio.max()}"


# ------------------------------------------------------------------------------------------------------ mlp_act


def test_relu2_is_relu_squared_inside_the_mlp():
    model = build(mlp_act="relu2")
    mlp = model.transformer.h[1].mlp
    x = torch.randn(2, 5, EMBD, generator=torch.Generator().manual_seed(0))
    expected = F.linear(F.relu(F.linear(x, mlp.c_fc.weight)) ** 2, mlp.c_proj.weight)
    close(mlp(x), expected, "mlp_act=relu2: MLP(x) != c_proj(relu(c_fc x)^2)")
    gelu = build(mlp_act="gelu").transformer.h[1].mlp
    expected = F.linear(F.gelu(F.linear(x, gelu.c_fc.weight), approximate="tanh"), gelu.c_proj.weight)
    close(gelu(x), expected, "mlp_act=gelu: MLP(x) != c_proj(gelu_tanh(c_fc x))")
    assert (mlp(x) - gelu(x)).abs().max() > 1e-4, "relu2 and gelu gave the same output"


# ------------------------------------------------------------------------------------------------------ softcap


def test_softcap_bounds_the_logits_and_the_loss_uses_the_capped_ones():
    cap = 2.0
    capped, plain = build(logit_softcap=cap), build()
    plain.load_state_dict(capped.state_dict())
    with torch.no_grad():  # raw logits of tens: far outside the cap
        for m in (capped, plain):
            m.transformer.wte.weight.mul_(50.0)
    idx = tokens()
    raw = plain(idx).logits
    assert raw.abs().max() > 3 * cap, "raw logits should exceed the cap for this test to mean anything"
    out = capped(idx, targets=idx)
    # tanh rounds to exactly 1 in float32 for inputs past ~9: the bound is inclusive
    assert out.logits.abs().max() <= cap, f"capped logits reach {out.logits.abs().max():.3f} > cap {cap}"
    close(out.logits, cap * torch.tanh(raw / cap), "logits != cap * tanh(raw logits / cap)")
    close(out.loss, F.cross_entropy(out.logits.view(-1, V), idx.view(-1)), "loss is not computed on capped logits")
    assert (out.loss - F.cross_entropy(raw.view(-1, V), idx.view(-1))).abs() > 0.1, "capping did not move the loss"


def test_softcap_logits_stay_float32_under_bf16_autocast():
    model = build(logit_softcap=5.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens(), targets=tokens())
    assert out.logits.dtype == torch.float32, f"capped logits came back as {out.logits.dtype}"
    assert out.logits.abs().max() <= 5.0 and torch.isfinite(out.loss)


# ------------------------------------------------------------------------------------------------------ zero init


def test_zero_init_proj_zeroes_every_output_projection_and_only_those():
    zero, default = build(zero_init_proj=True), build()
    n = 0
    for (name, p), (_, q) in zip(zero.named_parameters(), default.named_parameters(), strict=True):
        if name.endswith("c_proj.weight"):
            n += 1
            assert p.abs().max() == 0, f"{name} should start at zero with zero_init_proj"
            assert q.abs().max() > 0, f"{name} should not be zero by default"
        else:
            assert torch.equal(p, q), f"zero_init_proj changed the initialisation of {name}"
    assert n == 2 * LAYERS, f"expected attention and MLP c_proj in each of {LAYERS} blocks, found {n}"


def test_zero_init_blocks_start_as_the_identity():
    model = build(zero_init_proj=True, pos_encoding="learned")
    idx = tokens()
    x = model.transformer.wte(idx) + model.transformer.wpe.weight[: idx.size(1)]
    expected = model.lm_head(model.transformer.ln_f(x))
    close(model(idx).logits, expected, "with zero output projections the blocks must add nothing at init")


# ------------------------------------------------------------------------------------------------------ value residual


def test_value_residual_adds_one_mix_weight_per_block_after_the_first():
    model = build(value_residual=True)
    names = [n for n, _ in model.named_parameters() if n.endswith("value_lambda")]
    assert names == [f"transformer.h.{i}.attn.value_lambda" for i in range(1, LAYERS)], names
    assert all(p.item() == 0.5 for n, p in model.named_parameters() if n.endswith("value_lambda"))
    assert not any(n.endswith("value_lambda") for n, _ in build().named_parameters()), "off must add no parameter"


def test_value_residual_mixes_the_first_blocks_values():
    mixed, plain = build(value_residual=True, pos_encoding="none"), build(pos_encoding="none")
    shake(plain)
    mixed.load_state_dict(plain.state_dict(), strict=False)  # value_lambda stays 0.5
    idx = tokens()
    with torch.no_grad():
        for i in range(1, LAYERS):
            mixed.transformer.h[i].attn.value_lambda.fill_(1.0)  # only the block's own values: the plain model
    close(mixed(idx).logits, plain(idx).logits, "value_lambda = 1 must give the model without value_residual")

    # lambda = 0: every later block's values are exactly block 0's values of the same tokens
    with torch.no_grad():
        for i in range(1, LAYERS):
            mixed.transformer.h[i].attn.value_lambda.fill_(0.0)
    seen = {}
    for i in range(LAYERS):  # what each block's attention hands its output projection: (B, T, C)
        attn = mixed.transformer.h[i].attn
        attn.c_proj.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0].clone()))
    with torch.no_grad():
        out = mixed(idx, return_attention=True)
        x0 = mixed.transformer.h[0].ln_1(mixed.transformer.wte(idx))
        v0 = mixed.transformer.h[0].attn.c_attn(x0).split(EMBD, dim=-1)[2]
        v0 = v0.view(*idx.shape, HEADS, HS).transpose(1, 2)  # (B, nh, T, hs)
        for i in range(1, LAYERS):
            expected = (out.attentions[i] @ v0).transpose(1, 2).reshape(*idx.shape, EMBD)
            close(seen[i], expected, f"value_lambda = 0: block {i} should attend over block 0's values")


def test_value_lambda_learns():
    model = build(value_residual=True).train()
    shake(model)
    idx = tokens()
    model(idx, targets=idx).loss.backward()
    grads = [model.transformer.h[i].attn.value_lambda.grad for i in range(1, LAYERS)]
    assert all(g is not None and g.abs() > 0 for g in grads), f"value_lambda gets no gradient: {grads}"


# ------------------------------------------------------------------------------------------------------ every option


@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_keeps_the_model_causal(option, backend):
    model = shake(build(pos_encoding="rope", attn_backend=backend, **OPTIONS[option]))
    idx = tokens()
    base = model(idx).logits
    t = 6
    changed = idx.clone()
    changed[:, t + 1 :] = (idx[:, t + 1 :] + 1 + torch.arange(BLOCK - t - 1)) % V
    out = model(changed).logits
    close(out[:, : t + 1], base[:, : t + 1], f"{option}/{backend}: later tokens changed earlier logits",
          atol=1e-6, rtol=0)
    assert (out[:, t + 1 :] - base[:, t + 1 :]).abs().max() > 1e-4, "later logits should change with later tokens"


@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_gives_the_same_logits_through_the_kv_cache(option, backend):
    model = shake(build(pos_encoding="rope", attn_backend=backend, **OPTIONS[option]))
    idx = tokens()
    full = model(idx).logits
    cache = model.new_kv_cache()
    pieces = [model(idx[:, :5], kv_cache=cache).logits]
    pieces += [model(idx[:, t : t + 1], kv_cache=cache).logits for t in range(5, BLOCK)]
    close(torch.cat(pieces, dim=1), full, f"{option}/{backend}: cached decoding != one full forward")


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_agrees_across_backends_and_trains(option):
    math_model = shake(build(pos_encoding="rope", attn_backend="math", **OPTIONS[option])).train()
    sdpa_model = shake(build(pos_encoding="rope", attn_backend="sdpa", **OPTIONS[option])).train()
    idx = tokens()
    losses = [m(idx, targets=idx).loss for m in (math_model, sdpa_model)]
    close(losses[1], losses[0], f"{option}: sdpa and math backends disagree on the loss")
    for loss in losses:
        loss.backward()
    for (name, a), (_, b) in zip(math_model.named_parameters(), sdpa_model.named_parameters(), strict=True):
        assert a.grad is not None and torch.isfinite(a.grad).all(), f"{option}: {name} has no finite gradient"
        close(b.grad, a.grad, f"{option}: gradient of {name} differs between backends", atol=1e-6)
