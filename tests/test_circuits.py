"""attention_lab.interp.circuits: the QK and OV circuits of one head, from the weights alone.

Hand-built heads first, each with an answer known before any code runs: token embeddings that are orthonormal
and centred (so every LayerNorm only scales them, by sqrt(C)), an OV circuit that is the identity on their span
(copying score 1, eigenvalue score 1), a QK circuit in which token A's query matches token B's key more than
anything else (top pair (A, B)). Then random heads (about chance), the chunked reductions against the full
matrices, the positional part for every encoding, and one run at the default model's shape.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention_lab.interp import circuits as C
from model import GPT, POSITION_ENCODINGS, GPTConfig

V, EMBD, HEADS = 16, 64, 2
HS = EMBD // HEADS
A, B = 3, 11  # the hand-built QK head's query token and key token


def blank(pos: str = "none", **options) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=V, block_size=8, n_layer=2, n_head=HEADS, n_embd=EMBD, bias=False,
                    pos_encoding=pos, **options)
    return GPT(cfg).eval()


def centred_basis(seed: int = 0) -> torch.Tensor:
    """(C, hs) orthonormal columns, each of mean 0: LayerNorm's centring leaves their span alone."""
    a = torch.randn(EMBD, HS, generator=torch.Generator().manual_seed(seed))
    q, _ = torch.linalg.qr(a - a.mean(0))
    return q


def with_embedding(model: GPT, basis: torch.Tensor) -> GPT:
    """Token t's embedding is basis column t (tied models unembed with the same rows); untied: W_U = E too."""
    with torch.no_grad():
        model.transformer.wte.weight.copy_(basis[:, :V].T)
        model.lm_head.weight.copy_(basis[:, :V].T)
    return model


def set_head(model: GPT, layer: int, head: int, **weights: torch.Tensor) -> None:
    """Write W_Q, W_K, W_V (hs, C) into c_attn's rows and W_O (C, hs) into c_proj's columns of one head."""
    attn = model.transformer.h[layer].attn
    part = {"W_Q": 0, "W_K": 1, "W_V": 2}
    with torch.no_grad():
        for name, w in weights.items():
            if name == "W_O":
                attn.c_proj.weight[:, head * HS : (head + 1) * HS] = w
            else:
                lo = part[name] * EMBD + head * HS
                attn.c_attn.weight[lo : lo + HS] = w


# --------------------------------------------------------------------------------------------------------- OV


@pytest.mark.parametrize("tied", [True, False])
def test_identity_ov_circuit_copies_every_token(tied):
    basis = centred_basis()
    model = with_embedding(blank(tie_embeddings=tied), basis)
    set_head(model, 1, 0, W_V=basis.T, W_O=basis)  # E[a] -> e_a in the head -> E[a] back in the stream
    assert C.copying_score(model, 1, 0) == 1.0
    assert C.ov_eigenvalue_score(model, 1, 0) == pytest.approx(1.0, abs=1e-9)
    top = C.ov_top_tokens(model, 1, 0, token=A, k=3)
    assert top.ids[0] == A, f"attending to token {A} should raise token {A} most, got {top.ids}"
    # ln_f' gives the written vector RMS 1, i.e. norm sqrt(C), along E[a]: the logit of a is sqrt(C), the rest 0
    assert top.logits[0] == pytest.approx(math.sqrt(EMBD), rel=1e-3) and abs(top.logits[1]) < 1e-4


def test_negated_ov_circuit_suppresses_its_token():
    basis = centred_basis()
    model = with_embedding(blank(), basis)
    set_head(model, 1, 1, W_V=basis.T, W_O=-basis)
    assert C.copying_score(model, 1, 1) == 0.0
    assert C.ov_eigenvalue_score(model, 1, 1) == pytest.approx(-1.0, abs=1e-9)


