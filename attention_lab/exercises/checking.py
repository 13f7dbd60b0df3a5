"""Checking a learner's function: every case of the exercise against the reference, within the stated tolerance;
on a failure, the catalogue of known mistakes (book.py) asked which one the learner's outputs match; else where
their output first differs. Bad code (an exception, a wrong shape, dtype or device, NaN, minutes of work) is an
`error:` naming the exercise and the line in their file.

    pass   every case within tolerance                                  (exit 0 on the command line)
    fail   a known mistake, named; or an unknown one, located            (exit 1)
    error  their code raised, ran too long, or returned the wrong thing  (exit 2)
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from attention_lab.exercises.book import (
    EXERCISES,
    EXP_OVERFLOW,
    IN_PLACE,
    LOWER_PRECISION,
    Case,
    Evidence,
    Exercise,
    Mistake,
    Tolerance,
)
from attention_lab.exercises.learner import LearnerError, Outcome, call, load_function, same

DEFAULT_TIMEOUT = 30.0  # seconds for all cases together; the reference needs well under one
PROBE_TIMEOUT = 5.0
BIG_NEGATIVE = -1e4  # a hidden key's score may be any number at or below this (exp of it is 0): -1e9 passes


@dataclass
class Result:
    """What `check` found: status "pass", "fail" or "error", the message a learner reads, the mistake's name."""

    exercise: str
    status: str
    message: str
    mistake: str | None = None

    def __bool__(self) -> bool:
        return self.status == "pass"

    def __repr__(self) -> str:
        return self.message

    @property
    def exit_code(self) -> int:
        return {"pass": 0, "fail": 1, "error": 2}[self.status]


def exercise_named(name: str) -> Exercise:
    if name not in EXERCISES:
        raise ValueError(f"no exercise {name!r}; the exercises are {', '.join(EXERCISES)}")
    return EXERCISES[name]


def reference_and_mistakes(ex: Exercise, convention: str | None) -> tuple[Callable, list[Mistake]]:
    if not convention:
        return ex.reference, ex.mistakes
    if convention not in ex.conventions:
        known = f": {', '.join(ex.conventions)}" if ex.conventions else ""
        raise ValueError(f"{ex.name} has no other convention {convention!r}{known}")
    return ex.conventions[convention]


# -------------------------------------------------------------------------------------------- comparing


def parts(value, n: int) -> list[Tensor] | None:
    """The learner's output as n tensors (a tuple for decode), or None when it is not that."""
    if n == 1:
        return [value] if isinstance(value, Tensor) else None
    if isinstance(value, (tuple, list)) and len(value) == n and all(isinstance(v, Tensor) for v in value):
        return list(value)
    return None


def close(mine: Tensor, ref: Tensor, tol: Tolerance) -> Tensor:
    """Elementwise: within tolerance, the same infinity, both NaN, or a big negative where the reference hides a
    key with -inf."""
    mine = mine.detach().to("cpu", torch.float32)
    ok = torch.isclose(mine, ref, atol=tol.atol, rtol=tol.rtol, equal_nan=True)
    return ok | ((ref == -torch.inf) & (mine <= BIG_NEGATIVE))


def agree(mine: list[Tensor], ref: list[Tensor], tol: Tolerance) -> bool:
    return all(a.shape == b.shape and bool(close(a, b, tol).all()) for a, b in zip(mine, ref))


@dataclass
class Run:
    """One case: the reference's output and the learner's outcome."""

    case: Case
    ref: list[Tensor]
    outcome: Outcome
    mine: list[Tensor] | None
    changed: list[str] = field(default_factory=list)  # the inputs the learner's function changed in place

    @property
    def typed(self) -> bool:
        """It returned tensors of the input's dtype on the CPU (the cases the values are compared on)."""
        return self.mine is not None and all(x.dtype == self.case.dtype and x.device.type == "cpu" for x in self.mine)

    def ok(self, tol: Tolerance) -> bool:
        return self.typed and agree(self.mine, self.ref, tol)


def _ref_parts(value) -> list[Tensor]:
    return [v.detach().float() for v in (value if isinstance(value, tuple) else (value,))]


# -------------------------------------------------------------------------------------------- checking


