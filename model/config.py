"""GPTConfig: the model's hyperparameters, validated when built.

Names follow GPT-2 (n_layer, n_head, n_embd, block_size) so configs and weights map onto Hugging Face's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

POSITION_ENCODINGS = ("learned", "sinusoidal", "rope", "alibi", "none")
ATTENTION_BACKENDS = ("math", "sdpa")
MLP_ACTIVATIONS = ("gelu", "relu2")
ATTENTION_KINDS = ("softmax", "linear", "uniform")
ATTN_SCALES = ("sqrt", "none", "inverse")  # the factor on q.k: 1/sqrt(hs), 1, 1/hs
CAUSAL_MASKS = ("before_softmax", "after_softmax", "none")
QK_INITS = ("normal", "unit")  # c_attn's q and k rows: GPT-2's N(0, 0.02) | N(0, 1/n_embd), unit-variance q and k


@dataclass
class GPTConfig:
    vocab_size: int = 4096
    block_size: int = 256  # longest context the model attends over
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2
    pos_encoding: str = "learned"
    attn_backend: str = "sdpa"  # "math" is the explicit reference; "sdpa" the fused kernel
    tie_embeddings: bool = True  # lm_head shares the token embedding matrix
    mlp_ratio: float = 4  # the MLP's hidden width is mlp_ratio * n_embd (a whole number: 4.5 x 128 = 576)
    rope_base: float = 10000.0
    layer_norm_eps: float = 1e-5
    # recipe options (modded-nanogpt's list); each default is GPT-2's behaviour
    qk_norm: bool = False  # RMS-normalise q and k over the head channels (no parameters), before RoPE
    mlp_act: str = "gelu"  # "gelu" (GPT-2's tanh approximation) or "relu2" (relu(x)^2)
    logit_softcap: float = 0.0  # > 0: logits = c * tanh(logits / c), bounded in (-c, c); 0 = off
    zero_init_proj: bool = False  # attention and MLP output projections (c_proj) start at zero
    value_residual: bool = False  # blocks after the first mix in the first block's values (learned weight)
    # attention variants (model/attention.py, model/linear_attention.py); each default is full multi-head softmax
    n_kv_head: int = 0  # key/value heads, grouped-query attention: 0 = n_head (multi-head), 1 = multi-query
    window: int = 0  # sliding window: query i sees keys i-W < j <= i; 0 = every earlier key
    window_pattern: str = ""  # per layer, repeated: L local (the window), G global; "" = every layer local
    attn_sinks: bool = False  # a learned logit per head joins the softmax's denominator (gpt-oss's sinks)
    attention: str = "softmax"  # softmax | linear: causal linear attention with elu+1 features | uniform: each
    #   query's weights are 1/(keys it sees), the prefix's values averaged (q zeroed; q, k kept, no gradient)
    linear_denominator: bool = True  # linear: divide by phi(q) . sum_j phi(k_j) (False: no normaliser)
    linear_out_norm: bool = False  # linear: RMS-normalise each head's output (what recent linear models do)
    # experiment switches (model/attention.py), to test what the tutorials claim; each default is GPT-2's attention
    attn_scale: str = "sqrt"  # scores = q.k * 1/sqrt(hs) | "none": * 1 | "inverse": * 1/hs
    causal_mask: str = "before_softmax"  # future keys -inf before the softmax | "after_softmax": softmax over
    #   every key, then the future keys' weights set to 0 (rows sum to < 1) | "none": every key seen, no mask
    qk_tied: bool = False  # one projection for queries and keys: k = q (c_attn outputs [q | v]), q_i.q_j symmetric
    attend_self: bool = True  # False: a query never sees its own key unless it sees no other (Reformer's rule)
    qk_init: str = "normal"  # c_attn's q, k rows N(0, 0.02) | "unit": N(0, 1/n_embd), so q, k start at variance 1

    @property
    def mlp_hidden(self) -> int:
        """The MLP's hidden width: mlp_ratio * n_embd."""
        return int(round(self.mlp_ratio * self.n_embd))

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        ratio = self.mlp_ratio
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not ratio > 0 \
                or float(ratio * self.n_embd) != round(ratio * self.n_embd):
            raise ValueError(f"GPTConfig.mlp_ratio must be a positive number with mlp_ratio * n_embd a whole number "
                             f"(the MLP's width), got {ratio!r} with n_embd {self.n_embd}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"each head gets n_embd / n_head channels. Try n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))}."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.pos_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"GPTConfig.pos_encoding must be one of {', '.join(POSITION_ENCODINGS)}; got {self.pos_encoding!r}"
            )
        if self.attn_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"GPTConfig.attn_backend must be one of {', '.join(ATTENTION_BACKENDS)}; got {self.attn_backend!r}"
            )
        if self.pos_encoding == "rope" and self.head_size % 2 != 0:
            raise ValueError(
                f"GPTConfig.pos_encoding='rope' rotates channel pairs, so the head size n_embd/n_head must be even; "
                f"got {self.n_embd}/{self.n_head} = {self.head_size}"
            )
        if self.rope_base <= 0:
            raise ValueError(f"GPTConfig.rope_base must be positive, got {self.rope_base!r}")
        if self.mlp_act not in MLP_ACTIVATIONS:
            raise ValueError(f"GPTConfig.mlp_act must be one of {', '.join(MLP_ACTIVATIONS)}; got {self.mlp_act!r}")
        if isinstance(self.logit_softcap, bool) or not self.logit_softcap >= 0:
            raise ValueError(f"GPTConfig.logit_softcap must be >= 0 (0 turns it off), got {self.logit_softcap!r}")
        for name in ("qk_norm", "zero_init_proj", "value_residual"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPTConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"GPTConfig.layer_norm_eps must be positive, got {self.layer_norm_eps!r}")
        self._check_variants()
        self._check_switches()

    def _check_variants(self) -> None:
        if isinstance(self.n_kv_head, bool) or not isinstance(self.n_kv_head, int) or self.n_kv_head < 0 or (
                self.n_kv_head and self.n_head % self.n_kv_head):
            divisors = [d for d in range(1, self.n_head + 1) if self.n_head % d == 0]
            raise ValueError(f"GPTConfig.n_kv_head must divide n_head={self.n_head} (one of {divisors}; 0 = n_head), "
                             f"got {self.n_kv_head!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"GPTConfig.window must be an integer >= 0 (0 = no window), got {self.window!r}")
        if self.window_pattern and (set(self.window_pattern) - {"L", "G"} or not self.window):
            raise ValueError(f"GPTConfig.window_pattern must be letters L (local) and G (global), e.g. LLLG, and "
                             f"needs a window > 0; got {self.window_pattern!r} with window={self.window}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"GPTConfig.attention must be one of {', '.join(ATTENTION_KINDS)}; got {self.attention!r}")
        for name in ("attn_sinks", "linear_denominator", "linear_out_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPTConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.attention == "linear":
            clash = [f"window={self.window}"] if self.window else []
            clash += ["attn_sinks=true"] if self.attn_sinks else []
            clash += [f"pos_encoding={self.pos_encoding}"] if self.pos_encoding in ("rope", "alibi") else []
            if clash:
                raise ValueError(f"GPTConfig.attention='linear' has no softmax scores to window, sink or bias and "
                                 f"its elu+1 features are not rotated: it cannot be combined with {', '.join(clash)}; "
                                 "use pos_encoding learned, sinusoidal or none, window 0, attn_sinks false")

    def _check_switches(self) -> None:
        """The experiment switches: each value, then the combinations whose meaning is not defined."""
        if self.attn_scale not in ATTN_SCALES:
            raise ValueError(f"GPTConfig.attn_scale must be one of {', '.join(ATTN_SCALES)}; got {self.attn_scale!r}")
        if self.causal_mask not in CAUSAL_MASKS:
            raise ValueError(f"GPTConfig.causal_mask must be one of {', '.join(CAUSAL_MASKS)}; got "
                             f"{self.causal_mask!r}")
        for name in ("qk_tied", "attend_self"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPTConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.qk_init not in QK_INITS:
            raise ValueError(f"GPTConfig.qk_init must be one of {', '.join(QK_INITS)}; got {self.qk_init!r}")
        if self.attention == "linear" and (self.attn_scale != "sqrt" or self.causal_mask != "before_softmax"):
            raise ValueError(f"GPTConfig.attention='linear' has no softmax and no scale: attn_scale must be sqrt "
                             f"(got {self.attn_scale!r}) and causal_mask before_softmax (got {self.causal_mask!r}); "
                             "its causal sums are the mask")
        if self.causal_mask != "before_softmax":
            clash = [f"window={self.window}"] if self.window else []
            clash += ["pos_encoding=alibi"] if self.pos_encoding == "alibi" else []
            if clash:
                raise ValueError(f"GPTConfig.causal_mask={self.causal_mask!r} cannot be combined with "
                                 f"{', '.join(clash)}: a window and ALiBi's bias m (j - i) are defined for earlier "
                                 "keys only; use causal_mask=before_softmax, or window 0 and other positions")
        if self.qk_tied and self.kv_heads != self.n_head:
            raise ValueError(f"GPTConfig.qk_tied makes every query head its own key head (k = q), so it needs "
                             f"n_kv_head 0 or {self.n_head}; got n_kv_head={self.n_kv_head}")
        if not self.attend_self:
            clash = [f"attention={self.attention}"] if self.attention == "linear" else []
            clash += [f"causal_mask={self.causal_mask}"] if self.causal_mask != "before_softmax" else []
            if clash:
                raise ValueError(f"GPTConfig.attend_self=false hides each query's own key with -inf before the "
                                 f"softmax, so it cannot be combined with {', '.join(clash)} (no such mask there); "
                                 "use attention softmax or uniform and causal_mask=before_softmax, or attend_self true")
        if self.attention == "uniform":
            clash = ["pos_encoding=alibi"] if self.pos_encoding == "alibi" else []
            clash += ["attn_sinks=true"] if self.attn_sinks else []
            clash += [f"causal_mask={self.causal_mask}"] if self.causal_mask != "before_softmax" else []
            clash += [f"attn_scale={self.attn_scale}"] if self.attn_scale != "sqrt" else []
            clash += ["qk_tied=true"] if self.qk_tied else []
            clash += [f"qk_init={self.qk_init}"] if self.qk_init != "normal" else []
            if clash:
                raise ValueError(f"GPTConfig.attention='uniform' gives each query equal weights over the keys it sees "
                                 f"(its scores are all 0, its q and k unused): it cannot be combined with "
                                 f"{', '.join(clash)}, which would bias, sink, unmask, scale, tie or initialise "
                                 "those scores; use pos_encoding learned, sinusoidal, rope or none, attn_sinks false, "
                                 "causal_mask before_softmax, attn_scale sqrt, qk_tied false, qk_init normal")

    @property
    def score_scale(self) -> float:
        """The factor on q.k before the softmax (attn_scale): 1/sqrt(hs), 1 or 1/hs.

        1/sqrt(hs) keeps the scores' variance about 1 when q and k have unit-variance entries (q.k sums hs
        products); without it the softmax saturates as hs grows (Vaswani et al. 2017, footnote 4).
        """
        return {"sqrt": 1.0 / math.sqrt(self.head_size), "none": 1.0, "inverse": 1.0 / self.head_size}[self.attn_scale]

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head when it is 0."""
        return self.n_kv_head or self.n_head

    def layer_window(self, layer: int) -> int | None:
        """The window of layer `layer` (None: it sees every earlier key), from window and window_pattern."""
        if not self.window:
            return None
        pattern = self.window_pattern or "L"
        return self.window if pattern[layer % len(pattern)] == "L" else None

    @property
    def bounded_cache(self) -> bool:
        """Every layer keeps a bounded state (a window's W keys, or linear attention's sums) and no position
        table limits the positions: cached decoding may run past block_size without rebuilding."""
        layers_bounded = self.attention == "linear" or all(self.layer_window(i) for i in range(self.n_layer))
        return layers_bounded and self.pos_encoding in ("rope", "alibi", "none")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {unknown}; known fields: {sorted(known)}")
        return cls(**d)