@pytest.mark.parametrize("tied", [True, False])
def test_random_ov_circuits_copy_at_about_chance(tied):
    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=32, tie_embeddings=tied))
    scores = [C.copying_score(model, layer, head) for layer in range(2) for head in range(4)]
    assert max(scores) < 0.05, f"a random OV circuit should copy about 1/64 of tokens, got {scores}"
    eig = [C.ov_eigenvalue_score(model, layer, head) for layer in range(2) for head in range(4)]
    assert abs(np.mean(eig)) < 0.3 and all(-1 <= e <= 1 for e in eig), eig


def test_value_residual_reads_the_first_blocks_values():
    """Block 1 with lambda 0 takes its values from block 0 alone: identity there, random here, still copies."""
    basis = centred_basis()
    model = with_embedding(blank(value_residual=True), basis)
    set_head(model, 0, 0, W_V=basis.T)
    set_head(model, 1, 0, W_O=basis)
    with torch.no_grad():
        model.transformer.h[1].attn.value_lambda.fill_(0.0)
    assert C.copying_score(model, 1, 0) == 1.0
    with torch.no_grad():
        model.transformer.h[1].attn.value_lambda.fill_(1.0)  # now block 1's own random values only
    assert C.copying_score(model, 1, 0) < 0.5


def test_chunked_ov_reductions_equal_the_full_matrix():
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=32, qk_norm=True)).eval()
    with torch.no_grad():  # a head far from init, so that some tokens copy and some do not
        model.transformer.h[1].attn.c_attn.weight.normal_(0.0, 0.5)
        model.transformer.h[1].attn.c_proj.weight.normal_(0.0, 0.5)
    full = C.ov_logits(model, 1, 2)  # (V, V)
    assert full.shape == (64, 64)
    share = float(np.mean(full.argmax(-1) == np.arange(64)))
    for chunk in (5, 64, 1000):
        assert C.copying_score(model, 1, 2, chunk=chunk) == pytest.approx(share), f"chunk {chunk}"
    top = C.ov_top_tokens(model, 1, 2, token=7, k=4)
    assert np.array_equal(top.ids, np.argsort(-full[7])[:4]) and np.allclose(top.logits, np.sort(full[7])[::-1][:4])
    np.testing.assert_allclose(C.ov_logits(model, 1, 2, [7, 3]), full[[7, 3]], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------------- QK


@pytest.mark.parametrize("pos", POSITION_ENCODINGS)
def test_hand_built_qk_circuit_pairs_a_with_b(pos):
    basis = centred_basis()
    model = with_embedding(blank(pos), basis)
    w_k = basis.T.clone()
    w_k[A] += 2.0 * basis[:, B]  # k(B) = sqrt(C) (e_B + 2 e_A), so q(A) . k(B) = 2C: twice any other pair
    set_head(model, 1, 1, W_Q=basis.T, W_K=w_k)
    pairs = C.qk_token_pairs(model, 1, 1, k=5)
    assert (pairs.query[0], pairs.key[0]) == (A, B), f"top pair {pairs.query[0], pairs.key[0]}, want {A, B}"
    assert pairs.score[0] == pytest.approx(2 * EMBD / math.sqrt(HS), rel=1e-3)
    assert pairs.score[1] == pytest.approx(EMBD / math.sqrt(HS), rel=1e-3), "next: a token with itself"


def test_qk_norm_scores_the_normalised_query_and_key():
    """The same head with qk_norm: q and k get RMS 1, so q(A) . k(B) = hs * 2 / sqrt(5) (the key's 2 e_A part
    shrinks by 1 / sqrt(5)) and a token with itself scores hs: now each token's own pairs are on top."""
    basis = centred_basis()
    model = with_embedding(blank(qk_norm=True), basis)
    w_k = basis.T.clone()
    w_k[A] += 2.0 * basis[:, B]
    set_head(model, 1, 1, W_Q=basis.T, W_K=w_k)
    scores = C.qk_scores(model, 1, 1)
    assert scores[A, B] == pytest.approx(2 * HS / math.sqrt(5) / math.sqrt(HS), rel=1e-4)
    assert scores[A, A] == pytest.approx(math.sqrt(HS), rel=1e-4)
    assert np.abs(scores).max() <= math.sqrt(HS) * (1 + 1e-5), "QK-norm bounds every score by sqrt(hs)"


def test_chunked_top_pairs_equal_the_full_matrix():
    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=32, bias=True)).eval()
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.bias.normal_(0.0, 0.1)  # biases take part in q and k
    full = C.qk_scores(model, 0, 3)  # (V, V)
    order = np.argsort(-full, axis=None)[:20]
    for chunk in (7, 64):
        pairs = C.qk_token_pairs(model, 0, 3, k=20, chunk=chunk)
        assert np.array_equal(pairs.query * 64 + pairs.key, order), f"chunk {chunk}"
        np.testing.assert_allclose(pairs.score, full.ravel()[order], rtol=1e-6)
    np.testing.assert_allclose(C.qk_scores(model, 0, 3, [5]), full[[5]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pos", POSITION_ENCODINGS)
def test_positional_part_for_every_encoding(pos):
    model = blank(pos)
    got = C.qk_position_scores(model, 1, 1)
    if pos in ("rope", "none"):
        assert got is None, f"{pos} adds nothing to the scores"
        return
    assert got.shape == (8, 8) and np.all(np.isneginf(got[np.triu_indices(8, 1)])), "future keys are -inf"
    lower = np.tril_indices(8)
    if pos == "alibi":  # head 1 of 2: slope 2^(-8/2 * 2) = 1/256
        np.testing.assert_allclose(got[lower], (lower[1] - lower[0]) / 256.0)
    if pos == "learned":  # the same path as tokens: position rows equal to token rows give the token scores
        with torch.no_grad():
            model.transformer.wpe.weight.copy_(model.transformer.wte.weight[:8])
        np.testing.assert_allclose(C.qk_position_scores(model, 1, 1)[lower],
                                   C.qk_scores(model, 1, 1, range(8))[:, :8][lower], rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(got[lower]))


def test_bad_arguments_raise():
    model = blank()
    with pytest.raises(ValueError, match="token ids must be in"):
        C.ov_top_tokens(model, 0, 0, token=V)
    with pytest.raises(ValueError, match="layer must be in"):
        C.copying_score(model, 2, 0)
    with pytest.raises(ValueError, match="head must be in"):
        C.qk_token_pairs(model, 0, HEADS)
    with pytest.raises(ValueError, match="k must be in"):
        C.ov_top_tokens(model, 0, 0, token=1, k=0)


def test_runs_at_the_default_models_shape():
    """vocab 4096, 4 layers, 4 heads, n_embd 128: one head of each circuit (no time asserted here; the
    measured time is in the report)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig()).eval()
    v = model.config.vocab_size
    score = C.copying_score(model, 3, 2)
    assert 0.0 <= score <= 0.01, f"an untrained head copies about 1/{v} of tokens, got {score}"
    pairs = C.qk_token_pairs(model, 0, 1, k=10)
    assert pairs.query.shape == (10,) and np.all(np.diff(pairs.score) <= 0)
    assert C.ov_top_tokens(model, 2, 0, token=42, k=10).ids.shape == (10,)
    assert -1.0 <= C.ov_eigenvalue_score(model, 1, 3) <= 1.0


def test_copying_in_context_is_the_loop_over_step_inside():
    """copying_in_context, written out with step_inside at every position: the head's share through the
    unembedding, argmax against the token the head attends to most."""
    import numpy as np

    from attention_lab.interp.circuits import copying_in_context
    from attention_lab.interp.inside import step_inside
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=24, n_layer=2, n_head=2, n_embd=16, pos_encoding="rope")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape))
    ids = torch.randint(0, 16, (20,), generator=torch.Generator().manual_seed(1))
    w_u = model.lm_head.weight.detach().double().numpy()
    scores = copying_in_context(model, ids)
    assert scores.shape == (2, 2)
    for layer, head in ((0, 1), (1, 0)):
        hits = []
        for i in range(1, 20):
            got = step_inside(model, ids, layer, head, i)
            hits.append(np.argmax(got.share @ w_u.T) == int(ids[np.argmax(got.weights)]))
        assert scores[layer, head] == pytest.approx(np.mean(hits)), (layer, head)
