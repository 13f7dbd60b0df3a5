"""A learner's code, loaded and run with guards: a file that does not import, a missing function, an exception
inside it, a function that runs for minutes, each becomes one LearnerError whose message names the exercise and
the line in their file; and their attention(q, k, v) plugged into a real model (model/attention.py
learner_attention), with the spec ("path/to/file.py:attention") that checkpoints record.

Nothing here reads the library's files: only the learner's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from torch import Tensor

DEFAULT_FUNCTION = "attention"


class LearnerError(ValueError):
    """The learner's code could not be loaded or run: the message says what, in which exercise and at which line.
    A ValueError, so every command line prints it as one `error:` line."""


class Timeout(BaseException):  # noqa: N818 - a BaseException, so a learner's `except Exception` cannot swallow it
    """Raised inside the learner's function when its time is up."""


# ----------------------------------------------------------------------------------------------------- loading


def load_function(path: str | Path, name: str, exercise: str) -> Callable:
    """The function `name` of the learner's file; LearnerError naming the file and the line otherwise."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise LearnerError(f"{exercise}: there is no file {path} (write one with `python -m attention_lab.exercises "
                           f"start {exercise}`)")
    module_name = f"_learner_{path.stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling inside their file look themselves up here
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(module_name, None)
        raise LearnerError(f"{exercise}: {path} line {e.lineno}: it does not import: SyntaxError: {e.msg}") from None
    except BaseException as e:  # noqa: BLE001 - anything their module does at import is theirs to fix
        sys.modules.pop(module_name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        line = line_in(e, {str(path.resolve())})
        raise LearnerError(f"{exercise}: {path}{f' line {line}' if line else ''}: it does not import: "
                           f"{type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                         and getattr(v, "__module__", None) == module_name)
        raise LearnerError(f"{exercise}: {path} defines no function `{name}`"
                           + (f" (it defines {', '.join(defined)})" if defined else "")
                           + f"; the exercise calls `{name}`")
    return fn


def code_files(fn: Callable) -> set[str]:
    """The source files whose frames count as the learner's: the file their function was defined in."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__call__", None), "__code__", None)
    if code is None:
        return set()
    f = code.co_filename
    return {str(Path(f).resolve()) if not f.startswith("<") else f}


def line_in(exc: BaseException, files: set[str]) -> int | None:
    """The line of the innermost frame of the traceback that lies in one of `files` (the learner's)."""
    found = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        f = frame.f_code.co_filename
        if (str(Path(f).resolve()) if not f.startswith("<") else f) in files:
            found = line
    return found


# ----------------------------------------------------------------------------------------------------- running


@dataclass
class Outcome:
    """One call of the learner's function: what it returned or raised, where, and how long it took."""

    value: object = None
    error: BaseException | None = None
    line: int | None = None  # raised: the line in their file; traced: the line of their `return`
    bad_line: int | None = None  # traced: the line after which a NaN or +inf first appeared in their variables
    changed_line: int | None = None  # traced with watch: the line after which one of the inputs first changed
    seconds: float = 0.0
    timed_out: bool = False


def same(now: Tensor, before: Tensor) -> bool:
    """The tensor holds what it held (its shape and every entry; NaN equals NaN)."""
    return now.shape == before.shape and now.dtype == before.dtype and bool(
        (now.eq(before) | (now.isnan() & before.isnan()) if now.is_floating_point() else now.eq(before)).all())


def _has_bad(x) -> bool:
    return isinstance(x, Tensor) and x.is_floating_point() and x.device.type != "meta" and bool(
        (torch.isnan(x) | (x == math.inf)).any())


