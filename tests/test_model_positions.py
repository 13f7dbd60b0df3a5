"""Each positional encoding against its published definition, computed independently here.

Tolerances: the sinusoidal table is computed in float64 and stored as float32, so it matches the formula to
float32 rounding (atol 1e-6). RoPE angles are float32, whose rounding grows with the angle (pos * freq): at the
positions used here (< 64) q.k of unit-scale vectors agrees to ~1e-5, so atol=1e-4, rtol=1e-4.
"""

from __future__ import annotations

import math

import pytest
import torch

from model import GPT, GPTConfig
from model.positions import SINUSOID_SCALE, ALiBiPositions, RotaryPositions, alibi_slopes, sinusoidal_table

V, BLOCK, HEADS, EMBD = 64, 16, 4, 32
HS = EMBD // HEADS


def tiny(**overrides) -> GPTConfig:
    return GPTConfig(
        **{"vocab_size": V, "block_size": BLOCK, "n_layer": 2, "n_head": HEADS, "n_embd": EMBD, **overrides}
    )


def build(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny(**overrides)).eval()


# ------------------------------------------------------------------------------------------------------ sinusoidal


def vaswani_table(n_positions: int, d: int) -> torch.Tensor:
    """PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)), written out element by element."""
    table = [[0.0] * d for _ in range(n_positions)]
    for p in range(n_positions):
        for j in range(d):
            i = j // 2
            angle = p / 10000 ** (2 * i / d)
            table[p][j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return torch.tensor(table, dtype=torch.float32)


@pytest.mark.parametrize("n_positions, d", [(BLOCK, EMBD), (40, 7), (5, 2)])
def test_sinusoidal_table_matches_the_formula(n_positions, d):
    torch.testing.assert_close(
        sinusoidal_table(n_positions, d),
        vaswani_table(n_positions, d),
        atol=1e-6,
        rtol=0,
        msg=lambda m: f"sinusoidal_table({n_positions}, {d}) differs from Vaswani et al.\n{m}",
    )


def test_the_sinusoidal_table_starts_at_the_embeddings_size():
    """At unit scale the table drowns the 0.02-scale token embeddings (the positions claim's sinusoidal arm trained
    to 3.83 bits/byte): the model adds it scaled so each coordinate's RMS matches the embeddings' init std."""
    cfg = GPTConfig(vocab_size=64, block_size=256, n_layer=1, n_head=2, n_embd=64, pos_encoding="sinusoidal")
    model = GPT(cfg)
    table = model.transformer.wpe.embed(torch.arange(cfg.block_size))
    rms = table.pow(2).mean().sqrt().item()
    assert rms == pytest.approx(0.02, rel=0.02), f"the sinusoidal table's RMS is {rms:.4f}, the embeddings' 0.02"
    torch.testing.assert_close(table, SINUSOID_SCALE * sinusoidal_table(cfg.block_size, cfg.n_embd))


def test_sinusoidal_model_adds_the_table_and_trains_nothing():
    model = build(pos_encoding="sinusoidal")
    pe = model.transformer.wpe
    torch.testing.assert_close(
        pe.embed(torch.arange(BLOCK)),
        SINUSOID_SCALE * vaswani_table(BLOCK, EMBD),
        atol=1e-8,
        rtol=0,
        msg=lambda m: f"the model's sinusoidal embeddings differ from the formula (scaled)\n{m}",
    )
    assert list(pe.parameters()) == [], "sinusoidal positions should have no trainable parameters"
    assert not any("wpe" in k for k in model.state_dict()), "the table is derived from the config, not saved"


# ------------------------------------------------------------------------------------------------------------ RoPE


def rope_reference(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate channel pairs (i, i + hs/2) by pos * base^(-2i/hs) (GPT-NeoX pairing), in float64."""
    x = x.double()
    out = x.clone()
    half = x.size(-1) // 2
    for i in range(half):
        angle = pos.double() * base ** (-2 * i / x.size(-1))  # (T,)
        c, s = torch.cos(angle), torch.sin(angle)
        out[..., i] = x[..., i] * c - x[..., i + half] * s
        out[..., i + half] = x[..., i + half] * c + x[..., i] * s
    return out.float()


@pytest.fixture
def rope() -> RotaryPositions:
    return RotaryPositions(tiny(pos_encoding="rope"))


def qk(seed: int = 0, t: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, HEADS, t, HS, generator=g), torch.randn(2, HEADS, t, HS, generator=g)


def test_rope_matches_the_rotation_formula(rope):
    q, _ = qk()
    pos = torch.arange(3, 15)
    torch.testing.assert_close(
        rope.rotate(q, pos),
        rope_reference(q, pos),
        atol=1e-5,
        rtol=1e-5,
        msg=lambda m: f"RoPE differs from rotating pairs (i, i + hs/2) by pos * base^(-2i/hs)\n{m}",
    )
    torch.testing.assert_close(
        rope.rotate(q, torch.zeros(12, dtype=torch.long)), q, msg=lambda m: f"position 0 must not rotate\n{m}"
    )
    assert (rope.rotate(q, pos) - q).abs().max() > 0.1, "positions > 0 should rotate q"


def test_rope_preserves_norms(rope):
    q, _ = qk()
    rotated = rope.rotate(q, torch.arange(40, 52))
    torch.testing.assert_close(
        rotated.norm(dim=-1), q.norm(dim=-1), atol=1e-5, rtol=1e-5, msg=lambda m: f"RoPE changed a vector's norm\n{m}"
    )


@pytest.mark.parametrize("shift", [1, 7, 40])
def test_rope_scores_depend_only_on_relative_position(rope, shift):
    q, k = qk()
    pos = torch.arange(12)
    scores = rope.rotate(q, pos) @ rope.rotate(k, pos).transpose(-2, -1)  # (B, nh, T, T)
    shifted = rope.rotate(q, pos + shift) @ rope.rotate(k, pos + shift).transpose(-2, -1)
    torch.testing.assert_close(
        shifted, scores, atol=1e-4, rtol=1e-4, msg=lambda m: f"shifting all positions by {shift} changed q.k\n{m}"
    )
    # <R_m q, R_n k> = <q, R_(n-m) k>: the score of query m and key n needs only n - m
    m, n = 9, 4
    direct = (rope.rotate(q, torch.full((12,), m)) * rope.rotate(k, torch.full((12,), n))).sum(-1)
    relative = (q * rope.rotate(k, torch.full((12,), n - m))).sum(-1)
    torch.testing.assert_close(
        direct, relative, atol=1e-4, rtol=1e-4, msg=lambda d: f"<R_{m} q, R_{n} k> != <q, R_{n - m} k>\n{d}"
    )


# ----------------------------------------------------------------------------------------------------------- ALiBi

# Press et al. (2022): for n heads (a power of two) the slopes are 2^(-8/n), 2^(-16/n), ..., 2^(-8)
PUBLISHED_SLOPES = {
    8: [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256],
    4: [1 / 4, 1 / 16, 1 / 64, 1 / 256],
    1: [1 / 256],
    # not a power of two: the 4-head slopes, then every other slope of the 8-head list (1/2, 1/8)
    6: [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8],
    # the 8-head slopes, then every other 16-head slope (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5)
    12: [2.0**-e for e in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)],
}


@pytest.mark.parametrize("n_head", sorted(PUBLISHED_SLOPES))
def test_alibi_slopes_are_the_published_ones(n_head):
    torch.testing.assert_close(
        alibi_slopes(n_head),
        torch.tensor(PUBLISHED_SLOPES[n_head]),
        atol=1e-7,
        rtol=1e-6,
        msg=lambda m: f"ALiBi slopes for {n_head} heads\n{m}",
    )


def test_alibi_bias_is_minus_slope_times_distance():
    pe = ALiBiPositions(tiny(pos_encoding="alibi", n_head=8, n_embd=32))
    q_pos, k_pos = torch.arange(5, 9), torch.arange(9)  # 4 queries after 5 cached keys
    bias = pe.score_bias(q_pos, k_pos)  # (nh, Tq, Tk)
    assert bias.shape == (8, 4, 9)
    for h, slope in enumerate(PUBLISHED_SLOPES[8]):
        for i, qp in enumerate(q_pos.tolist()):
            for j, kp in enumerate(k_pos.tolist()):
                if kp <= qp:  # visible keys; future ones are masked to -inf anyway
                    assert bias[h, i, j].item() == pytest.approx(-slope * (qp - kp), abs=1e-6), (
                        f"head {h}, query {qp}, key {kp}: bias {bias[h, i, j].item()}, expected {-slope * (qp - kp)}"
                    )


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_alibi_reaches_the_attention_weights(backend):
    """With q = k = 0 every raw score is 0, so head h's weights are softmax(-slope_h * distance) exactly."""
    model = build(pos_encoding="alibi", attn_backend=backend)
    with torch.no_grad():
        c_attn = model.transformer.h[0].attn.c_attn
        c_attn.weight[: 2 * EMBD].zero_()  # the q and k rows; v keeps its weights
        c_attn.bias[: 2 * EMBD].zero_()
    w = model(torch.arange(10)[None], return_attention=True).attentions[0][0]  # (nh, T, T)
    dist = (torch.arange(10)[:, None] - torch.arange(10)[None, :]).float()  # query - key
    for h, slope in enumerate(PUBLISHED_SLOPES[HEADS]):
        expected = torch.softmax((-slope * dist).masked_fill(dist < 0, float("-inf")), dim=-1)
        torch.testing.assert_close(w[h], expected, atol=1e-6, rtol=1e-5, msg=lambda m: f"head {h} weights\n{m}")


# ------------------------------------------------------------------------------------------------- learned, none


def test_learned_positions_are_the_gpt2_parameter():
    model = build(pos_encoding="learned")
    params = dict(model.named_parameters())
    assert "transformer.wpe.weight" in params, f"expected transformer.wpe.weight among {sorted(params)[:6]}..."
    assert params["transformer.wpe.weight"].shape == (BLOCK, EMBD)
    assert [n for n in params if "wpe" in n] == ["transformer.wpe.weight"], "one position table, nothing else"


@pytest.mark.parametrize("pos_encoding", ["none", "rope", "alibi"])
def test_encodings_without_embeddings_have_no_position_parameters(pos_encoding):
    model = build(pos_encoding=pos_encoding)
    assert not [n for n, _ in model.named_parameters() if "wpe" in n], f"{pos_encoding} should train no positions"
    assert not [k for k in model.state_dict() if "wpe" in k], f"{pos_encoding} should save nothing for positions"


def test_none_cannot_tell_positions_apart():
    """NoPE: a run of one repeated token gives the same logits at every position (attention averages equals)."""
    idx = torch.full((1, BLOCK), 5)
    logits = build(pos_encoding="none")(idx).logits[0]  # (T, V)
    torch.testing.assert_close(
        logits,
        logits[:1].expand_as(logits),
        atol=1e-5,
        rtol=1e-5,
        msg=lambda m: f"pos_encoding='none' leaks position information: a repeated token's logits vary\n{m}",
    )
    learned = build(pos_encoding="learned")(idx).logits[0]
    assert (learned - learned[:1]).abs().max() > 1e-4, "learned positions should tell the positions apart"


def test_none_is_permutation_invariant_over_the_context_in_one_layer():
    """One NoPE layer sees the earlier tokens as a set: permuting them leaves the last position's logits alone."""
    model = build(pos_encoding="none", n_layer=1)
    idx = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(3))
    order = torch.randperm(11, generator=torch.Generator().manual_seed(4))
    permuted = torch.cat((idx[:, :-1][:, order], idx[:, -1:]), dim=1)  # shuffle all but the last token
    assert not torch.equal(permuted, idx)
    torch.testing.assert_close(
        model(permuted).logits[:, -1],
        model(idx).logits[:, -1],
        atol=1e-5,
        rtol=1e-5,
        msg=lambda m: f"pos_encoding='none' with one layer depends on the order of the context\n{m}",
    )
    learned = build(pos_encoding="learned", n_layer=1)
    assert (learned(permuted).logits[:, -1] - learned(idx).logits[:, -1]).abs().max() > 1e-4, (
        "learned positions should see the order, or this test could not fail"
    )
