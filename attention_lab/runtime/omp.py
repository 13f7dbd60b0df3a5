"""How OpenMP threads wait for each other: set before torch loads OpenMP, which reads the environment once.

torch's pip wheels use GNU libgomp. After a parallel op, a thread that waits for the others spins
GOMP_SPINCOUNT iterations (libgomp's default: 300,000), then sleeps. Spinning is fastest on an idle machine and
ruinous on a busy one: a 2-thread op on 2 cores waits for a descheduled thread. OMP_WAIT_POLICY=PASSIVE (sleep
at once) protects a shared machine but slows an idle one, by 4x when decoding on an Intel Xeon (measured).
A bounded spin is fast both ways. bench/threads.py on a 2-core AMD EPYC, training step, against PASSIVE:
GOMP_SPINCOUNT=1000 1.06x idle and 0.99x beside a busy process, libgomp's default 1.04x idle but 0.70x contended.

Decoding waits longer. A cached decoding token is about a hundred small ops, a few microseconds of Python apart,
each a parallel region when torch has two threads: with 1,000 spins the second thread has gone to sleep before
the next op and must be woken for each, and two threads decoded 2.5x slower than one (sample.py's default shape,
2-core Intel Xeon with AMX, 2026-12-02: 155-163 tokens/s against one thread's 386-450). With 100,000 spins it
stays awake across a token and two threads decode 1.2-1.3x faster than one (530-541 tokens/s; libgomp's
300,000: 546-605). So sample.py calls bound_spinning(DECODING_SPINCOUNT), and `--threads auto` measures one
thread against two under that wait (decoding.py keys the measurement by describe()).

No torch import here: the entry points (train.py, sample.py, bench/run.py) call bound_spinning() first.
"""

from __future__ import annotations

import os

SPINCOUNT = "1000"
DECODING_SPINCOUNT = "100000"  # sample.py's: a token's small ops keep both threads awake (module docstring)
VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")


def bound_spinning(spincount: str = SPINCOUNT) -> None:
    """Spin at most `spincount` iterations before sleeping, unless the environment already says how to wait
    (GOMP_SPINCOUNT or OMP_WAIT_POLICY set by the user wins). Effective only before torch is imported."""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = spincount


def describe() -> str:
    """The OpenMP settings in force, for benchmark tables: e.g. 'GOMP_SPINCOUNT=1000' or 'OpenMP defaults'."""
    set_ = [f"{name}={os.environ[name]}" for name in VARIABLES if name in os.environ]
    return ", ".join(set_) or "OpenMP defaults"
