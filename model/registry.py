"""Which network a config builds: the GPT (model/gpt.py) or the LSTM baseline (model/lstm.py).

A config's class names its network; a saved config (a checkpoint's model_config.json) names it with an "arch"
key, which the GPT's leaves out (as every checkpoint written before the LSTM did), so a checkpoint reloads as the
network that trained. The tools that read attention ask `has_attention` and step aside for a model without it.
"""

from __future__ import annotations

import torch.nn as nn

from .config import GPTConfig
from .gpt import GPT
from .gpt import flops_per_token as gpt_flops_per_token
from .gpt import num_params as gpt_num_params
from .lstm import LSTMLM, LSTMConfig
from .lstm import flops_per_token as lstm_flops_per_token
from .lstm import num_params as lstm_num_params

ARCHS: dict[str, tuple[type, type[nn.Module]]] = {"gpt": (GPTConfig, GPT), "lstm": (LSTMConfig, LSTMLM)}


def arch_of(cfg: GPTConfig | LSTMConfig) -> str:
    """"gpt" or "lstm": the network this config (or a model's config) builds."""
    cfg = getattr(cfg, "config", cfg)
    for name, (config_cls, _) in ARCHS.items():
        if isinstance(cfg, config_cls):
            return name
    raise TypeError(f"{type(cfg).__name__} is the config of no network here ({', '.join(ARCHS)})")


def has_attention(cfg) -> bool:
    """Does this config's (or model's) network have attention weights to capture, score and show?"""
    return arch_of(cfg) != "lstm"


def build_model(cfg: GPTConfig | LSTMConfig) -> nn.Module:
    """A fresh GPT or LSTMLM of this config."""
    return ARCHS[arch_of(cfg)][1](cfg)


def config_from_dict(d: dict) -> GPTConfig | LSTMConfig:
    """A saved config (to_dict's output) -> GPTConfig or LSTMConfig, by its "arch" key (none: the GPT)."""
    arch = d.get("arch", "gpt")
    if arch not in ARCHS:
        raise ValueError(f"unknown model arch {arch!r}; known: {', '.join(ARCHS)}")
    fields = {k: v for k, v in d.items() if k != "arch"}
    return ARCHS[arch][0].from_dict(fields)


def num_params(model: nn.Module, non_embedding: bool = True) -> int:
    """Parameters, a tied matrix once; the GPT leaves out its position table (model/gpt.py num_params)."""
    if arch_of(model) == "lstm":
        return lstm_num_params(model)
    return gpt_num_params(model, non_embedding)


def flops_per_token(cfg: GPTConfig | LSTMConfig, n_params: int, seq_len: int | None = None,
                    training: bool = True) -> float:
    """Matmul FLOPs per token: the GPT's 6N + attention (model/gpt.py), the LSTM's 6N (model/lstm.py)."""
    count = lstm_flops_per_token if arch_of(cfg) == "lstm" else gpt_flops_per_token
    return count(cfg, n_params, seq_len, training)
