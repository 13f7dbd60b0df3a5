"""The exercises, in the tutorials' order: what the learner writes, the project's function each is checked
against, the inputs, the tolerance, and the catalogue of known mistakes, each computed from the reference.

    scores      the scores of one head: q k^T / sqrt(d_k)                     model/attention.py math_attention
    mask        the causal mask: -inf on the future keys' scores              model/attention.py visible_keys
    attention   softmax and the weighted sum: the whole head (it trains)      model/attention.py math_attention
    multi_head  split into heads, attend, concatenate, project                model/attention.py CausalSelfAttention
    sinusoidal  the sinusoidal position table                                 model/positions.py sinusoidal_table
    rope        rotary positions: q or k rotated by position                  model/positions.py RotaryPositions
    decode      one decoding step with a KV cache                             model/attention.py KVCache

Shapes: B batch, nh heads, T queries, S keys, hs = d_k the head size, C = nh * hs the model width, P positions.
A mistake's output is the reference's with one idea changed (a switch of math_attention, another mask, another
reshape), so the catalogue agrees with the real model by construction; `explain` turns the learner's numbers
into the one sentence they read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from model.attention import CausalSelfAttention, KVCache, math_attention, split_qkv, visible_keys
from model.config import GPTConfig
from model.positions import PositionalEncoding, RotaryPositions, sinusoidal_table

F32, BF16 = torch.float32, torch.bfloat16
CLAIM = "python -m attention_lab.claims {}"


@dataclass(frozen=True)
class Tolerance:
    """|yours - reference| <= atol + rtol * |reference| at every element (torch.isclose's rule)."""

    atol: float
    rtol: float

    def __str__(self) -> str:
        return f"|yours - reference| <= {self.atol:g} + {self.rtol:g}·|reference|"


# float32: the reference and an answer written another way differ by a few float32 roundings (measured in
# tests/test_exercises.py: under 1e-6 at T = 512); bf16: the learner computes in bf16, the reference in float32
# from the same bf16 inputs, and bf16 keeps 8 bits of mantissa (a step of 2^-8 = 0.4% near 1)
TOLERANCE = {F32: Tolerance(1e-5, 1e-4), BF16: Tolerance(2e-2, 2e-2)}
# positions: an angle p * w computed in float32 is off by about p * 6e-8, 3e-5 at p = 511 (measured: a correct
# answer computed in float32 differs from the float64 table by 3.1e-5 there), so sines and cosines get 1e-4
POSITION_TOLERANCE = {F32: Tolerance(1e-4, 1e-4), BF16: Tolerance(2e-2, 2e-2)}


@dataclass
class Case:
    """One set of inputs: `args` as the learner's function receives them, `sizes` named for the messages."""

    sizes: dict
    args: tuple
    dtype: torch.dtype = F32
    note: str = ""  # what the case is for, with its numbers ("row maxima 16 to 9.6e+03")

    @property
    def label(self) -> str:
        return (" ".join(f"{k}={v}" for k, v in self.sizes.items()) + f" {str(self.dtype).removeprefix('torch.')}"
                + (f", {self.note}" if self.note else ""))

    @property
    def large(self) -> bool:
        return bool(self.note)

    def float_args(self) -> tuple:
        """The inputs in float32: the reference and the mistakes are computed from these."""
        return tuple(a.float() if isinstance(a, Tensor) and a.is_floating_point() else a for a in self.args)


@dataclass
class Evidence:
    """What a mistake's sentence may quote: the case, the learner's output and the reference's (float32), and
    `probe(*args)`, the learner's function on other inputs (None if it fails there)."""

    case: Case
    mine: object
    ref: object
    probe: Callable[..., object]

    def weights(self) -> Tensor | None:
        """The learner's attention weights (B, nh, T, T): their function's output for one-hot values (v = I)."""
        q, k, v = self.case.args[:3]
        t = k.size(-2)
        eye = torch.eye(t, dtype=v.dtype).expand(*v.shape[:-2], t, t)
        w = self.probe(q, k, eye)
        return w.float() if isinstance(w, Tensor) and w.shape == (*q.shape[:-1], t) else None


@dataclass
class Mistake:
    name: str
    title: str  # a few words, the tutorials' own: "no 1/sqrt(d_k)"
    compute: Callable[[Case], object] | None  # the output with this mistake, from the float32 inputs
    explain: Callable[[Evidence], str]  # one sentence, with the number that shows it
    why: str  # the command of the experiment that shows why it matters (or, without one, why in words)
    # instead of an output: (case, yours, reference's, which of yours are within tolerance) -> yours fits this
    # mistake (a softmax that overflows: yours differs only where the case's scores overflow exp)
    matches: Callable[[Case, list, list, list], bool] | None = None

    def output(self, case: Case):
        if self.compute is None:
            raise NotImplementedError(f"{self.name} is recognised by its pattern, not computed")
        return self.compute(case)


@dataclass
class Exercise:
    name: str
    title: str
    function: str  # the name of the learner's function
    signature: str  # its parameters, as in the skeleton
    doc: str  # the skeleton's docstring: shapes and what to compute
    reference: Callable[..., object]  # the project's own function on float32 inputs
    cases: Callable[[], list[Case]]
    mistakes: list[Mistake]
    axes: tuple[str, ...]  # the names of the output's axes, to say where yours first differs
    reference_name: str  # where the reference lives, for the messages
    hint: str = ""  # the skeleton's body comment
    outputs: tuple[str, ...] = ("output",)  # names of a tuple's parts (decode)
    conventions: dict = field(default_factory=dict)  # another accepted answer, by name (rope: "adjacent")
    tolerance: dict = field(default_factory=lambda: dict(TOLERANCE))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g: torch.Generator, *shape, dtype=F32) -> Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def _pos(t: int, start: int = 0) -> Tensor:
    return torch.arange(start, start + t)


def _ratio(mine: Tensor, ref: Tensor) -> float:
    """The median of yours / reference over entries where both are finite and the reference is not tiny."""
    ok = torch.isfinite(mine) & torch.isfinite(ref) & (ref.abs() > 1e-3)
    return (mine[ok] / ref[ok]).median().item() if ok.any() else float("nan")


class _Record(nn.Module):
    """A hook point's stand-in: keeps what passes (math_attention's on_scores), optionally changing it."""

    def __init__(self, change: Callable[[Tensor], Tensor] | None = None):
        super().__init__()
        self.change, self.seen = change, None

    def forward(self, x: Tensor) -> Tensor:
        x = self.change(x) if self.change else x
        self.seen = x
        return x


# ----------------------------------------------------------------------------------- numerics: large scores

EXP_OVERFLOW = math.log(torch.finfo(F32).max)  # 88.72: exp of a larger score is inf in float32 (and in bfloat16)
EXP_ZERO = math.log(torch.finfo(F32).smallest_normal)  # -87.34: exp below this is subnormal, then 0 (below -103.97)
EXP_IS_ZERO = math.log(2.0 ** -150)  # -103.97: below it exp rounds to 0 (half float32's smallest subnormal)
HALF_MAX = torch.finfo(torch.float16).max  # 65504: float16's largest number


def _aligned(g: torch.Generator, k: Tensor, row_scale: Tensor, limit: Tensor) -> Tensor:
    """Queries (B, nh, T, hs) for keys k (B, nh, S, hs): query i is row_scale[..., i] times one key j <= limit[i]
    picked at random (plus a little noise). Its largest score is about row_scale * hs / sqrt(hs), every other one
    far below it, so the softmax is saturated: any correct order of operations gives the same output, although
    float32 rounds scores of 1e4 by about 1e-3."""
    b, nh, _, hs = k.shape
    t = limit.numel()
    pick = (torch.rand(b, nh, t, generator=g) * (limit + 1)).floor().long()  # (B, nh, T)
    chosen = torch.gather(k, 2, pick[..., None].expand(b, nh, t, hs))  # (B, nh, T, hs)
    return row_scale[..., None] * chosen + 0.05 * torch.randn(b, nh, t, hs, generator=g)


