"""The machine's measured matmul peak: the denominator of model FLOPs utilisation (MFU).

A datasheet peak assumes every core at full clock doing nothing else; what a model can hope for is what the
BLAS reaches on large square matmuls, **in the dtype the run computes in**: a bf16 matmul on a CPU with
AVX512-BF16 runs about 2x a float32 one and on an AMX Xeon 4-8x, so dividing a bf16 run's FLOP/s by the
float32 peak overstates MFU by that factor. On a shared machine a busy moment lowers the measurement, so the
best of several samples is taken. bench/peak.py prints the same measurement as a table.

The trainer's peak is kept (kept_peak_flops): measuring took 2 s on 2 idle cores of an AMD EPYC (4 s on busy ones),
which every `train.py` without `train.peak_flops` paid at its start. On a CPU the best seconds per matmul of each size go into the measurement
file of decoding.py (kept_seconds: keyed by the CPU's name, torch's version, its bf16/AMX flags, the thread count,
and here the dtype), and a later run reads them. A peak first measured while the machine was busy is too low, and
every later run's MFU too high (2026-12-07, a 2-core AMD EPYC without bf16: kept 57 GFLOP/s, measured with another
job beside the run's start, where idle cores reach 115, so the run logged MFU 0.87). `python -m bench.run --only
peak` measures it again and keeps the faster of the two, size by size (keep_better_peak), so it mends such a peak and
a busy bench never lowers one; `provenance.json` says whether a run's peak was measured or kept. Deleting the file
measures everything again. A GPU's is measured once per process: the file's key names the CPU, not the GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from attention_lab.runtime import decoding
from attention_lab.runtime.device import synchronize

# big enough to reach the BLAS's peak, small enough that all take ~1-2 s on 2 CPU cores
CPU_SIZES = (512, 1024, 2048)
GPU_SIZES = (4096, 8192)
QUICK_SIZES = (256,)
MIN_SAMPLE_S = 0.08  # one timed sample repeats the matmul until it lasts about this long
QUICK_SAMPLE_S = 0.01


def matmul_probe(n: int, device: torch.device, dtype: torch.dtype) -> tuple[Callable[[], None], float]:
    """A callable doing one (n, n) @ (n, n) matmul into a preallocated output, and its FLOPs (2 n^3)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)  # preallocated: page faults are not matmul time

    def fn() -> None:
        torch.mm(a, b, out=out)

    return fn, 2.0 * n**3


def time_calls(fn: Callable[[], object], n: int, device: torch.device, max_s: float = float("inf")) -> float:
    """Seconds per call over n calls, or over as many as fit in max_s when the calls slow down on the way.

    The bound matters on a shared CPU: a call timed at 0.1 ms during calibration may take 15 ms a moment
    later (another process holds a core), and n calls fixed from the fast one would then run for minutes.
    bench/ times everything with it too.
    """
    synchronize(device)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        fn()
        done += 1
        if time.perf_counter() - t0 > max_s:
            break
    synchronize(device)
    return (time.perf_counter() - t0) / done


def matmul_rates(device: torch.device | str, dtype: torch.dtype, sizes: tuple[int, ...] | None = None,
                 samples: int = 5, min_s: float = MIN_SAMPLE_S) -> dict[int, list[float]]:
    """FLOP/s of every timed sample, per matmul size (default sizes: the device's)."""
    device = torch.device(device)
    sizes = sizes or (GPU_SIZES if device.type in ("cuda", "mps") else CPU_SIZES)
    rates: dict[int, list[float]] = {}
    for n in sizes:
        fn, flops = matmul_probe(n, device, dtype)
        fn()  # warmup: BLAS thread pool, packing buffers, GPU kernel selection
        inner = max(1, round(min_s / time_calls(fn, 1, device)))
        rates[n] = [flops / time_calls(fn, inner, device, max_s=4 * min_s) for _ in range(samples)]
    return rates


def measure_peak_flops(device: torch.device | str, dtype: torch.dtype, quick: bool = False,
                       samples: int = 5) -> float:
    """Best FLOP/s of square matmuls in `dtype` (the run's compute dtype); about 1.5 s on 2 CPU cores.

    quick=True times one small size (tests).
    """
    if quick:
        rates = matmul_rates(device, dtype, QUICK_SIZES, samples=2, min_s=QUICK_SAMPLE_S)
    else:
        rates = matmul_rates(device, dtype, samples=samples)
    return best_rate(rates)


def best_rate(rates: dict[int, list[float]]) -> float:
    """The best FLOP/s among every size's samples (matmul_rates' output): the peak."""
    return max(max(r) for r in rates.values())


_GPU_PEAKS: dict[tuple[str, torch.dtype], float] = {}  # this process's GPU measurements (none are kept in the file)


def kept_peak_flops(device: torch.device | str, dtype: torch.dtype,
                    measure: Callable[[torch.device, torch.dtype], dict[int, list[float]]] | None = None
                    ) -> tuple[float, bool]:
    """measure_peak_flops as the trainer takes it, kept (module docstring): (FLOP/s, whether it was measured now).

    On a CPU: the best seconds per (n, n) matmul of each of CPU_SIZES, from this process's memory or the
    measurement file, else measured (measure: matmul_rates unless given) and stored; the peak is the best size's
    2 n^3 / seconds. Elsewhere: measured once per process and device.
    """
    device = torch.device(device)
    if device.type != "cpu":
        key = (str(device), dtype)
        measured = key not in _GPU_PEAKS
        if measured:
            _GPU_PEAKS[key] = best_rate((measure or matmul_rates)(device, dtype))
        return _GPU_PEAKS[key], measured

    seconds, measured = decoding.kept_seconds(peak_key(dtype), KEPT_NAMES,
                                              lambda: best_seconds((measure or matmul_rates)(device, dtype)))
    return peak_of(seconds), measured


KEPT_NAMES = tuple(str(n) for n in CPU_SIZES)  # the kept CPU peak's entries: the best seconds of each size


def peak_key(dtype: torch.dtype) -> tuple[str, str]:
    """The kept CPU peak's key beyond the machine (decoding.measurement_key adds the CPU, torch, flags, threads)."""
    return "matmul peak", str(dtype).removeprefix("torch.")


def best_seconds(rates: dict[int, list[float]]) -> dict[str, float]:
    """matmul_rates' FLOP/s samples -> the best seconds per (n, n) matmul, by size's name (what is kept)."""
    return {str(n): 2.0 * n**3 / max(r) for n, r in rates.items()}


def peak_of(seconds: dict[str, float]) -> float:
    """FLOP/s of the fastest kept size: 2 n^3 / its best seconds."""
    return max(2.0 * int(n) ** 3 / seconds[n] for n in KEPT_NAMES)


def keep_better_peak(device: torch.device | str, dtype: torch.dtype, rates: dict[int, list[float]]
                     ) -> tuple[float, float] | None:
    """A full measurement of the CPU's peak (matmul_rates over CPU_SIZES: bench/peak.py's) folded into the peak the
    trainer keeps, size by size, the faster kept (decoding.keep_least): a peak first measured while the machine was
    busy (a low peak, so every later run's MFU too high) is mended by measuring it again on idle cores, and a busy
    measurement never lowers it. Returns (the kept peak before, after) in FLOP/s (before: 0 when none was kept),
    or None where nothing is kept (a GPU, or other sizes than the trainer's)."""
    if torch.device(device).type != "cpu" or set(rates) != set(CPU_SIZES):
        return None
    before, after = decoding.keep_least(peak_key(dtype), best_seconds(rates))
    return (peak_of(before) if set(KEPT_NAMES) <= set(before) else 0.0), peak_of(after)
