"""Circuits: what one head can do, read from the weights alone, without any text (the QK and OV circuits of
Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits", as TransformerLens computes them).
Pure: no files, no printing.

Legend
    V vocab_size, C n_embd, hs head size, P block_size (positions), a and b token ids
    E   = wte.weight (V, C) the token embeddings;  W_U = lm_head.weight (V, C) the unembedding (E when tied)
    W_Q, W_K, W_V (hs, C), b_Q, b_K, b_V (hs,), W_O (C, hs): the head's slices (inside.head_weights)
    rows are vectors and maps act on the right (y = x W^T + b), as nn.Linear

The direct path, one token alone. A head reads the residual stream through its block's ln_1; here the stream
holds a single token's embedding and nothing else, so each LayerNorm is applied to each embedding row on its own
(centred, scaled to unit RMS, gain and bias): exactly what ln_1 does to that token when it alone makes up the
stream. This keeps scores at the scale the model works at; folding in the gain alone and dropping the centring
and scaling (the usual linear simplification) ranks a row's entries the same way but scales each row by
~1 / |E[a]|^2, about 2500x at GPT-2's init. The other blocks and the MLPs are left out.

    QK   scores[a, b] = q(a) . k(b) * s, s = 1/sqrt(hs) (or the attn_scale switch's 1 or 1/hs)              (V, V)
             q(a) = ln_1(E[a]) W_Q^T + b_Q,   k(b) = ln_1(E[b]) W_K^T + b_K   (each RMS-normed with qk_norm)
         how strongly a query holding token a looks at a key holding token b, before the softmax.
         Position: learned / sinusoidal embeddings add to the token's: qk_position_scores sends the wpe rows
         through the same path (the token-position cross terms are left out); alibi adds its bias m_h (j - i)
         to the scores exactly, and qk_position_scores returns it; rope turns q and k by their positions, so
         the token scores above are those at relative offset 0 (q and k turned by the same angle keep their dot
         product); none: the token scores are all there is.
    OV   logits[a, :] = ln_f'(o(a)) W_U^T,   o(a) = (ln_1(E[a]) W_V^T + b_V) W_O^T                      (V, V)
         what the head adds to the logits when it puts all its weight on a key holding token a.
         ln_f' is ln_f without its bias (centred, unit RMS, gain): the bias belongs to no head. The logit
         softcap is left out: it is monotone and changes no ranking. With value_residual (block > 0) the value
         is lambda v(a) + (1 - lambda) v_first(a), v_first through block 0's ln_1 and W_V, as the model mixes.
    copying score    = share of tokens a with argmax_b logits[a, b] == a   (attending to a raises a the most)
    eigenvalue score = sum(lambda) / sum(|lambda|) over the eigenvalues of the OV matrix (TransformerLens):
                       1 when all are positive (copying), -1 when all negative, ~0 for a random map

The full V x V matrices (16M floats at V = 4096) are made a block of rows at a time and reduced at once (top
pairs, argmax), so no more than `chunk` rows of them exist at any time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attention_lab.interp.analysis import analyze
from attention_lab.interp.capture import plain_module
from attention_lab.interp.inside import head_weights
from model.attention import qk_norm

CHUNK = 512  # rows of a V x V matrix made at once: 512 x 4096 float32 = 8 MB


class TokenPairs(NamedTuple):
    query: np.ndarray  # (k,) int64 the query's token a
    key: np.ndarray  # (k,) int64 the key's token b
    score: np.ndarray  # (k,) float32 scores[a, b], highest first


class TopTokens(NamedTuple):
    ids: np.ndarray  # (k,) int64 the tokens whose logits the head raises most, most first
    logits: np.ndarray  # (k,) float32 by how much


def _rows(model, tokens: Sequence[int] | None) -> Tensor:
    """E[tokens] (n, C), every token when None; ValueError for an id outside the vocabulary."""
    e = model.transformer.wte.weight.detach()  # (V, C)
    if tokens is None:
        return e
    ids = torch.as_tensor(tokens, dtype=torch.long, device=e.device).reshape(-1)
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < e.size(0)):
        raise ValueError(f"token ids must be in 0..{e.size(0) - 1}, got {ids.tolist()}")
    return e[ids]


# ------------------------------------------------------------------------------------------------------------
# QK: which query token looks at which key token


def _query_key(model, layer: int, head: int, rows: Tensor) -> tuple[Tensor, Tensor]:
    """rows (n, C) as the lone content of the stream -> the head's q and k of each (n, hs)."""
    w = head_weights(model, layer, head)
    x = model.transformer.h[layer].ln_1(rows)  # each row normalised on its own: LayerNorm is per position
    q, k = x @ w.W_Q.T + w.b_Q, x @ w.W_K.T + w.b_K
    return (qk_norm(q), qk_norm(k)) if model.config.qk_norm else (q, k)


