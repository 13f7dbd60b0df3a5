"""What each head does over training, measured: the repeated-tokens probe, per-head ablation, the loss by
position, phase changes, and the summary table. Pure: no files, no printing, no logging. The trainer calls
measure_heads at every evaluation (attention_lab/training/callbacks.py); sample.py's report calls role_scores,
ablation_effects and the table once on the user's text. The role scores themselves: attention_lab/interp/roles.py.

Shapes: B batch, L n_layer, nh n_head, T tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attention_lab.interp.roles import (
    LABEL_ROLES,
    LABEL_THRESHOLD,
    MEASURES,
    ROLE_TABLE,
    ROLES,
    role_label,
    role_scores,
)

# ------------------------------------------------------------------------------------------------------------
# the built-in probe: random tokens, repeated


def repeated_tokens_probe(vocab_ids: Sequence[int] | int, half: int, batch: int, seed: int = 0) -> torch.Tensor:
    """(batch, 2 * half) int64: `half` random tokens, then the same tokens again; fixed by `seed`.

    vocab_ids: the token ids to draw from (e.g. those that occur in the training split), or a vocabulary size.
    No separators: the second half starts right after the first. On the repeat a model that copies in context
    (an induction head) predicts every token; on the first half it can only guess.
    """
    if half < 2:
        raise ValueError(f"the probe's half length must be >= 2 tokens, got {half}")
    pool = torch.arange(vocab_ids) if isinstance(vocab_ids, int) else torch.as_tensor(list(vocab_ids))
    gen = torch.Generator().manual_seed(seed)
    first = pool[torch.randint(len(pool), (batch, half), generator=gen)]
    return torch.cat([first, first], dim=1).long()


def probe_half_losses(token_losses: torch.Tensor, half: int) -> tuple[float, float]:
    """Mean loss on the probe's first half and on its repeat.

    token_losses (B, 2*half - 1): the loss of predicting token i+1 from tokens 0..i. The first half's
    predictions are i = 0..half-2 (targets inside the first half); the repeat's are i = half-1..2*half-2
    (targets in the second half: every one was seen `half` tokens earlier).
    """
    first = token_losses[:, : half - 1].mean().item()
    repeat = token_losses[:, half - 1 :].mean().item()
    return first, repeat


# ------------------------------------------------------------------------------------------------------------
# running a model


def per_token_losses(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, T) cross-entropy of every prediction, in nats (float32)."""
    logits = model(x).logits.float()
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)


