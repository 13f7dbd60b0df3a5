"""bench/gpu_check.py, the GPU path in one prepared call: here at the CPU's tiny sizes, every step, as on a GPU.

On a GPU it is run by hand (`make gpu-check`; docs/benchmarks.md holds the table of the last one); here the suite
proves the script itself works top to bottom, so the few minutes a GPU is lent are not spent on the script's bugs.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check

REPO = Path(__file__).resolve().parent.parent


def test_every_step_passes_on_the_cpu_and_the_table_says_so(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--json", str(out),
                           "--work", str(tmp_path / "work")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"gpu_check --device cpu failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    rows = json.loads(out.read_text())["rows"]
    assert [r["step"] for r in rows] == list(gpu_check.STEPS), "every step runs, in order"
    assert all(r["ok"] for r in rows), rows
    table = proc.stdout
    assert f"{len(rows)} of {len(rows)} steps passed" in table
    for r in rows:
        assert f"| {r['step']} | ok |" in table, f"the table has no row for {r['step']}"
    by = {r["step"]: r["result"] for r in rows}
    assert "cached == uncached" in by["generate"] and "tokens/s" in by["train"] and "MFU" in by["train"]
    assert "attention.npy" in by["sample"] and "check passed" in by["exercise"]
    assert (tmp_path / "work" / "sample").is_dir(), "the sample step wrote its maps into the work folder"


def test_a_failing_step_fails_the_check_and_the_others_still_run(monkeypatch, capsys):
    def broken(ck):
        raise AssertionError("planted: the fused kernel differs")

    monkeypatch.setattr(gpu_check, "STEPS", {"env": gpu_check.step_env, "broken": broken,
                                             "capture": gpu_check.step_capture})
    assert gpu_check.main(["--device", "cpu"]) == 1, "any failed step makes the exit status non-zero"
    out = capsys.readouterr().out
    assert "| broken | **FAILED** |" in out and "planted: the fused kernel differs" in out
    assert "| capture | ok |" in out, "a step after a failure still runs"
    assert "2 of 3 steps passed" in out and "failed: broken" in out


def test_a_difference_over_the_tolerance_or_nan_fails():
    assert gpu_check.within("logits", 1e-6, 1e-4).startswith("logits 1.0e-06")
    with pytest.raises(AssertionError, match="exceeds the tolerance"):
        gpu_check.within("logits", 2e-4, 1e-4)
    with pytest.raises(AssertionError, match="exceeds the tolerance"):
        gpu_check.within("logits", math.nan, 1e-4)


def test_bad_arguments_get_one_error_line(capsys):
    assert gpu_check.main(["--only", "env,warp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown step warp; the steps are env, peak")