class NotPassedYet(Exception):
    """A notebook's "your turn" that does not pass yet (check(..., stop=True)): the cell stops on the check's
    message, so running every cell stops at the first exercise still to write."""


def check(name: str, fn=None, *, function: str | None = None, rope: str | None = None, convention: str | None = None,
          timeout: float = DEFAULT_TIMEOUT, quiet: bool = False, stop: bool = False) -> Result:
    """Check the learner's function for exercise `name`: a callable (a notebook's `my_function`) or a file path
    (its function named as the exercise's, or `function`). rope="adjacent" (or convention=) accepts RoPE's
    adjacent-pairs convention. Prints the message unless quiet; returns the Result (truthy on a pass).
    stop=True (a notebook's "your turn" cell): anything but a pass raises NotPassedYet with the message instead."""
    result = _check(name, fn, function, convention or rope, timeout)
    if stop and not result:
        raise NotPassedYet(result.message)
    if not quiet:
        print(result.message)
    return result


def not_written(ex: Exercise, runs: list[Run]) -> Result | None:
    """Every case raised NotImplementedError (a stub as `start` or a notebook leaves it): say so plainly, with the
    stub's own words and where the answer is, instead of a traceback's line."""
    errors = [r.outcome.error for r in runs]
    if not errors or not all(isinstance(e, NotImplementedError) for e in errors):
        return None
    said = _first_line(errors[0])
    return Result(ex.name, "error", f"error: {ex.name}: not written yet (NotImplementedError: {said})."
                                    f"\n  stuck? the project's answer: python -m attention_lab.exercises solution "
                                    f"{ex.name} --anyway")


def _check(name: str, fn, function: str | None, convention: str | None, timeout: float) -> Result:
    ex = exercise_named(name)
    reference, mistakes = reference_and_mistakes(ex, convention)
    where = None
    if fn is None or isinstance(fn, (str, Path)):
        where = str(fn or default_file(name))
        try:
            fn = load_function(where, function or ex.function, name)
        except LearnerError as e:
            return Result(name, "error", f"error: {e}")
    elif not callable(fn):
        raise TypeError(f"check({name!r}, ...) takes your function or the path of your file, got {type(fn).__name__}")
    where = where or _where(fn)
    n_out = len(ex.outputs)
    tol = ex.tolerance
    runs: list[Run] = []
    deadline = time.monotonic() + timeout
    for case in ex.cases():
        with torch.no_grad():
            t0 = time.perf_counter()
            ref = _ref_parts(reference(*case.float_args()))
            ref_seconds = time.perf_counter() - t0
        given = tuple(a.clone() if isinstance(a, Tensor) else a for a in case.args)  # theirs to change, not ours
        outcome = call(fn, given, timeout=max(deadline - time.monotonic(), 0.01))
        changed = [n for n, before, after in zip(input_names(ex), case.args, given)
                   if isinstance(before, Tensor) and not same(after, before)]
        if outcome.timed_out:
            at = f" at line {outcome.line} of {where}" if outcome.line else ""
            return Result(name, "error", f"error: {name}: your {ex.function} was stopped after {timeout:g} s on case "
                                         f"{case.label}{at}; the reference takes {ref_seconds:.2g} s there (a Python "
                                         "loop over the entries? use tensor operations)")
        runs.append(Run(case, ref, outcome, parts(outcome.value, n_out) if outcome.error is None else None, changed))
    stub = not_written(ex, runs)
    if stub is not None:
        return stub
    in_place = next((r for r in runs if r.changed), None)
    if all(r.ok(tol[r.case.dtype]) for r in runs) and not _type_problem(runs, ex):
        if in_place is not None:
            return Result(name, "fail", f"fail: {name}: {_in_place_sentence(ex, in_place, fn, where)}; its output "
                                        f"agrees with the reference on all {len(runs)} cases.\n  why it matters: "
                                        f"{IN_PLACE.why}", IN_PLACE.name)
        return Result(name, "pass", _pass_message(ex, runs, where, convention))
    found = diagnose(runs, mistakes, tol)
    if found is not None:
        return _mistake_result(ex, found, runs, fn, where)
    lower = lower_precision(fn, ex, runs, reference, tol)
    if lower is not None:
        return Result(name, "fail", f"fail: {name}: {lower}.\n  why it matters: {LOWER_PRECISION.why}"
                                    + _also_in_place(ex, runs, fn, where), LOWER_PRECISION.name)
    # no known mistake: every failing case's first failure, the earliest case's in full, then one line for the
    # first case of each other kind, each naming its case (an exception in one case never hides an earlier NaN)
    failures = [f for r in runs if (f := _failure(ex, r, tol, fn, where, mistakes, reference)) is not None]
    kind, _, text, run = failures[0]
    status = "error" if any(f[1] == "error" for f in failures) else "fail"  # broken code somewhere: exit 2
    also, seen = "", {kind}
    for k, _, t, r in failures[1:]:
        if k not in seen:
            seen.add(k)
            also += f"\n  also: {t}"
    return Result(name, status, f"{status}: {name}: {text}{also}" + _also_in_place(ex, runs, fn, where))


