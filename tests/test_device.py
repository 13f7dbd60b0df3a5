"""Device and dtype choice: CPU fallbacks and clear errors for devices that are not there."""

from __future__ import annotations

import contextlib

import pytest
import torch

from attention_lab.runtime.device import autocast, pick_device, pick_dtype


def test_auto_picks_cuda_only_when_there_is_one():
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert pick_device("auto").type == expected


@pytest.mark.parametrize("cuda, mps, expected", [(True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"),
                                                 (False, False, "cpu")])
def test_auto_picks_cuda_then_apples_mps_then_the_cpu(monkeypatch, cuda, mps, expected):
    """Mocked backends (no Mac ran this): CUDA first, then MPS, then the CPU; asking for mps by name works where
    MPS is, and says to use the CPU where it is not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert pick_device("auto").type == expected, f"cuda {cuda}, mps {mps}: auto must pick {expected}"
    if mps:
        assert pick_device("mps", "train.device") == torch.device("mps")
    else:
        with pytest.raises(ValueError, match=r"train.device mps asks for Apple's MPS.*use cpu"):
            pick_device("mps", "train.device")


@pytest.mark.parametrize("macos14", [True, False])
def test_mps_trains_in_float32_by_default_and_bf16_only_where_macos_has_it(monkeypatch, macos14):
    """auto on MPS is float32 (no autocast): bf16 needs macOS 14 and has no hardware units on M1/M2, float16 needs a
    GradScaler; neither was measured on a Mac. float16 by name is allowed; bfloat16 by name before macOS 14 is an
    error in words. Muon's Newton-Schulz iteration stays in float32 on MPS too."""
    from attention_lab.training.optim import ns_dtype_for

    mps = torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos14 or major < 14)
    assert pick_dtype("auto", mps) == torch.float32
    assert pick_dtype("float32", mps) == torch.float32
    assert pick_dtype("float16", mps) == torch.float16
    if macos14:
        assert pick_dtype("bfloat16", mps) == torch.bfloat16
    else:
        with pytest.raises(ValueError, match="bfloat16 on Apple's MPS needs macOS 14"):
            pick_dtype("bfloat16", mps)
    assert ns_dtype_for("auto", mps) == torch.float32
    assert isinstance(autocast(mps, torch.float32), contextlib.nullcontext), "float32 on MPS runs without autocast"


def test_mps_runs_keep_the_cuda_only_paths_off(monkeypatch):
    """On MPS: the for-each AdamW (not the fused kernel), gloo (never NCCL) for a process group, no compile unless
    asked, a refusal in words for several processes on one Mac GPU, and the GPU's queue waited on before a timer
    stops. All with the backend mocked: nothing here ran on a Mac."""
    from attention_lab.runtime import device as device_mod
    from attention_lab.runtime import distributed
    from attention_lab.training.config import OptimConfig, TrainConfig
    from attention_lab.training.optim import configure_optimizer
    from model import GPT, GPTConfig

    mps = torch.device("mps")
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16))
    opt = configure_optimizer(model, OptimConfig(name="adamw"), mps)
    adamw = [o for o in getattr(opt, "optimizers", [opt]) if isinstance(o, torch.optim.AdamW)]
    assert adamw and not any(o.defaults.get("fused") for o in adamw), "fused AdamW is for CPU and CUDA only"
    on_cpu = configure_optimizer(model, OptimConfig(name="adamw"), torch.device("cpu"))
    assert all(o.defaults.get("fused") for o in getattr(on_cpu, "optimizers", [on_cpu])
               if isinstance(o, torch.optim.AdamW)), "the CPU keeps the fused kernel"
    assert TrainConfig().compile is False, "torch.compile is off by default (so never on MPS unless asked)"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.backend(use_cuda=False) == "gloo" and distributed.backend(use_cuda=True) == "nccl"
    one, two = distributed.DistInfo(), distributed.DistInfo(rank=1, local_rank=1, world_size=2)
    assert distributed.process_device(mps, one) == mps
    assert distributed.process_device(torch.device("cuda"), two) == torch.device("cuda", 1)
    assert distributed.process_device(torch.device("cpu"), two) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"train.device mps: several processes .* use train.device=cpu"):
        distributed.process_device(mps, two)

    waited = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: waited.append("mps"))
    device_mod.synchronize(mps)
    device_mod.synchronize(torch.device("cpu"))
    assert waited == ["mps"], "timers on MPS must wait for the GPU's queue (and only there)"


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


