"""What each attention head does, measured: role scores, a built-in probe, ablation, phase changes.

Pure functions: no files, no printing, no logging. The trainer calls them at every evaluation
(attention_lab/head_callback.py) and sample.py calls them once on the user's prompt.

Shapes: B batch, L n_layer, nh n_head, T tokens, A an attention pattern (..., T, T) whose rows (queries) sum
to 1 over the keys they may see (keys <= query).

Role scores (the "mul" form of TransformerLens's `detect_head`): for a role's detection pattern D (T, T) of 0/1,

    score(A, D) = sum(A * D) / sum(A)                              summed over every query row and key

i.e. the share of all attention mass that lands where the role says it should. Options drop parts of A first
(on a copy, never the caller's array): `exclude_first` zeroes key 0 (the "attention sink" most heads park
mass on), `exclude_self` zeroes the diagonal, and `target_rows_only` keeps only the query rows for which D
has a target at all. The trainer scores duplicate-token and induction heads with target_rows_only: on the
probe (random tokens, then the same tokens again) the first half's rows have nothing to copy, so over all
rows even a perfect induction head would score only about 0.5; over the repeat's rows it scores 1. This is
the "induction stripe" mean of the TransformerLens tutorials, in detect_head's form.

    previous_token   D[i, j] = 1 if j == i - 1
    duplicate_token  D[i, j] = 1 if j < i and ids[j] == ids[i]           (an earlier copy of the query's token)
    induction        D[i, j] = 1 if 1 <= j <= i and ids[j - 1] == ids[i] (the token after an earlier copy:
                                                                          prefix matching, then copy)

and three summaries of where the mass goes, each averaged over query rows i >= 1 (row 0 has one key):

    first_token      A[i, 0]                          mass on the first key ("sink")
    self             A[i, i]                          mass on the query's own position
    entropy          H(A[i, :i+1]) / log(i + 1)       0: one key takes everything; 1: uniform over the i+1 keys

Uniform causal attention is the baseline: each row i spreads 1/(i+1) over its keys, so previous_token scores
(1/T) * sum_{i=1}^{T-1} 1/(i+1) (0.035 at T = 128, 0.058 at T = 64), first_token and self score the mean of
1/(i+1) over rows i >= 1, and entropy scores 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

ROLES = ("previous_token", "duplicate_token", "induction", "first_token", "self", "entropy")
ROLE_HELP = {
    "previous_token": "attends to the token just before the query",
    "duplicate_token": "attends to earlier copies of the query's own token",
    "induction": "attends to the token that followed an earlier copy of the query's token (prefix matching)",
    "first_token": "parks attention on the first token (an attention sink)",
    "self": "attends to the query's own position",
    "entropy": "how spread out: 0 = one key, 1 = uniform",
}


# ------------------------------------------------------------------------------------------------------------
# detection patterns and scores


def previous_token_pattern(t: int) -> np.ndarray:
    return np.eye(t, k=-1)


def duplicate_token_pattern(ids: Sequence[int]) -> np.ndarray:
    ids = np.asarray(ids)
    same = ids[:, None] == ids[None, :]
    return np.tril(same, k=-1).astype(np.float64)


def induction_pattern(ids: Sequence[int]) -> np.ndarray:
    ids = np.asarray(ids)
    t = len(ids)
    d = np.zeros((t, t))
    d[:, 1:] = ids[:, None] == ids[None, :-1]  # key j's predecessor j-1 holds the query's token
    return np.tril(d)  # only keys the query can see


def detection_score(a: np.ndarray, d: np.ndarray, *, exclude_first: bool = False, exclude_self: bool = False,
                    target_rows_only: bool = False) -> np.ndarray:
    """sum(A * D) / sum(A) over the last two axes: a (..., T, T), d (T, T) -> (...).

    With target_rows_only, only query rows where d has a target count (0 where no row has one).
    """
    a = np.array(a, dtype=np.float64)  # a copy: the exclusions below must not edit the caller's pattern
    if target_rows_only:
        a[..., ~np.asarray(d).any(-1), :] = 0.0
    if exclude_first:
        a[..., :, 0] = 0.0
    if exclude_self:
        idx = np.arange(a.shape[-1])
        a[..., idx, idx] = 0.0
    total = a.sum(axis=(-2, -1))
    return (a * d).sum(axis=(-2, -1)) / np.where(total > 0, total, 1.0)


def first_token_mass(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a[..., 1:, 0].mean(-1)


def self_mass(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return np.diagonal(a, axis1=-2, axis2=-1)[..., 1:].mean(-1)


def normalised_entropy(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    t = a.shape[-1]
    plogp = np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)
    h = -plogp.sum(-1)[..., 1:]  # (..., T-1): rows 1..T-1
    return (h / np.log(np.arange(2, t + 1))).mean(-1)


def role_scores(attn: np.ndarray, ids: np.ndarray, *, exclude_first: bool = False, exclude_self: bool = False,
                target_rows_only: bool = True) -> dict[str, np.ndarray]:
    """Every role's score per head, averaged over the batch: attn (B, L, nh, T, T), ids (B, T) -> role: (L, nh).

    exclude_first / exclude_self apply to the three detection-pattern scores, as in TransformerLens;
    target_rows_only to the duplicate-token and induction scores (previous_token has a target in every row
    but the first).
    """
    attn = np.asarray(attn, dtype=np.float64)
    ids = np.asarray(ids)
    if attn.ndim == 4:
        attn, ids = attn[None], ids[None]
    b, n_layer, n_head, t, _ = attn.shape
    if ids.shape != (b, t):
        raise ValueError(f"role_scores: ids of shape {ids.shape} do not match attention {attn.shape}")
    opts = {"exclude_first": exclude_first, "exclude_self": exclude_self}
    out = {role: np.zeros((n_layer, n_head)) for role in ROLES}
    for a, seq in zip(attn, ids):
        out["previous_token"] += detection_score(a, previous_token_pattern(t), **opts)
        out["duplicate_token"] += detection_score(a, duplicate_token_pattern(seq), **opts,
                                                  target_rows_only=target_rows_only)
        out["induction"] += detection_score(a, induction_pattern(seq), **opts, target_rows_only=target_rows_only)
        out["first_token"] += first_token_mass(a)
        out["self"] += self_mass(a)
        out["entropy"] += normalised_entropy(a)
    return {role: v / b for role, v in out.items()}


def uniform_attention(t: int) -> np.ndarray:
    """The causal uniform pattern (T, T): row i spreads 1/(i+1) over keys 0..i."""
    return np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]


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
        what = f"{self.head} {self.metric}" if self.head else self.metric
        return f"step {self.step}: {what} {self.before:.2f} -> {self.after:.2f}"

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


def describe_heads(scores: dict[str, np.ndarray], threshold: float = 0.3,
                   ablation: np.ndarray | None = None) -> list[str]:
    """One line per head whose best role score reaches `threshold` (entropy and self excluded), strongest first."""
    roles = ("previous_token", "induction", "duplicate_token", "first_token")
    lines = []
    n_layer, n_head = scores[roles[0]].shape
    for layer in range(n_layer):
        for head in range(n_head):
            best = max(roles, key=lambda r: scores[r][layer, head])
            value = float(scores[best][layer, head])
            if value >= threshold:
                extra = f", ablation +{ablation[layer, head]:.3f} nats" if ablation is not None else ""
                lines.append((value, f"{head_name(layer, head)} {best} {value:.2f}{extra}"))
    return [text for _, text in sorted(lines, key=lambda p: -p[0])]



TABLE_ROLES = ("previous_token", "duplicate_token", "induction", "first_token", "self")


def head_label(scores: dict[str, np.ndarray], layer: int, head: int, threshold: float = 0.4) -> str:
    """The head's strongest measured role if it reaches `threshold`, else "mixed"."""
    best = max(TABLE_ROLES, key=lambda r: scores[r][layer, head])
    return best if scores[best][layer, head] >= threshold else "mixed"