def _maxima_note(scores: Tensor, visible: Tensor | None = None) -> str:
    """'row maxima 4.1 to 9.8e+03': the smallest and largest of the rows' largest (visible) scores."""
    top = (scores if visible is None else scores.masked_fill(~visible, -torch.inf)).amax(-1)
    return f"row maxima {top.min().item():.2g} to {top.max().item():.2g}"


def _overflow_rows(scores: Tensor) -> Tensor:
    """(..., S) scores -> (...) the rows where exp of the scores as they are overflows, in one entry or in the sum
    of the row's S entries."""
    return scores.amax(-1) > EXP_OVERFLOW - math.log(scores.size(-1))


def _sunk_rows(scores: Tensor, visible: Tensor) -> Tensor:
    """(B, nh, T, S) -> (B, nh, T): the rows whose largest visible score lies so far below the largest score of
    the whole tensor that exp(score - that) is subnormal or 0 for every key of the row."""
    return scores.masked_fill(~visible, -torch.inf).amax(-1) < scores.max() + EXP_ZERO


def _only_in(rows_of: Callable[[Case], Tensor], blown: bool = True) -> Callable:
    """A matcher: yours agrees with the reference except in the rows rows_of(case) marks (broadcast over the
    first output; any other output must agree everywhere), and there (blown) it is NaN, inf or 0, what exp's
    overflow or underflow leaves."""
    def matches(case: Case, mine: list, ref: list, ok: list) -> bool:
        bad = ~ok[0]
        if not bad.any():
            return all(bool(o.all()) for o in ok[1:])
        rows = rows_of(case).expand_as(bad)
        if bool((bad & ~rows).any()) or not all(bool(o.all()) for o in ok[1:]):
            return False
        m = mine[0].float()
        return not blown or bool((~torch.isfinite(m) | (m == 0))[bad].all())
    return matches


def _worst_row(ev: Evidence, rows_of: Callable[[Case], Tensor], axes: str) -> tuple[tuple, float]:
    """The first entry of yours that differs (as an index of the first output) in a marked row, and its value."""
    mine = (ev.mine[0] if isinstance(ev.mine, tuple) else ev.mine).float()
    ref = (ev.ref[0] if isinstance(ev.ref, tuple) else ev.ref).float()
    differs = ~torch.isclose(mine, ref, atol=1e-3, rtol=1e-3, equal_nan=False) & rows_of(ev.case).expand_as(mine)
    found = differs.nonzero()
    idx = tuple(int(x) for x in found[0]) if len(found) else (0,) * mine.dim()
    return idx, mine[idx].item()


def _where(idx: tuple, axes: str) -> str:
    if axes == "position":  # multi_head: (B, T, C)
        return f"position {idx[1]}"
    return f"query {idx[2]} of head {idx[1]}" if idx[2] or axes == "query" else f"the new query of head {idx[1]}"


def numerics_mistakes(scores_of: Callable[[Case], Tensor], visible_of: Callable[[Case], Tensor],
                      spread: Callable[[Tensor], Tensor], axes: str = "query") -> list[Mistake]:
    """The softmax written by hand, wrong only where scores are large: exp of the raw scores (overflow) and the
    whole tensor's max subtracted (underflow). scores_of(case): the scaled scores (B, nh, T, S) before any mask;
    visible_of(case): (T, S) the keys each query may see; spread: rows (B, nh, T) -> a mask of the first output."""
    def overflowing(c: Case) -> Tensor:
        return spread(_overflow_rows(scores_of(c)))

    def sunk(c: Case) -> Tensor:
        return spread(_sunk_rows(scores_of(c), visible_of(c)))

    def row_max(c: Case, idx: tuple) -> tuple[float, float]:
        s = scores_of(c)
        rows = s.masked_fill(~visible_of(c), -torch.inf).amax(-1)  # (B, nh, T)
        if axes == "position":  # the largest over the heads at that position
            return rows[idx[0], :, idx[1]].max().item(), s.max().item()
        return rows[idx[0], idx[1], idx[2]].item(), s.max().item()

    def unstable(ev: Evidence) -> str:
        idx, value = _worst_row(ev, overflowing, axes)
        top, _ = row_max(ev.case, idx)
        return (f"exp without subtracting the row's max: exp overflows float32 above {EXP_OVERFLOW:.1f} (exp("
                f"{EXP_OVERFLOW:.1f}) = {torch.finfo(F32).max:.2g}), and {_where(idx, axes)} has a largest score of "
                f"{top:.3g} ({ev.case.label}), so your output there is {value:.4g}; softmax(s) = softmax(s - m) for "
                "any m, so take m = s.amax(dim=-1, keepdim=True) before exp, or call torch.softmax, which does")

    def whole_max(ev: Evidence) -> str:
        idx, value = _worst_row(ev, sunk, axes)
        top, overall = row_max(ev.case, idx)
        return (f"the whole tensor's max subtracted, not each row's: {_where(idx, axes)} has a largest score of "
                f"{top:.3g}, {overall - top:.3g} below the tensor's largest ({overall:.3g}, {ev.case.label}), so "
                f"every exp(s - max) in its row is 0 (exp is 0 below {EXP_IS_ZERO:.0f}) and your output there "
                f"is {value:.4g} (0/0); subtract each row's own max: s.amax(dim=-1, keepdim=True)")

    return [
        Mistake("unstable_softmax", "exp without subtracting the row's max", None, unstable, CLAIM.format("scale"),
                matches=_only_in(overflowing)),
        Mistake("global_max", "the whole tensor's max subtracted, not each row's", None, whole_max,
                CLAIM.format("scale"), matches=_only_in(sunk, blown=False)),
    ]


# checking.py recognises these two in any exercise whose inputs are float tensors (by their effect, not an output)
IN_PLACE = Mistake("in_place", "your function changes its input in place", None, lambda ev: "",
                   "in the model, q, k and v are views of one projection that autograd, hooks and the KV cache keep; "
                   "an in-place edit changes them behind their backs (autograd raises, the cache holds other keys): "
                   "make a new tensor (q = q * scale, not q *= scale; masked_fill, not masked_fill_)")
LOWER_PRECISION = Mistake("lower_precision", "computed in a lower precision than the input's", None, lambda ev: "",
                          f"float16 keeps 11 bits of mantissa and overflows above {HALF_MAX:.0f}, bfloat16 keeps 8: "
                          "a float32 function rounded to either inside loses what float32 keeps (mixed precision, "
                          "autocast, keeps the softmax and its sum in float32 for this reason)")


# ------------------------------------------------------------------------------------------------ 1. scores


def scores_with(q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    """The scores math_attention computes before the softmax (no mask): q k^T * scale (None: 1/sqrt(hs))."""
    rec = _Record()
    everything = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool)
    math_attention(q, k, k, everything, scale=scale, causal_mask="none", on_scores=rec)
    return rec.seen


def _scores_cases() -> list[Case]:
    out = []
    for i, (b, nh, t, s, hs, dtype) in enumerate([(1, 1, 1, 1, 8, F32), (2, 3, 5, 5, 7, F32), (1, 2, 16, 16, 16, F32),
                                                  (2, 2, 6, 9, 4, F32), (1, 4, 512, 512, 64, F32),
                                                  (3, 2, 33, 33, 12, BF16)]):
        g = _gen(100 + i)
        out.append(Case({"B": b, "nh": nh, "T": t, "S": s, "hs": hs},
                        (_randn(g, b, nh, t, hs, dtype=dtype), _randn(g, b, nh, s, hs, dtype=dtype)), dtype))
    # large scores, up to 1e4: q.k reaches 8e4 before the division by sqrt(64), past float16's 65504
    g = _gen(150)
    k = torch.randn(1, 2, 12, 64, generator=g)
    q = _aligned(g, k, torch.logspace(0.1, math.log10(1250), 12), torch.full((12,), 11))
    out.append(Case({"B": 1, "nh": 2, "T": 12, "S": 12, "hs": 64}, (q, k), F32, _maxima_note(scores_with(q, k))))
    return out


