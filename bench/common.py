"""What every benchmark shares: the machine line, interleaved timing, and tables (markdown and JSON).

This machine is shared and noisy: absolute times drift by tens of percent within a minute, so every
comparison runs its contenders in the same process, interleaved (A, B, A, B, ...), and reports each one's
median alongside the median of the per-round ratios. A ratio taken within one round sees the same load on
both sides, which is why it holds when the absolute numbers do not.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attention_lab.runtime import omp
from attention_lab.runtime.device import cpu_model, synchronize  # noqa: F401 - re-exported for the benchmarks
from attention_lab.runtime.flops import measure_peak_flops, time_calls


def log(msg: str) -> None:
    """Progress goes to stderr, so stdout carries nothing but the tables."""
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------
# device and machine


def default_dtype(device: torch.device) -> torch.dtype:
    """The compute dtype benchmarks use: fp32 on CPU (comparable across CPU kinds), bf16 (autocast) on GPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def describe_machine(device: torch.device, dtype: torch.dtype | None = None) -> dict:
    info = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": str(device),
        "dtype": str(dtype or default_dtype(device)).replace("torch.", ""),
        # how OpenMP threads wait (attention_lab/runtime/omp.py): spinning or sleeping changes a 2-core machine's speed
        # several-fold, idle or beside another process
        "openmp": omp.describe(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def machine_line(m: dict) -> str:
    parts = [
        f"CPU {m['cpu']} ({m['cpu_count']} cores)",
        f"{m['torch_threads']} torch threads ({m['openmp']})",
        f"torch {m['torch']}",
    ]
    if m.get("transformers"):
        parts.append(f"transformers {m['transformers']}")
    device = m["device"] + (f" ({m['gpu']})" if m.get("gpu") else "")
    parts.append(f"device {device}, {m['dtype']}")
    return " · ".join(parts)


# ----------------------------------------------------------------------------------------------------------
# timing


def peak_bytes(fn, device: torch.device) -> int | None:
    """Bytes allocated by fn at its peak, beyond what was allocated before it ran (None if unmeasurable).

    GPU: torch.cuda.max_memory_allocated after reset_peak_memory_stats. CPU: torch.profiler(profile_memory=True)
    allocation events (+size, -size on free) in time order; the maximum of their running sum.
    """
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        from torch._C._profiler import _EventType

        tree = prof.profiler.kineto_results.experimental_event_tree()
    except (AttributeError, ImportError):  # the event tree is an experimental API; report n/a without it
        return None
    events, stack = [], list(tree)
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    running = peak = 0
    for _, size in sorted(events):
        running += size
        peak = max(peak, running)
    return peak


def interleaved(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    reps: int,
    warmup: int = 1,
    min_sample_s: float = 0.0,
) -> dict[str, list[float]]:
    """Seconds per call of each fn, `reps` samples each, taken round-robin: A, B, A, B, ...

    Warmup calls are interleaved too. A call faster than `min_sample_s` is repeated inside one sample (the
    count fixed after warmup, per fn, a sample cut short at 4x min_sample_s) so that timer resolution and
    one-off hiccups average out.
    """
    n_inner = {name: 1 for name in fns}
    for i in range(warmup):
        for name, fn in fns.items():
            dt = time_calls(fn, 1, device)
            if i == warmup - 1 and min_sample_s > 0:
                n_inner[name] = max(1, min(1000, round(min_sample_s / max(dt, 1e-9))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(time_calls(fn, n_inner[name], device, max_s=4 * min_sample_s or float("inf")))
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of num[i] / den[i]: with times, den's speedup over num, round by round."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def median_interval(xs: list[float], level: float = 0.9) -> tuple[float, float, float]:
    """A distribution-free interval for the median of what xs samples: (lo, hi, coverage).

    Order statistics: with n independent samples, the k-th smallest and the k-th largest bracket the median with
    probability 1 - 2 P(Binomial(n, 1/2) < k). The narrowest such interval whose coverage reaches `level`; with too
    few samples for that, the whole range and its coverage (4 samples: 1 - 2/16 = 0.875)."""
    ordered, n = sorted(xs), len(xs)
    if n == 0:
        raise ValueError("median_interval needs at least one sample")

    def coverage(k: int) -> float:
        below = sum(math.comb(n, i) for i in range(k)) / 2**n  # P(fewer than k samples under the median)
        return 1.0 - 2.0 * below

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return ordered[k - 1], ordered[n - k], coverage(k)


def verdict(lo: float, hi: float, target: float) -> str:
    """"met" when the whole interval reaches the target, "missed" when it lies below it, else "cannot tell"."""
    if lo >= target:
        return "met"
    if hi < target:
        return "missed"
    return "cannot tell"


def spread(xs: list[float]) -> float:
    """(max - min) / median of the samples: how noisy the run was."""
    return (max(xs) - min(xs)) / statistics.median(xs)


# ----------------------------------------------------------------------------------------------------------
# tables


@dataclass
class Column:
    key: str
    label: str
    fmt: str = "{}"  # a str.format spec applied to the raw value when printing


@dataclass
class Table:
    """One benchmark's result: raw values in `rows` (for JSON), formatted only when printed."""

    name: str
    title: str
    machine: dict
    columns: list[Column]
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # method, settings, targets: printed above the table
    summary: dict = field(default_factory=dict)  # headline numbers (targets met, fitted exponents, ...)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", machine_line(self.machine), ""]
        lines += [f"- {note}" for note in self.notes]
        if self.notes:
            lines.append("")
        lines.append("| " + " | ".join(c.label for c in self.columns) + " |")
        lines.append("|" + "|".join("---" if i == 0 else "--:" for i in range(len(self.columns))) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(_cell(row.get(c.key), c.fmt) for c in self.columns) + " |")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict:
        return {
            "title": self.title,
            "machine": self.machine,
            "notes": self.notes,
            "columns": {c.key: c.label for c in self.columns},
            "rows": self.rows,
            "summary": self.summary,
        }


def _cell(value, fmt: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return fmt.format(value)


@dataclass
class Context:
    """What a benchmark needs to know about this run; `peak_flops` is measured once and shared."""

    device: torch.device
    quick: bool
    machine: dict
    peak_flops: float | None = None
    asked_dtype: torch.dtype | None = None  # bench.run --dtype; None: default_dtype's

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the peak and the training step compute in (bf16 under autocast, both sides alike)."""
        return self.asked_dtype or default_dtype(self.device)

    def peak(self) -> float:
        if self.peak_flops is None:
            log("measuring the matmul peak (MFU denominator) ...")
            self.peak_flops = measure_peak_flops(self.device, self.dtype, quick=self.quick)
        return self.peak_flops
