"""The dtype that decodes fastest here: `--dtype auto` for sampling and the lab, chosen by a measurement.

Training picks bf16 on a CPU with native bf16 (pick_dtype): its matmuls are large, and AMX or AVX512-BF16 runs them
several times faster. A decoding step is different: one token, so each matmul is a matrix-vector product, bound by
reading the weights rather than by arithmetic. On a CPU, bf16 decoding is therefore the model's weights cast to
bf16 once (decoding_model: a copy, half the bytes to read at every token) and no autocast, which would cast every
weight again at every token: on a 2-core AMX Xeon, autocast decoded at half float32's speed (issue 44). Whether
half the bytes beats float32's kernels depends on the CPU (docs/benchmarks.md: bf16 weights decoded 1.2-1.4x
faster than float32 on an AMD EPYC without bf16 units, 0.8x as fast on an AMX Xeon host, where a full window was
2x faster in bf16), so on a CPU auto times a few real decoding steps of the actual model each way, and decodes
in the faster one.

Cached decoding on a CPU then stores the weights one of two ways, the faster measured in the chosen dtype
(decoding_layout): as trained (each nn.Linear weight (out, in), row after row) or column after column, the same
matrix with W^T laid out contiguously, which the matrix-vector kernel reads as x @ W^T. Nothing else changes: the
same modules, values and hooks, only where the numbers sit in memory (a copy of the model, like bf16's). On a
2-core AMD EPYC with AVX512-BF16 (Zen 4) whose decoding read its 17 MB of float32 weights from memory at every
token, columns decoded the default model 1.1-1.3x faster in float32 and no faster in bf16 (docs/benchmarks.md).
Then it runs in one thread or in all of torch's, again the faster measured (decoding_thread_count): a token is a
few matrix-vector products, which a second thread may speed up (a second core's memory bandwidth) or only keep
waiting.

The measurement costs about half a second or more, so it is kept: in this process's memory, and in a small JSON
file that later processes read instead of measuring again (sample.py would otherwise pay it inside every run).
It is stored under a key of everything the speed depends on: the CPU's name, torch's version, the CPU's bf16 and
AMX flags, the thread count, how OpenMP threads wait (omp.describe: sample.py spins longer than train.py), and the
caller's key (the model's shape, cached or not). Any of these different: a new measurement. The file is

    $ATTENTION_LAB_CACHE_DIR/measurements.json        when that variable is set (the tests set it)
    $XDG_CACHE_HOME/attention-lab/measurements.json   else, when that one is set
    ~/.cache/attention-lab/measurements.json          else

(Before 2026-11-29 the file was named decoding_dtype.json, when it held only decoding's measurements; an old file is
not read, and what it held is measured again once.)

Delete it (or run `python -m bench.decoding_dtype`, which measures afresh and overwrites its entries) to measure
again, e.g. after the machine's load changed for good. The file is a cache, never a requirement: missing,
corrupt, unreadable or unwritable, auto measures and decodes as before (one warning line at most). Writes are
atomic (a temporary file, then os.replace), so a reader never sees half a file; two processes writing at once
may drop one's new entry, which is then measured again.

Training's `model.attn_backend=auto` (sdpa against the math path, one attention layer's step:
attention_lab/training/backend.py) and `train.loss_chunk=auto` (the loss whole or in blocks:
attention_lab/training/loss_chunk.py) keep their measurements in the same file, under keys of their own, and so
does the trainer's matmul peak (the MFU denominator: the best seconds per matmul of each size, runtime/flops.py);
`kept_seconds` is the file's interface for any such measurement of named candidates.

    decoding_model(model, dtype, device, layout)  what decodes in dtype, under which autocast (bf16 weights on a
                                    CPU), its weights stored by rows or by columns
    time_decoding(decode, device)   seconds per decoding step of decode(dtype) for each dtype, interleaved, medians
    time_candidates(run, candidates)  the same for any candidates (thread counts; time_layouts: the layouts)
    faster_dtype(seconds)           the decision, a pure function of those numbers (faster_layout, faster_threads:
                                    the layout's and the threads')
    decoding_layout(...)            cached decoding's weights on a CPU: by rows or by columns, the faster measured
    decoding_thread_count(...)      cached decoding's threads on a CPU: one or all, the faster measured, kept
    decoding_dtype(name, ...)       what sampling calls: a named dtype as asked, auto as measured (or as stored)
    kept_seconds(key, measure)      any measurement of named candidates, kept the same way (training's backend)
    cache_file()                    where the measurements are stored

GPUs keep pick_dtype's choice (bf16 autocast where supported: nothing here measured one). A CPU without bf16
units is measured too: its bf16 arithmetic is emulated, but a decoding step reads the weights more than it
computes with them.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import statistics
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import omp
from .device import cpu_model, pick_dtype

CANDIDATES = (torch.float32, torch.bfloat16)
LAYOUTS = ("rows", "columns")  # how a decoding copy stores each nn.Linear weight: as trained, or its transpose contiguous
# bf16 must beat float32 by this fraction to be chosen: float32 is the reference numerics (the tokens a float32
# run gives), so a tie or a difference inside the noise of shared cores keeps it
MARGIN = 0.05
# a candidate whose warm-up steps took more than this many times the fastest's is not timed further (time_candidates)
OUT = 3.0

CACHE_DIR_ENV = "ATTENTION_LAB_CACHE_DIR"
FILE_NAME = "measurements.json"
FORMAT = 1  # the file's layout; a file of another format is read as empty (and rewritten)
KEEP = 64  # entries kept in the file, the most recently measured: one per machine setup, model shape and path
CAPABILITIES = ("amx_bf16", "amx_tile", "avx512_bf16")  # the flags of torch.cpu.get_capabilities a key names

_kept: dict[str, dict[str, float]] = {}  # kept_seconds' memory: the full key -> seconds per candidate's name
_warned: list[str] = []  # the warning this process printed: one line at most, whatever goes wrong after
_afresh = False  # inside measuring_afresh(): ignore what is stored, measure, overwrite


# model -> {(dtype, layout): (its weights' stamp, the copy that decodes so)}
_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decoding_model(model: nn.Module, dtype: torch.dtype, device: torch.device, layout: str = "rows"
                   ) -> tuple[nn.Module, torch.dtype]:
    """(what decodes, the autocast dtype of its forward passes) for decoding in `dtype` with the weights stored by
    `layout` (LAYOUTS). On a CPU, a dtype other than the weights' own, or layout "columns", is a copy of the model
    with its weights in that dtype and layout, under no autocast (module docstring); the copy is made once and kept
    while the model's weights are unchanged (any in-place change, an optimizer step or load_state_dict, bumps a
    parameter's version and makes a new copy). Elsewhere, and while the model is watched (hooks that read or edit
    its activations, as the lab's interventions: a copy would decode without them), the model itself under the
    dtype's autocast."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    own = next(model.parameters()).dtype
    if device.type != "cpu" or (dtype == own and layout == "rows") or watched(model):
        return model, dtype
    stamp = tuple((p.data_ptr(), p._version) for p in model.parameters())
    # the copies of these weights (older weights' copies dropped), one per dtype and layout asked for
    kept = _copies[model] = {how: c for how, c in _copies.get(model, {}).items() if c[0] == stamp}
    if (dtype, layout) not in kept:
        copied = copy.deepcopy(model).to(dtype)
        kept[(dtype, layout)] = (stamp, by_columns(copied) if layout == "columns" else copied)
    return kept[(dtype, layout)][1].train(model.training), own