def _failure(ex: Exercise, run: Run, tol: dict, fn, where: str, mistakes: list[Mistake], reference
             ) -> tuple[str, str, str, Run] | None:
    """This case's first failure: (kind, "error" or "fail", the sentence, the run), or None when it passes."""
    label = f"(case {run.case.label})"
    if run.outcome.error is not None:
        e, line = run.outcome.error, run.outcome.line
        return ("raised", "error", f"{where}{f' line {line}' if line else ''}: {type(e).__name__}: {_first_line(e)} "
                                   f"{label}", run)
    problem = _type_problem([run], ex)
    kind, suffix = "type", ""
    if problem is None and _shape_problem(run, ex) is not None:
        problem, kind = (run, _shape_problem(run, ex)), "shape"
        suffix = f", which matches none of the {len(mistakes)} known mistakes"
    if problem is not None:
        traced = call(fn, fresh(run.case.args), timeout=PROBE_TIMEOUT, trace=True)
        line = f" line {traced.line}" if traced.line else ""
        return kind, "error", f"{where}{line}: your {ex.function} returned{problem[1]} {label}{suffix}", run
    if ex.name != "mask" and _non_finite_where_ref_finite(run):  # a mask's output holds -inf: located instead
        traced = call(fn, fresh(run.case.args), timeout=PROBE_TIMEOUT, trace=True)
        at = f" line {traced.bad_line}" if traced.bad_line else ""
        what = _non_finite_kind(run)
        hint = (f"; this case has large scores ({run.case.note}): exp overflows above {EXP_OVERFLOW:.1f}, so "
                "subtract each row's max before exp" if run.case.large else "")
        return ("nonfinite", "error", f"{where}{at}: {what} appears there and reaches your output, where the "
                                      f"reference is finite {label}"
                + ("" if traced.bad_line else "; it first shows in your output") + hint, run)
    if run.ok(tol[run.case.dtype]):
        return None
    return "value", "fail", _value_failure(ex, run, mistakes, tol, fn, reference), run


def _non_finite_kind(run: Run) -> str:
    """'a NaN', 'an inf' or '-inf': the first non-finite value of the learner's output where the reference is
    finite."""
    for m, r in zip(run.mine, run.ref):
        if m.shape != r.shape:
            continue
        m = m.float()
        found = m[~torch.isfinite(m) & torch.isfinite(r)]
        if found.numel():
            v = found[0].item()
            return "a NaN" if v != v else "an inf" if v > 0 else "-inf"
    return "a NaN"


REPO = Path(__file__).resolve().parents[2]  # attention_lab/exercises/checking.py -> the checkout


def train_command(file: str | Path | None) -> str:
    """The command that trains with the learner's attention, runnable from the folder it is printed in: train.py
    and their file by absolute paths (train.py keeps the caller's folder: hydra.job.chdir is false)."""
    spec = f"{Path(file).resolve()}:attention" if file else "path/to/your_file.py:attention"
    script = REPO / "train.py"
    where = str(script) if script.is_file() else "train.py (in the attention-lab checkout)"
    return f"python {where} experiment=debug model.attn_impl={spec}"


def fresh(args: tuple) -> tuple:
    """The case's inputs as the learner's function gets them: copies, so an in-place edit never reaches the case."""
    return tuple(a.clone() if isinstance(a, Tensor) else a for a in args)


