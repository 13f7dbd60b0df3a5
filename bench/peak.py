"""The machine's matmul peak as a table: the denominator of MFU (model FLOPs utilisation).

The measurement itself is the trainer's (attention_lab/runtime/flops.py), in the dtype the benchmarks compute
in (float32 on CPU, bf16 on GPU; `bench.run --dtype` asks for another). On a shared CPU the peak read during a busy moment is low, which overstates
MFU; the training benchmark therefore also divides by a matmul timed in the same round as each step ("paired"
MFU).
"""

from __future__ import annotations

from attention_lab.runtime.flops import MIN_SAMPLE_S, QUICK_SAMPLE_S, QUICK_SIZES, keep_better_peak, matmul_rates

from .common import Column, Context, Table, median


def run(ctx: Context) -> Table:
    dtype = ctx.dtype
    if ctx.quick:
        rates = matmul_rates(ctx.device, dtype, QUICK_SIZES, samples=2, min_s=QUICK_SAMPLE_S)
    else:
        rates = matmul_rates(ctx.device, dtype, samples=7)
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
    kept = keep_better_peak(ctx.device, dtype, rates)  # the trainer's kept peak, mended where this one is faster
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
            "(`attention_lab.runtime.flops.measure_peak_flops(device, dtype)`, what the trainer divides by).",
            *([kept_note(*kept)] if kept else []),
        ],
        summary={"peak_flops": peak, "dtype": dtype_name},
    )


def kept_note(before: float, after: float) -> str:
    """What the measurement did to the peak the trainer keeps (flops.keep_better_peak)."""
    if before == 0.0:
        return f"The trainer had kept no peak here; it keeps **{after / 1e9:.1f} GFLOP/s** now."
    if after > before:
        return (f"The trainer's kept peak was {before / 1e9:.1f} GFLOP/s (measured in a busier moment); it keeps "
                f"**{after / 1e9:.1f}** now, the faster sizes of this measurement, so later runs' MFU divides by it.")
    return f"The trainer keeps {after / 1e9:.1f} GFLOP/s, its earlier measurement (no size ran faster now)."
