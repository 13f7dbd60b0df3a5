"""Causal self-attention: the formula of the tutorials, then the way the model runs it.

    y = softmax(mask(Q K^T / sqrt(d_k))) V        one head; mask(.) puts -inf on every key after the query

Shapes: B batch, T tokens, C n_embd (the model's width), nh n_head heads, hs = C // nh the head size (d_k).
Q, K, V (B, nh, T, hs); the scores and weights (B, nh, T, T); y (B, nh, T, hs), its heads side by side (B, T, C).

`reference_attention` below is that formula for one layer of the model, read top to bottom. The rest of the file
computes the same function for the model (CausalSelfAttention at the end): through torch's fused kernel, with a
KV cache for decoding, and with the variants and experiment switches the config offers (listed where they are
implemented, under "Variants and switches"). tests/test_model_invariants.py checks that the two agree.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import GPTConfig
from .hooks import HookPoint
from .positions import PositionalEncoding


def reference_attention(x: Tensor, w_qkv: Tensor, w_proj: Tensor, n_head: int,
                        b_qkv: Tensor | None = None, b_proj: Tensor | None = None) -> Tensor:
    """Masked multi-head self-attention of one layer, as the tutorials write it: x (B, T, C) -> (B, T, C).
    w_qkv (3C, C) the query, key and value projections stacked (a layer's c_attn.weight), w_proj (C, C) the
    output projection (c_proj.weight), b_qkv and b_proj their biases. Positions (RoPE) and QK-norm, which the
    default config adds, come after: CausalSelfAttention.forward."""
    B, T, C = x.shape
    hs = C // n_head
    q, k, v = F.linear(x, w_qkv, b_qkv).split(C, dim=-1)  # each (B, T, C): what a token looks for, offers, passes on
    q = q.view(B, T, n_head, hs).transpose(1, 2)  # (B, nh, T, hs): the heads split from the channels
    k = k.view(B, T, n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
    v = v.view(B, T, n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T): query i against key j
    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # (T, T): True where key j > query i
    scores = scores.masked_fill(future, float("-inf"))  # -inf before the softmax: the future gets weight exactly 0
    weights = F.softmax(scores, dim=-1)  # (B, nh, T, T): each row sums to 1
    y = weights @ v  # (B, nh, T, hs): each query's weighted sum of the values
    y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C): the heads concatenated side by side
    return F.linear(y, w_proj, b_proj)  # (B, T, C): the output projection mixes the heads


# Variants and switches ------------------------------------------------------------------------------------------
#
# More shapes: S keys (cached + new), nkv key/value heads, W a window, P = W the block of local attention.
#
# Per head: softmax(mask(Q K^T / sqrt(hs) + bias)) V. Two backends compute the same function:
#   math  the explicit reference (math_attention); can hand back the weights.
#   sdpa  torch's fused scaled_dot_product_attention; a windowed layer without a cache runs `local_attention`
#         instead, blocks of W queries against 2W keys: T*W work and memory rather than T*T.
# The variants (GPTConfig), each a change to the keys a query sees or to the softmax:
#   grouped-query (n_kv_head = nkv < nh)  nkv key/value heads; query head h reads kv head h // (nh / nkv)
#                                         (contiguous groups, as transformers' repeat_kv and sdpa's enable_gqa);
#                                         the cache holds nkv heads. nkv = 1 is multi-query attention.
#   sliding window (window = W)           query i sees keys i-W < j <= i; its cache keeps W keys (a ring buffer)
#   sinks (attn_sinks)                    a learned logit s_h per head joins the softmax's denominator:
#                                         w_ij = exp(a_ij) / (exp(s_h) + sum_j' exp(a_ij')), so a head may attend
#                                         to nothing (gpt-oss)
# The experiment switches (GPTConfig; each default is the line above), to test what the tutorials claim:
#   attn_scale  s = 1/sqrt(hs) | 1 ("none") | 1/hs ("inverse"):   scores = s Q K^T + bias
#   causal_mask before_softmax  w = softmax(scores, -inf on hidden keys): rows sum to 1
#               after_softmax   w = softmax(scores over every key), then hidden keys' w set to 0: rows sum to < 1 and
#                               the future still reaches each row through the denominator (math path only: the sdpa
#                               backend runs the math path for it)
#               none            w = softmax(scores over every key): the future leaks into each prediction
#   qk_tied     one projection for queries and keys: c_attn's rows are [q: nh heads | v: nh heads] and k = q
#               (before positions and QK-norm), so the scores q_i . q_j are symmetric before positions
#   attend_self False: query i does not see its own key (-inf on it, before the softmax) unless it sees no other
#               key (position 0, or window = 1): Reformer's rule for shared q and k, where q_i . q_i is the largest
#               score (Kitaev et al. 2020, sec. 2). `hide_self` edits the visible mask, and every path takes it: the
#               math path, sdpa (an explicit mask: masked_sdpa, never the kernel's is_causal), local_attention's
#               blocks, and the KV cache (the mask compares true positions, so cached = uncached)
#   uniform     (GPTConfig.attention = "uniform") q is zeroed, so every score is 0 and each query's weights are
#               1 / (the keys it sees): the block averages the visible values. c_attn keeps its q and k rows (the
#               parameter count is softmax attention's) but they get no gradient (k is detached too). Every path
#               computes it as it computes softmax attention, so the KV cache, windows and return_weights hold
# A learner's attention (attn_fn): a function attention(q, k, v) -> y of their own (attention_lab/exercises) in
# place of softmax(mask(Q K^T / sqrt(hs))) V; `learner_attention` calls it. The model only takes the callable:
# loading it from the learner's file happens outside model/.
# Linear attention, which has no softmax, is model/linear_attention.py.

FAR = -(2**62)  # the position of an empty ring-buffer slot: no query sees it


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout while training with p > 0; otherwise x itself, with no call at all. A function, not a module:
    decoding runs the model once per token, and each module call costs a few microseconds of Python (removing
    the 18 pass-through modules made cached decoding 7% faster on a 2-core AMD EPYC)."""
    return F.dropout(x, p, training=True) if training and p > 0 else x


def visible_keys(q_pos: Tensor, k_pos: Tensor, window: int | None = None) -> Tensor:
    """(T, S) bool, True where the query at position q_pos[i] may see the key at k_pos[j]: j's position is not
    later, and (with a window W) less than W back: q - W < k <= q."""
    seen = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        seen &= k_pos[None, :] > q_pos[:, None] - window
    return seen


def hide_self(visible: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """visible (..., T, S) with each query's own key hidden (attend_self=False), except in a row where it is the
    only visible key (position 0; window = 1), which keeps it: Reformer's "except when no other targets are
    available". q_pos (T,), k_pos (S,) the positions; an empty ring-buffer slot (FAR) is no query's own key."""
    others = visible & (k_pos[None, :] != q_pos[:, None])
    return torch.where(others.any(-1, keepdim=True), others, visible)


def expand_kv(x: Tensor, n_head: int) -> Tensor:
    """(B, nkv, S, hs) -> (B, nh, S, hs): each kv head serves n_head / nkv consecutive query heads."""
    n_rep = n_head // x.size(1)
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def math_attention(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, bias: Tensor | None = None,
                   sink: Tensor | None = None, dropout_p: float = 0.0, scale: float | None = None,
                   causal_mask: str = "before_softmax", on_scores: nn.Module | None = None,
                   on_weights: nn.Module | None = None) -> tuple[Tensor, Tensor]:
    """The explicit path: reference_attention's softmax with every variant and switch, the model's math backend.
    q (B, nh, T, hs), k and v (B, nkv, S, hs), visible (T, S), bias (nh, T, S) or None, sink
    (nh,) or None, scale the factor on q.k (None: 1/sqrt(hs)) -> y (B, nh, T, hs), weights (B, nh, T, S).
    on_scores: a module the scores pass through just before the softmax (scaled, biased, -inf where masked), and
    on_weights one the weights pass through before they average the values (CausalSelfAttention.hook_scores and
    hook_pattern, identities that a hook reads or edits: model/hooks.py).

    causal_mask says where `visible` acts: "before_softmax" -inf on hidden scores, "after_softmax" zeros on the
    weights of hidden keys after a softmax over every key, "none" not at all (module docstring)."""
    k, v = expand_kv(k, q.size(1)), expand_kv(v, q.size(1))
    scale = 1.0 / math.sqrt(k.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, S)
    if bias is not None:
        scores = scores + bias
    if causal_mask == "before_softmax":  # -inf before the softmax makes every hidden key's weight exactly 0
        scores = scores.masked_fill(~visible, float("-inf"))
    if on_scores is not None:
        scores = on_scores(scores)
    if sink is None:
        weights = F.softmax(scores, dim=-1)  # (B, nh, T, S), each row sums to 1
    else:  # the sink is one more logit in the denominator, with no value: rows sum to at most 1
        column = sink.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = F.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    if causal_mask == "after_softmax":  # the hidden keys' weights dropped, their exp(score) kept in the denominator
        weights = weights.masked_fill(~visible, 0.0)
    if on_weights is not None:
        weights = on_weights(weights)
    y = dropout(weights, dropout_p, training=True) @ v  # (B, nh, T, hs); the caller passes 0 in eval
    return y, weights


def learner_attention(fn, q: Tensor, k: Tensor, v: Tensor, weights_too: bool = False,
                      on_scores: nn.Module | None = None, on_weights: nn.Module | None = None
                      ) -> tuple[Tensor, Tensor | None]:
    """A learner's fn(q, k, v) -> y, causal attention over square inputs (B, nh, T, hs), in the model.
    q (B, nh, T, hs), k and v (B, nkv, S, hs) with S >= T (after a cache the queries are the last T positions)
    -> y (B, nh, T, hs), and with weights_too the weights (B, nh, T, S) the function gives each key.

    The function always sees S queries for S keys: queries after a cache get S - T zero queries in front and only
    the last T rows are kept, so its own causal mask lines up (an exact function gives the cached = uncached
    tokens). Its weights are its output for one-hot values (v = the identity): attention is linear in v. When a
    hook reads or edits the scores (on_scores), it sees log-weights, the scores up to a constant per row, and the
    edited weights keep each row's sum; y is then the (edited) weights times v."""
    b, nh, t, hs = q.shape
    k, v = expand_kv(k, nh), expand_kv(v, nh)
    s = k.size(2)
    if s > t:
        q = torch.cat([q.new_zeros(b, nh, s - t, hs), q], dim=2)  # (B, nh, S, hs)
    if not weights_too:
        return fn(q, k, v)[:, :, s - t:], None
    eye = torch.eye(s, dtype=v.dtype, device=v.device).expand(b, nh, s, s)
    weights = fn(q, k, eye)[:, :, s - t:]  # (B, nh, T, S): the output for one-hot values is each key's weight
    if on_scores is None and on_weights is None:
        return fn(q, k, v)[:, :, s - t:], weights
    if on_scores is not None:
        weights = F.softmax(on_scores(weights.log()), dim=-1) * weights.sum(-1, keepdim=True)
    if on_weights is not None:
        weights = on_weights(weights)
    return weights @ v, weights


def one_query_gqa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Decoding one token with grouped-query heads: each group's query heads become the query axis of their one
    kv head, q (B, nh, 1, hs) -> (B, nkv, nh/nkv, hs), so the cached keys are read once, never copied per query
    head (sdpa's enable_gqa copies them on the CPU: 2x slower at 8,192 cached keys). -> (B, nh, 1, hs)."""
    b, nh, _, hs = q.shape
    y = F.scaled_dot_product_attention(q.reshape(b, k.size(1), nh // k.size(1), hs), k, v, attn_mask=mask,
                                       scale=scale)
    return y.reshape(b, nh, 1, hs)


def masked_sdpa(q: Tensor, k: Tensor, v: Tensor, visible: Tensor, bias: Tensor | None = None,
                sink: Tensor | None = None, dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
    """sdpa with an explicit mask; q (B, nh, [blocks,] T, hs), k and v (B, nkv, [blocks,] S, hs), visible
    broadcastable to ([blocks,] T, S), bias to (nh, [1,] T, S) or None, scale the factor on q.k (None:
    1/sqrt(hs)). The sink is exact: one more key that every query sees, whose score is the head's sink logit
    and whose value is 0, built by giving q a channel of ones and that key the logit / scale in it (the scale
    stays the heads' own)."""
    hs = q.size(-1)
    scale = 1.0 / math.sqrt(hs) if scale is None else scale
    gqa = {"enable_gqa": True} if q.size(1) != k.size(1) else {}  # heads are dim 1, with or without blocks
    if gqa and q.dim() == 4 and q.size(2) == 1 and sink is None and bias is None and dropout_p == 0.0:
        return one_query_gqa(q, k, v, visible, scale)  # (1, S) mask: the same for every query head of a group
    if sink is not None:  # the sink key differs per query head: every query head gets its own keys
        k, v = expand_kv(k, q.size(1)), expand_kv(v, q.size(1))
        gqa = {}
        ones = q.new_ones(*q.shape[:-1], 1)
        q = torch.cat([q, ones], dim=-1)
        k = torch.cat([k, k.new_zeros(*k.shape[:-1], 1)], dim=-1)
        sink_key = k.new_zeros(*k.shape[:-2], 1, hs + 1)
        sink_key[..., -1] = (sink.to(k.dtype) * (1.0 / scale)).view(-1, *[1] * (k.dim() - 3))  # per head
        k = torch.cat([sink_key, k], dim=-2)
        v = torch.cat([v.new_zeros(*v.shape[:-2], 1, v.size(-1)), v], dim=-2)
        visible = torch.cat([visible.new_ones(*visible.shape[:-1], 1), visible], dim=-1)
        if bias is not None:
            bias = torch.cat([bias.new_zeros(*bias.shape[:-1], 1), bias], dim=-1)
    mask = visible if bias is None else bias.masked_fill(~visible, float("-inf")).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale, **gqa)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, k_pos: Tensor, window: int | None,
                    pe: PositionalEncoding, sink: Tensor | None, dropout_p: float, plain_causal: bool,
                    scale: float | None = None, causal: bool = True, attend_self: bool = True) -> Tensor:
    """The sdpa backend. plain_causal: the keys are positions 0..S-1 in order and no window hides any of them,
    so the kernel's own causal paths apply (and no T x S mask is built). scale: the factor on q.k (None:
    1/sqrt(hs)). causal=False (causal_mask="none"): every query sees every key, no mask at all (GPTConfig
    refuses it with a window or ALiBi). attend_self=False: an explicit mask without each query's own key
    (hide_self), so the kernel's causal shortcuts are never taken (GPTConfig refuses it with causal=False)."""
    t, s = q.size(-2), k.size(-2)
    gqa = {"enable_gqa": True} if q.size(1) != k.size(1) else {}
    if not causal:
        if sink is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, **gqa)
        everything = torch.ones(t, s, dtype=torch.bool, device=q.device)
        return masked_sdpa(q, k, v, everything, None, sink, dropout_p, scale)
    if pe.has_score_bias or sink is not None or not plain_causal or not attend_self:
        bias = pe.score_bias(pos, k_pos) if pe.has_score_bias else None
        visible = visible_keys(pos, k_pos, window)
        if not attend_self:
            visible = hide_self(visible, pos, k_pos)
        return masked_sdpa(q, k, v, visible, bias, sink, dropout_p, scale)
    if t == s:  # no cache, or a prefill into an empty one: the kernel's own causal path
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=scale, **gqa)
    if t == 1:  # one new token sees every cached key
        if gqa and dropout_p == 0.0:
            return one_query_gqa(q, k, v, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, **gqa)
    # is_causal aligns the mask top-left; queries that follow a cache need it aligned bottom-right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible_keys(pos, k_pos), dropout_p=dropout_p,
                                          scale=scale, **gqa)


