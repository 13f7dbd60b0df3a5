"""Checking a learner's function: every case of the exercise against the reference, within the stated tolerance;
on a failure, the catalogue of known mistakes (book.py) asked which one the learner's outputs match; else where
their output first differs. Bad code (an exception, a wrong shape, dtype or device, NaN, minutes of work) is an
`error:` naming the exercise and the line in their file.

    pass   every case within tolerance                                  (exit 0 on the command line)
    fail   a known mistake, named; or an unknown one, located            (exit 1)
    error  their code raised, ran too long, or returned the wrong thing  (exit 2)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attention_lab.exercises.book import EXERCISES, Case, Evidence, Exercise, Mistake, Tolerance
from attention_lab.exercises.learner import LearnerError, Outcome, call, load_function

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

    @property
    def typed(self) -> bool:
        """It returned tensors of the input's dtype on the CPU (the cases the values are compared on)."""
        return self.mine is not None and all(x.dtype == self.case.dtype and x.device.type == "cpu" for x in self.mine)

    def ok(self, tol: Tolerance) -> bool:
        return self.typed and agree(self.mine, self.ref, tol)


def _ref_parts(value) -> list[Tensor]:
    return [v.detach().float() for v in (value if isinstance(value, tuple) else (value,))]


# -------------------------------------------------------------------------------------------- checking


