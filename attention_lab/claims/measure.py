"""Measuring one trained arm: its final checkpoint (chosen by nothing), on one part of the held-out plays.

The validation split is cut in two (data/prepare.py PreparedData.held_out): the "choose" plays pick each arm's
learning rate, the "test" plays score the seeds, so no number in a verdict was read by a choice. Every measure
reads windows spread evenly over the whole part, not its first pages.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from attention_lab.interp.heads import ablation_effects, head_label
from attention_lab.interp.interventions import Intervention, intervention_edits
from attention_lab.interp.measures import (
    attention_stats,
    contextual_similarity,
    honest_position_losses,
    position_losses,
    prefix_shuffle,
    score_gradient,
)
from attention_lab.interp.roles import role_scores
from attention_lab.runtime.device import eval_mode
from attention_lab.store.checkpoint import CheckpointError, load_checkpoint
from attention_lab.training.evaluate import data_dir_of, split_nats
from data.batches import windows
from data.prepare import HeldOut, PreparedData

WHICH = "latest"  # the final checkpoint: no checkpoint is chosen on any split


LENGTHS = (1, 2, 4)  # the long-context measure scores windows of these multiples of the trained context


@dataclass
class Held:
    """Windows of LENGTHS[-1] times the context spread evenly over one held-out part, shared by every arm of a
    claim (each measure reads the first T of each window unless it is about longer ones)."""

    part: HeldOut
    x: torch.Tensor  # (n, 4T)
    y: torch.Tensor

    @classmethod
    def of(cls, run_dir: Path, part: str, block_size: int, n: int) -> "Held":
        data = PreparedData.open(data_dir_of(run_dir, run_dir))
        held = data.held_out(part)
        span = LENGTHS[-1] * block_size
        starts = np.linspace(0, len(held.tokens) - span - 2, n).astype(np.int64)
        x, y = windows(held.tokens, starts, span)  # the longest scored length, for the long-context measure
        return cls(held, x, y)

    def spread(self, k: int) -> np.ndarray:
        """k window indices spread evenly over all of them (so over the whole part), not the first k."""
        return np.unique(np.linspace(0, len(self.x) - 1, min(k, len(self.x))).round().astype(np.int64))

    def bpb(self, nats_per_token: float) -> float:
        return self.part.bits_per_byte(nats_per_token, 1)


def measure(claim, run_dir: Path, held: Held, quick: bool) -> dict:
    """The claim's numbers for one run on `held`'s part: bits/byte over the whole part (quick: its windows only)
    and the measures the claim names."""
    ckpt = load_checkpoint(run_dir, WHICH)
    model = ckpt.build_model("cpu")
    t = model.config.block_size
    x, y = held.x[:, :t], held.y[:, :t]
    few = held.spread(4 if quick else 16)  # the measures that run a pass per head or per position
    out: dict = {"step": ckpt.step, "params": sum(p.numel() for p in model.parameters())}
    curve = position_losses(model, x, y)
    if quick:
        out["bpb"] = held.bpb(float(curve.mean()))
    else:
        total, count = split_nats(model, held.part.tokens, batch_size=8)
        out["bpb"] = held.part.bits_per_byte(total, count)
    attention = hasattr(model.config, "n_head")
    if "position" in claim.measures:
        out["position_loss"] = curve.round(4).tolist()
        out["loss_first_8"] = float(curve[:8].mean())
        out["loss_last_half"] = float(curve[t // 2:].mean())
    if "shuffle" in claim.measures:
        out["shuffle_jump"] = prefix_shuffle(model, x, y, last=max(1, t // 4)).jump
    if "long_context" in claim.measures:  # on the same windows: their first T, 2T, 4T tokens
        out["bpb_windows_1x"] = held.bpb(float(curve.mean()))
        for f in LENGTHS[1:]:
            out[f"bpb_windows_{f}x"] = _long_context_bpb(ckpt, model, held, f)
    if "position" in claim.measures:
        out["position_buckets"] = buckets(curve)
    if "honest" in claim.measures:
        out["leaky_bpb"] = held.bpb(float(position_losses(model, x[few], y[few]).mean()))
        out["honest_bpb"] = held.bpb(float(honest_position_losses(model, x[few], y[few]).mean()))
    if "sample" in claim.measures:
        out["sample"] = _sample(model, ckpt, held, 48 if quick else 160)
    if attention and {"diagonal", "previous_head", "roles"} & set(claim.measures):
        with torch.no_grad():
            attn = torch.stack(model(x[few], return_attention=True).attentions, dim=1).float().numpy()
        scores = role_scores(attn, x[few].numpy())
        out["self_mass"] = float(scores["self"].mean())
        out["max_previous_token"] = float(scores["previous_token"].max())
        labels = [head_label(scores, layer, h) for layer in range(attn.shape[1]) for h in range(attn.shape[2])]
        out["heads_with_a_role"] = sum(lab != "mixed" for lab in labels)
    if "ablation" in claim.measures and attention:
        effects = ablation_effects(model, x[few], y[few])
        out["heads_that_matter"] = int((effects > 0.01).sum())
        out["heads"] = int(effects.size)
    if "attention" in claim.measures and attention:
        stats = attention_stats(model, x[few])
        out["entropy_by_layer"] = stats.entropy.round(4).tolist()
        out["max_score"] = float(stats.max_score.max())
    if "saturation" in claim.measures and attention:
        with torch.no_grad():
            attn = torch.stack(model(x[few], return_attention=True).attentions, dim=1).float().numpy()
        out |= saturation(attn)
        out |= score_gradients(model, run_dir, x[few], y[few])
    if "similarity" in claim.measures and attention:
        out |= context_measures(model, x, quick)
    if "recall" in claim.measures:  # the task's held-out examples, whole and aligned
        task = json.loads((run_dir / "config.json").read_text())["data"].get("recall_task", "copy")
        out |= recall_scores(model, held.part.tokens, ckpt.tokenizer().eot_id, task)
    return out


SATURATED = 0.99  # a row whose largest weight is above this is saturated: one key takes (nearly) everything


def saturation(weights: np.ndarray) -> dict:
    """How saturated causal softmax attention is. weights: (..., T, T), row t the weights of query t over keys
    0..t (the rest 0). Over every row with at least 2 keys (query 0 has one key: its weight is 1 whatever the
    scores), every head and layer:

        max_weight      the mean of each row's largest weight (1: one-hot; 1/(t+1): uniform)
        saturated_rows  the share of rows whose largest weight is above SATURATED
        entropy_rows    the mean of each row's entropy over log(t+1), its keys (0: one-hot, 1: uniform)
    """
    w = np.asarray(weights, dtype=np.float64)
    t = w.shape[-1]
    rows = w[..., 1:, :]  # queries 1..T-1: (..., T-1, T)
    keys = np.arange(2, t + 1, dtype=np.float64)  # query i (from 1) sees i + 1 keys
    top = rows.max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(rows > 0, rows * np.log(rows), 0.0).sum(axis=-1) / np.log(keys)
    return {"max_weight": float(top.mean()), "saturated_rows": float((top > SATURATED).mean()),
            "entropy_rows": float(ent.mean())}


def score_gradients(model, run_dir: Path, x: torch.Tensor, y: torch.Tensor) -> dict:
    """log10 of the RMS gradient at the softmax's input (interp.measures.score_gradient), for the trained model and
    for the same config untrained, initialised under the run's seed (the premise of the sqrt(d_k) argument is about
    the start: unit-variance q and k); log10, so that a paired difference is a ratio."""
    seed = json.loads((run_dir / "config.json").read_text())["train"]["seed"]
    torch.manual_seed(seed)
    untrained = type(model)(model.config)
    return {"log10_score_grad": math.log10(score_gradient(model, x, y)),
            "log10_score_grad_init": math.log10(score_gradient(untrained, x, y))}


def context_measures(model, x: torch.Tensor, quick: bool) -> dict:
    """How much of a token's identity is left after the last block (same-token cosine minus random pairs; 0: its
    vectors no closer to each other than to other tokens'; context_at_embedding: the same before any block), for the
    model as trained and with every head's attention pasted uniform over its prefix (the pasted control)."""
    cfg = model.config
    n = 10 if quick else 30
    sim = contextual_similarity(model, x, n_tokens=n)
    uniform = [Intervention("uniform", layer, head) for layer in range(cfg.n_layer) for head in range(cfg.n_head)]
    control = contextual_similarity(model, x, n_tokens=n, edits=intervention_edits(cfg, uniform))
    return {"context_at_embedding": float(sim.contextual[0]), "context_left": float(sim.contextual[-1]),
            "context_left_uniform": float(control.contextual[-1]),
            "context_by_layer": sim.contextual.round(4).tolist()}