def input_names(ex: Exercise) -> list[str]:
    return [p.split("=")[0].strip() for p in ex.signature.split(",")]


def _in_place_sentence(ex: Exercise, run: Run, fn, where: str) -> str:
    """'your mask changes its input scores in place: ... at line 9 of FILE' with the first changed entry."""
    name = run.changed[0]
    i = input_names(ex).index(name)
    given = fresh(run.case.args)
    traced = call(fn, given, timeout=PROBE_TIMEOUT, trace=True, watch=True)
    before, after = run.case.args[i], given[i]
    at = f" at line {traced.changed_line} of {where}" if traced.changed_line else f" ({where})"
    if after.shape != before.shape:
        what = f"its shape went from {tuple(before.shape)} to {tuple(after.shape)}"
    else:
        diff = ~(after.eq(before) | (after.isnan() & before.isnan()))
        idx = tuple(int(x) for x in diff.nonzero()[0])
        what = (f"{int(diff.sum())} of its {before.numel()} entries differ after the call ({name}"
                f"[{', '.join(map(str, idx))}] was {before[idx].item():.4g}, now {after[idx].item():.4g})")
    others = [n for n in run.changed[1:]]
    title = IN_PLACE.title.replace("your function", f"your {ex.function}").replace("its input", f"its input {name}")
    return (f"{title}"
            f"{at}: {what} (case {run.case.label})" + (f"; it changes {', '.join(others)} too" if others else ""))


def _also_in_place(ex: Exercise, runs: list[Run], fn, where: str) -> str:
    run = next((r for r in runs if r.changed), None)
    return "" if run is None else f"\n  also: {_in_place_sentence(ex, run, fn, where)}"


NUDGE = 2.0 ** -20  # float32 resolves a change of 1 part in 2^20 (8 of its steps); float16 and bfloat16 do not


