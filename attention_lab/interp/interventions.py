"""Interventions on attention, as edits at the model's activation points (model/hooks.py): the edited run and the
clean one differ in one place only. Pure: no files.

    zero      (layer, head)        the head's output z set to 0 before c_proj: what ablation_effects measures
    uniform   (layer, head)        its weights uniform over the keys it may see: every visible score set to 0
                                   before the softmax (hidden keys stay -inf), so a sink logit keeps its share
    hide_key  (key[, layer, head]) key position j hidden from every later query (its score -inf before the
                                   softmax), in every layer and head or only those named; query j itself still
                                   sees it (a row with no visible key has no softmax)

Positions are the indices of the sequence the model is given (no KV cache: hook_scores is (B, nh, T, T)).
Linear attention has no softmax: only `zero` applies to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from model.hooks import point_name

KINDS = ("zero", "uniform", "hide_key")
MAX_INTERVENTIONS = 64


@dataclass(frozen=True)
class Intervention:
    kind: str  # one of KINDS
    layer: int | None = None  # None with hide_key: every layer
    head: int | None = None  # None with hide_key: every head
    key: int | None = None  # hide_key only: the key position

    def label(self) -> str:
        where = "" if self.layer is None else f"L{self.layer}" + ("" if self.head is None else f"H{self.head}")
        if self.kind == "hide_key":
            return f"hide key {self.key}" + (f" in {where}" if where else "")
        return f"{self.kind} {where}"


def _int(item: Mapping, field: str, lo: int, hi: int, what: str, required: bool = True) -> int | None:
    value = item.get(field)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"intervention {what!r}: {field} must be an integer in {lo}..{hi}, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"intervention {what!r}: {field} must be in {lo}..{hi}, got {value}")
    return value


def parse_interventions(items, cfg, n_tokens: int) -> list[Intervention]:
    """Interventions from JSON-like dicts ({"kind", "layer", "head", "key"}), every field checked against the
    model (cfg: GPTConfig) and the text's n_tokens; ValueError naming the field and its range otherwise."""
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"interventions must be a list of objects, got {type(items).__name__}")
    if len(items) > MAX_INTERVENTIONS:
        raise ValueError(f"at most {MAX_INTERVENTIONS} interventions, got {len(items)}")
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            raise ValueError(f"each intervention must be an object like {{\"kind\": \"zero\", \"layer\": 0, "
                             f"\"head\": 1}}, got {item!r}")
        kind = item.get("kind")
        if kind not in KINDS:
            raise ValueError(f"intervention kind must be one of {', '.join(KINDS)}, got {kind!r}")
        unknown = set(item) - {"kind", "layer", "head", "key"}
        if unknown:
            raise ValueError(f"intervention {kind!r} has unknown fields {sorted(unknown)}; "
                             "the fields are kind, layer, head, key")
        if kind != "zero" and cfg.attention == "linear":
            raise ValueError(f"intervention {kind!r} edits a softmax; this model has linear attention, "
                             "where only 'zero' applies")
        required = kind != "hide_key"
        layer = _int(item, "layer", 0, cfg.n_layer - 1, kind, required)
        head = _int(item, "head", 0, cfg.n_head - 1, kind, required)
        key = _int(item, "key", 0, n_tokens - 1, kind) if kind == "hide_key" else None
        if kind != "hide_key" and item.get("key") is not None:
            raise ValueError(f"intervention {kind!r} takes no key (hide_key does)")
        out.append(Intervention(kind, layer, head, key))
    return out


def _zero_head(head: int) -> Callable[[Tensor], Tensor]:
    def edit(z: Tensor) -> Tensor:  # (B, nh, T, hs)
        z = z.clone()
        z[:, head] = 0.0
        return z
    return edit


def _uniform_head(head: int) -> Callable[[Tensor], Tensor]:
    def edit(scores: Tensor) -> Tensor:  # (B, nh, T, S), -inf on hidden keys
        scores = scores.clone()
        row = scores[:, head]
        scores[:, head] = torch.where(torch.isfinite(row), torch.zeros_like(row), row)
        return scores
    return edit


def _hide_key(key: int, head: int | None) -> Callable[[Tensor], Tensor]:
    def edit(scores: Tensor) -> Tensor:  # (B, nh, T, S)
        if key >= scores.shape[-1]:  # a key past the text (the ablation pass reads it without its last token)
            return scores
        scores = scores.clone()
        heads = slice(None) if head is None else slice(head, head + 1)
        scores[:, heads, key + 1 :, key] = float("-inf")  # the queries after j; query j keeps its own key
        return scores
    return edit


def intervention_edits(cfg, items: Sequence[Intervention]) -> dict[str, Callable[[Tensor], Tensor]]:
    """name of an activation point -> one function applying every intervention there, in order (model/hooks.py
    `hooked(model, edits)`)."""
    per_point: dict[str, list[Callable[[Tensor], Tensor]]] = {}
    for it in items:
        layers = range(cfg.n_layer) if it.layer is None else [it.layer]
        for layer in layers:
            if it.kind == "zero":
                per_point.setdefault(point_name("z", layer), []).append(_zero_head(it.head))
            elif it.kind == "uniform":
                per_point.setdefault(point_name("scores", layer), []).append(_uniform_head(it.head))
            else:
                per_point.setdefault(point_name("scores", layer), []).append(_hide_key(it.key, it.head))

    def chain(fns):
        def edit(x: Tensor) -> Tensor:
            for fn in fns:
                x = fn(x)
            return x
        return edit

    return {name: chain(fns) for name, fns in per_point.items()}
