"""The machine's measured matmul peak: the denominator of model FLOPs utilisation (MFU).

A datasheet peak assumes every core at full clock doing nothing else; what a model can hope for is what the
BLAS reaches on large square matmuls, in the dtype training runs in (fp32 on CPU, bf16 on GPU). On a shared
machine a busy moment lowers the measurement, so the best of several samples is taken.
"""

from __future__ import annotations

import time

import torch

CPU_SIZES = (512, 1024, 2048)
GPU_SIZES = (4096, 8192)
QUICK_SIZES = (256,)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype | None = None, quick: bool = False,
                       samples: int = 5, min_sample_s: float = 0.08) -> float:
    """Best FLOP/s of (n, n) @ (n, n) matmuls (2 n^3 FLOPs each) over a few sizes; about 1.5 s on 2 CPU cores.

    dtype defaults to bf16 on GPU, fp32 elsewhere; quick=True times one small size (tests).
    """
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    sizes = QUICK_SIZES if quick else GPU_SIZES if device.type == "cuda" else CPU_SIZES
    min_s = 0.01 if quick else min_sample_s
    gen = torch.Generator().manual_seed(0)
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, generator=gen).to(device, dtype)
        b = torch.randn(n, n, generator=gen).to(device, dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)  # preallocated: page faults are not matmul time
        torch.mm(a, b, out=out)  # warmup: thread pool, packing buffers, kernel selection
        _sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        _sync(device)
        inner = max(1, round(min_s / max(time.perf_counter() - t0, 1e-9)))
        for _ in range(samples):
            t0 = time.perf_counter()
            for _ in range(inner):
                torch.mm(a, b, out=out)
            _sync(device)
            best = max(best, 2.0 * n**3 * inner / (time.perf_counter() - t0))
    return best
