"""The issue-44 benchmarks run and print tables that name the CPU (bench/step_profile.py, bench/decoding_dtype.py).

Smoke only (--quick: a tiny model, seconds): their numbers are measurements, never asserted.
"""

from __future__ import annotations

import torch

from bench import decoding_dtype, step_profile


def machine_named(out: str) -> None:
    caps = torch.cpu.get_capabilities()
    assert f"avx512_bf16: {bool(caps.get('avx512_bf16'))}" in out and "amx_bf16:" in out, out[:400]
    assert "shared cores" in out, "the table says the cores were shared"


def test_the_decoding_bench_prints_both_paths_and_autos_choice(capsys):
    assert decoding_dtype.main(["--quick"]) == 0
    out = capsys.readouterr().out
    machine_named(out)
    rows = [line for line in out.splitlines() if line.startswith("| cached") or line.startswith("| uncached")]
    assert len(rows) == 2, out
    assert all(("float32" in r or "bfloat16" in r) for r in rows), rows


def test_the_step_profile_prints_the_groups_and_the_settings(capsys):
    assert step_profile.main(["--quick"]) == 0
    out = capsys.readouterr().out
    machine_named(out)
    assert "| attention backward (sdpa flash) |" in out and "| ms a step (under the profiler) |" in out, out
    settings = [line for line in out.splitlines() if line.startswith("| attention: the math path")]
    assert len(settings) == 2, "the attention setting in both dtypes"