def check(name: str, fn=None, *, function: str | None = None, rope: str | None = None, convention: str | None = None,
          timeout: float = DEFAULT_TIMEOUT, quiet: bool = False) -> Result:
    """Check the learner's function for exercise `name`: a callable (a notebook's `my_function`) or a file path
    (its function named as the exercise's, or `function`). rope="adjacent" (or convention=) accepts RoPE's
    adjacent-pairs convention. Prints the message unless quiet; returns the Result (truthy on a pass)."""
    result = _check(name, fn, function, convention or rope, timeout)
    if not quiet:
        print(result.message)
    return result


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
        outcome = call(fn, case.args, timeout=max(deadline - time.monotonic(), 0.01))
        if outcome.timed_out:
            at = f" at line {outcome.line} of {where}" if outcome.line else ""
            return Result(name, "error", f"error: {name}: your {ex.function} was stopped after {timeout:g} s on case "
                                         f"{case.label}{at}; the reference takes {ref_seconds:.2g} s there (a Python "
                                         "loop over the entries? use tensor operations)")
        runs.append(Run(case, ref, outcome, parts(outcome.value, n_out) if outcome.error is None else None))
    if all(r.ok(tol[r.case.dtype]) for r in runs) and not _type_problem(runs, ex):
        return Result(name, "pass", _pass_message(ex, runs, where, convention))
    problem = _type_problem(runs, ex)
    found = diagnose(runs, mistakes, tol)
    if found is not None:
        return _mistake_result(ex, found, runs, fn, where)
    raised = next((r for r in runs if r.outcome.error is not None), None)
    if raised is not None:
        e, line = raised.outcome.error, raised.outcome.line
        return Result(name, "error", f"error: {name}: {where}{f' line {line}' if line else ''}: "
                                     f"{type(e).__name__}: {_first_line(e)} (case {raised.case.label})")
    suffix = ""
    if problem is None:
        shaped = next((r for r in runs if r.typed and _shape_problem(r, ex)), None)
        problem = (shaped, _shape_problem(shaped, ex)) if shaped is not None else None
        suffix = f", which matches none of the {len(mistakes)} known mistakes"
    if problem is not None:
        run, what = problem
        traced = call(fn, run.case.args, timeout=PROBE_TIMEOUT, trace=True)
        line = f" line {traced.line}" if traced.line else ""
        return Result(name, "error", f"error: {name}: {where}{line}: your {ex.function} returned{what} "
                                     f"(case {run.case.label}){suffix}")
    bad = next((r for r in runs if _non_finite_where_ref_finite(r)), None)
    if bad is not None:
        traced = call(fn, bad.case.args, timeout=PROBE_TIMEOUT, trace=True)
        at = f" line {traced.bad_line}" if traced.bad_line else ""
        kind = "NaN" if any(torch.isnan(m).any() for m in bad.mine) else "inf"
        return Result(name, "error", f"error: {name}: {where}{at}: a {kind} appears there and reaches your output, "
                                     f"where the reference is finite (case {bad.case.label})"
                                     + ("" if traced.bad_line else "; it first shows in your output"))
    return Result(name, "fail", _unknown_message(ex, runs, mistakes, tol))


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
    from the reference on at least one: (mistake, that case)."""
    for m in mistakes:
        shown = None
        for r in runs:
            if not r.typed:
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

    def probe(*args):
        out = call(fn, args, timeout=PROBE_TIMEOUT)
        return out.value if out.error is None else None

    mine = run.mine[0] if len(run.mine) == 1 else tuple(x.float() for x in run.mine)
    ref = run.ref[0] if len(run.ref) == 1 else tuple(run.ref)
    if isinstance(mine, Tensor):
        mine = mine.float()
    try:
        sentence = m.explain(Evidence(run.case, mine, ref, probe))
    except Exception:  # noqa: BLE001 - a sentence that cannot quote its number still names the mistake
        sentence = f"{m.title}: your output matches the reference's with this mistake ({run.case.label})"
    return Result(ex.name, "fail", f"fail: {ex.name}: {sentence}.\n  why it matters: {m.why}{also}", m.name)


def _unknown_message(ex: Exercise, runs: list[Run], mistakes: list[Mistake], tol: dict) -> str:
    run = next(r for r in runs if not r.ok(tol[r.case.dtype]))
    t = tol[run.case.dtype]
    shape = _shape_problem(run, ex)
    if shape is not None:
        return (f"fail: {ex.name}: your {ex.function} returned{shape} (case {run.case.label}), and matches none of "
                f"the {len(mistakes)} known mistakes")
    for part, mine, ref in zip(ex.outputs, run.mine, run.ref):
        ok = close(mine, ref, t)
        if bool(ok.all()):
            continue
        label = "" if len(ex.outputs) == 1 else f"{part}: "
        return (f"fail: {ex.name}: {label}yours differs from the reference ({ex.reference_name}) and matches none of "
                f"the {len(mistakes)} known mistakes; {locate(ex, mine.float(), ref, ok)} (case {run.case.label}; "
                f"allowed: {t})")
    return f"fail: {ex.name}: yours differs from the reference (case {run.case.label})"


def locate(ex: Exercise, mine: Tensor, ref: Tensor, ok: Tensor) -> str:
    """Where the output first differs: the first query (position, key) that differs, the first head there, and
    the largest difference in that row."""
    axes = ex.axes[-mine.dim():] if len(ex.axes) >= mine.dim() else ex.axes
    bad = (~ok).nonzero()
    primary = next((i for i, a in enumerate(axes) if a in ("query", "position", "key")), 0)
    first = bad[bad[:, primary].argmin()]
    idx = [int(x) for x in first]
    names = {a: idx[i] for i, a in enumerate(axes)}
    row_sel = (*idx[:-1], slice(None))  # the row of the first difference: every entry of its last axis
    diff = (mine[row_sel] - ref[row_sel]).abs()
    diff = diff[torch.isfinite(diff)]
    worst = diff.max().item() if diff.numel() else float("nan")
    where = f"{axes[primary]} {names[axes[primary]]}"
    if "head" in names:
        where += f" of head {names['head']}"
    if "batch" in names and names["batch"]:
        where += f" (batch {names['batch']})"
    before = names[axes[primary]]
    agree_note = (f"; {axes[primary]}s 0-{before - 1} agree" if before > 1 else
                  f"; {axes[primary]} 0 agrees" if before == 1 else "")
    return (f"it first differs at {where}: the largest difference there is {worst:.3g} (yours "
            f"{mine[tuple(idx)].item():.4g}, reference {ref[tuple(idx)].item():.4g}){agree_note}")


# -------------------------------------------------------------------------------------------- passing


def _pass_message(ex: Exercise, runs: list[Run], where: str, convention: str | None) -> str:
    dtypes = sorted({r.case.dtype for r in runs}, key=str)
    tols = "; ".join(f"{str(d).removeprefix('torch.')} {ex.tolerance[d]}" for d in dtypes)
    note = ""
    if any(bool(((r.ref[0] == -torch.inf) & (r.mine[0].float() > -torch.inf)).any()) for r in runs):
        note = (f"\n  note: you hide keys with a large negative number, not -inf: the same weights after the softmax "
                f"(exp of it is 0), but a query that sees no key gets a uniform row instead of NaN")
    other = f" in the {convention} convention" if convention else ""
    lines = [f"pass: {ex.name} ({ex.title}){other} agrees with {ex.reference_name} on {len(runs)} cases "
             f"({', '.join(r.case.label for r in runs)}) within {tols}.{note}"]
    order = list(EXERCISES)
    nxt = order[order.index(ex.name) + 1] if ex.name != order[-1] else None
    lines.append(f"  the project's answer: python -m attention_lab.exercises solution {ex.name}")
    if ex.name == "attention":
        spec = where if where.endswith(".py") else "path/to/your_file.py"
        lines.append(f"  train a model with it: python train.py experiment=debug model.attn_impl={spec}:attention")
    if nxt:
        lines.append(f"  next: python -m attention_lab.exercises start {nxt}")
    return "\n".join(lines)
