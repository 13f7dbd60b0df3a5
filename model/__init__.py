"""The GPT (and the LSTM it is compared with), as pure math: no file I/O, logging or optimizer in this package,
and no import of the rest of the project (attention_lab/__init__.py states the rule; tests/test_layering.py
checks it)."""

from .attention import CausalSelfAttention, KVCache
from .config import ATTENTION_BACKENDS, ATTENTION_KINDS, POSITION_ENCODINGS, GPTConfig
from .generate import filter_logits, generate, generate_stream, sample_next
from .gpt import GPT, GPTOutput
from .hooks import ActivationCache, HookPoint, hook_points, hooked, point_name, run_with_cache
from .lstm import LSTMLM, LSTMConfig, lstm_matching
from .registry import ARCHS, arch_of, build_model, config_from_dict, flops_per_token, has_attention, num_params

__all__ = [
    "ARCHS",
    "ActivationCache",
    "HookPoint",
    "hook_points",
    "hooked",
    "point_name",
    "run_with_cache",
    "ATTENTION_BACKENDS",
    "ATTENTION_KINDS",
    "POSITION_ENCODINGS",
    "GPT",
    "GPTConfig",
    "GPTOutput",
    "CausalSelfAttention",
    "KVCache",
    "LSTMConfig",
    "LSTMLM",
    "arch_of",
    "build_model",
    "config_from_dict",
    "filter_logits",
    "flops_per_token",
    "generate",
    "generate_stream",
    "has_attention",
    "lstm_matching",
    "num_params",
    "sample_next",
]