def _hs(ev: Evidence) -> int:
    return ev.case.sizes["hs"]


def _scale_sentence(ev: Evidence, factor: str, mistake: str) -> str:
    hs = _hs(ev)
    r = _ratio(ev.mine, ev.ref) if ev.mine.shape == ev.ref.shape else float("nan")
    return (f"{mistake}: your scores are {r:.3g} times the reference's at d_k = {hs} ({ev.case.label}), which is "
            f"{factor}; q k^T is divided by sqrt(d_k) so the scores keep a variance of about 1 whatever the head "
            f"size and the softmax does not saturate")


def _attn_scale_sentence(ev: Evidence, factor: str, mistake: str) -> str:
    hs = _hs(ev)
    diff = (ev.mine - ev.ref).abs().max().item()
    return (f"{mistake}: your output is what the reference gives with the scores multiplied by {factor} at d_k = "
            f"{hs} ({ev.case.label}; largest difference {diff:.3g}); q k^T is divided by sqrt(d_k) so the scores "
            f"keep a variance of about 1 and the softmax does not saturate")


SCALE_MISTAKES = dict(
    no_scale=("no 1/sqrt(d_k)", "sqrt(d_k) = {:.3g}: the scores were never divided by sqrt(d_k)"),
    divided_by_dk=("divided by d_k", "1/sqrt(d_k) = {:.3g}: q k^T over d_k itself instead of its square root"),
)


def _scale_of(name: str, hs: int) -> float:
    return {"no_scale": 1.0, "divided_by_dk": 1.0 / hs}[name]


def _factor(name: str, hs: int) -> float:
    return {"no_scale": math.sqrt(hs), "divided_by_dk": 1.0 / math.sqrt(hs)}[name]


def _scores_mistakes() -> list[Mistake]:
    def scale_mistake(name):
        title, words = SCALE_MISTAKES[name]
        return Mistake(name, title,
                       lambda c: scores_with(*c.float_args(), scale=_scale_of(name, c.sizes["hs"])),
                       lambda ev: _scale_sentence(ev, words.format(_factor(name, _hs(ev))), title),
                       CLAIM.format("scale"))

    return [
        scale_mistake("no_scale"),
        scale_mistake("divided_by_dk"),
        Mistake("sqrt_of_length", "sqrt of the wrong size",
                lambda c: scores_with(*c.float_args(), scale=1.0 / math.sqrt(c.sizes["S"])),
                lambda ev: (f"sqrt of the wrong size: your scores are {_ratio(ev.mine, ev.ref):.3g} times the "
                            f"reference's ({ev.case.label}) = sqrt(d_k / S): you divided by the square root of the "
                            f"number of keys; d_k is the head size, q.size(-1) = {_hs(ev)}"),
                CLAIM.format("scale")),
        Mistake("keys_not_transposed", "keys not transposed",
                lambda c: scores_with(c.float_args()[0], c.float_args()[1].transpose(-2, -1),
                                      scale=1 / math.sqrt(c.sizes["hs"])),
                lambda ev: ("keys not transposed: you multiplied q @ k, which pairs query channels with key "
                            "positions; it only runs when S = hs (here " + ev.case.label + ") and is wrong there; "
                            "each score is a dot product of a query and a key over the channels: q @ k.transpose(-2, "
                            "-1)"),
                CLAIM.format("qk")),
        Mistake("wrong_axes", "the wrong axes multiplied",
                lambda c: scores_with(c.float_args()[0].transpose(-2, -1), c.float_args()[1].transpose(-2, -1),
                                      scale=1 / math.sqrt(c.sizes["hs"])),
                lambda ev: (f"the wrong axes multiplied: your scores have shape {tuple(ev.mine.shape)} = q^T k, one "
                            f"number per pair of channels ({ev.case.label}); scores are one number per (query, key) "
                            "pair, (B, nh, T, S) = q @ k.transpose(-2, -1)"),
                CLAIM.format("qk")),
        Mistake("transposed", "queries and keys swapped",
                lambda c: scores_with(c.float_args()[1], c.float_args()[0], scale=1 / math.sqrt(c.sizes["hs"])),
                lambda ev: (f"queries and keys swapped: your scores are k q^T, the reference's transposed "
                            f"(shape {tuple(ev.mine.shape)} for {ev.case.label}): row i must be query i's scores "
                            "for every key, q @ k.transpose(-2, -1)"),
                CLAIM.format("qk")),
    ]


# -------------------------------------------------------------------------------------------------- 2. mask


def masked(scores: Tensor, visible: Tensor, fill: float = float("-inf")) -> Tensor:
    return scores.masked_fill(~visible, fill)


def _causal(t: int) -> Tensor:
    """visible_keys of positions 0..T-1 against themselves: the model's causal mask, (T, T) bool."""
    return visible_keys(_pos(t), _pos(t))


def _diagonal_hidden(t: int) -> Tensor:
    return visible_keys(_pos(t) - 1, _pos(t))  # key j visible to query i only when j <= i - 1


def _one_future(t: int) -> Tensor:
    return visible_keys(_pos(t) + 1, _pos(t))  # j <= i + 1


def _transposed_mask(t: int) -> Tensor:
    return _causal(t).T  # j >= i: the past hidden, the future seen


def _mask_cases() -> list[Case]:
    out = []
    for i, (b, nh, t, dtype) in enumerate([(1, 1, 1, F32), (2, 3, 5, F32), (1, 2, 17, F32), (1, 4, 512, F32),
                                           (3, 2, 33, BF16)]):
        g = _gen(200 + i)
        out.append(Case({"B": b, "nh": nh, "T": t}, (_randn(g, b, nh, t, t, dtype=dtype),), dtype))
    return out


def _first_future_seen(ev: Evidence) -> str:
    """'query 0 of head 0 gives key 1 a score of 0' style: the first hidden key whose score is not -inf."""
    t = ev.ref.size(-1)
    leak = torch.isfinite(ev.mine) & ~_causal(t)
    if not leak.any():
        return ""
    b, h, i, j = (int(x) for x in leak.nonzero()[0])
    return f"query {i} of head {h} has score {ev.mine[b, h, i, j].item():.3g} for key {j}, which comes after it"


