"""Decoding: the KV cache changes nothing but speed; top-k / top-p / temperature / seeded sampling do what they say.

Tolerances: cached decoding computes the same float32 function as a full forward with different matrix shapes
(one query row instead of T); with the sharpened weights below logits reach ~10 and differ by ~2e-5 (~2e-6
relative), so we assert atol=1e-5, rtol=1e-4. Token-equality tests run in float64, so a near-tie between two
logits cannot flip an argmax or a multinomial draw on another BLAS.
"""

from __future__ import annotations

import math

import pytest
import torch

from model import ATTENTION_BACKENDS, GPT, POSITION_ENCODINGS, GPTConfig, filter_logits, generate, sample_next

V, BLOCK = 64, 16


def build(pos_encoding: str = "learned", backend: str = "sdpa", seed: int = 0, dtype=torch.float32) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=V, block_size=BLOCK, n_layer=2, n_head=4, n_embd=32, pos_encoding=pos_encoding, attn_backend=backend
    )
    model = GPT(cfg).to(dtype).eval()
    # GPT-2 init (std 0.02) gives nearly flat logits, and greedy decoding then repeats one token for ever, which
    # would make "same tokens" a weak check; larger weights give sharper, varied predictions
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5)
    return model


def prompt(b: int = 2, t: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


# -------------------------------------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("prompt_len", [5, BLOCK + 4])  # a prompt longer than the block is cropped
@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_cached_greedy_generation_equals_uncached_past_block_size(pos_encoding, prompt_len):
    model = build(pos_encoding, dtype=torch.float64)
    idx = prompt(t=prompt_len)
    cached = generate(model, idx, 40, greedy=True, use_cache=True)
    uncached = generate(model, idx, 40, greedy=True, use_cache=False)
    assert cached.shape == (2, prompt_len + 40), f"generate returned shape {tuple(cached.shape)}"
    assert torch.equal(cached[:, :prompt_len], idx), "the prompt should come back unchanged"
    assert torch.equal(cached, uncached), (
        f"{pos_encoding}: KV-cache greedy tokens differ from the uncached path at positions "
        f"{(cached != uncached).nonzero()[:5].tolist()} (block_size={BLOCK}, prompt {prompt_len}, 40 new tokens)"
    )


@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_cached_sampling_equals_uncached_with_the_same_seed(pos_encoding):
    """Sampling visits many more distinct tokens than greedy decoding, so this exercises the cache harder."""
    model = build(pos_encoding, dtype=torch.float64)
    runs = [
        generate(model, prompt(), 40, use_cache=use_cache, generator=torch.Generator().manual_seed(7))
        for use_cache in (True, False)
    ]
    assert torch.equal(runs[0], runs[1]), f"{pos_encoding}: seeded sampling differs with and without the KV cache"
    assert runs[0][:, 5:].unique().numel() > 10, "degenerate samples; the comparison needs varied tokens to mean much"


# how the BLOCK tokens reach the cache: a 5-token prefill then one token at a time, or three uneven chunks
CHUNKINGS = {
    "prefill then one by one": [(0, 5)] + [(t, t + 1) for t in range(5, BLOCK)],
    "chunks 6+7+3": [(0, 6), (6, 13), (13, BLOCK)],
}


@pytest.mark.parametrize("chunking", CHUNKINGS)
@pytest.mark.parametrize("backend", ATTENTION_BACKENDS)
@pytest.mark.parametrize("pos_encoding", POSITION_ENCODINGS)
def test_cached_decoding_logits_equal_a_full_forward(pos_encoding, backend, chunking):
    model = build(pos_encoding, backend)
    idx = prompt(t=BLOCK)
    full = model(idx).logits  # (B, T, V)
    cache = model.new_kv_cache()
    pieces = [model(idx[:, a:b], kv_cache=cache).logits for a, b in CHUNKINGS[chunking]]
    assert cache.length == BLOCK, f"cache length {cache.length} after {BLOCK} tokens"
    torch.testing.assert_close(
        torch.cat(pieces, dim=1),
        full,
        atol=1e-5,
        rtol=1e-4,
        msg=lambda m: f"{pos_encoding}/{backend}: cache filled as {chunking} != one full forward\n{m}",
    )


def test_cache_overflow_raises_a_clear_error():
    model = build()
    cache = model.new_kv_cache()
    model(prompt(t=BLOCK - 2), kv_cache=cache)
    with pytest.raises(ValueError, match="block_size"):
        model(prompt(t=3), kv_cache=cache)


# ------------------------------------------------------------------------------------------------------- filtering


@pytest.mark.parametrize("k", [1, 3, 19, 20, 50])
def test_top_k_keeps_exactly_the_k_largest(k):
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(0))  # distinct values
    out = filter_logits(logits, top_k=k)
    kept = torch.isfinite(out)
    expected = torch.zeros_like(kept).scatter(-1, logits.topk(min(k, 20), dim=-1).indices, True)
    assert torch.equal(kept, expected), f"top_k={k} kept {kept.sum(-1).tolist()} tokens per row, not the {k} largest"
    assert torch.equal(out[kept], logits[kept]), "kept logits must be unchanged"
    assert (out[~kept] == float("-inf")).all(), "dropped logits must be -inf"


