"""One attention layer of the model against the same layer written out by hand from its weights, in each
configuration that changes how the query and key heads are made (model/attention.py qkv_heads): grouped-query
heads, tied queries and keys, QK-norm, RoPE, learned positions. The model norms and rotates its q and k heads as one
tensor and reads RoPE's angles from tables made once; the hand-written layer does each head on its own, from
positions' angles computed afresh (RotaryPositions.angles). Forward and the gradients of every weight must agree.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig

CASES = {
    "multi-head, RoPE, QK-norm (the default)": dict(n_kv_head=0, qk_norm=True, pos_encoding="rope"),
    "grouped-query (4 query heads, 2 kv heads), RoPE, QK-norm": dict(n_kv_head=2, qk_norm=True, pos_encoding="rope"),
    "grouped-query, RoPE, no QK-norm": dict(n_kv_head=2, qk_norm=False, pos_encoding="rope"),
    "multi-query (1 kv head), RoPE": dict(n_kv_head=1, qk_norm=True, pos_encoding="rope"),
    "tied queries and keys, RoPE, QK-norm": dict(qk_tied=True, qk_norm=True, pos_encoding="rope"),
    "tied queries and keys, learned positions": dict(qk_tied=True, qk_norm=False, pos_encoding="learned"),
    "learned positions, QK-norm": dict(n_kv_head=0, qk_norm=True, pos_encoding="learned"),
}


def written_out(attn, pe, x: torch.Tensor, cfg: GPTConfig) -> torch.Tensor:
    """The layer, one head at a time: q, k, v from c_attn's rows, each head RMS-normed (qk_norm) and rotated by its
    positions' angles (RoPE), softmax(q k^T / sqrt(hs)) with -inf on later keys, the heads side by side, c_proj."""
    b, t, c = x.shape
    nh, hs = cfg.n_head, cfg.head_size
    nkv = cfg.kv_heads
    w = attn.c_attn.weight
    q_rows = w[: nh * hs]
    k_rows = q_rows if cfg.qk_tied else w[nh * hs: (nh + nkv) * hs]
    v_rows = w[-nkv * hs:]
    pos = torch.arange(t)
    if cfg.pos_encoding == "rope":
        cos, sin = pe.angles(pos)  # (T, hs), computed here, not read from the tables
    heads = []
    for h in range(nh):
        g = h // (nh // nkv)  # the kv head this query head reads
        q = x @ q_rows[h * hs:(h + 1) * hs].T  # (B, T, hs)
        k = x @ k_rows[g * hs:(g + 1) * hs].T
        v = x @ v_rows[g * hs:(g + 1) * hs].T
        if cfg.qk_norm:
            q = q / q.pow(2).mean(-1, keepdim=True).add(torch.finfo(q.dtype).eps).sqrt()
            k = k / k.pow(2).mean(-1, keepdim=True).add(torch.finfo(k.dtype).eps).sqrt()
        if cfg.pos_encoding == "rope":
            half = hs // 2
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), -1) * sin
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(F.softmax(scores, -1) @ v)
    return torch.cat(heads, -1) @ attn.c_proj.weight.T


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_a_layer_equals_its_heads_written_out_forward_and_gradients(case, backend):
    """Planted bugs: grouped-query keys cut from the query heads, tied keys detached from the gradient, RoPE's
    tables kept at lower precision than its angles."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=4, n_embd=32, attn_backend=backend,
                    **CASES[case])
    model = GPT(cfg).double()
    attn, pe = model.transformer.h[0].attn, model.transformer.wpe
    x = torch.randn(2, 12, cfg.n_embd, dtype=torch.float64)
    pos = torch.arange(12)
    y, _, _ = attn(x, pe, pe.rotation(pos, (0, 12)), pos)
    ref = written_out(attn, pe, x, cfg)
    torch.testing.assert_close(y, ref, atol=1e-10, rtol=1e-9, msg=f"{case}: the layer's output")
    grads = torch.autograd.grad(y.square().sum(), (attn.c_attn.weight, attn.c_proj.weight))
    ref_grads = torch.autograd.grad(ref.square().sum(), (attn.c_attn.weight, attn.c_proj.weight))
    for name, got, want in zip(("c_attn", "c_proj"), grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9, msg=f"{case}: the gradient of {name}")


def test_ropes_tables_are_its_angles_in_float32_and_past_them_it_computes():
    """rotation(pos, span) reads rows of tables made once; they must be the angles themselves (float32), and a span
    past block_size (a bounded cache decoding on) computes its angles."""
    cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16, pos_encoding="rope")
    pe = GPT(cfg).transformer.wpe
    for start, end in ((0, 16), (5, 6), (15, 16)):
        pos = torch.arange(start, end)
        for got, want in zip(pe.rotation(pos, (start, end)), pe.angles(pos), strict=True):
            assert got.dtype == torch.float32 and torch.equal(got, want), (start, end)
    past = torch.arange(20, 23)
    for got, want in zip(pe.rotation(past, (20, 23)), pe.angles(past), strict=True):
        assert torch.equal(got, want)


def test_a_model_cast_to_bf16_keeps_ropes_angles_in_float32():
    """decoding_model's bf16 copy is model.to(torch.bfloat16), which casts every floating buffer: RoPE's
    frequencies and tables stay float32 (their angles, pos * frequency, reach hundreds of radians)."""
    cfg = GPTConfig(vocab_size=32, block_size=512, n_layer=1, n_head=2, n_embd=32, pos_encoding="rope")
    model = GPT(cfg)
    pe = model.transformer.wpe
    before = [t.clone() for t in (pe.inv_freq, pe.cos_table, pe.sin_table)]
    model.to(torch.bfloat16)
    for got, want in zip((pe.inv_freq, pe.cos_table, pe.sin_table), before, strict=True):
        assert got.dtype == torch.float32 and torch.equal(got, want)
    model.float()
    assert all(torch.equal(got, want) for got, want in zip((pe.inv_freq, pe.cos_table, pe.sin_table), before))
