"""An LSTM language model: the recurrent baseline the GPT is measured against ("attention replaced recurrent
networks"). It takes what the GPT takes and returns what it returns (model/gpt.py's GPTOutput: logits, loss), so
train.py trains it, attention_lab.evaluate scores it in bits/byte and generate() samples from it, on the same
data, tokenizer and loss. torch's nn.LSTM does the recurrence; nothing here attends.

    wte (V, C) -> dropout -> h: n_layer LSTM layers, C wide -> dropout -> lm_head (C -> V), tied to wte by default

Shapes: B batch, T tokens in this call, C n_embd (the embedding and the hidden size), L n_layer, V vocab_size.

Every window starts from a zero state, as a GPT's context starts empty: a training window, an evaluation window
and a generation window of the same tokens give the same logits, and the LSTM sees no more context than the GPT
it is compared with (block_size tokens). In decoding the state is carried from token to token (LSTMState, what
generate() calls the cache) until the window slides; then generate() rebuilds it from the window, exactly as
for the GPT, so cached and uncached decoding give the same tokens.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from .attention import dropout
from .config import GPTConfig
from .gpt import GPT, GPTOutput, next_token_loss
from .gpt import num_params as gpt_num_params


@dataclass
class LSTMConfig:
    vocab_size: int = 4096
    block_size: int = 256  # the window trained, evaluated and sampled on; each window starts from a zero state
    n_layer: int = 4
    n_embd: int = 128  # the embedding and the hidden size (one width: the tied head reads the top layer's state)
    dropout: float = 0.0  # on the embeddings, between layers and on the top layer's output
    tie_embeddings: bool = True  # lm_head shares the token embedding matrix, as the GPT's

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LSTMConfig.{name} must be a positive integer, got {value!r}")
        if isinstance(self.dropout, bool) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LSTMConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"LSTMConfig.tie_embeddings must be true or false, got {self.tie_embeddings!r}")

    @property
    def bounded_cache(self) -> bool:
        """False: the state is constant-size, but the model never saw a context past block_size, so decoding
        rebuilds it from the window as the GPT's does (see the module docstring)."""
        return False

    def to_dict(self) -> dict:
        """The fields and "arch": "lstm", so a saved config says which network it builds (model/registry.py)."""
        return {"arch": "lstm", **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "LSTMConfig":
        d = dict(d)
        if d.pop("arch", "lstm") != "lstm":
            raise ValueError(f"not an LSTM config: arch={d.get('arch')!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown LSTMConfig fields {unknown}; known fields: {sorted(known)}")
        return cls(**d)


class LSTMState:
    """The recurrent state carried between decoding calls: (h, c), each (L, B, C), after `length` tokens.

    It stands where the GPT's KVCache stands (new_kv_cache, length, reset), at a constant size: one state instead
    of every earlier token's keys and values."""

    def __init__(self) -> None:
        self.state: tuple[Tensor, Tensor] | None = None
        self.length = 0

    def reset(self) -> None:
        self.state, self.length = None, 0


class LSTMLM(nn.Module):
    def __init__(self, cfg: LSTMConfig):
        super().__init__()
        self.config = cfg
        self.rnn = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                # "h", the hidden layers, as GPT-2's h: the optimizer's rule for hidden matrices (Muon) finds the
                # gates' weights by that name, as it finds the blocks' (attention_lab/training/optim.py)
                h=nn.LSTM(cfg.n_embd, cfg.n_embd, num_layers=cfg.n_layer, batch_first=True,
                          dropout=cfg.dropout if cfg.n_layer > 1 else 0.0),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.rnn.wte.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embedding (and an untied head) U(-0.1, 0.1), as AWD-LSTM (Merity et al. 2017); the gates' weights and
        biases torch's U(-1/sqrt(C), 1/sqrt(C)); the forget gates' bias 1 (Jozefowicz et al. 2015), so each layer
        begins by keeping its cell state and gradients reach back across the window from the first step."""
        nn.init.uniform_(self.rnn.wte.weight, -0.1, 0.1)
        if not self.config.tie_embeddings:
            nn.init.uniform_(self.lm_head.weight, -0.1, 0.1)
        lstm, c = self.rnn.h, self.config.n_embd
        lstm.reset_parameters()
        with torch.no_grad():
            for layer in range(self.config.n_layer):  # gates stacked (input, forget, cell, output), C rows each
                getattr(lstm, f"bias_ih_l{layer}")[c : 2 * c].fill_(1.0)
                getattr(lstm, f"bias_hh_l{layer}")[c : 2 * c].zero_()

    def new_kv_cache(self) -> LSTMState:
        return LSTMState()

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        kv_cache: LSTMState | None = None,
        return_attention: bool = False,
        last_only: bool = False,
    ) -> GPTOutput:
        """Next-token logits at every position, as GPT.forward.

        idx:      (B, T) token ids; with a kv_cache, the T tokens that follow the ones its state has read.
        targets:  (B, T) the token that follows each position (-1 = ignore); gives `loss`.
        kv_cache: the LSTMState of earlier tokens (new_kv_cache()), updated in place.
        return_attention: refused: an LSTM has no attention weights.
        last_only: logits of the last position only, (B, 1, V).
        """
        if return_attention:
            raise ValueError("an LSTM has no attention weights to return (model.arch=lstm)")
        b, t = idx.shape
        past = kv_cache.length if kv_cache is not None else 0
        if past + t > self.config.block_size:
            raise ValueError(
                f"sequence of {past + t} tokens is longer than block_size={self.config.block_size}; "
                "crop the input to the last block_size tokens"
            )
        x = dropout(self.rnn.wte(idx), self.config.dropout, self.training)  # (B, T, C)
        state = kv_cache.state if kv_cache is not None else None  # None: a zero state, a fresh window
        x, state = self.rnn.h(x, state)  # (B, T, C); state (h, c), each (L, B, C)
        if kv_cache is not None:
            kv_cache.state, kv_cache.length = state, past + t
        if last_only:
            x = x[:, [-1], :]  # (B, 1, C); a list index keeps the time dimension
        logits = self.lm_head(dropout(x, self.config.dropout, self.training))  # (B, T, V)

        return GPTOutput(logits, next_token_loss(logits, targets) if targets is not None else None, None)


def lstm_params(vocab_size: int, n_layer: int, n_embd: int, tie_embeddings: bool = True) -> int:
    """Parameters of an LSTMLM: k V C + L (8 C^2 + 8 C), k = 1 tied, 2 untied.

    Each layer's four gates read the layer's input (4C x C) and the previous hidden state (4C x C), each with
    a bias (torch keeps two bias vectors, b_ih and b_hh, of 4C each)."""
    k = 1 if tie_embeddings else 2
    return k * vocab_size * n_embd + n_layer * (8 * n_embd**2 + 8 * n_embd)


def lstm_matching(gpt: GPTConfig) -> LSTMConfig:
    """The LSTM of the GPT's vocabulary, context, depth, dropout and tying whose width C brings its parameter
    count closest to the GPT's, so the two are compared at equal size.

    The GPT's count is model.num_params (embeddings once, no position table: what the trainer prints), counted on
    a model built on the meta device (no memory, every option's parameters included). The width solves
    lstm_params(C) = P_gpt:  8 L C^2 + (k V + 8 L) C - P_gpt = 0,  C = (-(k V + 8 L) + sqrt((k V + 8 L)^2 +
    32 L P_gpt)) / (16 L), rounded, then whichever of C - 1, C, C + 1 comes closest. Neighbouring widths differ by
    about 16 L C + k V parameters: 0.6% of the default 4-layer, 256-wide GPT (4.2M), so the match is within 0.3%
    there; a GPT of a few thousand parameters can miss by a few percent.
    """
    with torch.device("meta"):
        target = gpt_num_params(GPT(gpt))
    k = 1 if gpt.tie_embeddings else 2
    a, b = 8 * gpt.n_layer, k * gpt.vocab_size + 8 * gpt.n_layer
    root = round((-b + math.sqrt(b * b + 4 * a * target)) / (2 * a))
    width = min((c for c in (root - 1, root, root + 1) if c > 0),
                key=lambda c: abs(lstm_params(gpt.vocab_size, gpt.n_layer, c, gpt.tie_embeddings) - target))
    return LSTMConfig(vocab_size=gpt.vocab_size, block_size=gpt.block_size, n_layer=gpt.n_layer, n_embd=width,
                      dropout=gpt.dropout, tie_embeddings=gpt.tie_embeddings)


def num_params(model: LSTMLM) -> int:
    """Parameters, a tied matrix once (there is no position table to leave out)."""
    return sum(p.numel() for p in model.parameters())


def flops_per_token(cfg: LSTMConfig, n_params: int, seq_len: int | None = None, training: bool = True) -> float:
    """Matmul FLOPs per token: 2N forward, 6N training (backward twice the forward), as the GPT's count without
    its attention term. Every parameter is one multiply and one add per token (the gates on the input and on the
    previous state, the head); nothing grows with the context: each step reads one state, not every earlier
    token. seq_len is accepted for the GPT's signature and changes nothing."""
    forward = 2 * n_params
    return 3 * forward if training else forward