@torch.no_grad()
def qk_scores(model, layer: int, head: int, query_tokens: Sequence[int] | None = None) -> np.ndarray:
    """scores[a, b] = q(a) . k(b) * s (s = 1/sqrt(hs), or model.attn_scale's) for the given query tokens a (all when None) and every key token b:
    float32 (n, V). All V rows at V = 4096 take 64 MB; qk_token_pairs finds the top pairs without them."""
    model = plain_module(model)
    q, _ = _query_key(model, layer, head, _rows(model, query_tokens))
    _, k = _query_key(model, layer, head, _rows(model, None))
    return (q @ k.T * model.config.score_scale).float().cpu().numpy()


@torch.no_grad()
def qk_token_pairs(model, layer: int, head: int, k: int = 10, chunk: int = CHUNK) -> TokenPairs:
    """The k (query token, key token) pairs with the highest QK scores (module docstring), highest first.

    The V x V scores are made `chunk` query rows at a time; only the best k seen so far are kept. Within a block,
    the best k scores lie in the k rows with the highest maxima (a score outside them has k row maxima at least
    as high above it), so only those rows are searched: 0.4 ms a block of 512 x 4096, where a top-k over the
    whole block took 31 ms on 2 AMD EPYC cores.
    """
    model = plain_module(model)
    v = model.config.vocab_size
    if not 1 <= k <= v * v:
        raise ValueError(f"k must be in 1..vocab_size^2 ({v * v}), got {k}")
    q, keys = _query_key(model, layer, head, _rows(model, None))  # (V, hs) each
    scale = model.config.score_scale  # 1/sqrt(hs), or the attn_scale switch's 1 or 1/hs
    best = q.new_empty(0)  # the best scores so far, and their flat indices a * V + b
    where = torch.empty(0, dtype=torch.long, device=q.device)
    for start in range(0, v, chunk):
        block = q[start : start + chunk] @ keys.T * scale  # (n, V)
        rows = block.amax(-1).topk(min(k, len(block))).indices  # the rows that hold the block's best k
        top = block[rows].flatten().topk(min(k, len(rows) * v))
        flat = (start + rows[top.indices // v]) * v + top.indices % v  # a * V + b
        best, order = torch.cat([best, top.values]).topk(min(k, len(best) + len(top.values)))
        where = torch.cat([where, flat])[order]
    return TokenPairs((where // v).cpu().numpy(), (where % v).cpu().numpy(), best.float().cpu().numpy())


@torch.no_grad()
def qk_position_scores(model, layer: int, head: int) -> np.ndarray | None:
    """The positional part of the head's scores, float32 (P, P): query position i, key position j; -inf for
    j > i, as the model masks them.

    learned / sinusoidal: the position embeddings through the token path, p(i) . p'(j) / sqrt(hs) with
    p(i) = ln_1(wpe[i]) W_Q^T + b_Q (and qk_norm); alibi: the head's bias m_h (j - i); rope and none: None
    (rope's position acts by turning q and k, not by adding a score).
    """
    model = plain_module(model)
    pe, n = model.transformer.wpe, model.config.block_size
    pos = torch.arange(n, device=model.transformer.wte.weight.device)
    table = pe.embed(pos)  # (P, C) or None
    if table is not None:
        q, k = _query_key(model, layer, head, table.detach())
        scores = q @ k.T * model.config.score_scale
    elif pe.has_score_bias:
        scores = pe.score_bias(pos, pos)[head]
    else:
        return None
    future = torch.ones(n, n, dtype=torch.bool, device=pos.device).triu(1)
    return scores.masked_fill(future, float("-inf")).float().cpu().numpy()


# ------------------------------------------------------------------------------------------------------------
# OV: what attending to a token writes into the logits


def _ov_out(model, layer: int, head: int, rows: Tensor) -> Tensor:
    """rows (n, C) as the lone content of the stream -> ln_f'(o(row)) (n, C): what the head writes, as read
    by the unembedding (module docstring)."""
    w = head_weights(model, layer, head)
    blocks = model.transformer.h
    v = blocks[layer].ln_1(rows) @ w.W_V.T + w.b_V  # (n, hs)
    lam = blocks[layer].attn.value_lambda
    if lam is not None:  # value_residual: the first block's value of the same token, mixed in as the model does
        w0 = head_weights(model, 0, head)
        v = lam * v + (1.0 - lam) * (blocks[0].ln_1(rows) @ w0.W_V.T + w0.b_V)
    ln_f = model.transformer.ln_f
    return F.layer_norm(v @ w.W_O.T, ln_f.normalized_shape, ln_f.weight, None, ln_f.eps)  # (n, C)


def _unembedding(model) -> Tensor:
    return model.lm_head.weight.detach()  # (V, C)


@torch.no_grad()
def ov_logits(model, layer: int, head: int, tokens: Sequence[int] | None = None) -> np.ndarray:
    """Rows of the OV circuit, float32 (n, V): logits[a, :] for the given tokens a (all when None: 64 MB at
    V = 4096)."""
    model = plain_module(model)
    return (_ov_out(model, layer, head, _rows(model, tokens)) @ _unembedding(model).T).float().cpu().numpy()


@torch.no_grad()
def ov_top_tokens(model, layer: int, head: int, token: int, k: int = 10) -> TopTokens:
    """The k tokens whose logits the head raises most when it attends to `token`, and the logits it adds."""
    v = model.config.vocab_size
    if not 1 <= k <= v:
        raise ValueError(f"k must be in 1..vocab_size ({v}), got {k}")
    row = torch.from_numpy(ov_logits(model, layer, head, [token])[0])  # (V,)
    top = row.topk(k)
    return TopTokens(top.indices.numpy(), top.values.numpy())


@torch.no_grad()
def copying_score(model, layer: int, head: int, chunk: int = CHUNK) -> float:
    """Share of tokens a whose own logit is the one the head raises most when attending to a:
    mean over a of [argmax_b logits[a, b] == a]. 1: a perfect copying head; ~1/V: a random map.

    The V x V OV matrix is made `chunk` rows at a time and reduced to its argmax at once.
    """
    model = plain_module(model)
    out = _ov_out(model, layer, head, _rows(model, None))  # (V, C)
    w_u = _unembedding(model)
    hits = 0
    for start in range(0, out.size(0), chunk):
        best = (out[start : start + chunk] @ w_u.T).argmax(-1)  # (n,)
        hits += int((best == torch.arange(start, start + len(best), device=best.device)).sum())
    return hits / out.size(0)


@torch.no_grad()
def ov_eigenvalue_score(model, layer: int, head: int) -> float:
    """TransformerLens's copying score: sum(lambda) / sum(|lambda|) over the eigenvalues of the OV matrix.

    The OV matrix is X W_U^T with X = ln_f'(o(E)) (V, C) of rank r <= hs. With Q (C, r) an orthonormal basis
    of X's rows, X = X Q Q^T, and since AB and BA share their nonzero eigenvalues, those of the OV matrix are
    those of Q^T W_U^T X Q (r, r): V x V is never formed, and the eigensolver never meets the C - r zero
    eigenvalues (a cluster it converges on slowly: 0.5 s for a 128 x 128 one, against ms for 32 x 32).
    """
    model = plain_module(model)
    x = _ov_out(model, layer, head, _rows(model, None))  # (V, C)
    # numerical rank as numpy's matrix_rank counts it, at the precision X was made in: float32 rounding leaves
    # tiny singular values past the true rank, which is at most hs (X's rows are per-row scalings of hs values)
    tol = max(x.shape) * torch.finfo(x.dtype).eps
    x = x.double()
    _, sv, vh = torch.linalg.svd(x, full_matrices=False)  # sv (C,) descending, vh (C, C)
    rank = min(model.config.head_size, int((sv > sv[0] * tol).sum()))
    q = vh[:rank].T  # (C, r)
    eig = torch.linalg.eigvals(q.T @ _unembedding(model).double().T @ x @ q)  # (r,) complex
    total = eig.abs().sum()
    return float(eig.sum().real / total) if total > 0 else 0.0


def copying_of(model, shares: np.ndarray, weights: np.ndarray, ids) -> np.ndarray:
    """Per head (L, nh): the share of positions i >= 1 at which the head's output there (shares (L, nh, T, C), from
    analysis.analyze's shares), through the unembedding, raises most the logit of the token the head attends to most
    (weights (L, nh, T, T)): argmax_b share_i W_U^T [b] == ids[argmax_j w_ij]."""
    w_u = _unembedding(plain_module(model)).double().cpu().numpy().T  # (C, V)
    attended = np.asarray(ids)[np.asarray(weights).argmax(-1)]  # (L, nh, T)
    out = np.zeros(shares.shape[:2])
    for layer, head in np.ndindex(*out.shape):  # one (T, V) logit matrix at a time
        best = (shares[layer, head] @ w_u).argmax(-1)
        out[layer, head] = (best == attended[layer, head])[1:].mean()
    return out


@torch.no_grad()
def copying_in_context(model, ids) -> np.ndarray:
    """The copying score measured on a text instead of on lone embeddings, for every head (L, nh): copying_of
    the heads' outputs on `ids` (cropped to the last block_size).

    The weights-only copying_score reads each token's embedding through ln_1 alone; a head in a later layer
    reads the residual stream after the earlier layers wrote into it, so an induction head can copy in context
    (high here, on a repeated text) while its embedding-only score is at chance (docs/heads.md measures both).
    ln_f is left out of the path, as in ov_logits; the softcap does not change an argmax.
    """
    found = analyze(plain_module(model), ids, ablation=False)
    return copying_of(model, found.shares, found.weights, found.ids)
