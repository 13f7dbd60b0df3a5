"""The attention variants (model/attention.py, model/linear_attention.py) against written-out references:
degenerate settings equal the base model bit for bit, windows hide exactly the keys they should, blockwise local
attention equals the dense masked form, sinks join only the denominator, the caches decode as a full forward
does, chunked linear attention equals the recurrent one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from model.attention import local_attention, masked_sdpa, math_attention, visible_keys
from model.linear_attention import chunked, implied_weights, recurrent
from model.positions import build_positional_encoding

TINY = dict(vocab_size=61, block_size=48, n_layer=2, n_head=4, n_embd=32)


def model_of(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    m = GPT(GPTConfig(**(TINY | kw))).eval()
    with torch.no_grad():  # sharper attention than the 0.02 init gives, so masks and weights matter
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(6)
    return m


def ids(t: int, seed: int = 1, vocab: int = 61) -> torch.Tensor:
    return torch.randint(0, vocab, (2, t), generator=torch.Generator().manual_seed(seed))


def same_weights(a: GPT, b: GPT) -> None:
    b.load_state_dict(a.state_dict(), strict=False)


# ---------------------------------------------------------------------------------------------------------
# degenerate settings are the base model


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("pos", ["rope", "alibi", "learned"])
def test_degenerate_variants_are_the_base_model_bit_for_bit(backend, pos):
    base = model_of(pos_encoding=pos, attn_backend=backend)
    x = ids(TINY["block_size"])
    want = base(x).logits
    for kw in ({"n_kv_head": TINY["n_head"]}, {"window": TINY["block_size"]}, {"window": 1000, "window_pattern": "LG"}):
        other = model_of(pos_encoding=pos, attn_backend=backend, **kw)
        same_weights(base, other)
        assert torch.equal(other(x).logits, want), f"{kw} should be the base model exactly ({pos}, {backend})"
    sinks = model_of(pos_encoding=pos, attn_backend=backend, attn_sinks=True)
    same_weights(base, sinks)
    with torch.no_grad():
        for block in sinks.transformer.h:
            block.attn.sink.fill_(float("-inf"))
    got = sinks(x).logits
    if backend == "math":
        assert torch.equal(got, want), f"a sink logit of -inf adds exp(-inf) = 0 to the denominator ({pos})"
    else:  # sdpa sees one more key (whose weight is exactly 0): the kernel sums in another order
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# grouped-query attention


def test_grouped_query_heads_read_contiguous_groups_not_a_tiling():
    torch.manual_seed(0)
    b, nh, nkv, t, hs = 1, 4, 2, 6, 8
    q, k, v = torch.randn(b, nh, t, hs), torch.randn(b, nkv, t, hs), torch.randn(b, nkv, t, hs)
    pos = torch.arange(t)
    y, _ = math_attention(q, k, v, visible_keys(pos, pos))
    # written out: query head h reads key/value head h // (nh / nkv)
    for h in range(nh):
        kv = h // (nh // nkv)
        ref = F.scaled_dot_product_attention(q[:, h], k[:, kv], v[:, kv], is_causal=True)
        torch.testing.assert_close(y[:, h], ref, msg=f"head {h} should read kv head {kv}")
    tiled, _ = math_attention(q, k.repeat(1, nh // nkv, 1, 1), v.repeat(1, nh // nkv, 1, 1), visible_keys(pos, pos))
    assert not torch.allclose(y, tiled), "a tiled .repeat pairs query heads with the wrong kv heads"
    fused = masked_sdpa(q, k, v, visible_keys(pos, pos))
    torch.testing.assert_close(fused, y, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_grouped_query_model_backends_agree_and_the_cache_holds_nkv_heads(n_kv_head):
    m = model_of(n_kv_head=n_kv_head, pos_encoding="rope")
    x = ids(20)
    math_model = model_of(n_kv_head=n_kv_head, pos_encoding="rope", attn_backend="math")
    same_weights(m, math_model)
    torch.testing.assert_close(m(x).logits, math_model(x).logits, atol=1e-5, rtol=1e-5)
    assert m.transformer.h[0].attn.c_attn.weight.shape[0] == (4 + 2 * n_kv_head) * 8
    cache = m.new_kv_cache()
    m(x[:, :5], kv_cache=cache)
    assert cache.k[0].shape[1] == n_kv_head, "the KV cache holds the kv heads only"


# ---------------------------------------------------------------------------------------------------------
# sliding windows


def test_the_window_sees_exactly_the_last_w_keys():
    pos = torch.arange(10)
    vis = visible_keys(pos, pos, window=3)
    assert vis[7].nonzero().flatten().tolist() == [5, 6, 7], "query 7 with W=3 sees keys 5, 6, 7"
    assert vis[1].nonzero().flatten().tolist() == [0, 1]


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_keys_outside_the_window_change_nothing(backend):
    torch.manual_seed(0)
    w, t, i = 4, 16, 11
    m = model_of(window=w, n_layer=1, pos_encoding="rope", attn_backend=backend)
    x = ids(t)
    attn = m.transformer.h[0].attn
    h = m.transformer.h[0].ln_1(m.transformer.wte(x))
    pe = m.transformer.wpe
    pos = torch.arange(t)
    rot = pe.rotation(pos)
    y = attn(h, pe, rot, pos)[0][:, i]
    far = h.clone()
    far[:, : i - w + 1] += torch.randn_like(far[:, : i - w + 1])  # every key at or before i - W
    assert torch.allclose(attn(far, pe, rot, pos)[0][:, i], y, atol=1e-6), "a key W or more back leaked in"
    near = h.clone()
    near[:, i - w + 1] += 1.0  # the oldest key inside the window
    assert not torch.allclose(attn(near, pe, rot, pos)[0][:, i], y, atol=1e-4), "the window lost its oldest key"


@pytest.mark.parametrize("t, w", [(64, 16), (50, 16), (17, 8), (9, 8)])
@pytest.mark.parametrize("extra", ["plain", "alibi", "sink", "gqa"])
def test_blockwise_local_attention_equals_the_dense_masked_form(t, w, extra):
    torch.manual_seed(0)
    nh, nkv, hs = 4, 2 if extra == "gqa" else 4, 8
    cfg = GPTConfig(**(TINY | {"pos_encoding": "alibi" if extra == "alibi" else "none"}))
    pe = build_positional_encoding(cfg)
    q = torch.randn(2, nh, t, hs, requires_grad=True)
    k = torch.randn(2, nkv, t, hs, requires_grad=True)
    v = torch.randn(2, nkv, t, hs, requires_grad=True)
    sink = torch.randn(nh, requires_grad=True) if extra == "sink" else None
    pos = torch.arange(t)
    bias = pe.score_bias(pos, pos) if pe.has_score_bias else None
    want, _ = math_attention(q, k, v, visible_keys(pos, pos, w), bias, sink)
    got = local_attention(q, k, v, w, pe, sink)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    inputs = [q, k, v] + ([sink] if sink is not None else [])
    g_want = torch.autograd.grad(want.square().sum(), inputs)
    g_got = torch.autograd.grad(got.square().sum(), inputs)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pattern", ["", "LG"])
def test_windowed_model_sdpa_equals_math(pattern):
    m = model_of(window=8, window_pattern=pattern, pos_encoding="rope")
    ref = model_of(window=8, window_pattern=pattern, pos_encoding="rope", attn_backend="math")
    same_weights(m, ref)
    x = ids(TINY["block_size"])
    torch.testing.assert_close(m(x).logits, ref(x).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_incremental_decoding_past_the_window_equals_a_full_forward(pos):
    m = model_of(window=6, pos_encoding=pos)
    x = ids(30)
    full = m(x).logits
    cache = m.new_kv_cache()
    steps = [m(x[:, :4], kv_cache=cache).logits]  # a prefill shorter than the window, then one token at a time
    steps += [m(x[:, i : i + 1], kv_cache=cache).logits for i in range(4, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)
    assert cache.k[0].shape[2] == 6, "a windowed layer's cache keeps W entries"


def test_a_windowed_cache_decodes_past_block_size_without_rebuilding():
    m = model_of(window=6, pos_encoding="rope", block_size=16)
    assert m.config.bounded_cache
    x = ids(40)
    cache = m.new_kv_cache()
    got = torch.cat([m(x[:, :10], kv_cache=cache).logits]
                    + [m(x[:, i : i + 1], kv_cache=cache).logits for i in range(10, 40)], dim=1)
    # the reference: a model whose context is long enough, with the same weights (RoPE and the window are
    # relative, so the far tokens see exactly what the short-context model's cache gives them)
    big = model_of(window=6, pos_encoding="rope", block_size=64)
    same_weights(m, big)
    torch.testing.assert_close(got, big(x).logits, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# sinks


def test_sink_joins_the_denominator_only():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    pos = torch.arange(5)
    sink = torch.tensor([0.5, -1.0])
    y, w = math_attention(q, k, v, visible_keys(pos, pos), sink=sink)
    scores = (q @ k.transpose(-2, -1)) / 2.0 + torch.triu(torch.full((5, 5), float("-inf")), 1)
    ref = scores.exp() / (scores.exp().sum(-1, keepdim=True) + sink.view(1, 2, 1, 1).exp())
    torch.testing.assert_close(w, ref)
    assert (w.sum(-1) < 1).all(), "with a sink the weights sum to less than 1"
    torch.testing.assert_close(masked_sdpa(q, k, v, visible_keys(pos, pos), sink=sink), y, atol=1e-6, rtol=1e-5)


def test_sink_model_sdpa_equals_math():
    m = model_of(attn_sinks=True, pos_encoding="alibi", n_kv_head=2)
    with torch.no_grad():
        for block in m.transformer.h:
            block.attn.sink.copy_(torch.linspace(-1, 2, 4))
    ref = model_of(attn_sinks=True, pos_encoding="alibi", n_kv_head=2, attn_backend="math")
    same_weights(m, ref)
    x = ids(30)
    torch.testing.assert_close(m(x).logits, ref(x).logits, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# linear attention


@pytest.mark.parametrize("denominator", [True, False])
@pytest.mark.parametrize("t", [1, 63, 64, 150])
def test_chunked_linear_attention_equals_the_recurrent_one(denominator, t):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, t, 8, requires_grad=True) for _ in range(3))
    want, _ = recurrent(q, k, v, denominator)
    got = chunked(q, k, v, denominator)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


def test_linear_attention_never_sees_the_future():
    m = model_of(attention="linear", pos_encoding="learned")
    x = ids(40)
    y = m(x).logits
    later = x.clone()
    later[:, 25:] = (later[:, 25:] + 7) % 61
    assert torch.equal(m(later).logits[:, :25], y[:, :25]), "changing tokens 25.. changed earlier logits"


def test_linear_attention_decodes_from_a_constant_state_as_a_full_forward():
    m = model_of(attention="linear", pos_encoding="none", linear_out_norm=True)
    assert m.config.bounded_cache
    x = ids(60, vocab=61)
    cache = m.new_kv_cache()
    got = torch.cat([m(x[:, :10], kv_cache=cache).logits]
                    + [m(x[:, i : i + 1], kv_cache=cache).logits for i in range(10, 60)], dim=1)
    big = model_of(attention="linear", pos_encoding="none", linear_out_norm=True, block_size=64)
    same_weights(m, big)
    torch.testing.assert_close(got, big(x).logits, atol=1e-4, rtol=1e-4)
    s, z = cache.state[0]
    assert s.shape == (2, 4, 8, 8) and z.shape == (2, 4, 8), "the state is hs x hs per head, whatever the length"


def test_linear_attention_maps_are_its_implied_normalised_weights():
    m = model_of(attention="linear", pos_encoding="learned")
    out = m(ids(12), return_attention=True)
    w = out.attentions[0]
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert (w.triu(1) == 0).all(), "no weight on future keys"
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    phi = lambda x: F.elu(x) + 1  # noqa: E731
    a = (phi(q) @ phi(k).transpose(-2, -1)).tril()
    torch.testing.assert_close(implied_weights(q, k), a / a.sum(-1, keepdim=True))


# ---------------------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize("bad, match", [
    ({"n_kv_head": 3}, "n_kv_head must divide"),
    ({"window": -1}, "window must be"),
    ({"window_pattern": "LLG"}, "needs a window"),
    ({"window": 4, "window_pattern": "LXG"}, "letters L"),
    ({"attention": "performer"}, "attention must be one of"),
    ({"attention": "linear", "pos_encoding": "rope"}, "pos_encoding=rope"),
    ({"attention": "linear", "window": 8}, "window=8"),
])
def test_variant_config_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**(TINY | bad))


def test_window_pattern_repeats_over_the_layers():
    cfg = GPTConfig(**(TINY | {"n_layer": 5, "window": 8, "window_pattern": "LLG"}))
    assert [cfg.layer_window(i) for i in range(5)] == [8, 8, None, 8, 8]
    assert math.isclose(cfg.head_size, 8)


# ---------------------------------------------------------------------------------------------------------
# generation far past the context


def test_a_bounded_cache_generates_past_block_size_as_the_sliding_window_does():
    """Windows of 4 over 2 layers reach 6 tokens back, within block_size 16: the cache that never rebuilds and
    the uncached sliding window compute the same function, so greedy decoding gives the same tokens."""
    from model.generate import generate

    m = model_of(window=4, pos_encoding="rope", block_size=16)
    prompt = ids(5)
    cached = generate(m, prompt, 40, greedy=True, use_cache=True)
    uncached = generate(m, prompt, 40, greedy=True, use_cache=False)
    assert torch.equal(cached, uncached)


def test_keep_first_keeps_the_first_tokens_in_every_window():
    from model.generate import generate_stream, window_of

    tokens = torch.arange(30)[None]
    assert window_of(tokens, 30, 10, 3).tolist() == [[0, 1, 2, 23, 24, 25, 26, 27, 28, 29]]
    assert window_of(tokens, 8, 10, 3).tolist() == [list(range(8))]
    m = model_of(pos_encoding="rope", block_size=16)
    prompt = ids(20)
    out = list(generate_stream(m, prompt, 3, greedy=True, keep_first=4))
    context = torch.cat([prompt[:, :4], prompt[:, -12:]], dim=1)
    assert torch.equal(out[0], m(context).logits[:, -1].argmax(-1, keepdim=True)), "the first window: 4 + 12 recent"
    with pytest.raises(ValueError, match="keep_first"):
        next(generate_stream(m, prompt, 1, keep_first=16))


@pytest.mark.parametrize("window", [0, 5])
def test_grouped_query_decoding_equals_the_full_forward(window):
    """One token at a time reads the cached kv heads without copying them per query head (one_query_gqa)."""
    m = model_of(n_kv_head=2, window=window, pos_encoding="rope")
    x = ids(20)
    cache = m.new_kv_cache()
    got = torch.cat([m(x[:, :3], kv_cache=cache).logits] + [m(x[:, i : i + 1], kv_cache=cache).logits
                                                            for i in range(3, 20)], dim=1)
    torch.testing.assert_close(got, m(x).logits, atol=1e-4, rtol=1e-4)
