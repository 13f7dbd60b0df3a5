"""The project's own answers, in plain torch, as a learner would write them (`python -m attention_lab.exercises
solution NAME` prints one). The checks do not use these: they compare with the model's own functions
(model/attention.py, model/positions.py); tests/test_exercises.py checks that every answer passes."""

import math

import torch


def scores(q, k):
    """q (B, nh, T, hs), k (B, nh, S, hs) -> (B, nh, T, S)."""
    d_k = q.size(-1)
    return q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, nh, T, S): query i's score for key j


def mask(scores):
    """scores (B, nh, T, T) -> the same, -inf where the key comes after the query."""
    t = scores.size(-1)
    future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(diagonal=1)  # (T, T): key j > query i
    return scores.masked_fill(future, float("-inf"))


def attention(q, k, v):
    """q, k, v (B, nh, T, hs) -> (B, nh, T, hs): softmax(mask(q k^T / sqrt(hs))) v in each head."""
    t = q.size(-2)
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, nh, T, T)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(diagonal=1)
    s = s.masked_fill(future, float("-inf"))  # -inf before the softmax: a hidden key's weight is exactly 0
    weights = torch.softmax(s, dim=-1)  # over the keys: each query's row sums to 1
    return weights @ v  # (B, nh, T, hs): each query's weighted average of the values


def multi_head(x, w_qkv, b_qkv, w_proj, b_proj, n_head):
    """x (B, T, C) -> (B, T, C): project, split into heads, attend in each, concatenate, project."""
    b, t, c = x.shape
    hs = c // n_head
    qkv = x @ w_qkv.T + b_qkv  # (B, T, 3C)
    q, k, v = qkv.split(c, dim=-1)  # (B, T, C) each
    # (B, T, C) -> (B, T, nh, hs) -> (B, nh, T, hs): the transpose puts the heads before the positions
    q, k, v = (z.view(b, t, n_head, hs).transpose(1, 2) for z in (q, k, v))
    y = attention(q, k, v)  # (B, nh, T, hs)
    y = y.transpose(1, 2).reshape(b, t, c)  # heads side by side again: head h at channels h*hs:(h+1)*hs
    return y @ w_proj.T + b_proj


def sinusoidal(n_positions, dim):
    """-> (n_positions, dim) float32: PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(the same)."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)  # (ceil(dim/2),): 0, 2, 4, ...
    angle = pos / 10000 ** (two_i / dim)  # (P, ceil(dim/2))
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)  # even channels: sines
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])  # odd channels: cosines (an odd dim has one fewer)
    return table.float()


def rope(x, pos, base=10000.0):
    """x (B, nh, T, hs), pos (T,) -> x with each channel pair (i, i + hs/2) rotated by pos * base^(-2i/hs)."""
    hs = x.size(-1)
    inv_freq = 1.0 / base ** (torch.arange(0, hs, 2, dtype=torch.float32, device=x.device) / hs)  # (hs/2,)
    angle = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, hs/2)
    angle = torch.cat((angle, angle), dim=-1)  # (T, hs): channel i and i + hs/2 share an angle
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)  # (x1, x2) -> (-x2, x1): a quarter turn of every pair
    return x * cos + rotated * sin


def rope_adjacent(x, pos, base=10000.0):
    """The other convention (RoFormer, GPT-J): pairs (2i, 2i + 1) of neighbouring channels, the same angles."""
    hs = x.size(-1)
    inv_freq = 1.0 / base ** (torch.arange(0, hs, 2, dtype=torch.float32, device=x.device) / hs)
    angle = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, hs/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, hs/2) each
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def decode(q, k, v, k_cache, v_cache):
    """q, k, v (B, nh, 1, hs) the new token's; caches (B, nh, S, hs) -> y (B, nh, 1, hs), caches (B, nh, S+1, hs)."""
    k_cache = torch.cat([k_cache, k], dim=2)  # append first: the new token sees itself
    v_cache = torch.cat([v_cache, v], dim=2)
    s = (q @ k_cache.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, 1, S+1): no mask, every key is earlier
    y = torch.softmax(s, dim=-1) @ v_cache
    return y, k_cache, v_cache
