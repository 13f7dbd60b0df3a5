"""The head roles: ONE table of what each role is called, means and is drawn as, and the pure scores that
measure it from attention weights. Everything that names a role (the trainer's callbacks, the pages, the
summary tables, the TensorBoard timeline) reads ROLE_TABLE; nothing else lists roles.

Shapes: B batch, L n_layer, nh n_head, T tokens, A an attention pattern (..., T, T) whose rows (queries) sum
to 1 over the keys they may see (keys <= query).

Role scores. For a role's detection pattern D (T, T) of 0/1 there are two standard numbers, and each has its
own name here:

    stripe     score(A, D) = sum(A * D) / sum(A)   summed over the query rows i that HAVE a target (D[i].any())
    all rows   score(A, D) = sum(A * D) / sum(A)   summed over every query row: TransformerLens's
                                                   `detect_head(..., error_measure="mul")`

`previous_token`, `duplicate_token` and `induction` are the stripe form: the share of attention that lands on the
role's target, among the queries that have one. It is the "induction stripe" of TransformerLens's induction-head
tutorial and of Olsson et al. (2022): on the probe (random tokens, then the same tokens again) the first half's
rows have nothing to copy, so a perfect induction head scores 1 on the stripe. `previous_token_all_rows`,
`duplicate_token_all_rows` and `induction_all_rows` are detect_head's form: rows without a target still count in
the denominator, so on the probe even a perfect induction head scores only about half. A batch of sequences is
the mean of each sequence's score, as detect_head averages over a list of prompts. Options drop parts of A first
(on a copy, never the caller's array): `exclude_first` zeroes key 0 (the "attention sink" most heads park mass
on) and `exclude_self` zeroes the diagonal, as detect_head's exclude_bos / exclude_current_token.

    previous_token   D[i, j] = 1 if j == i - 1
    duplicate_token  D[i, j] = 1 if j < i and ids[j] == ids[i]           (an earlier copy of the query's token)
    induction        D[i, j] = 1 if 1 <= j <= i and ids[j - 1] == ids[i] (the token after an earlier copy:
                                                                          prefix matching, then copy)

and three summaries of where the mass goes, each averaged over query rows i >= 1 (row 0 has one key):

    first_token      A[i, 0]                          mass on the first key ("sink")
    self             A[i, i]                          mass on the query's own position
    entropy          H(A[i, :i+1]) / log(i + 1)       0: one key takes everything; 1: uniform over the i+1 keys

Uniform causal attention is the baseline: each row i spreads 1/(i+1) over its keys, so previous_token scores
the mean of 1/(i+1) over rows i >= 1 (0.0349 at T = 128, 0.0594 at T = 64; previous_token_all_rows
(1/T) * sum_{i=1}^{T-1} 1/(i+1): 0.0346 and 0.0585), first_token and self score the mean of 1/(i+1) over rows
i >= 1, and entropy scores 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Role:
    """One thing measured per head: a role score (0..1) or a loss change (nats)."""

    name: str
    short: str  # column and heatmap label
    label: str  # legend text
    help: str  # one sentence: what a high value means
    unit: str = "score"
    form: str = ""  # which definition: "stripe" or "all rows" for the detection-pattern scores (see above)
    names_heads: bool = True  # may be a head's label in the summary table (a head is "mixed" if none reaches it)
    tracked: bool = True  # drawn in the fingerprints and timelines (TensorBoard, tb_report)


ROLE_TABLE = (
    Role("previous_token", "prev", "previous token (stripe)",
         "share of attention on the token just before the query, over the queries that have one", form="stripe"),
    Role("duplicate_token", "dup", "duplicate token (stripe)",
         "share of attention on earlier copies of the query's own token, over the queries that have one",
         form="stripe"),
    Role("induction", "ind", "induction (stripe)",
         "share of attention on the token that followed an earlier copy of the query's token (prefix matching), "
         "over the queries that have one", form="stripe"),
    Role("first_token", "first", "first token (sink)", "parks attention on the first token (an attention sink)"),
    Role("self", "self", "self", "attends to the query's own position", tracked=False),
    Role("entropy", "ent", "entropy", "how spread out: 0 = one key, 1 = uniform", names_heads=False, tracked=False),
    # TransformerLens's detect_head numbers for the same three patterns, shown beside the stripe scores
    Role("previous_token_all_rows", "prev·TL", "previous token, all rows (detect_head)",
         "as previous_token, over every query row: TransformerLens's detect_head", names_heads=False,
         tracked=False, form="all rows"),
    Role("duplicate_token_all_rows", "dup·TL", "duplicate token, all rows (detect_head)",
         "as duplicate_token, over every query row: TransformerLens's detect_head", names_heads=False,
         tracked=False, form="all rows"),
    Role("induction_all_rows", "ind·TL", "induction, all rows (detect_head)",
         "as induction, over every query row: TransformerLens's detect_head (about half the stripe on the probe)",
         names_heads=False, tracked=False, form="all rows"),
)
# not roles but per-head numbers the pages and tables show beside them: the loss change when the head is zeroed
ABLATION_TABLE = (
    Role("ablation_probe", "\u0394probe", "ablation, probe",
         "loss change (nats/token) on the probe's repeated half (random tokens seen a second time) when this head "
         "alone is zeroed: + the model needs the head there, - it does better without it (the probe's loss can exceed "
         "ln(vocab): a model can be surer and wronger than uniform)", "nats", False),
    Role("ablation_val", "\u0394val", "ablation, validation",
         "loss change (nats/token) on validation text when this head alone is zeroed: + the model needs the head, "
         "- it does better without it", "nats", False),
    Role("ablation", "\u0394loss", "ablation",
         "loss change (nats/token) on this text when this head alone is zeroed: + the model needs the head here, "
         "- it does better without it", "nats", False),
)
ROLES = tuple(r.name for r in ROLE_TABLE)  # every role score role_scores computes, in table order
TRACKED_ROLES = tuple(r.name for r in ROLE_TABLE if r.tracked)
ROLE_HELP = {r.name: r.help for r in ROLE_TABLE}
DETECTION_ROLES = ("previous_token", "duplicate_token", "induction")  # each has a stripe and an all-rows form
MEASURES = {r.name: r for r in ROLE_TABLE + ABLATION_TABLE}
# A head's one-word label (the model view, sample.py's summary table, claims): its strongest role among these, if
# that role's score reaches LABEL_THRESHOLD, else "mixed". The pages' role filter starts at the same threshold
# (viewer/page.py writes it into the page), so a head labelled with a role is one the filter shows for it.
LABEL_ROLES = tuple(r.name for r in ROLE_TABLE if r.names_heads)
LABEL_THRESHOLD = 0.4
MIXED = "mixed"


def role_label(scores: Mapping[str, float | None], threshold: float = LABEL_THRESHOLD) -> str:
    """One head's label from its scores {role: value}: the role of LABEL_ROLES with the highest score if that score
    is >= threshold, else "mixed". Roles missing, None or NaN do not count (none measured: "mixed"); on a tie the
    role listed first in ROLE_TABLE wins (previous token, duplicate token, induction, first token, self)."""
    measured = [(role, float(scores[role])) for role in LABEL_ROLES
                if scores.get(role) is not None and math.isfinite(float(scores[role]))]
    if not measured:
        return MIXED
    role, value = max(measured, key=lambda rv: rv[1])  # max keeps the first of equal values: the table's order
    return role if value >= threshold else MIXED


def role_labels(scores: Mapping[str, Sequence], threshold: float = LABEL_THRESHOLD) -> list[list[str]]:
    """role_label of every head: scores {role: (L, nh) array or nested lists, None where not measured} -> L x nh
    labels ([] when no labelling role is given)."""
    grids = {role: np.asarray(scores[role], dtype=object) for role in LABEL_ROLES if role in scores}
    if not grids:
        return []
    n_layer, n_head = next(iter(grids.values())).shape
    return [[role_label({role: g[layer, head] for role, g in grids.items()}, threshold) for head in range(n_head)]
            for layer in range(n_layer)]


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
    a = _excluded(a, exclude_first, exclude_self)
    stripe, all_rows = _detection_pair(a, a.sum(axis=-1, dtype=np.float64), d)
    return stripe if target_rows_only else all_rows


def _weights(a) -> np.ndarray:
    """Attention weights as read here: float32 or float64 as given (no copy), anything else as float64."""
    a = np.asarray(a)
    return a if a.dtype in (np.float32, np.float64) else a.astype(np.float64)


def _excluded(a: np.ndarray, exclude_first: bool, exclude_self: bool) -> np.ndarray:
    """a with key 0 and/or the diagonal zeroed, on a float64 copy (never the caller's pattern); a itself, in its
    own float dtype, when nothing is excluded (no copy: the live lab scores 16 heads x 500^2 at every pause)."""
    if not (exclude_first or exclude_self):
        return _weights(a)
    a = np.array(a, dtype=np.float64)  # a copy: the exclusions below must not edit the caller's pattern
    if exclude_first:
        a[..., :, 0] = 0.0
    if exclude_self:
        idx = np.arange(a.shape[-1])
        a[..., idx, idx] = 0.0
    return a


def _detection_pair(a: np.ndarray, rows: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stripe, all rows) scores of a (..., T, T) against d (T, T), given each query row's mass rows (..., T):
    one sum(A * D) serves both; only the denominators differ. Sums are in float64 whatever a's dtype."""
    d = np.asarray(d, dtype=np.float64)
    q, k = np.nonzero(d)  # the patterns are sparse: sum(A * D) over D's cells, not an (..., T, T) product
    hits = (a[..., q, k] * d[q, k]).sum(axis=-1, dtype=np.float64)
    target = (rows * d.any(-1)).sum(axis=-1)
    total = rows.sum(axis=-1)
    return hits / np.where(target > 0, target, 1.0), hits / np.where(total > 0, total, 1.0)


def first_token_mass(a: np.ndarray) -> np.ndarray:
    return np.asarray(a)[..., 1:, 0].mean(-1, dtype=np.float64)


def self_mass(a: np.ndarray) -> np.ndarray:
    return np.diagonal(np.asarray(a), axis1=-2, axis2=-1)[..., 1:].mean(-1, dtype=np.float64)


def normalised_entropy(a: np.ndarray) -> np.ndarray:
    """H(A[i, :i+1]) / log(i + 1), averaged over rows i >= 1: a (..., T, T) -> (...). -w log w is taken in a's own
    float dtype, with torch on every core (a 500-token text's 16 heads: 10 ms, against 35 in float64 numpy), and
    summed in float64."""
    a = _weights(a)
    if not (a.flags.c_contiguous and a.flags.writeable):  # torch shares the memory: it wants it writeable
        a = np.array(a, order="C")
    a = torch.from_numpy(a)
    with torch.inference_mode():
        h = torch.special.entr(a).sum(-1, dtype=torch.float64)[..., 1:].numpy()  # (..., T-1): 0 log 0 = 0
    return (h / np.log(np.arange(2, a.shape[-1] + 1))).mean(-1)


def role_scores(attn: np.ndarray, ids: np.ndarray, *, exclude_first: bool = False,
                exclude_self: bool = False) -> dict[str, np.ndarray]:
    """Every role's score per head, the mean over the batch of each sequence's score: attn (B, L, nh, T, T),
    ids (B, T) -> role: (L, nh). Each detection role twice: its stripe score (`induction`) and its all-rows
    score (`induction_all_rows`, TransformerLens's detect_head). exclude_first / exclude_self apply to both.
    The weights are read in their own float dtype (float32 from a model) and every sum is taken in float64.
    """
    attn = _weights(attn)
    ids = np.asarray(ids)
    if attn.ndim == 4:
        attn, ids = attn[None], ids[None]
    b, n_layer, n_head, t, _ = attn.shape
    if ids.shape != (b, t):
        raise ValueError(f"role_scores: ids of shape {ids.shape} do not match attention {attn.shape}")
    out = {role: np.zeros((n_layer, n_head)) for role in ROLES}
    for a, seq in zip(attn, ids):
        patterns = {"previous_token": previous_token_pattern(t), "duplicate_token": duplicate_token_pattern(seq),
                    "induction": induction_pattern(seq)}
        kept = _excluded(a, exclude_first, exclude_self)
        rows = kept.sum(axis=-1, dtype=np.float64)  # (L, nh, T): each query row's mass, once for every pattern
        for role, d in patterns.items():
            stripe, all_rows = _detection_pair(kept, rows, d)
            out[role] += stripe
            out[f"{role}_all_rows"] += all_rows
        out["first_token"] += first_token_mass(a)
        out["self"] += self_mass(a)
        out["entropy"] += normalised_entropy(a)
    return {role: v / b for role, v in out.items()}


def uniform_attention(t: int) -> np.ndarray:
    """The causal uniform pattern (T, T): row i spreads 1/(i+1) over keys 0..i."""
    return np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