def icl_positions(t: int) -> tuple[slice, slice]:
    """The early and late position windows of the in-context-learning score for context length t.

    Olsson et al. (2022) compare the loss at token 500 with token 50 of a 1024-token context; scaled to t the
    early window is positions [t/20, t/10) and the late one [t/2, t): both wide enough to average out noise.
    """
    early = slice(max(1, t // 20), max(2, t // 10))
    late = slice(t // 2, t)
    return early, late


def icl_score(position_loss: np.ndarray) -> float:
    """Mean loss in the late window minus the early window (negative: later tokens are predicted better)."""
    early, late = icl_positions(len(position_loss))
    return float(np.mean(position_loss[late]) - np.mean(position_loss[early]))


class HeadAblation:
    """Zero one head's output (its slice of the channels going into c_proj) while the context is active.

    Uses a forward pre-hook on the layer's attention output projection, so the model code is untouched:
    attn.c_proj sees (B, T, C) with head h's hs channels at [h*hs, (h+1)*hs) set to zero.
    """

    def __init__(self, model, layer: int, head: int):
        self.proj = model.transformer.h[layer].attn.c_proj
        hs = model.config.head_size
        self.lo, self.hi = head * hs, (head + 1) * hs
        self.handle = None

    def _hook(self, module, args):
        x = args[0].clone()
        x[..., self.lo : self.hi] = 0
        return (x,)

    def __enter__(self):
        self.handle = self.proj.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


@torch.no_grad()
def ablation_effects(model, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> np.ndarray:
    """Loss increase (nats/token) when each head alone is zeroed: (L, nh); mask (B, T) picks the positions scored."""
    def loss() -> float:
        losses = per_token_losses(model, x, y)
        return (losses[mask].mean() if mask is not None else losses.mean()).item()

    base = loss()
    cfg = model.config
    out = np.zeros((cfg.n_layer, cfg.n_head))
    for layer in range(cfg.n_layer):
        for head in range(cfg.n_head):
            with HeadAblation(model, layer, head):
                out[layer, head] = loss() - base
    return out


@dataclass
class HeadReport:
    """What one evaluation measured about the heads; arrays are (L, nh)."""

    scores: dict[str, np.ndarray]  # role -> (L, nh), on the repeated-tokens probe
    text_scores: dict[str, np.ndarray]  # role -> (L, nh), on natural validation windows
    ablation_probe: np.ndarray | None  # loss change on the probe's repeat when the head is zeroed
    ablation_val: np.ndarray | None  # loss change on validation windows
    probe_first_loss: float
    probe_repeat_loss: float
    position_loss: np.ndarray  # (T,) validation loss at every position of the context
    icl_score: float

    def model_metrics(self) -> dict[str, float]:
        return {"probe_first_loss": self.probe_first_loss, "probe_repeat_loss": self.probe_repeat_loss,
                "icl_score": self.icl_score}


@torch.no_grad()
def measure_heads(model, probe: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor, *,
                  ablate: bool = True) -> HeadReport:
    """Role scores, half losses, position losses and (optionally) per-head ablation for one model state.

    probe (B, 2*half) from repeated_tokens_probe; val_x, val_y (N, T) validation windows: the first B/2 give
    role scores and ablation, all N the loss by position. The model should be in eval mode; autocast is
    the caller's choice.
    """
    half = probe.size(1) // 2
    px, py = probe[:, :-1], probe[:, 1:]
    out = model(px, return_attention=True)
    attn = torch.stack(out.attentions, dim=1).float().cpu().numpy()  # (B, L, nh, T, T)
    scores = role_scores(attn, px.cpu().numpy())
    token_losses = F.cross_entropy(out.logits.float().flatten(0, 1), py.flatten(), reduction="none").view_as(py)
    first, repeat = probe_half_losses(token_losses, half)

    n = max(1, probe.size(0) // 2)  # attention maps and ablation on half as many validation windows as probe rows
    vout = model(val_x[:n], return_attention=True)
    vattn = torch.stack(vout.attentions, dim=1).float().cpu().numpy()
    text_scores = role_scores(vattn, val_x[:n].cpu().numpy())
    # the loss by position on every window given: a smoother curve than n windows would draw
    position_loss = torch.cat([per_token_losses(model, x, y) for x, y in zip(val_x.split(n), val_y.split(n))])
    position_loss = position_loss.mean(0).cpu().numpy()

    ab_probe = ab_val = None
    if ablate:
        repeat_mask = torch.zeros_like(py, dtype=torch.bool)
        repeat_mask[:, half - 1 :] = True
        ab_probe = ablation_effects(model, px, py, repeat_mask)
        ab_val = ablation_effects(model, val_x[:n], val_y[:n])
    return HeadReport(scores, text_scores, ab_probe, ab_val, first, repeat, position_loss, icl_score(position_loss))


# ------------------------------------------------------------------------------------------------------------
# phase changes


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


@dataclass(frozen=True)
class PhaseChange:
    step: int
    metric: str
    head: str | None  # "L1H3", or None for a model-level series
    before: float
    after: float

    @property
    def message(self) -> str:
        """What changed, with the unit of its numbers: a head's role score (0 to 1) or the probe's loss gap."""
        if self.head:
            return (f"step {self.step}: {self.head} {self.metric} score {self.before:.2f} -> {self.after:.2f} "
                    "(a role score, 0 to 1)")
        return (f"step {self.step}: {self.metric} {self.before:+.2f} -> {self.after:+.2f} nats/token "
                "(the repeated-tokens probe; below 0: its repeat is easier than its first half)")

    def to_dict(self) -> dict:
        return {"step": self.step, "metric": self.metric, "head": self.head, "before": self.before,
                "after": self.after, "message": self.message}


def detect_rise(steps: Sequence[int], values: Sequence[float], *, level: float, rise: float,
                lookback: int = 3) -> int | None:
    """The first index at which a series reaches `level` having risen by at least `rise` over the minimum of
    the `lookback` evaluations before it; None if it never does.

    A phase change is a jump, not a drift: the rise must happen within `lookback` evaluations. The first point
    cannot be one (there is no "before").
    """
    v = np.asarray(values, dtype=np.float64)
    for i in range(1, len(v)):
        before = v[max(0, i - lookback) : i].min()
        if v[i] >= level and v[i] - before >= rise:
            return i
    return None


def detect_fall(steps: Sequence[int], values: Sequence[float], *, drop: float, lookback: int = 3) -> int | None:
    """The first index at which a series has fallen by at least `drop` below the maximum of the `lookback`
    evaluations before it (e.g. the repeat-minus-first-half loss of the probe when copying starts)."""
    v = np.asarray(values, dtype=np.float64)
    for i in range(1, len(v)):
        if v[max(0, i - lookback) : i].max() - v[i] >= drop:
            return i
    return None


class PhaseChangeDetector:
    """Feeds on one evaluation at a time and reports each phase change once.

    Head series: a head's score for `role` rises to >= level by >= rise (default: induction 0.1 -> 0.4 style).
    Model series: the probe's repeated half's loss falls below its first half's by a margin that grows by at
    least `loss_drop` nats within the lookback (reported as "repeat minus first-half loss": before -> after).
    """

    def __init__(self, roles: Sequence[str] = ("induction", "previous_token"), level: float = 0.3,
                 rise: float = 0.2, loss_drop: float = 0.5, lookback: int = 3):
        self.roles, self.level, self.rise, self.loss_drop, self.lookback = roles, level, rise, loss_drop, lookback
        self.steps: list[int] = []
        self.history: dict[str, list] = {role: [] for role in roles}
        self.gap: list[float] = []  # repeat loss - first-half loss
        self.repeat: list[float] = []
        self.reported: set = set()

    def update(self, step: int, scores: dict[str, np.ndarray], probe_first: float,
               probe_repeat: float) -> list[PhaseChange]:
        self.steps.append(step)
        self.gap.append(probe_repeat - probe_first)
        self.repeat.append(probe_repeat)
        found = []
        for role in self.roles:
            self.history[role].append(np.asarray(scores[role]))
            series = np.stack(self.history[role])  # (n_evals, L, nh)
            for layer, head in np.ndindex(series.shape[1:]):
                key = (role, layer, head)
                if key in self.reported:
                    continue
                i = detect_rise(self.steps, series[:, layer, head], level=self.level, rise=self.rise,
                                lookback=self.lookback)
                if i == len(self.steps) - 1:
                    before = float(series[max(0, i - self.lookback) : i, layer, head].min())
                    found.append(PhaseChange(step, role, head_name(layer, head), before, float(series[i, layer, head])))
                    self.reported.add(key)
        if "repeat_loss" not in self.reported:
            i = detect_fall(self.steps, self.gap, drop=self.loss_drop, lookback=self.lookback)
            if i == len(self.steps) - 1:
                before = max(self.gap[max(0, i - self.lookback) : i])
                found.append(PhaseChange(step, "repeat minus first-half loss", None, before, self.gap[i]))
                self.reported.add("repeat_loss")
        return found


def head_label(scores: dict[str, np.ndarray], layer: int, head: int, threshold: float = LABEL_THRESHOLD) -> str:
    """The head's strongest measured role if it reaches `threshold`, else "mixed" (roles.role_label)."""
    return role_label({role: scores[role][layer, head] for role in LABEL_ROLES if role in scores}, threshold)


def head_rows(scores: dict[str, np.ndarray], ablation: np.ndarray | None = None,
              copying: np.ndarray | None = None, copying_text: np.ndarray | None = None) -> list[dict]:
    """One dict per head: its label, every role score and (optionally) the ablation effect and the copying score
    of its OV circuit (attention_lab/interp/circuits.py), rounded."""
    n_layer, n_head = scores["previous_token"].shape
    rows = []
    for layer in range(n_layer):
        for head in range(n_head):
            row = {"layer": layer, "head": head, "role": head_label(scores, layer, head)}
            row |= {role: round(float(scores[role][layer, head]), 4) for role in ROLES}
            if ablation is not None:
                row["ablation"] = round(float(ablation[layer, head]), 4)
            if copying is not None:
                row["copying"] = round(float(copying[layer, head]), 4)
            if copying_text is not None:
                row["copying_text"] = round(float(copying_text[layer, head]), 4)
            rows.append(row)
    return rows


def legend_lines(ablation: bool, copying: bool, text: bool) -> list[str]:
    """The head table's legend, a column to a line: each role score's words are its `help` in roles.ROLE_TABLE (the
    pages' tooltips say the same), the technical name last; docs/glossary.md has each word."""
    lines = ["what the columns say (each word is a docs/glossary.md entry):",
             *legend_entry("role", "the pattern the head follows most, in words (mixed: none stands out)")]
    for role in ROLE_TABLE:
        if role.form != "all rows":  # the detect_head forms: one line for the three, below
            lines += legend_entry(role.short, role.help)
    lines += legend_entry("\u00b7TL", "the same share over every query row, as TransformerLens's detect_head counts it "
                                      "(attention_lab/interp/roles.py)")
    if ablation:
        lines += legend_entry("ablation", MEASURES["ablation"].help)
    if copying:
        lines += legend_entry("copy", "the share of tokens that the head, attending to one, raises above all others "
                                      "as the next token (its OV circuit)")
    if text:
        lines += legend_entry("copy@text", "the same on this text, for the token each position attends to most")
    return lines


def legend_entry(column: str, words: str) -> list[str]:
    """One legend entry, one line: the column's name, then its words (unwrapped, so that no phrase is cut)."""
    return [f"  {column:<10} {words}"]


def format_head_table(rows: Sequence[dict]) -> str:
    """head_rows -> a fixed-width table and, under it, what each column says in words."""
    cols = [(MEASURES[role].short, role) for role in ROLES]
    has_ablation = bool(rows) and "ablation" in rows[0]
    has_copying = bool(rows) and "copying" in rows[0]
    has_text = bool(rows) and "copying_text" in rows[0]
    header = (f"{'head':>5}  {'role':<15}" + "".join(f"{c:>8}" for c, _ in cols) + ("  ablation" if has_ablation else "")
              + ("   copy" if has_copying else "") + ("  copy@text" if has_text else ""))
    lines = [header]
    for r in rows:
        line = f"{head_name(r['layer'], r['head']):>5}  {r['role']:<15}" + "".join(f"{r[k]:8.2f}" for _, k in cols)
        if has_ablation:
            line += f"  {r['ablation']:+8.3f}"
        if has_copying:
            line += f"  {r['copying']:5.2f}"
        if has_text:
            line += f"  {r['copying_text']:9.2f}"
        lines.append(line)
    lines += legend_lines(has_ablation, has_copying, has_text)
    return "\n".join(lines)