def call(fn: Callable, args: tuple, timeout: float | None = None, trace: bool = False, watch: bool = False
         ) -> Outcome:
    """fn(*args), stopped after `timeout` seconds (SIGALRM: the main thread only; elsewhere it runs to the end),
    every exception caught. trace=True also records the line of their `return` and the line after which a NaN
    (or +inf; -inf is how a mask hides a key) first appeared in one of their variables; watch=True (with trace)
    the line after which one of the tensors in args first changed (an in-place edit)."""
    files = code_files(fn)
    out = Outcome()
    watched = [(a, a.clone()) for a in args if isinstance(a, Tensor)] if watch else []
    tracer = _Tracer(files, getattr(fn, "__code__", None), watched) if trace else None
    use_alarm = timeout is not None and threading.current_thread() is threading.main_thread() and hasattr(
        signal, "setitimer")
    previous = None
    if use_alarm:
        def on_alarm(signum, frame):
            raise Timeout()
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(timeout, 1e-3))
    t0 = time.perf_counter()
    try:
        if tracer is not None:
            sys.settrace(tracer.global_trace)
        with torch.no_grad():
            out.value = fn(*args)
    except Timeout as e:
        out.error, out.timed_out, out.line = e, True, line_in(e, files)
    except Exception as e:  # noqa: BLE001 - their exception is reported, never raised into the library
        out.error, out.line = e, line_in(e, files)
    finally:
        if tracer is not None:
            sys.settrace(None)
        out.seconds = time.perf_counter() - t0
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    if tracer is not None:
        if out.error is None:
            out.line = tracer.return_line
        out.bad_line = tracer.bad_line
        out.changed_line = tracer.changed_line
    return out


class _Tracer:
    """sys.settrace for the learner's frames only: the last `return` line of their function, and the first line
    after which one of their local tensors holds a NaN or +inf."""

    def __init__(self, files: set[str], top, watched: list[tuple[Tensor, Tensor]] = ()):
        self.files, self.top, self.watched = files, top, watched
        self.return_line = None
        self.bad_line = None
        self.changed_line = None

    def global_trace(self, frame, event, arg):
        f = frame.f_code.co_filename
        if (str(Path(f).resolve()) if not f.startswith("<") else f) not in self.files:
            return None
        last = [frame.f_lineno]

        def local(frame, event, arg):
            if self.bad_line is None and event in ("line", "return"):
                if any(_has_bad(v) for v in list(frame.f_locals.values())) or (event == "return" and _has_bad(arg)):
                    self.bad_line = last[0]
            if self.watched and self.changed_line is None and event in ("line", "return") and any(
                    not same(now, before) for now, before in self.watched):
                self.changed_line = last[0]
            if event == "return" and frame.f_code is self.top:
                self.return_line = frame.f_lineno
            last[0] = frame.f_lineno
            return local

        return local


# --------------------------------------------------------------------------------------- plugged into a model