def _long_context_bpb(ckpt, model, held: Held, factor: int) -> float | None:
    """Bits/byte on windows of `factor` times the trained context, for encodings that have no table of positions
    (learned positions have no row past their table: None, and the report says so; a model without attention,
    the LSTM, reads any length)."""
    cfg = model.config
    if getattr(cfg, "pos_encoding", "learned") == "learned" and hasattr(cfg, "n_head"):
        return None
    t = factor * cfg.block_size
    try:
        longer = ckpt.build_model("cpu", replace(cfg, block_size=t))
    except (CheckpointError, RuntimeError):
        return None
    return held.bpb(float(position_losses(longer, held.x[:, :t], held.y[:, :t]).mean()))


def buckets(curve: np.ndarray) -> dict[str, float]:
    """A per-position loss curve (position 0 first) as means over log-spaced buckets of positions: 1, 2, 3-4, 5-8,
    ... (1-based: tokens seen), keyed by the bucket's last position."""
    curve = np.asarray(curve, dtype=np.float64)
    edges = [1, 2, 3] + [2 ** k + 1 for k in range(2, 30) if 2 ** k < len(curve)] + [len(curve) + 1]
    return {str(b - 1): float(curve[a - 1:b - 1].mean()) for a, b in zip(edges, edges[1:])}