def local_attention(q: Tensor, k: Tensor, v: Tensor, window: int, pe: PositionalEncoding,
                    sink: Tensor | None = None, dropout_p: float = 0.0, scale: float | None = None,
                    attend_self: bool = True) -> Tensor:
    """Sliding-window attention in blocks: queries in blocks of P = W, each block against the P keys before it
    and its own P, so (T / W) blocks of W x 2W scores: time and memory grow with T*W, not T*T. Equals
    masked_sdpa with visible_keys(pos, pos, W). q (B, nh, T, hs), k and v (B, nkv, T, hs) -> (B, nh, T, hs).

    sdpa with a dense window mask computes every one of the T x T scores (and on the CPU first turns the mask
    into a T x T float tensor), so it costs more than plain causal attention, not less.
    """
    b, nh, t, hs = q.shape
    p = window
    n = -(-t // p)  # blocks
    pad = n * p - t

    def blocks(x: Tensor) -> Tensor:  # (B, h, T, hs) -> (B, h, n, P, hs), zero-padded at the end
        return F.pad(x, (0, 0, 0, pad)).view(x.size(0), x.size(1), n, p, hs)

    def with_previous(x: Tensor) -> Tensor:  # (B, h, n, P, hs) -> (B, h, n, 2P, hs): the block before, then it
        return torch.cat([F.pad(x, (0, 0, 0, 0, 1, 0))[:, :, :-1], x], dim=3)

    qb = blocks(q)
    kb, vb = with_previous(blocks(expand_kv(k, nh))), with_previous(blocks(expand_kv(v, nh)))
    # query r of block i sits at i*P + r, key c of its 2P keys at i*P - P + c: relative positions P + r and c
    rel_q, rel_k = torch.arange(p, 2 * p, device=q.device), torch.arange(2 * p, device=q.device)
    visible = visible_keys(rel_q, rel_k, window).expand(n, p, 2 * p).clone()  # (n, P, 2P)
    visible[0, :, :p] = False  # the first block has nothing before it
    if not attend_self:  # after the line above, so that position 0 (alone in its row) keeps its own key
        visible = hide_self(visible, rel_q, rel_k)
    bias = pe.score_bias(rel_q, rel_k) if pe.has_score_bias else None  # ALiBi: relative, the same in every block
    bias = bias[:, None] if bias is not None else None  # (nh, 1, P, 2P) against (B, nh, n, P, 2P)
    y = masked_sdpa(qb, kb, vb, visible, bias, sink, dropout_p, scale)
    return y.reshape(b, nh, n * p, hs)[:, :, :t]


class KVCache:
    """Keys and values of every layer for the tokens seen so far; linear-attention layers keep running sums.

    A layer that sees every earlier key keeps them in a buffer of `max_len` positions: a forward pass writes its
    T new keys/values at [length, length + T). A windowed layer keeps only the last W, in a ring buffer of W slots
    (position p in slot p mod W) with each slot's position, so masks and ALiBi see true positions and decoding
    may go on past block_size. `advance(T)` after every layer has been updated. Buffers are allocated on first
    use, so they take the dtype the activations have (bf16 under autocast).
    """

    def __init__(self, n_layer: int, max_len: int, windows: list[int | None] | None = None):
        self.n_layer = n_layer
        self.max_len = max_len
        self.windows = windows or [None] * n_layer
        self.length = 0
        self.k: list[Tensor | None] = [None] * n_layer
        self.v: list[Tensor | None] = [None] * n_layer
        self.pos: list[Tensor | None] = [None] * n_layer  # ring layers: the position held in each slot
        self.state: list[object | None] = [None] * n_layer  # linear attention's (sum_j phi(k_j) v_j^T, sum_j phi(k_j))
        self._positions: Tensor | None = None  # 0..max_len-1, made once: decoding slices it rather than calling arange

    def positions(self, start: int, end: int, device: torch.device) -> Tensor:
        """The positions start..end-1 (end - start,), a view of one table made on first use (one token's step
        would otherwise build it in every layer); past max_len (a bounded cache decoding on) a new arange."""
        if end > self.max_len:
            return torch.arange(start, end, device=device)
        if self._positions is None or self._positions.device != device:
            self._positions = torch.arange(self.max_len, device=device)
        return self._positions[start:end]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store k, v (B, nkv, T, hs); return the keys and values the new queries attend over (B, nkv, S, hs)
        and their positions (S,)."""
        window = self.windows[layer]
        b, h, t, hs = k.shape
        if window is not None:
            return self._update_ring(layer, k, v, window)
        end = self.length + t
        if end > self.max_len:
            raise ValueError(
                f"KV cache holds at most {self.max_len} positions; {self.length} cached + {t} new do not fit. "
                "Call reset() and prefill the last block_size tokens."
            )
        keys, values = self.k[layer], self.v[layer]
        if keys is None or keys.shape[0] != b or keys.dtype != k.dtype:
            keys = self.k[layer] = k.new_empty(b, h, self.max_len, hs)
            values = self.v[layer] = v.new_empty(b, h, self.max_len, hs)
        keys.narrow(2, self.length, t).copy_(k)  # positions [length, end): one op each, no slice objects
        values.narrow(2, self.length, t).copy_(v)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end), self.positions(0, end, k.device)

    def _update_ring(self, layer: int, k: Tensor, v: Tensor, window: int) -> tuple[Tensor, Tensor, Tensor]:
        b, h, t, hs = k.shape
        if self.k[layer] is None or self.k[layer].shape[0] != b or self.k[layer].dtype != k.dtype or self.length == 0:
            self.k[layer] = k.new_zeros(b, h, window, hs)
            self.v[layer] = v.new_zeros(b, h, window, hs)
            self.pos[layer] = torch.full((window,), FAR, dtype=torch.long, device=k.device)
        ring_k, ring_v, ring_pos = self.k[layer], self.v[layer], self.pos[layer]
        new_pos = self.positions(self.length, self.length + t, k.device)
        if t > 1:  # a prefill: attend over what the ring holds and all new keys, then keep the last W
            out = (torch.cat([ring_k, k], dim=2), torch.cat([ring_v, v], dim=2), torch.cat([ring_pos, new_pos]))
        keep = min(t, window)
        slots = new_pos[-keep:] % window
        ring_k[:, :, slots] = k[:, :, -keep:]
        ring_v[:, :, slots] = v[:, :, -keep:]
        ring_pos[slots] = new_pos[-keep:]
        return out if t > 1 else (ring_k, ring_v, ring_pos.clone())

    def advance(self, t: int) -> None:
        self.length += t

    def reset(self) -> None:
        self.length = 0
        self.state = [None] * self.n_layer


def qkv_width(n_head: int, n_kv_head: int, head_size: int, qk_tied: bool = False) -> int:
    """c_attn's output channels: [q: nh heads | k: nkv heads | v: nkv heads], hs each; with qk_tied the k part
    is absent ([q | v], k = q), so each layer has C * nkv * hs weights (and nkv * hs biases) fewer."""
    return (n_head + (1 if qk_tied else 2) * n_kv_head) * head_size


def split_qkv(qkv: Tensor, n_head: int, n_kv_head: int, qk_tied: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """The fused projection's output (B, T, (nh + 2 nkv) hs), rows [q heads | k heads | v heads] -> q (B, nh, T, hs),
    k and v (B, nkv, T, hs): heads split from the channels. qk_tied: the output is (B, T, (nh + nkv) hs),
    rows [q heads | v heads] (nkv = nh), and k is q itself."""
    b, t, width = qkv.shape
    hs = width // (n_head + (1 if qk_tied else 2) * n_kv_head)
    if qk_tied:
        q, v = qkv.split([n_head * hs, n_kv_head * hs], dim=-1)
        q = q.view(b, t, n_head, hs).transpose(1, 2)
        return q, q, v.view(b, t, n_kv_head, hs).transpose(1, 2)
    q, k, v = qkv.split([n_head * hs, n_kv_head * hs, n_kv_head * hs], dim=-1)
    return (q.view(b, t, n_head, hs).transpose(1, 2), k.view(b, t, n_kv_head, hs).transpose(1, 2),
            v.view(b, t, n_kv_head, hs).transpose(1, 2))


def qkv_heads(qkv: Tensor, n_head: int, n_kv_head: int, qk_tied: bool, normed: bool, pe: PositionalEncoding,
              rotation: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
    """split_qkv, with QK-norm (normed) and the positions' rotation applied on the way: q (B, nh, T, hs), k and v
    (B, nkv, T, hs). The query and key heads lead the projection's channels, so they are normed and rotated as
    one (B, T, nh + nkv, hs) tensor: one call of each for all of them, not one per q and k (a one-token decoding
    step is a few dozen such small calls; docs/benchmarks.md)."""
    b, t, width = qkv.shape
    n_qk = n_head + (0 if qk_tied else n_kv_head)  # [q | k] heads ([q] with qk_tied: k is q)
    hs = width // (n_qk + n_kv_head)
    qk, v = qkv.split_with_sizes([n_qk * hs, n_kv_head * hs], dim=-1)  # (Tensor.split is a Python wrapper of it)
    qk = qk.view(b, t, n_qk, hs)
    if normed:
        qk = qk_norm(qk)
    if rotation is not None:
        qk = pe.rotate_heads(qk, rotation)
    qk = qk.transpose(1, 2)  # (B, nh + nkv, T, hs)
    q, k = (qk, qk) if qk_tied else qk.split_with_sizes([n_head, n_kv_head], dim=1)
    return q, k, v.view(b, t, n_kv_head, hs).transpose(1, 2)


def qk_norm(x: Tensor) -> Tensor:
    """Parameter-free RMS norm over the head channels: each q and k row gets RMS 1 (norm sqrt(hs)).

    Bounds every score |q.k| / sqrt(hs) by sqrt(hs), so no logit can grow without limit (QK-norm, Henry et al.
    2020; modded-nanogpt). Applied before RoPE, which preserves norms.
    """
    return F.rms_norm(x, (x.size(-1),))


class CausalSelfAttention(nn.Module):
    hooked = False  # True inside model.hooks.hooked(): the hook points are called
    explicit_path = False  # True there when scores or weights are read or edited: the explicit path runs

    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = cfg.n_head, cfg.kv_heads, cfg.head_size
        self.n_embd = cfg.n_embd
        self.backend = cfg.attn_backend
        self.dropout_p = cfg.dropout
        self.window = cfg.layer_window(layer)
        self.scale, self.causal_mask = cfg.score_scale, cfg.causal_mask
        self.qk_tied = cfg.qk_tied  # keys are the queries: c_attn has no key rows
        self.attend_self = cfg.attend_self  # False: a query's own key is hidden unless it is its only one
        self.uniform = cfg.attention == "uniform"  # q zeroed: weights 1 / (visible keys), the values averaged
        # a learner's attention(q, k, v) -> y in place of the built-in (learner_attention); set from outside
        # (attention_lab/exercises loads it from their file), never saved with the weights
        self.attn_fn = None
        # points to hook, no parameters (model/hooks.py): called only inside hooked(), which also makes the
        # explicit path run when the scores or weights are read or edited
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_scores, self.hook_pattern, self.hook_z = HookPoint(), HookPoint(), HookPoint()
        # q, k, v projections, fused: the output channels are [q: nh heads | k: nkv heads | v: nkv heads], hs each
        # ([q | v] with qk_tied)
        width = qkv_width(cfg.n_head, cfg.kv_heads, cfg.head_size, self.qk_tied)
        self.c_attn = nn.Linear(cfg.n_embd, width, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)  # output projection
        self.qk_norm = cfg.qk_norm
        self.sink = nn.Parameter(torch.zeros(cfg.n_head)) if cfg.attn_sinks else None  # one logit per head
        # value residual (Zhou et al. 2024, "ResFormer"): v <- lambda v + (1 - lambda) v_first, where v_first is
        # the first block's value of the same token; one learned lambda per block after the first
        self.value_lambda = nn.Parameter(torch.tensor(0.5)) if cfg.value_residual and layer > 0 else None

    def forward(
        self,
        x: Tensor,
        pe: PositionalEncoding,
        rotation: tuple[Tensor, Tensor] | None,
        pos: Tensor,
        kv_cache: KVCache | None = None,
        layer: int = 0,
        return_weights: bool = False,
        v_first: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """x (B, T, C); rotation: pe.rotation(pos) of x's positions (RoPE's cos/sin tables, else None), computed
        once per forward pass; pos (T,) x's positions; v_first (B, nkv, T, hs) the first block's values of these
        tokens (used with value_residual).

        Returns y (B, T, C), the attention weights (B, nh, T, S) when return_weights (else None), and this
        block's values of the new tokens before any mixing, (B, nkv, T, hs).
        """
        b, t, c = x.shape
        # the heads split from the channels, each q and k RMS-normed (qk_norm), then rotated by position (RoPE)
        q, k, v = qkv_heads(self.c_attn(x), self.n_head, self.n_kv_head, self.qk_tied, self.qk_norm, pe, rotation)
        if self.uniform:  # every score 0, so each row's softmax is uniform over its visible keys; no gradient to q, k
            q, k = torch.zeros_like(q), k.detach()
        v_own = v
        if self.value_lambda is not None and v_first is not None:
            v = self.value_lambda * v + (1.0 - self.value_lambda) * v_first
        hooked = self.hooked
        if hooked:
            q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        k_pos = pos
        if kv_cache is not None:
            k, v, k_pos = kv_cache.update(layer, k, v)  # (B, nkv, S, hs), (S,)
        dropout_p = self.dropout_p if self.training else 0.0

        weights = None
        if self.attn_fn is not None:
            explicit = hooked and self.explicit_path
            y, weights = learner_attention(self.attn_fn, q, k, v, return_weights or explicit,
                                           self.hook_scores if explicit else None, self.hook_pattern if hooked else None)
        elif return_weights or (hooked and self.explicit_path) or self.backend == "math" or self.causal_mask == "after_softmax":
            visible = visible_keys(pos, k_pos, self.window)
            if self.causal_mask == "none":  # every key, the later ones too (GPTConfig refuses it with a window)
                visible = torch.ones_like(visible)
            if not self.attend_self:  # GPTConfig allows it with causal_mask before_softmax only
                visible = hide_self(visible, pos, k_pos)
            bias = pe.score_bias(pos, k_pos) if pe.has_score_bias else None
            y, weights = math_attention(q, k, v, visible, bias, self.sink, dropout_p, self.scale, self.causal_mask,
                                        self.hook_scores if hooked else None, self.hook_pattern if hooked else None)
        elif self.window is not None and kv_cache is None and t > self.window:
            y = local_attention(q, k, v, self.window, pe, self.sink, dropout_p, self.scale, self.attend_self)
        else:  # a ring buffer's keys are out of order and may hold empty slots: only a full layer is plain
            plain = self.window is None or (kv_cache is None and t <= self.window)
            y = fused_attention(q, k, v, pos, k_pos, self.window, pe, self.sink, dropout_p, plain, self.scale,
                                causal=self.causal_mask != "none", attend_self=self.attend_self)
        if hooked:
            y = self.hook_z(y)  # (B, nh, T, hs): each head's output
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # re-assemble heads side by side: (B, T, C)
        y = dropout(self.c_proj(y), self.dropout_p, self.training)
        return y, (weights if return_weights else None), v_own
