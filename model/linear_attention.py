"""Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): softmax's exp(q.k) replaced by
a feature map's dot product phi(q).phi(k), with phi(x) = elu(x) + 1 > 0, so the sum over keys factors:

    y_i = phi(q_i)^T S_i / (phi(q_i)^T z_i),   S_i = sum_{j<=i} phi(k_j) v_j^T  (hs x hs),   z_i = sum_{j<=i} phi(k_j)

Training cost grows with T (not T^2) and decoding keeps a constant-size state (S, z) instead of every key.
The weights it implies, w_ij = phi(q_i).phi(k_j) / sum_{j'<=i} phi(q_i).phi(k_j'), are what the maps show.
Options, as current practice: no denominator (y_i = phi(q_i)^T S_i), and an RMS norm of each head's output.

Shapes: B batch, nh heads, T tokens, hs head size, L chunk length, n chunks.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import KVCache, dropout, expand_kv, qkv_heads, qkv_width
from .config import GPTConfig
from .hooks import HookPoint
from .positions import PositionalEncoding

CHUNK = 64  # training: exact quadratic attention inside a chunk, running sums between chunks
EPS = 1e-6  # keeps the denominator away from 0 (phi > 0 makes it positive; this guards underflow)


def feature_map(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0


def implied_weights(q: Tensor, k: Tensor, denominator: bool = True) -> Tensor:
    """(B, nh, T, T): the normalised weights phi(q_i).phi(k_j) / sum_j' ..., 0 for future keys (rows sum to 1,
    also without the denominator: the maps show where the mass goes)."""
    a = (feature_map(q) @ feature_map(k).transpose(-2, -1)).tril()  # (B, nh, T, T), masked: future keys 0
    return a / a.sum(-1, keepdim=True).clamp_min(EPS)


def recurrent(q: Tensor, k: Tensor, v: Tensor, denominator: bool = True,
              state: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The reference: one token at a time. q, k, v (B, nh, T, hs) -> y (B, nh, T, hs) and the final state
    (S (B, nh, hs, hs), z (B, nh, hs)); `state` continues from an earlier call (decoding)."""
    fq, fk = feature_map(q), feature_map(k)
    b, h, t, hs = q.shape
    s, z = state if state is not None else (q.new_zeros(b, h, hs, v.size(-1)), q.new_zeros(b, h, hs))
    out = []
    for i in range(t):
        s = s + fk[:, :, i, :, None] * v[:, :, i, None, :]  # += phi(k_i) v_i^T
        z = z + fk[:, :, i]
        num = (fq[:, :, i, None, :] @ s)[:, :, 0]  # (B, nh, hs)
        if denominator:
            num = num / (fq[:, :, i] * z).sum(-1, keepdim=True).clamp_min(EPS)
        out.append(num)
    return torch.stack(out, dim=2), (s, z)


def chunked(q: Tensor, k: Tensor, v: Tensor, denominator: bool = True, chunk: int = CHUNK) -> Tensor:
    """Training form, equal to `recurrent`: inside each chunk of L tokens the masked L x L products, plus what
    every earlier chunk contributes through its summed phi(k) v^T (a prefix sum over chunks). O(T L hs + T hs^2)."""
    b, h, t, hs = q.shape
    n = -(-t // chunk)
    pad = n * chunk - t
    fq, fk = (F.pad(feature_map(x), (0, 0, 0, pad)).view(b, h, n, chunk, hs) for x in (q, k))
    vv = F.pad(v, (0, 0, 0, pad)).view(b, h, n, chunk, v.size(-1))
    if pad:  # padded keys must add nothing to the sums (phi(0) = 1, not 0)
        valid = (torch.arange(n * chunk, device=q.device) < t).view(n, chunk, 1).to(fk.dtype)
        fk = fk * valid
    kv = fk.transpose(-2, -1) @ vv  # (B, nh, n, hs, hs): each chunk's sum of phi(k) v^T
    s_before = kv.cumsum(2) - kv  # the sums of every chunk before this one
    z_before = fk.sum(3).cumsum(2) - fk.sum(3)  # (B, nh, n, hs)
    intra = (fq @ fk.transpose(-2, -1)).tril()  # (B, nh, n, L, L), causal inside the chunk
    num = intra @ vv + fq @ s_before
    if denominator:
        den = intra.sum(-1) + (fq * z_before[:, :, :, None, :]).sum(-1)
        num = num / den[..., None].clamp_min(EPS)
    return num.reshape(b, h, n * chunk, -1)[:, :, :t]


class LinearAttention(nn.Module):
    """The attention block with linear attention: the same projections (c_attn, c_proj; grouped-query heads
    allowed; qk_tied: k = q) as CausalSelfAttention, another mixing of the values. There is no softmax and no
    scale: GPTConfig refuses attn_scale and causal_mask other than their defaults with it."""

    hooked = False  # True inside model.hooks.hooked(): the hook points are called
    explicit_path = False  # True there when the implied weights are read

    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = cfg.n_head, cfg.kv_heads, cfg.head_size
        self.dropout_p = cfg.dropout
        self.denominator, self.out_norm = cfg.linear_denominator, cfg.linear_out_norm
        self.qk_tied = cfg.qk_tied  # keys are the queries: c_attn has no key rows
        width = qkv_width(cfg.n_head, cfg.kv_heads, cfg.head_size, self.qk_tied)
        self.c_attn = nn.Linear(cfg.n_embd, width, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.value_lambda = nn.Parameter(torch.tensor(0.5)) if cfg.value_residual and layer > 0 else None
        self.qk_norm = cfg.qk_norm
        # points to hook (model/hooks.py); no hook_scores (no softmax), and hook_pattern only reads: the output
        # is computed from the running sums, not from the implied weights
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_pattern, self.hook_z = HookPoint(), HookPoint()

    def forward(self, x: Tensor, pe: PositionalEncoding, rotation, pos: Tensor, kv_cache: KVCache | None = None,
                layer: int = 0, return_weights: bool = False, v_first: Tensor | None = None):
        """As CausalSelfAttention.forward; the weights returned are the implied normalised ones (B, nh, T, T).
        With a kv_cache the layer keeps (S, z) in it and continues from them: constant work per token."""
        b, t, c = x.shape
        q, k, v = qkv_heads(self.c_attn(x), self.n_head, self.n_kv_head, self.qk_tied, self.qk_norm, pe, None)
        v_own = v
        if self.value_lambda is not None and v_first is not None:
            v = self.value_lambda * v + (1.0 - self.value_lambda) * v_first
        hooked = self.hooked
        if hooked:
            q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        k, v = expand_kv(k, self.n_head), expand_kv(v, self.n_head)
        if kv_cache is not None and (kv_cache.state[layer] is not None or t == 1):
            y, kv_cache.state[layer] = recurrent(q, k, v, self.denominator, kv_cache.state[layer])
        elif kv_cache is not None:  # a prefill: the chunked form, then the state its sums leave
            y = chunked(q, k, v, self.denominator)
            fk = feature_map(k)
            kv_cache.state[layer] = (fk.transpose(-2, -1) @ v, fk.sum(2))
        else:
            y = chunked(q, k, v, self.denominator)
        if self.out_norm:
            y = F.rms_norm(y, (y.size(-1),))
        weights = None
        if (return_weights or (hooked and self.explicit_path)) and kv_cache is None:
            weights = implied_weights(q, k, self.denominator)
            if hooked:
                weights = self.hook_pattern(weights)
        if hooked:
            y = self.hook_z(y)  # (B, nh, T, hs): each head's output
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return dropout(self.c_proj(y), self.dropout_p, self.training), (weights if return_weights else None), v_own