def _sample(model, ckpt, held: Held, n_tokens: int) -> str:
    from model import generate

    tok = ckpt.tokenizer()
    prompt = held.x[:1, :16]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        out = generate(model, prompt, n_tokens, temperature=0.8, top_k=50, generator=gen)
    return tok.decode(out[0].tolist())


@torch.no_grad()
def recall_scores(model, tokens: np.ndarray, eot: int, task: str = "copy", batch_size: int = 16) -> dict:
    """The delayed-copy task (data/recall.py) scored on its held-out examples, each read whole and aligned: the
    separator before it, then its 2d letters (a block and the same block again). Only the copy is scored, the d
    predictions whose target is the token exactly d back; the first block is noise to every model.

        copy_bits      mean over copied letters of -log2 p(the letter): 0 for a model that looks back d tokens,
                       log2(symbols) (4 for 16) for the best model that sees only the last k < d tokens
        copy_accuracy  the share of copied letters that are the model's most likely token (1 / symbols: chance)

    tokens: a held-out part (examples separated by `eot`), every example 2d long; the model must see all 2d.
    task "item" (data/recall.py item_task): examples d + 1 long, the one scored prediction the last, the item
    recalled from d back: recall_bits and recall_accuracy, the same numbers over that one token an example."""
    if task == "item":
        return _item_scores(model, tokens, eot, batch_size)
    ends = np.flatnonzero(np.asarray(tokens) == eot)
    starts = np.concatenate([[0], ends[:-1] + 1])
    docs = [np.asarray(tokens[a:b], dtype=np.int64) for a, b in zip(starts, ends)]
    lengths = {len(d) for d in docs}
    if not docs or len(lengths) != 1 or min(lengths) % 2:
        raise ValueError(f"recall_scores needs examples of one even length 2d, separated by token {eot}; got "
                         f"{len(docs)} examples of lengths {sorted(lengths)[:5]}")
    t = lengths.pop()
    d = t // 2
    if model.config.block_size < t:
        raise ValueError(f"the model sees {model.config.block_size} tokens, the delayed copy needs {t} (2 x distance "
                         f"{d}): train it with model.block_size >= {t}")
    y = torch.from_numpy(np.stack(docs))  # (n, 2d): the targets
    x = torch.cat([torch.full((len(y), 1), eot), y[:, :-1]], dim=1)  # (n, 2d): the separator, then all but the last
    nats, hits = [], []
    with eval_mode(model), torch.no_grad():
        for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
            logits = model(xb).logits[:, d:].float()  # (b, d, V): the predictions of the copied letters only
            nats.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), yb[:, d:], reduction="none"))
            hits.append(logits.argmax(-1) == yb[:, d:])
    return {"copy_bits": float(torch.cat(nats).mean() / np.log(2)),
            "copy_accuracy": float(torch.cat(hits).float().mean())}


@torch.no_grad()
def _item_scores(model, tokens: np.ndarray, eot: int, batch_size: int) -> dict:
    """recall_scores for the item task: each held-out example (d + 1 letters) read whole from its separator; only
    its last letter, the item from d back, is scored."""
    ends = np.flatnonzero(np.asarray(tokens) == eot)
    starts = np.concatenate([[0], ends[:-1] + 1])
    docs = [np.asarray(tokens[a:b], dtype=np.int64) for a, b in zip(starts, ends)]
    lengths = {len(d) for d in docs}
    if not docs or len(lengths) != 1 or min(lengths) < 3:
        raise ValueError(f"recall_scores (item) needs examples of one length d + 1 >= 3, separated by token {eot}; got "
                         f"{len(docs)} examples of lengths {sorted(lengths)[:5]}")
    t = lengths.pop()
    if model.config.block_size < t:
        raise ValueError(f"the model sees {model.config.block_size} tokens, the recall needs {t} (distance {t - 1} "
                         f"and the item): train it with model.block_size >= {t}")
    y = torch.from_numpy(np.stack(docs))  # (n, d + 1)
    x = torch.cat([torch.full((len(y), 1), eot), y[:, :-1]], dim=1)  # the separator, then all but the last
    nats, hits = [], []
    with eval_mode(model), torch.no_grad():
        for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
            logits = model(xb).logits[:, -1].float()  # (b, V): the prediction of the recalled item
            nats.append(torch.nn.functional.cross_entropy(logits, yb[:, -1], reduction="none"))
            hits.append(logits.argmax(-1) == yb[:, -1])
    return {"recall_bits": float(torch.cat(nats).mean() / np.log(2)),
            "recall_accuracy": float(torch.cat(hits).float().mean())}