def head_rows(scores: dict[str, np.ndarray], ablation: np.ndarray | None = None) -> list[dict]:
    """One dict per head: its label, every role score and (optionally) the ablation effect, rounded."""
    n_layer, n_head = scores["previous_token"].shape
    rows = []
    for layer in range(n_layer):
        for head in range(n_head):
            row = {"layer": layer, "head": head, "role": head_label(scores, layer, head)}
            row |= {role: round(float(scores[role][layer, head]), 4) for role in ROLES}
            if ablation is not None:
                row["ablation"] = round(float(ablation[layer, head]), 4)
            rows.append(row)
    return rows


def format_head_table(rows: Sequence[dict]) -> str:
    """head_rows -> a fixed-width table with a legend line."""
    cols = (("prev", "previous_token"), ("dup", "duplicate_token"), ("induc", "induction"), ("first", "first_token"),
            ("self", "self"), ("entr", "entropy"))
    has_ablation = bool(rows) and "ablation" in rows[0]
    header = f"{'head':>5}  {'role':<15}" + "".join(f"{c:>7}" for c, _ in cols) + ("  ablation" if has_ablation else "")
    lines = [header]
    for r in rows:
        line = f"{head_name(r['layer'], r['head']):>5}  {r['role']:<15}" + "".join(f"{r[k]:7.2f}" for _, k in cols)
        if has_ablation:
            line += f"  {r['ablation']:+8.3f}"
        lines.append(line)
    lines.append("scores: share of attention on each role's target (attention_lab/heads.py); entr: entropy, 1 = uniform"
                 + ("; ablation: loss change (nats/token) on this text when the head is zeroed" if has_ablation else ""))
    return "\n".join(lines)
