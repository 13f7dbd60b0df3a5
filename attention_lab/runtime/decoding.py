"""The dtype that decodes fastest here: `--dtype auto` for sampling and the lab, chosen by a measurement.

Training picks bf16 on a CPU with native bf16 (pick_dtype): its matmuls are large, and AMX or AVX512-BF16 runs them
several times faster. A decoding step is different: one token, so each matmul is a matrix-vector product that
bf16 units barely speed up, while autocast still casts every weight on every step. On a 2-core AMX Xeon bf16
decoded at half float32's speed (issue 44). So on such a CPU auto times a few real decoding steps of the actual
model in float32 and in bf16, once per process (per CPU and per model shape), and decodes in the faster one.

    time_decoding(decode, device)   seconds per call of decode() under each dtype, interleaved, medians
    faster_dtype(seconds)           the decision, a pure function of those numbers
    decoding_dtype(name, ...)       what sampling calls: a named dtype as asked, auto as measured

GPUs keep pick_dtype's choice (bf16 where supported: nothing here measured one), and a CPU without bf16 units
keeps float32 (emulated bf16 is slower, no need to time it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable

import torch

from .device import autocast, cpu_has_native_bf16, cpu_model, pick_dtype

CANDIDATES = (torch.float32, torch.bfloat16)
# bf16 must beat float32 by this fraction to be chosen: float32 is the reference numerics (the tokens a float32
# run gives), so a tie or a difference inside the noise of shared cores keeps it
MARGIN = 0.05

_measured: dict[Hashable, dict[torch.dtype, float]] = {}  # (CPU name, the caller's key) -> seconds per decode()


def time_decoding(decode: Callable[[], object], device: torch.device, dtypes=CANDIDATES, rounds: int = 5,
                  clock: Callable[[], float] = time.perf_counter) -> dict[torch.dtype, float]:
    """Seconds per call of decode() (a few decoding steps of the real model) under each dtype's autocast: one
    untimed call each first (allocations, kernel choice), then `rounds` rounds that take the dtypes in turn
    (A, B, A, B, ...), so a neighbour's load falls on both alike; the median of each."""
    for dtype in dtypes:
        with autocast(device, dtype):
            decode()
    seconds: dict[torch.dtype, list[float]] = {dtype: [] for dtype in dtypes}
    for _ in range(rounds):
        for dtype in dtypes:
            with autocast(device, dtype):
                start = clock()
                decode()
                seconds[dtype].append(clock() - start)
    return {dtype: statistics.median(times) for dtype, times in seconds.items()}


def faster_dtype(seconds: dict[torch.dtype, float], margin: float = MARGIN) -> torch.dtype:
    """The dtype with the least time; another dtype displaces float32 only when it is faster by more than
    `margin` (a fraction of float32's time)."""
    best = min(seconds, key=seconds.get)
    if torch.float32 in seconds and best != torch.float32 and seconds[best] > (1 - margin) * seconds[torch.float32]:
        return torch.float32
    return best


def decoding_dtype(name: str, device: torch.device, decode: Callable[[], object], key: Hashable,
                   measure: Callable[..., dict[torch.dtype, float]] | None = None) -> torch.dtype:
    """The dtype to decode in. A name other than auto is pick_dtype's. auto: on a CPU with native bf16, the
    faster of float32 and bf16 for decode() (a few decoding steps of the model about to decode), measured once
    per process for each (CPU, key): the key names what the speed depends on (the model's shape, cached or
    not); measure: time_decoding unless given. Elsewhere auto is pick_dtype's (module docstring)."""
    if name != "auto" or device.type != "cpu" or not cpu_has_native_bf16():
        return pick_dtype(name, device)
    cache_key = (cpu_model(), key)
    if cache_key not in _measured:
        _measured[cache_key] = (measure or time_decoding)(decode, device)
    return faster_dtype(_measured[cache_key])


def forget_measurements() -> None:
    """Drop every measurement of this process (tests; a bench that times auto afresh)."""
    _measured.clear()