# probabilities 0.4, 0.3, 0.2, 0.1 (cumulative 0.4, 0.7, 0.9, 1.0), placed in two different vocabulary orders
PROBS = torch.tensor([[0.2, 0.4, 0.1, 0.3], [0.3, 0.1, 0.4, 0.2]])


@pytest.mark.parametrize(
    "top_p, kept_probs",
    [
        (0.05, {0.4}),  # the most likely token always stays
        (0.35, {0.4}),
        (0.65, {0.4, 0.3}),  # 0.4 < 0.65 <= 0.7
        (0.75, {0.4, 0.3, 0.2}),
        (0.95, {0.4, 0.3, 0.2, 0.1}),
        (1.0, {0.4, 0.3, 0.2, 0.1}),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept_probs):
    logits = PROBS.log() + 3.0  # a constant shift: softmax gives the same probabilities
    out = filter_logits(logits, top_p=top_p)
    for row in range(2):
        got = {round(p, 6) for p in PROBS[row][torch.isfinite(out[row])].tolist()}
        assert got == kept_probs, (
            f"top_p={top_p}, row {row}: kept probabilities {sorted(got)}, expected {sorted(kept_probs)}"
        )
    kept = torch.isfinite(out)
    assert torch.equal(out[kept], logits[kept]), "kept logits must be unchanged"


def test_sampling_never_leaves_the_filtered_set():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(0)).expand(500, V)
    g = torch.Generator().manual_seed(0)
    allowed = set(logits[0].topk(3).indices.tolist())
    drawn = set(sample_next(logits, temperature=2.0, top_k=3, generator=g).flatten().tolist())
    assert drawn <= allowed, f"top_k=3 sampled tokens {sorted(drawn - allowed)} outside the top 3 {sorted(allowed)}"
    assert len(drawn) == 3, "at temperature 2, 500 draws should reach all three allowed tokens"


# -------------------------------------------------------------------------------------------------------- sampling


def test_seeded_sampling_is_deterministic():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    draws = [
        torch.cat([sample_next(logits, top_p=0.9, generator=g) for _ in range(20)], 1)
        for g in (torch.Generator().manual_seed(123), torch.Generator().manual_seed(123))
    ]
    assert torch.equal(draws[0], draws[1]), "the same generator seed must give the same samples"

    model = build()
    a = generate(model, prompt(), 20, temperature=1.0, generator=torch.Generator().manual_seed(5))
    b = generate(model, prompt(), 20, temperature=1.0, generator=torch.Generator().manual_seed(5))
    c = generate(model, prompt(), 20, temperature=1.0, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b), "generate with the same seed must repeat itself"
    assert not torch.equal(a, c), "a different seed should give a different sample (else the seed is ignored)"


def test_temperature_zero_and_greedy_are_argmax():
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    argmax = logits.argmax(-1, keepdim=True)
    assert torch.equal(sample_next(logits, temperature=0.0), argmax), "temperature 0 should be argmax"
    assert torch.equal(sample_next(logits, greedy=True, temperature=5.0), argmax), "greedy should ignore temperature"
    assert torch.equal(sample_next(logits, top_k=1, generator=torch.Generator().manual_seed(0)), argmax)

    model = build()
    idx = prompt()
    out = generate(model, idx, 8, temperature=0.0)
    for t in range(8):  # each new token is the argmax of a full forward over the tokens before it
        ctx = out[:, : idx.size(1) + t]
        assert torch.equal(out[:, ctx.size(1)], model(ctx).logits[:, -1].argmax(-1)), f"token {t} is not the argmax"


def test_low_temperature_sharpens_the_distribution():
    logits = torch.tensor([[math.log(0.6), math.log(0.3), math.log(0.1)]]).expand(2000, 3)
    draws = sample_next(logits, temperature=0.25, generator=torch.Generator().manual_seed(0)).flatten()
    # p^(1/T) normalised: 0.6^4 / (0.6^4 + 0.3^4 + 0.1^4) = 0.9405
    share = (draws == 0).float().mean().item()
    assert abs(share - 0.9405) < 0.03, f"at temperature 0.25 token 0 should be drawn ~94% of the time, got {share:.3f}"