def parse_spec(spec: str) -> tuple[str, str]:
    """"path/to/file.py:name" (or "path/to/file.py": the function `attention`) -> (path, name); ValueError
    saying the form otherwise."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        path, name = spec, DEFAULT_FUNCTION
    if not path.endswith(".py") or not name.isidentifier():
        raise ValueError(f"model.attn_impl={spec!r} must name a Python file and a function in it: "
                         "path/to/file.py:attention (or path/to/file.py, which means its function `attention`)")
    return path, name


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class LearnerAttention:
    """The learner's attention(q, k, v) -> y as the model calls it (CausalSelfAttention.attn_fn): each call's
    output checked (a tensor of q's shape on q's device), an exception or a bad output turned into LearnerError
    naming their file and line. `spec` is the absolute "file.py:name" the run records."""

    def __init__(self, fn: Callable, path: Path, name: str):
        self.fn, self.path, self.name = fn, Path(path).resolve(), name
        self.sha256 = sha256_of(self.path)
        self.files = code_files(fn) | {str(self.path)}

    @property
    def spec(self) -> str:
        return f"{self.path}:{self.name}"

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        try:
            y = self.fn(q, k, v)
        except Exception as e:  # noqa: BLE001 - their exception, named with its line, is the user's to fix
            line = line_in(e, self.files)
            raise LearnerError(f"model.attn_impl: your {self.name} ({self.path}{f' line {line}' if line else ''}) "
                               f"raised {type(e).__name__}: {e} (q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                               f"{tuple(v.shape)}); check it with `python -m attention_lab.exercises check attention "
                               f"{self.path}`") from e
        want = (*q.shape[:-1], v.size(-1))
        if not isinstance(y, Tensor) or tuple(y.shape) != want or y.device != q.device:
            got = (f"a {type(y).__name__}" if not isinstance(y, Tensor) else
                   f"shape {tuple(y.shape)} on {y.device}")
            raise LearnerError(f"model.attn_impl: your {self.name} ({self.path}) returned {got} for q "
                               f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; the model needs shape "
                               f"{want} on {q.device}; check it with `python -m attention_lab.exercises check "
                               f"attention {self.path}`")
        return y if y.dtype == v.dtype else y.to(v.dtype)  # autocast may hand back float32 from a bf16 softmax


def refuse_unsupported(cfg) -> None:
    """ValueError when a learner's attention cannot stand in for this model's (cfg: GPTConfig or ModelConfig)."""
    clash = []
    if getattr(cfg, "arch", "gpt") != "gpt" or getattr(cfg, "attention", "softmax") != "softmax":
        clash.append("a network without softmax attention (model.arch=gpt and model.attention=softmax only)")
    clash += [f"window={cfg.window}"] if getattr(cfg, "window", 0) else []
    clash += ["attn_sinks=true"] if getattr(cfg, "attn_sinks", False) else []
    clash += ["pos_encoding=alibi"] if getattr(cfg, "pos_encoding", "") == "alibi" else []
    clash += [f"attn_scale={cfg.attn_scale}"] if getattr(cfg, "attn_scale", "sqrt") != "sqrt" else []
    clash += [f"causal_mask={cfg.causal_mask}"] if getattr(cfg, "causal_mask", "before_softmax") != "before_softmax" \
        else []
    clash += ["attend_self=false"] if not getattr(cfg, "attend_self", True) else []
    if clash:
        raise ValueError(f"model.attn_impl runs your attention(q, k, v), which does its own scale and causal mask "
                         f"over every earlier key; it cannot be combined with {', '.join(clash)}: leave those at "
                         "their defaults (your file can write any of them)")


def load_attention(spec: str) -> LearnerAttention:
    """The learner's attention named by spec ("path/to/file.py:attention"); LearnerError saying what is wrong."""
    path, name = parse_spec(spec)
    return LearnerAttention(load_function(path, name, "attention"), Path(path), name)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "attn_fn")]


def plug(model: nn.Module, spec: str | None) -> nn.Module:
    """Every attention layer of `model` runs the learner's function named by spec ("" or None: the built-in
    attention again). Returns the model."""
    fn = None
    if spec:
        refuse_unsupported(model.config)
        fn = spec if isinstance(spec, LearnerAttention) else load_attention(spec)
    layers = attention_modules(model)
    if fn is not None and not layers:
        raise ValueError("model.attn_impl: this model has no softmax attention layer to take your function")
    for m in layers:
        m.attn_fn = fn
    return model


def learner_of(model: nn.Module) -> LearnerAttention | None:
    """The learner's attention this model runs, or None for the built-in one."""
    return next((m.attn_fn for m in attention_modules(model) if m.attn_fn is not None), None)


def provenance(model: nn.Module) -> dict:
    """What a checkpoint records about the attention: {} for the built-in, else the spec and the file's hash."""
    fn = learner_of(model)
    return {} if fn is None else {"attn_impl": fn.spec, "attn_impl_sha256": fn.sha256}


def reopen(model: nn.Module, meta: dict) -> tuple[nn.Module, str | None]:
    """Plug in the learner's attention a checkpoint's meta names (nothing for the built-in); LearnerError when
    its file is missing or broken. Returns the model and a note when the file changed since training."""
    spec = meta.get("attn_impl")
    if not spec:
        return model, None
    path, name = parse_spec(spec)
    if not Path(path).is_file():
        raise LearnerError(f"this run's attention is a learner's function, `{name}` in {path} (model.attn_impl), "
                           "and that file is missing: put the same file back at that path to reopen the run")
    plug(model, spec)
    note = None
    if meta.get("attn_impl_sha256") and sha256_of(Path(path)) != meta["attn_impl_sha256"]:
        note = (f"{path} has changed since this checkpoint was trained: the model now runs the new code with the "
                "weights the old code trained")
    return model, note
