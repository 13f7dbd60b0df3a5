"""The machine's matmul peak, measured: the denominator of MFU (model FLOPs utilisation).

A vendor's datasheet peak assumes every core at full clock running nothing else; on a shared two-core CPU
that is unreachable. What a model can hope for is what the BLAS reaches on a large square matmul, so MFU
here is measured model FLOP/s divided by the best rate of such matmuls, in the dtype training runs in
(fp32 on CPU, bf16 on GPU).

On a shared CPU the peak read during a busy moment is low, which overstates MFU; the training benchmark
therefore also divides by a matmul timed in the same round as each step ("paired" MFU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attention_lab.flops import (
    CPU_SIZES,
    GPU_SIZES,
    QUICK_SIZES,
    measure_peak_flops,  # noqa: F401 - the trainer's peak, re-exported here
)

from .common import Column, Context, Table, default_dtype, median, time_calls

# The trainer's sizes: big enough to reach the BLAS's peak, small enough that all take ~1-2 s on 2 CPU cores.
# On the 2-core development machine every size from 256 up reaches the same ~190 GFLOP/s when the cores are
# free and as little as a tenth of it while another process holds one: the best sample is the peak.
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


def matmul_rates(
    device: torch.device | str,
    dtype: torch.dtype,
    sizes: tuple[int, ...],
    samples: int = 5,
    min_s: float = MIN_SAMPLE_S,
) -> dict[int, list[float]]:
    """FLOP/s of every timed sample, per matmul size."""
    device = torch.device(device)
    rates: dict[int, list[float]] = {}
    for n in sizes:
        fn, flops = matmul_probe(n, device, dtype)
        fn()  # warmup: BLAS thread pool, packing buffers, GPU kernel selection
        inner = max(1, round(min_s / time_calls(fn, 1, device)))
        rates[n] = []
        for _ in range(samples):
            rates[n].append(flops / time_calls(fn, inner, device, max_s=4 * min_s))
    return rates


def _rates(device: torch.device, dtype: torch.dtype, quick: bool, samples: int) -> dict[int, list[float]]:
    if quick:
        return matmul_rates(device, dtype, QUICK_SIZES, samples=2, min_s=QUICK_SAMPLE_S)
    return matmul_rates(device, dtype, GPU_SIZES if device.type == "cuda" else CPU_SIZES, samples=samples)


def run(ctx: Context) -> Table:
    dtype = default_dtype(ctx.device)
    rates = _rates(ctx.device, dtype, ctx.quick, samples=7)
    rows = [
        {
            "n": n,
            "gflop": 2.0 * n**3 / 1e9,
            "best_gflops": max(r) / 1e9,
            "median_gflops": median(r) / 1e9,
            "samples": len(r),
        }
        for n, r in rates.items()
    ]
    peak = max(max(r) for r in rates.values())
    ctx.peak_flops = peak  # the training benchmark's MFU uses this same number
    dtype_name = str(dtype).replace("torch.", "")
    return Table(
        name="peak",
        title=f"Matmul peak ({dtype_name}), the MFU denominator",
        machine=ctx.machine,
        columns=[
            Column("n", "n (square n×n @ n×n)"),
            Column("gflop", "GFLOP / matmul", "{:.2f}"),
            Column("best_gflops", "best GFLOP/s", "{:.1f}"),
            Column("median_gflops", "median GFLOP/s", "{:.1f}"),
            Column("samples", "samples"),
        ],
        rows=rows,
        notes=[
            f"torch.mm into a preallocated output, {dtype_name}; each sample repeats it for >= {MIN_SAMPLE_S} s.",
            f"Peak = best sample over all sizes = **{peak / 1e9:.1f} GFLOP/s** "
            "(`bench.peak.measure_peak_flops(device, dtype)`).",
        ],
        summary={"peak_flops": peak, "dtype": dtype_name},
    )
