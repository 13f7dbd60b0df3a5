"""Positional encodings behind one interface.

A Transformer's attention is permutation-invariant: without position information "dog bites man" and
"man bites dog" look the same. Each encoding below injects position at exactly one of three places:

    embed(pos)              -> (T, C) added to the token embeddings       learned, sinusoidal
    rotate(x, pos)          -> x rotated by position, applied to q and k   rope
    score_bias(q_pos, k_pos)-> (nh, Tq, Tk) added to the attention scores  alibi

and is a no-op at the other two. `pos` holds absolute token positions, int64 of shape (T,).

The model splits rotation in two so the angles are computed once per forward pass, not twice per layer:
`rotation(pos)` once (RoPE: the (T, hs) cos and sin tables; None elsewhere), then `rotate_heads(x, tables)` in
every layer, rotating its query and key heads side by side, x (B, T, heads, hs), in one pass. `rotate(x, pos)` is both at once, for a single tensor.

Shapes: B batch, T query length, S key length, C n_embd, nh n_head, hs head size = C // nh.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from .config import GPTConfig


class PositionalEncoding(nn.Module):
    """Base class: adds no position information anywhere ("none" = NoPE)."""

    has_score_bias = False  # lets the model skip building key positions when score_bias returns None

    def embed(self, pos: Tensor) -> Tensor | None:
        return None

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        return x

    def rotation(self, pos: Tensor, span: tuple[int, int] | None = None) -> tuple[Tensor, Tensor] | None:
        return None

    def rotate_heads(self, x: Tensor, tables: tuple[Tensor, Tensor] | None) -> Tensor:
        return x

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return None


class LearnedPositions(PositionalEncoding):
    """GPT-2: one trained vector per position, stored as `wpe.weight` (block_size, C)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.block_size, cfg.n_embd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def embed(self, pos: Tensor) -> Tensor:
        return self.weight[pos]  # (T, C)


def sinusoidal_table(n_positions: int, dim: int) -> Tensor:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = pos / torch.pow(10000.0, two_i / dim)  # (P, ceil(d/2))
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])  # an odd d has one fewer cosine column
    return table.float()


# The table's entries are +-1 (each coordinate's RMS 1/sqrt(2)) while the token embeddings start at std 0.02: at
# unit scale the positions drown the words (the claims preset at 600 steps, trainer's validation: 3.83 bits/byte
# at scale 1, 3.21 at 0.2 after 400 steps, 2.70 at this scale, where learned positions reach about 2.69). Vaswani
# et al. scale the embeddings up by sqrt(d_model) instead; this model keeps GPT-2's 0.02 initialisation, so the
# table is scaled down to it: each coordinate's RMS is 0.02 at the start, like a learned table's. The GPT-2
# export writes this scaled table as `wpe`, so it stays exact.
SINUSOID_SCALE = 0.02 * math.sqrt(2.0)


def sinusoidal_embedding(n_positions: int, dim: int) -> Tensor:
    """The table SinusoidalPositions adds: sinusoidal_table scaled to the embeddings' initial size."""
    return SINUSOID_SCALE * sinusoidal_table(n_positions, dim)