def _mask_mistakes() -> list[Mistake]:
    def weights_after(mine: Tensor) -> Tensor:
        return F.softmax(mine, dim=-1)

    return [
        Mistake("zero_not_inf", "0 instead of -inf",
                lambda c: masked(c.float_args()[0], _causal(c.sizes["T"]), 0.0),
                lambda ev: (f"0 instead of -inf: the future keys' scores are set to 0, not -inf ("
                            f"{_first_future_seen(ev)}), so after the softmax they still get weight e^0/Z "
                            f"({weights_after(ev.mine)[0, 0, 0, 1:].sum().item():.3g} of query 0's weight goes to the "
                            f"future in {ev.case.label}); -inf before the softmax is what makes a hidden key's "
                            "weight exactly 0"),
                CLAIM.format("mask")),
        Mistake("diagonal_hidden", "the mask is one off",
                lambda c: masked(c.float_args()[0], _diagonal_hidden(c.sizes["T"])),
                lambda ev: (f"the mask is one off: it hides the diagonal too (query 0's score for key 0 is "
                            f"{ev.mine[0, 0, 0, 0].item()}), so a token cannot attend to itself and query 0 sees no "
                            "key at all (its softmax is NaN); hide only j > i: triu(..., diagonal=1)"),
                CLAIM.format("mask")),
        Mistake("future_visible", "the mask is one off the other way",
                lambda c: masked(c.float_args()[0], _one_future(c.sizes["T"])),
                lambda ev: (f"the mask is one off the other way: each query still sees the next key ("
                            f"{_first_future_seen(ev)}), so the model can read the token it must predict; hide every "
                            "j > i: triu(..., diagonal=1)"),
                CLAIM.format("mask")),
        Mistake("mask_transposed", "the mask is transposed",
                lambda c: masked(c.float_args()[0], _transposed_mask(c.sizes["T"])),
                lambda ev: (f"the mask is transposed: it hides the past and keeps the future ("
                            f"{_first_future_seen(ev)}); a query may see keys j <= i: keep the lower triangle"),
                CLAIM.format("mask")),
        Mistake("softmaxed", "you returned weights, not scores",
                lambda c: F.softmax(masked(c.float_args()[0], _causal(c.sizes["T"])), dim=-1),
                lambda ev: (f"you returned weights, not scores: your rows sum to "
                            f"{ev.mine[0, 0, -1].sum().item():.3g} (softmax already applied); this step only sets "
                            "the future keys' scores to -inf, the softmax comes next"),
                CLAIM.format("mask")),
    ]


# ---------------------------------------------------------------------------------------------- 3. attention


def attention_with(q: Tensor, k: Tensor, v: Tensor, visible: Tensor | None = None, **switches) -> Tensor:
    """math_attention, the model's reference, over causal self-attention (or `visible`), with its switches."""
    visible = _causal(q.size(-2)) if visible is None else visible
    return math_attention(q, k, v, visible, **switches)[0]


def _zero_fill(visible: Tensor) -> _Record:
    return _Record(lambda s: s.masked_fill(~visible, 0.0))


