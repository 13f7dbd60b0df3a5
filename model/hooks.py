"""Named activation points and the cache one forward pass fills (the shape of TransformerLens's HookPoint and
run_with_cache): analyses read what the model computed instead of running or re-deriving it again, and an
intervention is an edit at one of the same points, so an edited run differs from the clean one in one place.

The points, for block l (names relative to model.transformer; B batch, T tokens, nh heads, nkv key/value heads,
hs head size, C n_embd, S keys = T without a KV cache):

    h.{l}.hook_resid_pre     (B, T, C)      the residual stream entering block l (l = 0: the embeddings)
    h.{l}.hook_resid_mid     (B, T, C)      after the attention's residual add
    h.{l}.hook_resid_post    (B, T, C)      leaving block l (the last one: ln_f's input)
    h.{l}.attn.hook_q        (B, nh, T, hs) the queries as the dot products see them (after QK-norm and RoPE)
    h.{l}.attn.hook_k        (B, nkv, T, hs) the keys likewise (the new tokens' keys, before any KV cache)
    h.{l}.attn.hook_v        (B, nkv, T, hs) the values the weights average (after the value-residual mix)
    h.{l}.attn.hook_scores   (B, nh, T, S)  softmax's input: scaled, biased, -inf where a key is hidden
    h.{l}.attn.hook_pattern  (B, nh, T, S)  the attention weights (linear attention: its implied weights)
    h.{l}.attn.hook_z        (B, nh, T, hs) each head's output, before c_proj mixes the heads

Outside `hooked(...)` no point is called at all (each is behind one attribute test), so training and decoding
pay nothing; inside it, when scores or weights are read or edited, the attention runs its explicit path so that
they exist (otherwise the fused path runs and hook_scores / hook_pattern are not called).
Linear attention has no softmax: no hook_scores, and its hook_pattern is read-only (its output does not use it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
import torch.nn as nn
from torch import Tensor

Edit = Callable[[Tensor], Tensor]  # a point's activation in, its replacement out

ATTENTION_POINTS = ("q", "k", "v", "scores", "pattern", "z")
BLOCK_POINTS = ("resid_pre", "resid_mid", "resid_post")


class HookPoint(nn.Module):
    """The identity, with a name to hook: a forward hook on it reads (or, returning a tensor, replaces) what
    passes through."""

    def forward(self, x: Tensor) -> Tensor:
        return x


def point_name(kind: str, layer: int) -> str:
    """("q", 2) -> "h.2.attn.hook_q"; ("resid_pre", 0) -> "h.0.hook_resid_pre"."""
    if kind in ATTENTION_POINTS:
        return f"h.{layer}.attn.hook_{kind}"
    if kind in BLOCK_POINTS:
        return f"h.{layer}.hook_{kind}"
    raise KeyError(f"no activation point {kind!r}; the points are {ATTENTION_POINTS + BLOCK_POINTS}")


def residual_names(n_layer: int) -> list[str]:
    """The residual stream's points in order: entering each block, then leaving the last (ln_f's input)."""
    return [point_name("resid_pre", layer) for layer in range(n_layer)] + [point_name("resid_post", n_layer - 1)]


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """name -> point, every HookPoint of the model, named relative to model.transformer ("h.0.attn.hook_q")."""
    return {name.removeprefix("transformer."): m for name, m in model.named_modules() if isinstance(m, HookPoint)}


class ActivationCache(Mapping):
    """What one forward pass recorded: name -> tensor (float32, detached, on the model's device).

    cache["h.0.attn.hook_pattern"], or by kind and layer as TransformerLens writes it: cache["pattern", 0];
    cache.stack("pattern") -> (L, ...) every layer's, in order."""

    def __init__(self, tensors: dict[str, Tensor], n_layer: int):
        self._tensors = tensors
        self.n_layer = n_layer

    def __getitem__(self, key) -> Tensor:
        if isinstance(key, tuple):
            kind, layer = key
            key = point_name(kind, layer % self.n_layer)
        try:
            return self._tensors[key]
        except KeyError:
            raise KeyError(f"{key!r} was not recorded; recorded: {sorted(self._tensors)[:6]}...") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def stack(self, kind: str) -> Tensor:
        """Every layer's activation of one kind, stacked on a new first axis: (L, ...)."""
        return torch.stack([self[kind, layer] for layer in range(self.n_layer)])

    def residual_stream(self) -> Tensor:
        """(L + 1, B, T, C): row l < L enters block l (row 0: the embeddings), row L leaves the last block."""
        return torch.stack([self[name] for name in residual_names(self.n_layer)])


def _modules_with_points(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "hooked")]


@contextlib.contextmanager
def hooked(model: nn.Module, edits: Mapping[str, Edit] | None = None,
           record: Iterable[str] | None = None) -> Iterator[dict[str, Tensor]]:
    """Within the block every forward pass calls the model's points: `edits` (name -> function) replace what
    passes (edits compose in the order given when several name one point), and the points named in `record`
    are stored, float32
    and detached, into the dict this yields (a later forward pass overwrites them)."""
    points = hook_points(model)
    unknown = [n for n in list(edits or {}) + list(record or ()) if n not in points]
    if unknown:
        raise KeyError(f"no activation point {unknown[0]!r} in this model; it has {sorted(points)[:9]}...")
    seen: dict[str, Tensor] = {}
    handles = []

    def editor(fn: Edit):
        return lambda module, args, out: fn(out)

    def keeper(name: str):
        def keep(module, args, out):
            seen[name] = out.detach().float()
        return keep

    for name, fn in (edits or {}).items():
        handles.append(points[name].register_forward_hook(editor(fn)))
    for name in record or ():  # after the edits: what is recorded is what the model went on with
        handles.append(points[name].register_forward_hook(keeper(name)))
    # scores and weights exist only on the explicit attention path: it runs when they are read or edited
    explicit = any(n.rsplit(".", 1)[-1] in ("hook_scores", "hook_pattern") for n in [*(edits or {}), *(record or ())])
    switched = _modules_with_points(model)
    for m in switched:
        m.hooked = True
        if hasattr(m, "explicit_path"):
            m.explicit_path = explicit
    try:
        yield seen
    finally:
        for m in switched:
            m.hooked = False
            if hasattr(m, "explicit_path"):
                m.explicit_path = False
        for h in handles:
            h.remove()


@torch.no_grad()
def run_with_cache(model: nn.Module, idx: Tensor, *, edits: Mapping[str, Edit] | None = None,
                   names: Iterable[str] | None = None, targets: Tensor | None = None):
    """One forward pass of idx (B, T) that records every activation point (or those in `names`) -> (the
    model's output, ActivationCache). `edits` are applied during the pass (name -> function)."""
    names = list(hook_points(model)) if names is None else list(names)
    with hooked(model, edits, record=names) as seen:
        out = model(idx, targets)
    return out, ActivationCache(dict(seen), model.config.n_layer)