def test_decoding_threads_sets_the_count_asked_and_restores_it(torch_threads):
    """sample.py decodes in the thread count it chose (one thread or all: runtime/decoding.decoding_thread_count);
    None keeps torch's threads, a GPU's decoding leaves the CPU's alone, and the count comes back afterwards, even
    on an error."""
    from attention_lab.runtime.device import decoding_threads

    state = torch_threads
    calls = state["set"]
    cpu = torch.device("cpu")
    with decoding_threads(cpu, 1):
        assert state["n"] == 1, "decoding asked for one thread"
    assert state["n"] == 2 and calls == [1, 2], calls
    with decoding_threads(cpu, 3):
        assert state["n"] == 3, "decoding asked for three threads"
    assert state["n"] == 2
    with decoding_threads(cpu, None):
        assert state["n"] == 2, "None keeps every thread (full forward passes)"
    with decoding_threads(torch.device("cuda"), 1):
        assert state["n"] == 2, "a GPU's decoding leaves the CPU threads alone"
    with pytest.raises(RuntimeError), decoding_threads(cpu, 1):
        raise RuntimeError("boom")
    assert state["n"] == 2, "restored after an error"


@pytest.mark.parametrize("entry, spin", [("train", "1000"), ("sample", "100000"), ("bench.run", "1000")])
def test_entry_points_bound_openmp_spinning_unless_the_environment_says_otherwise(entry, spin):
    """GOMP_SPINCOUNT must be set before torch loads libgomp: in a fresh interpreter importing the entry point;
    a wait setting already in the environment (GOMP_SPINCOUNT or OMP_WAIT_POLICY) wins. sample.py decodes, and
    spins longer (attention_lab/runtime/omp.py: two threads asleep between a token's ops decoded 2.5x slower)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    cases = [({}, f"{spin} None"), ({"GOMP_SPINCOUNT": "7"}, "7 None"), ({"OMP_WAIT_POLICY": "PASSIVE"}, "None PASSIVE")]
    # one interpreter an entry point (importing one costs seconds): the first case as a fresh import, the others
    # by running the module again (importlib.reload) with their setting in the environment
    code = f"""import importlib, json, os, sys
import {entry} as m
seen = []
for extra in json.loads(sys.argv[1]):
    if seen:
        for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
            os.environ.pop(name, None)
        os.environ.update(extra)
        importlib.reload(m)
    seen.append(f"{{os.environ.get('GOMP_SPINCOUNT')}} {{os.environ.get('OMP_WAIT_POLICY')}}")
print("|".join(seen))
"""
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code, json.dumps([extra for extra, _ in cases])], cwd=repo, env=clean,
                         capture_output=True, text=True, check=True)
    for (extra, expected), got in zip(cases, out.stdout.strip().split("|"), strict=True):
        assert got == expected, f"{entry} with {extra}: {got!r} (stderr {out.stderr[-500:]})"
    source = (repo / (entry.replace(".", "/") + ".py")).read_text()
    assert source.index("\nbound_spinning(") < source.index("import torch"), \
        f"{entry}: the setting must come before torch is imported"


def test_the_benchmarks_spin_as_sample_py_when_they_time_decoding_alone():
    """bench.run sets OpenMP's wait before argparse runs: sample.py's longer spin for `--only generate`, train.py's
    otherwise (one process cannot switch: libgomp reads it once)."""
    from bench.run import only_decoding

    assert only_decoding(["--only", "generate"]) and only_decoding(["--quick", "--only=generate"])
    assert not only_decoding(["--only", "generate,train"]) and not only_decoding([]) and not only_decoding(["--only"])


def test_the_test_session_itself_waits_with_a_bounded_spin():
    """`make test` runs a pytest process a core, each with two torch threads: conftest bounds OpenMP's spin before torch
    loads, as the entry points do (libgomp's default spin cost the suite 5 more minutes of CPU: docs/testing.md). A
    setting the environment already had wins."""
    import os
    from pathlib import Path

    assert "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ, \
        "the tests run with libgomp's default spin: conftest must call bound_spinning()"
    source = (Path(__file__).parent / "conftest.py").read_text()
    assert source.index("bound_spinning()") < source.index("import torch"), \
        "conftest: the setting must come before torch is imported"
