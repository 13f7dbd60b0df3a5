"""The machine's measured matmul peak: the denominator of model FLOPs utilisation (MFU)."""

from __future__ import annotations

import time

import torch


def measure_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                       size: int | None = None, repeats: int = 5) -> float:
    """Best FLOP/s of square matmuls (2 n^3 FLOPs each): fp32 on CPU, bf16 on GPU unless dtype says otherwise."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    dtype = dtype or (torch.bfloat16 if on_gpu else torch.float32)
    n = size or (8192 if on_gpu else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    inner = 20 if on_gpu else 2
    best = float("inf")
    for i in range(repeats + 1):
        if on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(inner):
            a @ b
        if on_gpu:
            torch.cuda.synchronize()
        if i:  # the first round warms up
            best = min(best, (time.perf_counter() - t0) / inner)
    return 2 * n**3 / best
