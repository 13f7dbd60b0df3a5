"""The GPT, as pure math: no file I/O, logging or optimizer in this package, and no import of the rest of the
project (attention_lab/__init__.py states the rule; tests/test_layering.py checks it)."""

from .attention import CausalSelfAttention, KVCache
from .config import ATTENTION_BACKENDS, ATTENTION_KINDS, POSITION_ENCODINGS, GPTConfig
from .generate import filter_logits, generate, generate_stream, sample_next
from .gpt import GPT, GPTOutput, flops_per_token, num_params

__all__ = [
    "ATTENTION_BACKENDS",
    "ATTENTION_KINDS",
    "POSITION_ENCODINGS",
    "GPT",
    "GPTConfig",
    "GPTOutput",
    "CausalSelfAttention",
    "KVCache",
    "filter_logits",
    "flops_per_token",
    "generate",
    "generate_stream",
    "num_params",
    "sample_next",
]
