"""Device and dtype choice: CPU fallbacks and clear errors for devices that are not there."""

from __future__ import annotations

import contextlib

import pytest
import torch

from attention_lab.runtime.device import autocast, pick_device, pick_dtype


def test_auto_picks_cuda_only_when_there_is_one():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == expected


@pytest.mark.parametrize("name, match", [("quantum", "not a device"), ("tpu", "not a device|only cpu")])
def test_unknown_devices_are_named_in_the_error(name, match):
    with pytest.raises(ValueError, match=match):
        pick_device(name, "train.device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_a_missing_gpu_says_to_use_the_cpu():
    with pytest.raises(ValueError, match=r"train.device cuda asks for a GPU.*use cpu"):
        pick_device("cuda", "train.device")


@pytest.mark.parametrize("caps, expected", [
    ({"amx_bf16": True, "avx512_bf16": True}, torch.bfloat16),
    ({"amx_bf16": False, "avx512_bf16": True}, torch.bfloat16),
    ({"amx_bf16": False, "avx512_bf16": False, "avx2": True}, torch.float32),
    ({}, torch.float32),
])
def test_auto_dtype_on_the_cpu_is_bf16_only_with_native_bf16(monkeypatch, caps, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert pick_dtype("auto", torch.device("cpu")) == expected


def test_auto_dtype_follows_this_cpus_capabilities_and_float32_autocast_is_a_no_op():
    cpu = torch.device("cpu")
    caps = torch.cpu.get_capabilities()
    native = bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))
    assert pick_dtype("auto", cpu) == (torch.bfloat16 if native else torch.float32), caps
    assert isinstance(autocast(cpu, torch.float32), contextlib.nullcontext)
    assert pick_dtype("bfloat16", cpu) == torch.bfloat16
    with autocast(cpu, torch.bfloat16):
        y = torch.ones(2, 2) @ torch.ones(2, 2)
    assert y.dtype == torch.bfloat16, "bf16 autocast on the CPU must run matmuls in bf16"


def test_cached_batch1_decoding_runs_in_one_thread_on_a_cpu_and_restores_the_count(monkeypatch):
    """sample.py decodes with the cache in one CPU thread (bench/threads.py: as fast idle, not slowed by a busy
    neighbour); full forward passes keep every thread, and the count comes back afterwards, even on an error."""
    from attention_lab.runtime.device import decoding_threads

    calls = []
    state = {"n": 2}
    monkeypatch.setattr(torch, "get_num_threads", lambda: state["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), state.update(n=n)))
    cpu = torch.device("cpu")
    with decoding_threads(cpu, cached=True):
        assert state["n"] == 1, "cached CPU decoding runs in one thread"
    assert state["n"] == 2 and calls == [1, 2], calls
    with decoding_threads(cpu, cached=False):
        assert state["n"] == 2, "uncached decoding (full forward passes) keeps every thread"
    with decoding_threads(torch.device("cuda"), cached=True):
        assert state["n"] == 2, "a GPU's decoding leaves the CPU threads alone"
    with pytest.raises(RuntimeError), decoding_threads(cpu, cached=True):
        raise RuntimeError("boom")
    assert state["n"] == 2, "restored after an error"


@pytest.mark.parametrize("entry", ["train", "sample", "bench.run"])
def test_entry_points_bound_openmp_spinning_unless_the_environment_says_otherwise(entry):
    """GOMP_SPINCOUNT must be set before torch loads libgomp: in a fresh interpreter importing the entry point;
    a wait setting already in the environment (GOMP_SPINCOUNT or OMP_WAIT_POLICY) wins."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    code = f"import {entry}, os; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    cases = [({}, "1000 None"), ({"GOMP_SPINCOUNT": "7"}, "7 None"), ({"OMP_WAIT_POLICY": "PASSIVE"}, "None PASSIVE")]
    for extra, expected in cases:
        out = subprocess.run([sys.executable, "-c", code], cwd=repo, env={**clean, **extra}, capture_output=True,
                             text=True, check=True)
        assert out.stdout.strip() == expected, f"{entry} with {extra}: {out.stdout!r} (stderr {out.stderr[-500:]})"
    source = (repo / (entry.replace(".", "/") + ".py")).read_text()
    assert source.index("bound_spinning()") < source.index("import torch"), \
        f"{entry}: the setting must come before torch is imported"
