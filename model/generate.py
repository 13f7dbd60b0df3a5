"""Sampling and the decoding loop, with or without a KV cache.

With the cache, each new token costs one forward pass of a single position that reads the cached keys
and values. Once the context holds block_size tokens it slides: every token's position shifts by one and the
deeper layers' keys depend on tokens that have left the window, so the cache is rebuilt from the window,
which is exactly what the uncached path computes. Both paths give the same tokens.

A model whose every layer keeps a bounded state (sliding windows with RoPE, ALiBi or no positions; linear
attention: GPTConfig.bounded_cache) never rebuilds: its cache goes on past block_size at constant cost per token.
keep_first=k keeps the first k tokens in every rebuilt window (StreamingLLM's attention sinks, Xiao et al. 2023):
the window is those k tokens and the most recent block_size - k, at positions 0..block_size-1, so RoPE sees the
distances it was trained on. With keep_first a bounded cache rebuilds too: streaming on would drop the first
tokens the caller asked to keep, and the cached and uncached paths would see different windows.

A model that sees later tokens (GPTConfig.causal_mask "after_softmax" or "none") generates too: the tokens after
the last one do not exist yet, so each step is the model's prediction at the end of the context it has. There
the cache is not used: each new token changes what every earlier position sees, so earlier keys and values go
stale, and every step recomputes the whole context (quadratic, fine for experiments).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from .gpt import GPT


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """logits (B, V) -> the same with every token outside top-k / the top-p nucleus set to -inf."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, [-1]]  # (B, 1); list index keeps the dim
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token once the tokens ranked above it already hold top_p of the mass; the first always stays
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """logits (B, V) of the last position -> next token ids (B, 1)."""
    if greedy or temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


@torch.inference_mode()
def generate_stream(
    model: GPT,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    keep_first: int = 0,
) -> Iterator[Tensor]:
    """Yield the next token ids (B, 1) one step at a time after the prompt idx (B, T), T >= 1.

    Each token is sampled from the logits at the last position of the context (at most block_size tokens): also
    for a model whose positions see later tokens, where use_cache is ignored (module docstring)."""
    block = model.config.block_size
    # (an LSTM has no mask: it is causal by construction, and its cache is exact)
    use_cache = use_cache and getattr(model.config, "causal_mask", "before_softmax") == "before_softmax"
    if not 0 <= keep_first < block:
        raise ValueError(f"keep_first must be in [0, block_size={block}), got {keep_first}")
    b, t = idx.shape
    # the prompt's window, then each new token written in place (no per-step concatenation)
    prompt = window_of(idx, t, block, keep_first)
    n = prompt.size(1)
    tokens = idx.new_empty(b, n + max_new_tokens)
    tokens[:, :n] = prompt
    cache = model.new_kv_cache() if use_cache else None
    # the cache itself forgets what it must, unless the first tokens must stay in every window
    unbounded = cache is not None and model.config.bounded_cache and not keep_first
    logits = model(tokens[:, :n], kv_cache=cache, last_only=True).logits[:, -1]  # prefill: (B, V)
    for step in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, top_p, greedy, generator)  # (B, 1)
        yield nxt
        if step == max_new_tokens - 1:
            break
        tokens[:, n] = nxt[:, 0]
        n += 1
        if cache is not None and (cache.length < block or unbounded):
            logits = model(nxt, kv_cache=cache, last_only=True).logits[:, -1]
            continue
        window = window_of(tokens, n, block, keep_first)  # the context: at most block_size tokens
        if cache is not None:  # the window slides: rebuild the cache from it (see module docstring)
            cache.reset()
        logits = model(window, kv_cache=cache, last_only=True).logits[:, -1]


def window_of(tokens: Tensor, n: int, block: int, keep_first: int = 0) -> Tensor:
    """The context of the first n tokens (B, n): all of them, or the first keep_first and the last
    block - keep_first when they do not fit."""
    if n <= block:
        return tokens[:, :n]
    recent = tokens[:, n - (block - keep_first) : n]
    return torch.cat([tokens[:, :keep_first], recent], dim=1) if keep_first else recent


def generate(model: GPT, idx: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
    """The prompt idx (B, T) followed by max_new_tokens generated tokens: (B, T + max_new_tokens)."""
    new = list(generate_stream(model, idx, max_new_tokens, **kwargs))
    return torch.cat([idx, *new], dim=1) if new else idx