def _softmax_over_queries(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    rec = _Record()
    math_attention(q, k, v, _causal(q.size(-2)), on_scores=rec)  # the masked scores, -inf on the future
    return F.softmax(rec.seen, dim=-2) @ v


def _keys_as_queries(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    s = scores_with(k, q)  # (B, nh, T, T): row i holds key i's products with every query
    return F.softmax(masked(s, _causal(q.size(-2))), dim=-1) @ v


def _attention_cases() -> list[Case]:
    out = []
    for i, (b, nh, t, hs, dtype) in enumerate([(1, 1, 1, 8, F32), (2, 3, 5, 7, F32), (1, 2, 16, 16, F32),
                                               (1, 4, 512, 64, F32), (3, 2, 33, 12, BF16)]):
        g = _gen(300 + i)
        out.append(Case({"B": b, "nh": nh, "T": t, "hs": hs},
                        tuple(_randn(g, b, nh, t, hs, dtype=dtype) for _ in range(3)), dtype))
    for seed, dtype in ((350, F32), (351, BF16)):  # large scores: row maxima from about 4 to 1e4
        out.append(_large_attention_case(seed, dtype))
    return out


def _large_attention_case(seed: int, dtype: torch.dtype, b: int = 1, nh: int = 2, t: int = 12, hs: int = 16) -> Case:
    g = _gen(seed)
    k = torch.randn(b, nh, t, hs, generator=g)
    q = _aligned(g, k, torch.logspace(0, math.log10(2500), t), torch.arange(t))
    q, k, v = q.to(dtype), k.to(dtype), _randn(g, b, nh, t, hs, dtype=dtype)
    note = _maxima_note(scores_with(q.float(), k.float()), _causal(t))
    return Case({"B": b, "nh": nh, "T": t, "hs": hs}, (q, k, v), dtype, note)


def _row_sums(ev: Evidence) -> Tensor | None:
    w = ev.weights()
    return None if w is None else w.sum(-1)


def _future_weight(ev: Evidence) -> str:
    w = ev.weights()
    if w is None:
        return ""
    t = w.size(-1)
    leak = (w * ~_causal(t)).sum(-1)  # (B, nh, T): each query's weight on later keys
    b, h, i = (int(x) for x in (leak == leak.max()).nonzero()[0])
    return f"query {i} of head {h} puts {leak[b, h, i].item():.3g} of its weight on later keys ({ev.case.label})"


def _attention_mistakes() -> list[Mistake]:
    def scale_mistake(name):
        title, words = SCALE_MISTAKES[name]
        return Mistake(name, title,
                       lambda c: attention_with(*c.float_args(), scale=_scale_of(name, c.sizes["hs"])),
                       lambda ev: _attn_scale_sentence(ev, words.format(_factor(name, _hs(ev))), title),
                       CLAIM.format("scale"))

    def after_softmax(ev):
        sums = _row_sums(ev)
        said = (f"query 0's weights sum to {sums[0, 0, 0].item():.3g} and query {sums.size(-1) // 2}'s to "
                f"{sums[0, 0, sums.size(-1) // 2].item():.3g}, not 1 ({ev.case.label})") if sums is not None else \
            "the rows of your weights sum to less than 1"
        return (f"the mask is applied after the softmax: {said}; the future keys were in the softmax's denominator, "
                "so they still shape every weight (the future leaks); put -inf on their scores before the softmax")

    numerics = numerics_mistakes(lambda c: scores_with(*c.float_args()[:2]), lambda c: _causal(c.sizes["T"]),
                                 lambda rows: rows[..., None])
    return numerics + [
        scale_mistake("no_scale"),
        scale_mistake("divided_by_dk"),
        Mistake("mask_after_softmax", "the mask is applied after the softmax",
                lambda c: attention_with(*c.float_args(), causal_mask="after_softmax"), after_softmax,
                CLAIM.format("mask")),
        Mistake("zero_not_inf", "0 instead of -inf",
                lambda c: attention_with(*c.float_args(), causal_mask="none",
                                         on_scores=_zero_fill(_causal(c.sizes["T"]))),
                lambda ev: (f"0 instead of -inf: the future keys' scores are set to 0, not -inf, so the softmax "
                            f"still gives them weight e^0/Z ({_future_weight(ev)}); -inf before the softmax makes a "
                            "hidden key's weight exactly 0"),
                CLAIM.format("mask")),
        Mistake("no_mask", "no causal mask",
                lambda c: attention_with(*c.float_args(), causal_mask="none"),
                lambda ev: (f"no causal mask: every query sees every key ({_future_weight(ev)}), so the model reads "
                            "the token it must predict; set the scores of keys j > i to -inf before the softmax"),
                CLAIM.format("mask")),
        Mistake("diagonal_hidden", "the mask is one off",
                lambda c: attention_with(*c.float_args(), visible=_diagonal_hidden(c.sizes["T"])),
                lambda ev: ("the mask is one off: it hides the diagonal too, so a token cannot attend to itself and "
                            f"query 0 sees no key at all (its output is {ev.mine[0, 0, 0, 0].item()}, a softmax over "
                            "nothing); hide only j > i: triu(..., diagonal=1)"),
                CLAIM.format("mask")),
        Mistake("future_visible", "the mask is one off the other way",
                lambda c: attention_with(*c.float_args(), visible=_one_future(c.sizes["T"])),
                lambda ev: (f"the mask is one off the other way: each query also sees the next key "
                            f"({_future_weight(ev)}), which is the token it must predict; hide every j > i: "
                            "triu(..., diagonal=1)"),
                CLAIM.format("mask")),
        Mistake("mask_transposed", "the mask is transposed",
                lambda c: attention_with(*c.float_args(), visible=_transposed_mask(c.sizes["T"])),
                lambda ev: (f"the mask is transposed: it hides the past and keeps the future ({_future_weight(ev)}); "
                            "a query may see keys j <= i: keep the lower triangle"),
                CLAIM.format("mask")),
        Mistake("softmax_over_queries", "softmax over the query axis",
                lambda c: _softmax_over_queries(*c.float_args()),
                lambda ev: ("softmax over the query axis: your weights sum to 1 down each key's column, not along each "
                            + (f"query's row (query 0's row sums to {_row_sums(ev)[0, 0, 0].item():.3g}, "
                               f"{ev.case.label})" if _row_sums(ev) is not None else "query's row")
                            + ", so a weight depends on later queries' scores (the future leaks); softmax(scores, "
                            "dim=-1)"),
                CLAIM.format("mask")),
        Mistake("keys_not_transposed", "keys not transposed",
                lambda c: attention_with(c.float_args()[0], c.float_args()[1].transpose(-2, -1), c.float_args()[2]),
                lambda ev: ("keys not transposed: your scores are q @ k, which pairs query channels with key positions; "
                            f"it only runs when T = hs (here {ev.case.label}) and is wrong there; scores are q @ "
                            "k.transpose(-2, -1)"),
                CLAIM.format("qk")),
        Mistake("queries_keys_swapped", "queries and keys swapped",
                lambda c: _keys_as_queries(*c.float_args()),
                lambda ev: ("queries and keys swapped: your scores are k q^T, so row i holds key i's products with "
                            f"every query ({ev.case.label}); row i must be query i's scores: q @ k.transpose(-2, -1)"),
                CLAIM.format("qk")),
    ]


# --------------------------------------------------------------------------------------------- 4. multi_head


def _module(c: int, nh: int, w_qkv, b_qkv, w_proj, b_proj) -> CausalSelfAttention:
    m = CausalSelfAttention(GPTConfig(n_embd=c, n_head=nh, pos_encoding="none", attn_backend="math", block_size=1024))
    with torch.no_grad():
        m.c_attn.weight.copy_(w_qkv)
        m.c_attn.bias.copy_(b_qkv)
        m.c_proj.weight.copy_(w_proj)
        m.c_proj.bias.copy_(b_proj)
    return m.eval()


def multi_head_reference(x, w_qkv, b_qkv, w_proj, b_proj, n_head):
    """The model's own attention layer (CausalSelfAttention, math backend, no positions) with these weights."""
    m = _module(x.size(-1), n_head, w_qkv, b_qkv, w_proj, b_proj)
    with torch.no_grad():
        return m(x, PositionalEncoding(), None, _pos(x.size(1)))[0]


def _split_heads(qkv: Tensor, nh: int):
    return split_qkv(qkv, nh, nh)  # the model's: (B, T, 3C) -> q, k, v (B, nh, T, hs)


def _split_no_transpose(qkv: Tensor, nh: int):
    b, t, c3 = qkv.shape
    return tuple(z.reshape(b, nh, t, c3 // 3 // nh) for z in qkv.split(c3 // 3, dim=-1))


def _concat(y: Tensor) -> Tensor:
    b, nh, t, hs = y.shape
    return y.transpose(1, 2).reshape(b, t, nh * hs)  # as CausalSelfAttention.forward re-assembles its heads


def multi_head_with(x, w_qkv, b_qkv, w_proj, b_proj, n_head, split=_split_heads, core=None,
                    concat=_concat, project=True):
    """The layer from the model's pieces (split_qkv, math_attention) with one of them swapped for a mistake."""
    q, k, v = split(F.linear(x, w_qkv, b_qkv), n_head)
    y = concat((core or attention_with)(q, k, v))
    return F.linear(y, w_proj, b_proj) if project else y


def _multi_head_cases() -> list[Case]:
    out = []
    for i, (b, t, c, nh, dtype) in enumerate([(1, 1, 8, 2, F32), (2, 7, 12, 4, F32), (1, 32, 32, 1, F32),
                                              (3, 32, 32, 2, F32), (2, 64, 48, 3, F32)]):
        g = _gen(400 + i)
        args = (_randn(g, b, t, c), _randn(g, 3 * c, c) / math.sqrt(c), _randn(g, 3 * c) * 0.1,
                _randn(g, c, c) / math.sqrt(c), _randn(g, c) * 0.1, nh)
        out.append(Case({"B": b, "T": t, "C": c, "nh": nh, "hs": c // nh}, args, dtype))
    return out + [_large_multi_head_case()]


def _multi_head_scores(case: Case) -> Tensor:
    """The scaled scores (B, nh, T, T) inside the model's layer for this case, before the mask."""
    x, w_qkv, b_qkv, _, _, nh = case.float_args()
    q, k, _ = _split_heads(F.linear(x, w_qkv, b_qkv), nh)
    return scores_with(q, k)


def _large_multi_head_case(b: int = 1, t: int = 16, c: int = 32, nh: int = 2) -> Case:
    """Position p's vector times 0.5 .. 63, so the heads' row maxima run from about 1 to 2e3; the first seed
    whose every row above a score of 30 leads its second key by 10 or more (a saturated softmax: see _aligned)."""
    scale = torch.logspace(-0.3, 1.8, t)[:, None]  # (T, 1)
    for seed in range(450, 550):
        g = _gen(seed)
        args = (_randn(g, b, t, c) * scale, _randn(g, 3 * c, c) / math.sqrt(c), _randn(g, 3 * c) * 0.1,
                _randn(g, c, c) / math.sqrt(c), _randn(g, c) * 0.1, nh)
        case = Case({"B": b, "T": t, "C": c, "nh": nh, "hs": c // nh}, args, F32)
        s = _multi_head_scores(case).masked_fill(~_causal(t), -torch.inf)
        top = s.topk(2, dim=-1).values  # (B, nh, T, 2); query 0's second is -inf
        if bool((top[..., 0] - top[..., 1])[top[..., 0] > 30].ge(10).all()):
            case.note = _maxima_note(s)
            return case
    raise AssertionError("no seed gives a saturated large-scores case for multi_head")


def _multi_head_mistakes(attention_mistakes: list[Mistake]) -> list[Mistake]:
    def head_mistake(name, title, sentence, **swap):
        return Mistake(name, title, lambda c: multi_head_with(*c.float_args(), **swap), sentence, CLAIM.format("heads"))

    out = [
        head_mistake("split_no_transpose", "heads split without the transpose",
                     lambda ev: (f"heads split without the transpose: you reshaped (B, T, C) straight to (B, nh, T, hs), "
                                 f"so each 'head' holds pieces of {ev.case.sizes['nh']} different tokens, later ones "
                                 f"included ({ev.case.label}); view as (B, T, nh, hs), then transpose(1, 2)"),
                     split=_split_no_transpose),
        head_mistake("concat_no_transpose", "heads concatenated without the transpose",
                     lambda ev: ("heads concatenated without the transpose: you reshaped (B, nh, T, hs) straight to "
                                 "(B, T, C), so each position's output is made of other positions' heads ("
                                 f"{ev.case.label}); transpose(1, 2) back to (B, T, nh, hs) first, then reshape"),
                     concat=lambda y: y.reshape(y.size(0), y.size(2), -1)),
        head_mistake("heads_interleaved", "heads concatenated in the wrong order",
                     lambda ev: ("heads concatenated in the wrong order: your channels go channel-major (channel c of "
                                 "every head, then channel c + 1), but the output projection reads head h at channels "
                                 "h*hs..(h+1)*hs; concatenate whole heads: y.transpose(1, 2).reshape(B, T, C)"),
                     concat=lambda y: y.permute(0, 2, 3, 1).reshape(y.size(0), y.size(2), -1)),
        head_mistake("heads_reversed", "heads concatenated in the wrong order",
                     lambda ev: ("heads concatenated in the wrong order: your heads are in reverse order, so the output "
                                 "projection's columns for head 0 read the last head; keep head h at channels "
                                 "h*hs..(h+1)*hs"),
                     concat=lambda y: _concat(y.flip(1))),
        head_mistake("no_output_projection", "no output projection",
                     lambda ev: ("no output projection: your output is the concatenated heads themselves; the layer "
                                 "ends with y @ w_proj.T + b_proj, which mixes what the heads found"),
                     project=False),
    ]
    out += numerics_mistakes(_multi_head_scores, lambda c: _causal(c.sizes["T"]), lambda rows: rows.any(1)[..., None],
                             axes="position")
    for m in attention_mistakes:  # a mistake inside the heads: the same idea, one level down
        if m.name in ("keys_not_transposed",) or m.compute is None:
            continue
        out.append(Mistake(m.name, m.title,
                           (lambda mm: lambda c: multi_head_with(*c.float_args(),
                                                                 core=_core_of(mm, c)))(m),
                           (lambda mm: lambda ev: f"inside your heads, {mm.title}: " + _head_sentence(mm.name))(m),
                           m.why))
    return out


def _core_of(mistake: Mistake, case: Case):
    """The attention of each head with this mistake, as a function of (q, k, v) for multi_head_with."""
    def core(q, k, v):
        hs = q.size(-1)
        sub = Case({"B": q.size(0), "nh": q.size(1), "T": q.size(2), "hs": hs}, (q, k, v))
        return mistake.compute(sub)
    return core


HEAD_SENTENCES = {  # what goes wrong inside each head, in other words than the mistake's title
    "no_scale": "q k^T is never divided by sqrt(d_k), so the scores grow with the head size and the softmax saturates",
    "divided_by_dk": "q k^T is divided by d_k, where sqrt(d_k) keeps the scores' variance near 1",
    "mask_after_softmax": "the future keys stay in each softmax's denominator, so the visible weights sum to less "
                          "than 1 and the future leaks",
    "zero_not_inf": "a future key's score of 0 still gets weight e^0/Z after the softmax",
    "no_mask": "every query sees every key, the token it must predict included",
    "diagonal_hidden": "no token may attend to itself, so query 0 sees no key at all (NaN)",
    "future_visible": "each query also sees the key after it, the token it must predict",
    "mask_transposed": "the past is hidden and the future kept",
    "softmax_over_queries": "each key's column sums to 1 instead of each query's row, so a weight depends on later "
                            "queries",
    "queries_keys_swapped": "the scores are k q^T, so row i holds key i's products with every query",
}


def _head_sentence(name: str) -> str:
    return HEAD_SENTENCES[name] + " (check your attention alone: `check attention`)"


# ------------------------------------------------------------------------------------------- 5. sinusoidal


def table_with(n_positions: int, dim: int, even=torch.sin, odd=torch.cos, two_i_scale: float = 1.0,
               first: int = 0, concatenated: bool = False) -> Tensor:
    """sinusoidal_table's formula with one thing changed (the defaults are the reference: a test checks)."""
    pos = torch.arange(first, first + n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, dim, 2, dtype=torch.float64) * two_i_scale
    angle = pos / torch.pow(10000.0, two_i / dim)
    if concatenated:  # [sin of every frequency | cos of every frequency]
        return torch.cat([even(angle), odd(angle[:, : dim // 2])], dim=-1).float()
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = even(angle)
    table[:, 1::2] = odd(angle[:, : dim // 2])
    return table.float()


def _sinusoidal_cases() -> list[Case]:
    return [Case({"P": p, "dim": d}, (p, d), F32) for p, d in [(1, 8), (12, 7), (32, 32), (512, 256)]]


def _sinusoidal_mistakes() -> list[Mistake]:
    def m(name, title, sentence, **change):
        return Mistake(name, title, lambda c: table_with(*c.args, **change), sentence, CLAIM.format("positions"))

    return [
        m("concatenated", "sin and cos concatenated, not interleaved",
          lambda ev: (f"sin and cos concatenated, not interleaved: your row {min(1, len(ev.mine) - 1)} starts "
                      f"{_row(ev.mine, min(1, len(ev.mine) - 1))} where the reference's starts "
                      f"{_row(ev.ref, min(1, len(ev.ref) - 1))}: you put every sine first, then every cosine (the "
                      "tensor2tensor layout); the model interleaves them as Vaswani et al. write it: PE[p, 2i] = sin, "
                      "PE[p, 2i+1] = cos"), concatenated=True),
        m("sin_cos_swapped", "sin and cos swapped",
          lambda ev: (f"sin and cos swapped: your row 0 is {_row(ev.mine, 0)} where the reference's is "
                      f"{_row(ev.ref, 0)} (sin 0 = 0, cos 0 = 1): even channels take the sine, odd ones the cosine"),
          even=torch.cos, odd=torch.sin),
        m("pair_index_exponent", "the exponent uses i, not 2i",
          lambda ev: (f"the exponent uses i, not 2i: your channel {min(3, ev.case.args[1] - 1)} at position 1 is "
                      f"{ev.mine[1, min(3, ev.case.args[1] - 1)].item():.4g} where the reference's is "
                      f"{ev.ref[1, min(3, ev.case.args[1] - 1)].item():.4g}: your wavelengths grow half as fast; the "
                      "pair i of channels (2i, 2i+1) has frequency 1 / 10000^(2i/d)"), two_i_scale=0.5),
        m("doubled_exponent", "the exponent counts 2i twice",
          lambda ev: (f"the exponent counts 2i twice: your channel {min(3, ev.case.args[1] - 1)} at position 1 is "
                      f"{ev.mine[1, min(3, ev.case.args[1] - 1)].item():.4g} where the reference's is "
                      f"{ev.ref[1, min(3, ev.case.args[1] - 1)].item():.4g}: arange(0, d, 2) already counts 2i, so "
                      "the exponent is that over d, not twice it"), two_i_scale=2.0),
        m("positions_from_one", "positions counted from 1",
          lambda ev: (f"positions counted from 1: your row 0 is {_row(ev.mine, 0)}, the reference's position 1; the "
                      "first token is position 0 (sin 0 = 0, cos 0 = 1)"), first=1),
    ]


def _row(t: Tensor, i: int) -> str:
    return "[" + ", ".join(f"{x:.3g}" for x in t[i, :4].tolist()) + ", ...]"


# ------------------------------------------------------------------------------------------------- 6. rope


def _rotary(hs: int, base: float) -> RotaryPositions:
    return RotaryPositions(GPTConfig(n_embd=hs, n_head=1, pos_encoding="rope", rope_base=base))


def rope_reference(x: Tensor, pos: Tensor, base: float = 10000.0) -> Tensor:
    """The model's RoPE (RotaryPositions.rotate): channel pairs (i, i + hs/2), the rotate-half convention."""
    return _rotary(x.size(-1), base).rotate(x, pos)


def _interleave_perm(hs: int) -> Tensor:
    """Channels 0, 2, 4, ..., 1, 3, 5, ...: adjacent pairs (2i, 2i+1) become halves' pairs (i, i + hs/2)."""
    return torch.cat([torch.arange(0, hs, 2), torch.arange(1, hs, 2)])


def rope_adjacent(x: Tensor, pos: Tensor, base: float = 10000.0) -> Tensor:
    """RoPE over adjacent pairs (2i, 2i+1) (RoFormer, GPT-J): the model's rotation with the channels regrouped."""
    perm = _interleave_perm(x.size(-1))
    return rope_reference(x[..., perm], pos, base)[..., torch.argsort(perm)]


def _rope_pair_index(x: Tensor, pos: Tensor, base: float = 10000.0) -> Tensor:
    rot = _rotary(x.size(-1), base)
    hs = x.size(-1)
    rot.inv_freq = 1.0 / (base ** (torch.arange(hs // 2, dtype=torch.float32) / hs))  # i, not 2i
    return rot.rotate(x, pos)


def _rope_cases() -> list[Case]:
    out = []
    for i, (b, nh, t, hs, start, dtype) in enumerate([(1, 1, 1, 2, 0, F32), (2, 3, 7, 8, 0, F32),
                                                      (1, 2, 9, 16, 5, F32), (1, 4, 512, 64, 0, F32),
                                                      (3, 2, 33, 12, 20, BF16)]):
        g = _gen(600 + i)
        out.append(Case({"B": b, "nh": nh, "T": t, "hs": hs, "first position": start},
                        (_randn(g, b, nh, t, hs, dtype=dtype), _pos(t, start)), dtype))
    return out


def _rope_mistakes(convention: str) -> list[Mistake]:
    other = "halves" if convention == "adjacent" else "adjacent"
    claim = CLAIM.format("positions")
    out = []
    if other == "adjacent":
        out.append(Mistake("adjacent_pairs", "RoPE on adjacent pairs, not halves",
                           lambda c: rope_adjacent(*c.float_args()),
                           lambda ev: ("RoPE on adjacent pairs, not halves: you rotate channels (2i, 2i+1) together "
                                       "(the RoFormer paper's and GPT-J's convention); this model rotates (i, i + hs/2) "
                                       "(rotate-half, as GPT-NeoX and Llama). Both are RoPE; only one matches these "
                                       "weights. To check yours in your convention: add --rope adjacent (in a notebook "
                                       "rope=\"adjacent\")"), claim))
    else:
        out.append(Mistake("halves_pairs", "RoPE on halves, not adjacent pairs",
                           lambda c: rope_reference(*c.float_args()),
                           lambda ev: ("RoPE on halves, not adjacent pairs: you rotate channels (i, i + hs/2) together "
                                       "(rotate-half, the model's own convention) but asked for adjacent pairs "
                                       "(2i, 2i+1); drop --rope adjacent to check it against the model"), claim))
    accepted = rope_adjacent if convention == "adjacent" else rope_reference

    def regrouped(f):  # the same mistake in the learner's convention
        if convention != "adjacent":
            return f
        def g(x, pos, base=10000.0):
            perm = _interleave_perm(x.size(-1))
            return f(x[..., perm], pos, base)[..., torch.argsort(perm)]
        return g

    out += [
        Mistake("wrong_direction", "rotated the wrong way",
                lambda c: accepted(c.float_args()[0], -c.float_args()[1]),
                lambda ev: ("rotated the wrong way: your output is the reference's rotation by -angle (the sign of the "
                            "sine flipped: rotate_half is (-x2, x1), not (x2, -x1)); q and k would still give relative "
                            "scores, but not the model's"), claim),
        Mistake("pair_index_exponent", "frequencies from i, not 2i",
                lambda c: regrouped(_rope_pair_index)(*c.float_args()),
                lambda ev: ("frequencies from i, not 2i: pair i turns at base^(-i/hs) in your code, base^(-2i/hs) in "
                            "the model's, so your slowest pair is far too fast"), claim),
        Mistake("ignores_pos", "positions 0..T-1 instead of pos",
                lambda c: accepted(c.float_args()[0], _pos(c.sizes["T"])),
                lambda ev: (f"positions 0..T-1 instead of pos: your rotation matches the reference's for positions "
                            f"starting at 0, but here pos starts at {ev.case.sizes['first position']} "
                            f"({ev.case.label}), as it does after a KV cache; rotate by the pos you are given"), claim),
    ]
    return out


# ------------------------------------------------------------------------------------------------ 7. decode


def decode_reference(q, k, v, k_cache, v_cache, top_left: bool = False, **switches):
    """One step through the model's KVCache and math_attention: the cache takes the S old keys, then the new
    one; the new query at position S sees keys 0..S -> (y, keys, values)."""
    s = k_cache.size(2)
    cache = KVCache(1, s + 1)
    if s:
        cache.update(0, k_cache, v_cache)
        cache.advance(s)
    keys, values, k_pos = cache.update(0, k, v)
    q_pos = torch.tensor([0 if top_left else s])  # top_left: the query placed at position 0, as is_causal does
    y = math_attention(q, keys, values, visible_keys(q_pos, k_pos), **switches)[0]
    return y, keys.clone(), values.clone()


def _decode_cases() -> list[Case]:
    out = []
    for i, (b, nh, s, hs, dtype) in enumerate([(1, 1, 0, 8, F32), (2, 3, 1, 7, F32), (1, 2, 31, 16, F32),
                                               (2, 4, 511, 64, F32), (3, 2, 20, 12, BF16)]):
        g = _gen(700 + i)
        new = tuple(_randn(g, b, nh, 1, hs, dtype=dtype) for _ in range(3))
        old = tuple(_randn(g, b, nh, s, hs, dtype=dtype) for _ in range(2))
        out.append(Case({"B": b, "nh": nh, "S": s, "hs": hs}, new + old, dtype))
    for seed, dtype in ((750, F32), (751, BF16)):  # large scores: the four rows' maxima about 12, 120, 1.2e3, 1e4
        g = _gen(seed)
        keys = torch.randn(2, 2, 16, 16, generator=g)  # 15 cached keys and the new one
        q = _aligned(g, keys, torch.tensor([3.0, 30.0, 300.0, 2500.0]).view(2, 2, 1), torch.tensor([15]))
        v = torch.randn(2, 2, 16, 16, generator=g)
        args = tuple(a.to(dtype) for a in (q, keys[:, :, 15:], v[:, :, 15:], keys[:, :, :15], v[:, :, :15]))
        out.append(Case({"B": 2, "nh": 2, "S": 15, "hs": 16}, args, dtype,
                        _maxima_note(scores_with(args[0].float(), keys.to(dtype).float()))))
    return out


def _decode_scores(case: Case) -> Tensor:
    q, k, _, k_cache, _ = case.float_args()
    return scores_with(q, torch.cat([k_cache, k], dim=2))  # (B, nh, 1, S + 1)


CACHE_WHY = ("each later step attends over the keys and values this step returns, so a key unseen, not kept or out "
             "of order changes every token generated after it; with a right cache the cached and the uncached model "
             "give the same tokens (tests/test_exercises_training.py checks that for the model's own KVCache)")


def _own_weight(case: Case) -> float:
    """The weight the reference gives the new token's own key, head 0 of batch 0."""
    return F.softmax(_decode_scores(case)[0, 0, 0], dim=-1)[-1].item()


def _decode_mistakes() -> list[Mistake]:
    def own_not_seen(c):
        q, k, v, kc, vc = c.float_args()
        if kc.size(2) == 0:
            y = torch.zeros_like(q)
        else:
            y = math_attention(q, kc, vc, torch.ones(1, kc.size(2), dtype=torch.bool))[0]
        return y, torch.cat([kc, k], 2), torch.cat([vc, v], 2)

    def not_appended(c):
        y, _, _ = decode_reference(*c.float_args())
        return y, c.float_args()[3], c.float_args()[4]

    def prepended(c):
        q, k, v, kc, vc = c.float_args()
        y, _, _ = decode_reference(*c.float_args())
        return y, torch.cat([k, kc], 2), torch.cat([v, vc], 2)

    def scale_mistake(name):
        title, words = SCALE_MISTAKES[name]
        return Mistake(name, title,
                       lambda c: decode_reference(*c.float_args(), scale=_scale_of(name, c.sizes["hs"])),
                       lambda ev: (f"{title}: your output is what the reference gives with the scores multiplied by "
                                   f"{words.format(_factor(name, _hs(ev)))} ({ev.case.label})"),
                       CLAIM.format("scale"))

    numerics = numerics_mistakes(_decode_scores, lambda c: torch.ones(1, c.sizes["S"] + 1, dtype=torch.bool),
                                 lambda rows: rows[..., None], axes="new")
    return numerics + [
        Mistake("own_key_not_seen", "attended before appending",
                own_not_seen,
                lambda ev: ("attended before appending: the new token attends over the cached keys only, not its own "
                            f"key, which the reference gives {_own_weight(ev.case):.3g} of the new query's weight in "
                            f"head 0 ({ev.case.label}); append k and v to the caches first, then attend over all "
                            f"S + 1 = {ev.case.sizes['S'] + 1}"),
                CACHE_WHY),
        Mistake("mask_top_left", "the causal mask aligned top-left",
                lambda c: decode_reference(*c.float_args(), top_left=True),
                lambda ev: (f"the causal mask aligned top-left: the new query sees only key 0 of the "
                            f"{ev.case.sizes['S'] + 1} ({ev.case.label}), as tril(ones(1, S + 1)) or sdpa's "
                            "is_causal=True do for one query; the new token is the last position and sees every "
                            "cached key: no mask at all"),
                CACHE_WHY),
        Mistake("cache_not_appended", "the new key not kept",
                not_appended,
                lambda ev: (f"the new key not kept: your output is right but the caches you return have "
                            f"{ev.mine[1].size(2)} keys, not {ev.ref[1].size(2)} (k, which starts "
                            f"{ev.ref[1][0, 0, -1, 0].item():.4g}, is missing): the next step would not see this "
                            "token"), CACHE_WHY),
        Mistake("cache_prepended", "the new key put first",
                prepended,
                lambda ev: ("the new key put first: your output is right (without positions the order of keys does "
                            f"not change it) but the caches hold k at index 0 of {ev.mine[1].size(2)}, "
                            f"where the reference's is at {ev.ref[1].size(2) - 1}; the cache keeps positions in order, "
                            "the newest last: torch.cat([k_cache, k], dim=2)"), CACHE_WHY),
        scale_mistake("no_scale"),
        scale_mistake("divided_by_dk"),
    ]


# ---------------------------------------------------------------------------------------------- the exercises


_ATTENTION_MISTAKES = _attention_mistakes()

EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    Exercise("scores", "the scores of one head", "scores", "q, k",
             "q (B, nh, T, hs) the queries, k (B, nh, S, hs) the keys of every head.\n"
             "Return the scores (B, nh, T, S): entry [b, h, i, j] is query i's dot product with key j, divided by\n"
             "sqrt(d_k), where d_k = hs is the head size.",
             lambda q, k: scores_with(q, k), _scores_cases, _scores_mistakes(), ("batch", "head", "query", "key"),
             "model/attention.py math_attention (the scores before its softmax)",
             "q @ k.transpose(...) ... / math.sqrt(...)"),
    Exercise("mask", "the causal mask", "mask", "scores",
             "scores (B, nh, T, T): query i's score for key j at [b, h, i, j].\n"
             "Return the same scores with -inf wherever key j comes after query i (j > i), so that after the softmax\n"
             "no query can see the future. Keys j <= i keep their scores.",
             lambda s: masked(s, _causal(s.size(-1))), _mask_cases, _mask_mistakes(),
             ("batch", "head", "query", "key"), "model/attention.py visible_keys (-inf where it is False)",
             "torch.ones(T, T).triu(...), scores.masked_fill(...)"),
    Exercise("attention", "softmax and the weighted sum: one head's causal attention", "attention", "q, k, v",
             "q, k, v (B, nh, T, hs): the queries, keys and values of every head.\n"
             "Return (B, nh, T, hs): in each head, softmax(mask(q k^T / sqrt(d_k))) v: the scores, -inf on the\n"
             "future keys, a softmax over the keys, the weighted average of the values.\n"
             "This is the function that trains: python train.py experiment=debug model.attn_impl=THIS_FILE:attention",
             lambda q, k, v: attention_with(q, k, v), _attention_cases, _ATTENTION_MISTAKES,
             ("batch", "head", "query", "channel"), "model/attention.py math_attention",
             "your scores and your mask, then torch.softmax(..., dim=...) and @ v"),
    Exercise("multi_head", "multi-head attention: split, attend, concatenate, project", "multi_head",
             "x, w_qkv, b_qkv, w_proj, b_proj, n_head",
             "x (B, T, C) the tokens' vectors; w_qkv (3C, C), b_qkv (3C,): the fused projection (nn.Linear's\n"
             "layout: out x in), its outputs [q | k | v], C channels each, head h at channels h*hs:(h+1)*hs of each;\n"
             "w_proj (C, C), b_proj (C,) the output projection; n_head heads of hs = C // n_head channels.\n"
             "Return (B, T, C): q, k, v projected and split into heads (B, nh, T, hs), causal attention in each\n"
             "head (paste your `attention` into this file), the heads concatenated side by side, the projection.",
             multi_head_reference, _multi_head_cases, _multi_head_mistakes(_ATTENTION_MISTAKES),
             ("batch", "position", "channel"), "model/attention.py CausalSelfAttention (math backend)",
             "qkv = x @ w_qkv.T + b_qkv; .split, .view(B, T, n_head, hs), .transpose(1, 2), ..."),
    Exercise("sinusoidal", "the sinusoidal position table", "sinusoidal", "n_positions, dim",
             "Return the (n_positions, dim) float32 table of Vaswani et al. (2017):\n"
             "PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(p / 10000^(2i/dim)).\n"
             "An odd dim has one more sine column than cosine columns.",
             lambda p, d: sinusoidal_table(p, d), _sinusoidal_cases, _sinusoidal_mistakes(), ("position", "channel"),
             "model/positions.py sinusoidal_table",
             "torch.arange(...), 10000 ** (...), table[:, 0::2] = ...", tolerance=dict(POSITION_TOLERANCE)),
    Exercise("rope", "rotary positions (RoPE): q or k rotated by position", "rope", "x, pos, base=10000.0",
             "x (B, nh, T, hs) queries or keys (hs even); pos (T,) int64, the tokens' positions (they need not start\n"
             "at 0). Return x rotated: channel pair (i, i + hs/2) turned by the angle pos * base^(-2i/hs), for\n"
             "i < hs/2 (the rotate-half convention of GPT-NeoX and Llama, which this model uses; to write the\n"
             "adjacent-pairs convention (2i, 2i+1) instead, check with --rope adjacent).",
             rope_reference, _rope_cases, _rope_mistakes("halves"), ("batch", "head", "position", "channel"),
             "model/positions.py RotaryPositions.rotate",
             "angles pos[:, None] * inv_freq[None, :], then x * cos + rotate_half(x) * sin",
             conventions={"adjacent": (rope_adjacent, _rope_mistakes("adjacent"))}, tolerance=dict(POSITION_TOLERANCE)),
    Exercise("decode", "one decoding step with a KV cache", "decode", "q, k, v, k_cache, v_cache",
             "q, k, v (B, nh, 1, hs): the new token's query, key and value; k_cache, v_cache (B, nh, S, hs): the\n"
             "keys and values of the S tokens before it (S may be 0).\n"
             "Return (y, k_cache, v_cache): y (B, nh, 1, hs) the new token's attention over all S + 1 keys (the\n"
             "cached ones and its own), and the caches with the new key and value appended (B, nh, S + 1, hs).",
             lambda *a: decode_reference(*a), _decode_cases, _decode_mistakes(), ("batch", "head", "key", "channel"),
             "model/attention.py KVCache.update + math_attention", "torch.cat([...], dim=2), then attend",
             outputs=("y", "k_cache", "v_cache")),
)}