def lower_precision(fn, ex: Exercise, runs: list[Run], reference, tol: dict) -> str | None:
    """The sentence when the learner's float32 function computes in fewer bits inside: its first float input
    nudged by 1 part in 2^20 moves the reference's output at most entries and theirs at almost none (the nudge is
    rounded away), while their output stays near the reference's (within 5% of its largest entry). None else."""
    run = next((r for r in runs if r.case.dtype == torch.float32 and not r.case.large and r.typed
                and r.mine[0].shape == r.ref[0].shape and not r.ok(tol[r.case.dtype]) and r.ref[0].numel() >= 16),
               None)
    if run is None:
        return None
    first = next((i for i, a in enumerate(run.case.args) if isinstance(a, Tensor) and a.is_floating_point()), None)
    if first is None:
        return None
    mine, ref = run.mine[0].float(), run.ref[0]
    finite = torch.isfinite(mine) & torch.isfinite(ref)
    scale = ref[torch.isfinite(ref)].abs().max().item() if torch.isfinite(ref).any() else 0.0
    if not finite.any() or (mine - ref)[finite].abs().max().item() > 0.05 * scale:
        return None
    sign = torch.randint(0, 2, run.case.args[first].shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    nudged = list(fresh(run.case.args))
    nudged[first] = nudged[first] * (1 + NUDGE * sign)
    with torch.no_grad():
        ref2 = _ref_parts(reference(*Case(run.case.sizes, tuple(nudged)).float_args()))[0]
    out = call(fn, tuple(nudged), timeout=PROBE_TIMEOUT)
    mine2 = parts(out.value, len(ex.outputs)) if out.error is None else None
    if mine2 is None or mine2[0].shape != mine.shape:
        return None
    moved = (ref2 != ref) & finite
    still = moved & (mine2[0].float() == mine)
    if int(moved.sum()) < 8 or int(still.sum()) < 0.5 * int(moved.sum()):
        return None
    kinds = [n for d, n in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16"))
             if bool((mine[finite].to(d).float() == mine[finite]).all())][:1]  # the fewer bits, where both fit
    diff = (mine - ref)[finite].abs().max().item()
    names = input_names(ex)
    return (f"{LOWER_PRECISION.title}: when {names[first]} changes by 1 part in 2^{-round(math.log2(NUDGE))} (float32 "
            f"resolves it, float16 and bfloat16 round it away), the reference's output moves at {int(moved.sum())} of "
            f"its {moved.numel()} entries and yours at only {int(moved.sum()) - int(still.sum())} of those: your "
            f"{ex.function} rounds to fewer bits inside"
            + (f" (every entry it returns is a {kinds[0]} number)" if kinds else "")
            + f"; its largest difference from the reference is {diff:.3g} (case {run.case.label}); keep the input's "
              "dtype throughout: no .half(), .bfloat16() or dtype=torch.float16 inside")


def default_file(name: str) -> Path:
    """Where `start NAME` writes by default: ./my_attention/NAME.py."""
    return Path("my_attention") / f"{name}.py"


def _where(fn) -> str:
    code = getattr(fn, "__code__", None)
    return f"{getattr(fn, '__name__', 'your function')} ({code.co_filename})" if code else getattr(fn, "__name__", "it")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else "(no message)"


def _type_problem(runs: list[Run], ex: Exercise) -> tuple[Run, str] | None:
    """The first case whose output is not a tensor of the reference's shape, dtype and device (or a tuple of
    them), and the words for it."""
    n = len(ex.outputs)
    for r in runs:
        if r.outcome.error is not None:
            continue
        if r.mine is None:
            v = r.outcome.value
            return r, (f" a {type(v).__name__}" + (f" of {len(v)}" if isinstance(v, (tuple, list)) else "")
                       + (", not a tensor" if n == 1 else f", not a tuple of {n} tensors ({', '.join(ex.outputs)})"))
        for part, mine, ref in zip(ex.outputs, r.mine, r.ref):
            label = " a tensor" if n == 1 else f" {part}"
            if mine.device.type != "cpu":
                return r, f"{label} on device {mine.device}; your input was on cpu: return it on the input's device"
            if mine.dtype != r.case.dtype:
                return r, (f"{label} of dtype {str(mine.dtype).removeprefix('torch.')}; expected "
                           f"{str(r.case.dtype).removeprefix('torch.')} (the input's dtype"
                           + (": a table the model adds to float32 embeddings)" if ex.name == "sinusoidal" else
                              ": build your own tensors (the mask, the constants) with dtype=the input's)"))
    return None


def _shape_problem(run: Run, ex: Exercise) -> str | None:
    for part, mine, ref in zip(ex.outputs, run.mine, run.ref):
        if mine.shape != ref.shape:
            label = " a tensor" if len(ex.outputs) == 1 else f" {part}"
            return f"{label} of shape {tuple(mine.shape)}; expected {tuple(ref.shape)}"
    return None


def _non_finite_where_ref_finite(run: Run) -> bool:
    if run.mine is None:
        return False
    return any(m.shape == r.shape and bool((~torch.isfinite(m.float()) & torch.isfinite(r)).any())
               for m, r in zip(run.mine, run.ref))


# -------------------------------------------------------------------------------------------- diagnosing


def diagnose(runs: list[Run], mistakes: list[Mistake], tol: dict) -> tuple[Mistake, Run] | None:
    """The first mistake of the catalogue that the learner's outputs match on every case where their function
    returned tensors of the input's dtype (the cases where it raised are the error the message adds), differing
    from the reference on at least one: (mistake, that case). A mistake known by its output is compared on the
    ordinary cases; one known by its pattern (the softmax's overflow) on every case."""
    for m in mistakes:
        shown = None
        for r in runs:
            if not r.typed:
                continue
            t = tol[r.case.dtype]
            if m.matches is not None:  # a mistake known by its pattern (where the scores overflow), not an output
                if not all(a.shape == b.shape for a, b in zip(r.mine, r.ref)) or not m.matches(
                        r.case, r.mine, r.ref, [close(a, b, t) for a, b in zip(r.mine, r.ref)]):
                    break
                if shown is None and not agree(r.mine, r.ref, t):
                    shown = r
                continue
            if r.case.large:  # large scores test the numerics; another idea's output there hangs on near ties
                continue
            try:
                with torch.no_grad():
                    theirs = _ref_parts(m.output(r.case))
            except Exception:  # noqa: BLE001 - the mistake cannot run on this case (q @ k with S != hs)
                theirs = None
            if theirs is None or not agree(r.mine, theirs, tol[r.case.dtype]):
                break
            if shown is None and not agree(theirs, r.ref, tol[r.case.dtype]):
                shown = r
        else:
            if shown is not None:
                return m, shown
    return None


def _mistake_result(ex: Exercise, found: tuple[Mistake, Run], runs: list[Run], fn, where: str) -> Result:
    m, run = found
    also = ""
    raised = next((r for r in runs if r.outcome.error is not None), None)
    typed = _type_problem(runs, ex)
    if raised is not None:
        e, line = raised.outcome.error, raised.outcome.line
        also = (f"\n  also: on case {raised.case.label} it raised {type(e).__name__} at {where}"
                f"{f' line {line}' if line else ''}: {_first_line(e)}")
    elif typed is not None:
        also = f"\n  also: on case {typed[0].case.label} it returned{typed[1]}"
    also += _also_in_place(ex, runs, fn, where)

    def probe(*args):
        out = call(fn, fresh(args), timeout=PROBE_TIMEOUT)
        return out.value if out.error is None else None

    mine = run.mine[0] if len(run.mine) == 1 else tuple(x.float() for x in run.mine)
    ref = run.ref[0] if len(run.ref) == 1 else tuple(run.ref)
    if isinstance(mine, Tensor):
        mine = mine.float()
    try:
        sentence = m.explain(Evidence(run.case, mine, ref, probe))
    except Exception:  # noqa: BLE001 - a sentence that cannot quote its number still names the mistake
        sentence = f"{m.title}: your output matches the reference's with this mistake ({run.case.label})"
    if not MEASURED.search(sentence.replace(run.case.label, "")) and (first := _first_difference(ex, run)):
        sentence += f"; {first}"  # every sentence quotes a number of yours
    return Result(ex.name, "fail", f"fail: {ex.name}: {sentence}.\n  why it matters: {m.why}{also}", m.name)


# a measured number (0.137, 16, 3e-05), shape ((1, 1, 8, 8)) or row ([0, 1, 0, ...]), not the 1 of "sums to 1"
MEASURED = re.compile(r"\d\.\d|\d\d|\de[+-]|\(\d+(, \d+)+\)|\[-?[\d.]+, ")


def _first_difference(ex: Exercise, run: Run) -> str:
    """'it first differs at query 1 of head 0: the largest difference there is ...' for the first differing output."""
    t = ex.tolerance[run.case.dtype]
    for part, mine, ref in zip(ex.outputs, run.mine, run.ref):
        if mine.shape == ref.shape and not bool((ok := close(mine, ref, t)).all()):
            return (f"{'' if len(ex.outputs) == 1 else part + ': '}{locate(ex, mine.float(), ref, ok, part)} (case "
                    f"{run.case.label})")
    return ""  # another shape: the sentence says so


def _value_failure(ex: Exercise, run: Run, mistakes: list[Mistake], tol: dict, fn=None, reference=None) -> str:
    """The sentence for a case whose output has the right type and shape but other values: where it differs."""
    t = tol[run.case.dtype]
    for part, mine, ref in zip(ex.outputs, run.mine, run.ref):
        ok = close(mine, ref, t)
        if bool(ok.all()):
            continue
        label = "" if len(ex.outputs) == 1 else f"{part}: "
        heads = head_of_difference(ex, fn, run, reference, t) if ex.name == "multi_head" and fn is not None else ""
        return (f"{label}yours differs from the reference ({ex.reference_name}) and matches none of the "
                f"{len(mistakes)} known mistakes; {locate(ex, mine.float(), ref, ok, part)}{heads} (case "
                f"{run.case.label}; allowed: {t})")
    return f"yours differs from the reference (case {run.case.label})"


def locate(ex: Exercise, mine: Tensor, ref: Tensor, ok: Tensor, part: str = "output") -> str:
    """Where the output first differs: the first query (position, key) that differs, the head there, and in
    that row the entry that differs most (its key or channel) with its own two values."""
    axes = ex.axes[-mine.dim():] if len(ex.axes) >= mine.dim() else ex.axes
    bad = (~ok).nonzero()
    primary = next((i for i, a in enumerate(axes) if a in ("query", "position", "key")), 0)
    first = bad[bad[:, primary].argmin()]
    idx = [int(x) for x in first]
    names = {a: idx[i] for i, a in enumerate(axes)}
    row_sel = (*idx[:-1], slice(None))  # the row of the first difference: every entry of its last axis
    diff = (mine[row_sel] - ref[row_sel]).abs()
    diff = torch.where(torch.isnan(diff), torch.inf, diff).masked_fill(ok[row_sel], -1.0)  # NaN counts as largest
    j = int(diff.argmax())
    at = (*idx[:-1], j)
    worst = (mine[at] - ref[at]).abs().item()
    label = "the new query" if part == "y" else f"{axes[primary]} {names[axes[primary]]}"
    where = label
    if "head" in names:
        where += f" of head {names['head']}"
    if "batch" in names and names["batch"]:
        where += f" (batch {names['batch']})"
    before = names[axes[primary]]
    agree_note = ("" if part == "y" else f"; {axes[primary]}s 0-{before - 1} agree" if before > 1 else
                  f"; {axes[primary]} 0 agrees" if before == 1 else "")
    entry = f" at {axes[-1]} {j}" if primary != len(axes) - 1 else ""
    return (f"it first differs at {where}: the largest difference there is {worst:.3g}{entry} (yours "
            f"{mine[at].item():.4g}, reference {ref[at].item():.4g}){agree_note}")


def head_of_difference(ex: Exercise, fn, run: Run, reference, tol: Tolerance) -> str:
    """multi_head: the output projection mixes every head into every channel, so the learner's layer is run again
    with the projection set to the identity (their heads side by side) to say which head differs first."""
    x, w_qkv, b_qkv, _, _, nh = run.case.args
    c = x.size(-1)
    args = (x, w_qkv, b_qkv, torch.eye(c, dtype=x.dtype), torch.zeros(c, dtype=x.dtype), nh)
    out = call(fn, fresh(args), timeout=PROBE_TIMEOUT)
    mine = parts(out.value, 1) if out.error is None else None
    with torch.no_grad():
        ref = _ref_parts(reference(*Case(run.case.sizes, args).float_args()))[0]
    if mine is None or mine[0].shape != ref.shape:
        return ""
    ok = close(mine[0], ref, tol)
    if bool(ok.all()):
        return ("; with the output projection set to the identity yours agrees with the reference: your heads are "
                "right, the projection (y @ w_proj.T + b_proj) is not")
    hs = c // nh
    bad = (~ok).nonzero()
    pos, ch = (int(v) for v in bad[bad[:, 1].argmin()][1:])
    return (f"; with the output projection set to the identity (your heads side by side), head {ch // hs} differs "
            f"first, at position {pos}, channel {ch % hs} of its {hs} (output channel {ch})")


# -------------------------------------------------------------------------------------------- passing


def _pass_message(ex: Exercise, runs: list[Run], where: str, convention: str | None) -> str:
    dtypes = sorted({r.case.dtype for r in runs}, key=str)
    tols = "; ".join(f"{str(d).removeprefix('torch.')} {ex.tolerance[d]}" for d in dtypes)
    note = ""
    if any(bool(((r.ref[0] == -torch.inf) & (r.mine[0].float() > -torch.inf)).any()) for r in runs):
        note = ("\n  note: you hide keys with a large negative number, not -inf: the same weights after the softmax "
                "(exp of it is 0), but a query that sees no key gets a uniform row instead of NaN")
    other = f" in the {convention} convention" if convention else ""
    lines = [f"pass: {ex.name} ({ex.title}){other} agrees with {ex.reference_name} on {len(runs)} cases "
             f"({', '.join(r.case.label for r in runs)}) within {tols}.{note}"]
    order = list(EXERCISES)
    nxt = order[order.index(ex.name) + 1] if ex.name != order[-1] else None
    lines.append(f"  the project's answer: python -m attention_lab.exercises solution {ex.name}")
    if ex.name == "attention":
        lines.append(f"  train a model with it: {train_command(where if where.endswith('.py') else None)}")
    if nxt:
        lines.append(f"  next: python -m attention_lab.exercises start {nxt}")
    return "\n".join(lines)