class SinusoidalPositions(PositionalEncoding):
    """Fixed sinusoids added to the token embeddings; nothing to train."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        # non-persistent: derived from the config, so it is neither saved nor expected in checkpoints
        self.register_buffer("table", sinusoidal_embedding(cfg.block_size, cfg.n_embd), persistent=False)

    def embed(self, pos: Tensor) -> Tensor:
        return self.table[pos]  # (T, C)


class RotaryPositions(PositionalEncoding):
    """RoPE (Su et al. 2021): rotate each (i, i + hs/2) channel pair of q and k by angle pos * base^(-2i/hs).

    The dot product of a query rotated by angle a and a key rotated by angle b depends only on a - b, so the
    attention scores depend on relative position alone. Rotate-half pairing, as in GPT-NeoX and Llama.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_size, self.base, self.block_size = cfg.head_size, cfg.rope_base, cfg.block_size
        # non-persistent buffers, derived from the config: the frequencies, and the tables of positions
        # 0..block_size-1 made once (a decoding step reads its one row rather than computing five small ops)
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)
        self.register_buffer("cos_table", torch.empty(0), persistent=False)
        self.register_buffer("sin_table", torch.empty(0), persistent=False)
        self._make_tables(torch.float32, torch.device("cpu"))

    def _make_tables(self, dtype: torch.dtype, device: torch.device) -> None:
        hs = self.head_size
        self.inv_freq = 1.0 / (self.base ** (torch.arange(0, hs, 2, dtype=dtype, device=device) / hs))  # (hs/2,)
        self.cos_table, self.sin_table = self.angles(torch.arange(self.block_size, device=device))

    def _apply(self, fn, recurse=True):
        """Module.to / .half() / .double() cast every floating buffer: here the angles are made again instead, in
        float32 (float64 when the model is cast to it), on the new device. A bf16 copy of the weights (decoding's)
        would otherwise rotate by angles rounded to 3 significant digits, wrong by radians at position 500."""
        super()._apply(fn, recurse)
        self._make_tables(torch.float64 if self.inv_freq.dtype == torch.float64 else torch.float32,
                          self.inv_freq.device)
        return self

    def angles(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """The (T, hs) cos and sin of every channel pair's angle, in float32 whatever the activations' dtype."""
        angle = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]  # (T, hs/2)
        angle = torch.cat((angle, angle), dim=-1)  # (T, hs): channel i and i + hs/2 share an angle
        return angle.cos(), angle.sin()

    def rotation(self, pos: Tensor, span: tuple[int, int] | None = None) -> tuple[Tensor, Tensor]:
        """angles(pos). span (start, end): pos is start..end-1, which the caller knows without reading pos; inside
        the tables, their rows are returned (views)."""
        if span is not None and span[1] <= self.cos_table.size(0):
            return self.cos_table[span[0]:span[1]], self.sin_table[span[0]:span[1]]
        return self.angles(pos)

    @staticmethod
    def _turn(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.size(-1) // 2
        rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (..., T, hs)
        return x * cos + rotated_half * sin

    def rotate_heads(self, x: Tensor, tables: tuple[Tensor, Tensor]) -> Tensor:
        # x: (B, T, heads, hs), the query and key heads side by side: the tables (T, hs) broadcast over the heads
        cos, sin = (t.to(x.dtype)[:, None] for t in tables)
        return self._turn(x, cos, sin)

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        cos, sin = (t.to(x.dtype) for t in self.angles(pos))
        return self._turn(x, cos, sin)


def alibi_slopes(n_head: int) -> Tensor:
    """The head slopes of Press et al. (2022): a geometric sequence starting at 2^(-8/n).

    For a head count that is not a power of two, the paper takes the slopes of the nearest lower power of two
    and fills the rest with every other slope of the next power of two.
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        slopes = power_of_two(n_head)
    else:
        closest = 2 ** math.floor(math.log2(n_head))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBiPositions(PositionalEncoding):
    """ALiBi: no embeddings; each head penalises a key linearly with its distance to the query."""

    has_score_bias = True

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(cfg.n_head), persistent=False)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        distance = (k_pos[None, :] - q_pos[:, None]).to(torch.float32)  # (Tq, Tk), <= 0 for visible keys
        return self.slopes[:, None, None] * distance[None]  # (nh, Tq, Tk)


POSITIONAL_ENCODINGS: dict[str, type[PositionalEncoding]] = {
    "learned": LearnedPositions,
    "sinusoidal": SinusoidalPositions,
    "rope": RotaryPositions,
    "alibi": ALiBiPositions,
    "none": PositionalEncoding,
}


def build_positional_encoding(cfg: GPTConfig) -> PositionalEncoding:
    cls = POSITIONAL_ENCODINGS[cfg.pos_encoding]
    return cls() if cls is PositionalEncoding else cls(cfg)
