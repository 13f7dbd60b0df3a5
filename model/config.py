"""GPTConfig: the model's hyperparameters, validated when built.

Names follow GPT-2 (n_layer, n_head, n_embd, block_size) so configs and weights map onto Hugging Face's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

POSITION_ENCODINGS = ("learned", "sinusoidal", "rope", "alibi", "none")
ATTENTION_BACKENDS = ("math", "sdpa")
MLP_ACTIVATIONS = ("gelu", "relu2")


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
    mlp_ratio: int = 4
    rope_base: float = 10000.0
    layer_norm_eps: float = 1e-5
    # recipe options (modded-nanogpt's list); each default is GPT-2's behaviour
    qk_norm: bool = False  # RMS-normalise q and k over the head channels (no parameters), before RoPE
    mlp_act: str = "gelu"  # "gelu" (GPT-2's tanh approximation) or "relu2" (relu(x)^2)
    logit_softcap: float = 0.0  # > 0: logits = c * tanh(logits / c), bounded in (-c, c); 0 = off
    zero_init_proj: bool = False  # attention and MLP output projections (c_proj) start at zero
    value_residual: bool = False  # blocks after the first mix in the first block's values (learned weight)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
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

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {unknown}; known fields: {sorted(known)}")
        return cls(**d)
