"""Masked multi-head self-attention, written out, plus the KV cache it reads during decoding.

Shapes: B batch, T new (query) tokens, S keys = tokens cached before + T, C n_embd, nh n_head, hs = C // nh.

Two backends compute the same function:
  math  the explicit reference: softmax(mask(QK^T / sqrt(hs) + bias)) V; can hand back the weights.
  sdpa  torch's fused scaled_dot_product_attention (flash / memory-efficient kernels on GPU).
Asking for the weights always runs `math`, so capture never slows ordinary training, which runs `sdpa`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import GPTConfig
from .positions import PositionalEncoding


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout while training with p > 0; otherwise x itself, with no call at all. A function, not a module:
    decoding runs the model once per token, and each module call costs a few microseconds of Python (removing
    the 18 pass-through modules made cached decoding 7% faster on a 2-core AMD EPYC)."""
    return F.dropout(x, p, training=True) if training and p > 0 else x


def causal_mask(t: int, s: int, device: torch.device) -> Tensor:
    """(T, S) bool, True where query i may see key j: the T queries are the last T of the S positions."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def math_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """q (B, nh, T, hs), k and v (B, nh, S, hs), bias (nh, T, S) or None -> y (B, nh, T, hs), weights (B, nh, T, S)."""
    t, s = q.size(-2), k.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, S)
    if bias is not None:
        scores = scores + bias
    # -inf before the softmax makes every future key's weight exactly 0
    scores = scores.masked_fill(~causal_mask(t, s, q.device), float("-inf"))
    weights = F.softmax(scores, dim=-1)  # (B, nh, T, S), each row sums to 1
    y = dropout(weights, dropout_p, training=True) @ v  # (B, nh, T, hs); the caller passes 0 in eval
    return y, weights


def fused_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dropout_p: float) -> Tensor:
    t, s = q.size(-2), k.size(-2)
    if bias is not None:
        mask = bias.masked_fill(~causal_mask(t, s, q.device), float("-inf")).to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if t == s:  # no cache, or a prefill into an empty one: the kernel's own causal path
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    if t == 1:  # one new token sees every cached key
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    # is_causal aligns the mask top-left; queries that follow a cache need it aligned bottom-right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t, s, q.device), dropout_p=dropout_p)


class KVCache:
    """Keys and values of every layer for the tokens seen so far, preallocated to `max_len` positions.

    A forward pass writes its T new keys/values at [length, length + T) in every layer, then `advance(T)`.
    The buffers are allocated on first use so they take the dtype the activations have (bf16 under autocast).
    """

    def __init__(self, n_layer: int, max_len: int):
        self.n_layer = n_layer
        self.max_len = max_len
        self.length = 0
        self.k: list[Tensor | None] = [None] * n_layer
        self.v: list[Tensor | None] = [None] * n_layer

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, nh, T, hs) after the cached ones; return all keys and values (B, nh, S, hs)."""
        b, nh, t, hs = k.shape
        end = self.length + t
        if end > self.max_len:
            raise ValueError(
                f"KV cache holds at most {self.max_len} positions; {self.length} cached + {t} new do not fit. "
                "Call reset() and prefill the last block_size tokens."
            )
        if self.k[layer] is None or self.k[layer].shape[0] != b or self.k[layer].dtype != k.dtype:
            self.k[layer] = k.new_empty(b, nh, self.max_len, hs)
            self.v[layer] = v.new_empty(b, nh, self.max_len, hs)
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, t: int) -> None:
        self.length += t

    def reset(self) -> None:
        self.length = 0


def qk_norm(x: Tensor) -> Tensor:
    """Parameter-free RMS norm over the head channels: each q and k row gets RMS 1 (norm sqrt(hs)).

    Bounds every score |q.k| / sqrt(hs) by sqrt(hs), so no logit can grow without limit (QK-norm, Henry et al.
    2020; modded-nanogpt). Applied before RoPE, which preserves norms.
    """
    return F.rms_norm(x, (x.size(-1),))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.backend = cfg.attn_backend
        self.dropout_p = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v projections, fused
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)  # output projection
        self.qk_norm = cfg.qk_norm
        # value residual (Zhou et al. 2024, "ResFormer"): v <- lambda v + (1 - lambda) v_first, where v_first is
        # the first block's value of the same token; one learned lambda per block after the first
        self.value_lambda = nn.Parameter(torch.tensor(0.5)) if cfg.value_residual and layer > 0 else None

    def forward(
        self,
        x: Tensor,
        pe: PositionalEncoding,
        rotation: tuple[Tensor, Tensor] | None,
        bias: Tensor | None = None,
        kv_cache: KVCache | None = None,
        layer: int = 0,
        return_weights: bool = False,
        v_first: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """x (B, T, C); rotation: pe.rotation(pos) of x's positions (RoPE's cos/sin tables, else None), computed
        once per forward pass; bias (nh, T, S) additive score bias or None;
        v_first (B, nh, T, hs) the first block's values of these tokens (used with value_residual).

        Returns y (B, T, C), the attention weights (B, nh, T, S) when return_weights (else None), and this
        block's values of the new tokens before any mixing, (B, nh, T, hs).
        """
        b, t, c = x.shape
        qkv = self.c_attn(x).view(b, t, 3, self.n_head, c // self.n_head)  # (B, T, 3, nh, hs)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, nh, T, hs): heads split from the channels
        if self.qk_norm:
            q, k = qk_norm(q), qk_norm(k)
        q, k = pe.rotate_qk(q, k, rotation)
        v_own = v
        if self.value_lambda is not None and v_first is not None:
            v = self.value_lambda * v + (1.0 - self.value_lambda) * v_first
        if kv_cache is not None:
            k, v = kv_cache.update(layer, k, v)  # (B, nh, S, hs)

        weights = None
        dropout_p = self.dropout_p if self.training else 0.0
        if return_weights or self.backend == "math":
            y, weights = math_attention(q, k, v, bias, dropout_p)
        else:
            y = fused_attention(q, k, v, bias, dropout_p)
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # re-assemble heads side by side: (B, T, C)
        y = dropout(self.c_proj(y), self.dropout_p, self.training)
        return y, (weights if return_weights else None), v_own