def by_columns(model: nn.Module) -> nn.Module:
    """model, each nn.Linear weight (out, in) stored column after column: the same matrix and values, its
    transpose laid out contiguously (W^T.contiguous().T), so that F.linear's x @ W^T reads W^T row after row. A
    weight tied to another (the output layer to the token embedding) gets its own copy: the embedding's rows stay
    rows for its lookups. In place; returns the model."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight = nn.Parameter(module.weight.detach().t().contiguous().t(),
                                         requires_grad=module.weight.requires_grad)
    return model


def watched(model: nn.Module) -> bool:
    """Whether forward hooks (or model.hooks.hooked's switches) are on any of the model's modules just now."""
    return any(m._forward_hooks or m._forward_pre_hooks or getattr(m, "hooked", False) for m in model.modules())


def time_decoding(decode: Callable[[torch.dtype], Iterable], device: torch.device, dtypes=CANDIDATES,
                  rounds: int = 5, clock: Callable[[], float] = time.perf_counter) -> dict[torch.dtype, float]:
    """Seconds per decoding step of decode(dtype) (a few decoding steps of the real model, the way that dtype
    decodes: decoding_model), timed by time_candidates."""
    return time_candidates(decode, dtypes, rounds, clock)


def time_layouts(decode: Callable[[str], Iterable], rounds: int = 5,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per decoding step of decode(layout) for each of LAYOUTS, timed like time_candidates (its own seam:
    a test stubs the layouts' timings apart from the threads')."""
    return _interleaved(decode, LAYOUTS, rounds, clock)


def time_candidates(run: Callable[[Any], Iterable], candidates: Iterable, rounds: int = 5,
                    clock: Callable[[], float] = time.perf_counter) -> dict[Any, float]:
    """Seconds per step of run(candidate), an iterable of decoding steps (a generator: each next() one token).
    One warm-up call each first (allocations, kernel choice, a thread pool), then `rounds` rounds that take the
    candidates in turn (A, B, A, B, ...), so a neighbour's load falls on all alike. Every step of a call is timed
    but its first (the prompt's prefill and the cache's allocation); the median over all of a candidate's steps.
    Single steps, because a whole probe's time holds its prefill, a matrix product (where bf16 without bf16 units
    is slowest) that 500 decoded tokens pay once, and any neighbour's burst inside it. On a 2-core AMD EPYC
    without bf16 (Zen 3), where bf16 weights in two threads decoded 500 tokens fastest, auto picked them in 5 of
    16 fresh measurements by whole probes and 12 of 16 by steps (bf16 in all 16; docs/benchmarks.md).

    A candidate whose warm-up steps took more than OUT times the fastest candidate's (medians) cannot win: it is
    not timed in the rounds, and its warm-up median stands. There bf16 by columns decoded at a quarter of float32's
    speed, and a full window's step in bf16 without bf16 units at a fifth: timing them in every round was most of
    a first measurement's time."""
    return _interleaved(run, candidates, rounds, clock)


def _interleaved(run: Callable[[Any], Iterable], candidates: Iterable, rounds: int,
                 clock: Callable[[], float]) -> dict[Any, float]:
    candidates = tuple(candidates)
    warm = {candidate: _step_seconds(run(candidate), clock) for candidate in candidates}
    if not all(warm.values()):
        raise ValueError("each probe must run at least two decoding steps: the first (the prefill) is not timed")
    warm_median = {candidate: statistics.median(times) for candidate, times in warm.items()}
    fastest = min(warm_median.values())
    timed = [candidate for candidate in candidates if warm_median[candidate] <= OUT * fastest]
    seconds: dict[Any, list[float]] = {candidate: [] for candidate in timed}
    for _ in range(rounds):
        for candidate in timed:
            seconds[candidate] += _step_seconds(run(candidate), clock)
    return {candidate: statistics.median(seconds[candidate]) if candidate in seconds else warm_median[candidate]
            for candidate in candidates}


def _step_seconds(steps: Iterable, clock: Callable[[], float]) -> list[float]:
    """The seconds of each step of an iterable (each next(): one step's end to the next's), in order, but its first
    (the prompt's prefill and the cache's allocation), which no decoded token pays again."""
    times, start = [], clock()
    for _ in steps:
        end = clock()
        times.append(end - start)
        start = end
    return times[1:]


def faster(seconds: dict[Any, float], reference: Any, margin: float = MARGIN) -> Any:
    """The candidate with the least time; another displaces `reference` only when it is faster by more than
    `margin` (a fraction of the reference's time)."""
    best = min(seconds, key=seconds.get)
    if reference in seconds and best != reference and seconds[best] > (1 - margin) * seconds[reference]:
        return reference
    return best


def faster_dtype(seconds: dict[torch.dtype, float], margin: float = MARGIN) -> torch.dtype:
    """The dtype with the least time; float32, the reference numerics, stays unless another is faster by more than
    `margin`."""
    return faster(seconds, torch.float32, margin)


def faster_layout(seconds: dict[str, float], margin: float = MARGIN) -> str:
    """The layout with the least time; rows, the weights as trained, stay unless columns are faster by more than
    `margin`."""
    return faster(seconds, "rows", margin)


def faster_threads(seconds: dict[int, float], margin: float = MARGIN) -> int:
    """The thread count with the least time; one thread, which a busy neighbour never keeps waiting, stays unless
    another count is faster by more than `margin`."""
    return faster(seconds, 1, margin)


def cache_file() -> Path:
    """Where measurements are stored (module docstring): read at each call, so a test's environment applies."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]) / FILE_NAME
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or "relative")
    base = xdg if xdg.is_absolute() else Path.home() / ".cache"  # the XDG spec: a relative value is ignored
    return base / "attention-lab" / FILE_NAME


def measurement_key(key: Hashable) -> dict[str, object]:
    """Everything a decoding step's speed depends on: this machine's setup and the caller's key."""
    caps = torch.cpu.get_capabilities()
    return {"cpu": cpu_model(), "torch": torch.__version__, **{flag: bool(caps.get(flag)) for flag in CAPABILITIES},
            "threads": torch.get_num_threads(), "openmp": omp.describe(), "model": str(key)}


def decoding_dtype(name: str, device: torch.device, decode: Callable[[torch.dtype], Iterable], key: Hashable,
                   measure: Callable[..., dict[torch.dtype, float]] | None = None) -> torch.dtype:
    """The dtype to decode in (decoding_model says how). A name other than auto is pick_dtype's. auto: on a CPU,
    the faster of float32 and bf16 for decode(dtype) (a few decoding steps of the model about to decode), measured
    once per measurement_key and kept (module docstring): the key names what the speed depends on beyond the
    machine (the model's shape, cached or not); measure: time_decoding unless given. Elsewhere auto is
    pick_dtype's."""
    if name != "auto" or device.type != "cpu":
        return pick_dtype(name, device)
    names = {str(dtype).removeprefix("torch."): dtype for dtype in CANDIDATES}  # the file names dtypes by text

    def timed() -> dict[str, float]:
        return {str(d).removeprefix("torch."): s for d, s in (measure or time_decoding)(decode, device).items()}

    seconds, _ = kept_seconds(key, tuple(names), timed)
    return faster_dtype({dtype: seconds[name] for name, dtype in names.items()})


def decoding_layout(device: torch.device, cached: bool, decode: Callable[[str], Iterable], key: Hashable,
                    measure: Callable[[Callable[[str], Iterable]], dict[str, float]] | None = None) -> str:
    """How cached decoding on a CPU stores the weights (decoding_model's layout): rows or columns, the faster for
    decode(layout) (a few decoding steps of the model with its weights stored so), measured once per
    measurement_key and kept like the dtype; columns must win by more than MARGIN. A token is one matrix-vector
    product per weight, whose speed on a CPU depends on how the kernel walks the matrix through memory; full
    forward passes (uncached, or a GPU's decoding) are matrix products and keep the rows, unmeasured."""
    if device.type != "cpu" or not cached:
        return "rows"
    seconds, _ = kept_seconds((key, "layout"), LAYOUTS, lambda: dict((measure or time_layouts)(decode)))
    return faster_layout(seconds)


def decoding_thread_count(device: torch.device, cached: bool, decode: Callable[[int], Iterable], key: Hashable,
                          measure: Callable[[Callable[[int], Iterable], tuple[int, int]], dict[int, float]]
                          | None = None) -> int:
    """The torch threads to decode in. Cached decoding on a CPU (one token a step: small matrix-vector products)
    runs in one thread or in all of torch's, the faster for decode(threads) (a few decoding steps in that many
    threads), measured once per measurement_key and kept like the dtype; a second thread must win by more than
    MARGIN, since one thread is never slowed by waiting for another on a busy machine. Which wins depends on the
    CPU, the model and the dtype (docs/benchmarks.md): on a 2-core AMD EPYC, the default model, one and two
    threads were about even in float32 and two were 0.98-1.3x as fast in bf16; on an AMX Xeon host two threads
    decoded 1.1-1.5x faster in float32. Full forward passes (uncached, or a GPU's decoding) keep torch's threads,
    unmeasured."""
    most = torch.get_num_threads()
    if device.type != "cpu" or not cached or most == 1:
        return most

    def timed() -> dict[str, float]:
        return {str(n): s for n, s in (measure or time_candidates)(decode, (1, most)).items()}

    seconds, _ = kept_seconds((key, "threads"), ("1", str(most)), timed)
    return faster_threads({1: seconds["1"], most: seconds[str(most)]})


def kept_seconds(key: Hashable, names: tuple[str, ...], measure: Callable[[], dict[str, float]]
                 ) -> tuple[dict[str, float], bool]:
    """Seconds per candidate, by name, for this machine setup (measurement_key) and the caller's key: from this
    process's memory, else from the file, else measure() (which returns {name: seconds}), then stored. Returns
    (the seconds, whether measure() ran now). A stored entry that lacks one of `names` counts as none. What
    decoding_dtype does for its two dtypes, for any caller: training's attention backend keeps sdpa vs math here."""
    cache_key = _cache_key(key)
    measured = False
    if cache_key not in _kept or _afresh:
        stored = None if _afresh else _read_entries().get(cache_key)
        seconds = stored if stored is not None and set(names) <= set(stored) else None
        if seconds is None:
            seconds, measured = {name: float(s) for name, s in measure().items()}, True
            _store(cache_key, seconds)
        _kept[cache_key] = seconds
    return dict(_kept[cache_key]), measured


def keep_least(key: Hashable, seconds: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Fold a new measurement of a best-of quantity into the kept one (the matmul peak's seconds per size): each
    name keeps the lesser seconds of the two, so a measurement taken while the machine was busy is mended by a
    later one on idle cores and never undoes one. Returns (the seconds kept before: {} when none, the seconds kept
    now); names of the kept entry that the new measurement lacks stay as they were."""
    cache_key = _cache_key(key)
    stored = dict(_kept.get(cache_key) or _read_entries().get(cache_key) or {})
    merged = stored | {name: min(float(s), stored.get(name, float(s))) for name, s in seconds.items()}
    if merged != stored:
        _store(cache_key, merged)
    _kept[cache_key] = merged
    return stored, dict(merged)


def _cache_key(key: Hashable) -> str:
    """The measurement file's key of an entry: measurement_key as sorted JSON."""
    return json.dumps(measurement_key(key), sort_keys=True)


def forget_measurements() -> None:
    """This process's memory as a fresh process's (tests): no measurement held, no warning printed yet. The file
    stays (delete it, or measure afresh: measuring_afresh, `python -m bench.decoding_dtype`)."""
    _kept.clear()
    _warned.clear()


@contextlib.contextmanager
def measuring_afresh() -> Iterator[None]:
    """Inside, auto measures even where a measurement is kept, and overwrites it (bench/decoding_dtype.py)."""
    global _afresh
    before, _afresh = _afresh, True
    try:
        yield
    finally:
        _afresh = before


# ------------------------------------------------------------------------------------------------ the file


def _warn(message: str) -> None:
    """One line on stderr, the first time only in a process: the cache never stops a sample, nor floods it."""
    if not _warned:
        _warned.append(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _positive_seconds(raw: object) -> dict[str, float] | None:
    """A stored {name: seconds}; None unless it is a non-empty dict of positive finite times."""
    if not isinstance(raw, dict) or not raw:
        return None
    for value in raw.values():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
            return None
    return {str(name): float(value) for name, value in raw.items()}


def _read_entries() -> dict[str, dict[str, float]]:
    """The stored measurements ({name: seconds}) by full key (JSON text), in the file's order (oldest first); an
    entry with a time that is not a positive number is left out. Empty when there is
    no file, and when it cannot be read or is not ours (with a warning: it is then measured and rewritten)."""
    path = "the cache file"
    try:
        path = cache_file()
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
            raise ValueError(f"not a format-{FORMAT} measurement file")
    except (FileNotFoundError, NotADirectoryError):  # nothing stored yet (a write says so if it cannot store)
        return {}
    except (OSError, ValueError, RuntimeError) as e:  # json's errors, UnicodeDecodeError: ValueErrors; no home
        _warn(f"measurement cache {path} unreadable ({type(e).__name__}): measuring again")
        return {}
    entries = {}
    for entry in data["entries"]:
        seconds = _positive_seconds(entry.get("seconds")) if isinstance(entry, dict) else None
        if seconds is not None and isinstance(entry.get("key"), dict):
            entries[json.dumps(entry["key"], sort_keys=True)] = seconds
    return entries


def _store(cache_key: str, seconds: dict[str, float]) -> None:
    """Add (or replace) one measurement ({name: seconds}) in the file, keeping the KEEP most recent, written
    atomically."""
    entries = _read_entries()
    entries.pop(cache_key, None)
    entries[cache_key] = seconds  # last: the most recent
    data = {"format": FORMAT,
            "about": "attention-lab: seconds per few decoding steps in each dtype, what `--dtype auto` decodes in, "
                     "and in one thread against all (attention_lab/runtime/decoding.py); per attention layer step in "
                     "each backend, what `model.attn_backend=auto` trains with (attention_lab/training/backend.py); "
                     "per output layer and loss step whole or chunked, what `train.loss_chunk=auto` trains with "
                     "(attention_lab/training/loss_chunk.py); per square matmul of each size, the matmul peak the "
                     "trainer's MFU divides by (attention_lab/runtime/flops.py); delete this file to measure again",
            "entries": [{"key": json.loads(k), "seconds": v} for k, v in list(entries.items())[-KEEP:]]}
    path, tmp = "the cache file", None
    try:
        path = cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{FILE_NAME}.",
                                         suffix=".tmp", delete=False) as f:
            tmp = Path(f.name)
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
        tmp = None
    except (OSError, RuntimeError) as e:  # RuntimeError: Path.home() with no home to find
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        _warn(f"measurement cache {path} not written ({reason}): the next process measures again")
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
