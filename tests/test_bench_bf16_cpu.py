"""The issue-44 benchmarks run and print tables that name the CPU (bench/step_profile.py, bench/decoding_dtype.py).

Smoke only (--quick: a tiny model, seconds): their numbers are measurements, never asserted.
"""

from __future__ import annotations

import re

import pytest
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
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    ways = [(r[1], r[2], r[3]) for r in rows[1:]]  # (dtype, threads, layout) after the header
    counts = sorted({"1", str(torch.get_num_threads())})
    assert ways == [(d, n, lay) for d in ("float32", "bfloat16") for lay in ("rows", "columns") for n in counts] + [
        (d, str(torch.get_num_threads()), "rows") for d in ("float32", "bfloat16")], f"each way of each path once:\n{out}"
    picks = [r[6] for r in rows[1:] if r[0]]
    assert [r[0] for r in rows[1:] if r[0]] == ["cached (sample.py)", "uncached (the lab)"], out
    assert all(re.fullmatch(r"(float32|bfloat16), \d+ thread\(s\), (rows|columns)", pick) for pick in picks), picks
    assert picks[1].endswith(", rows"), f"the uncached path keeps the rows: {picks}"


def test_the_step_profile_prints_the_groups_and_the_settings(capsys):
    assert step_profile.main(["--quick", "--dtypes", "bfloat16,float32"]) == 0
    out = capsys.readouterr().out
    machine_named(out)
    assert "| attention backward (sdpa flash) |" in out and "| ms a step (under the profiler) |" in out, out
    settings = [line for line in out.splitlines() if line.startswith("| attention: the math path")]
    assert len(settings) == 2, "the attention setting in both dtypes"


def test_the_bf16_training_step_runs_both_sides_under_autocast(tmp_path, monkeypatch):
    """bench.run --dtype bfloat16: the peak is bf16's, and ours and Hugging Face's steps both run under bf16
    autocast (a planted bench that times float32 while its title says bf16 fails here)."""
    import json

    from bench import train_step
    from bench.run import main

    seen = []
    real = train_step.autocast

    def spy(device, dtype):
        seen.append(dtype)
        return real(device, dtype)

    monkeypatch.setattr(train_step, "autocast", spy)
    out = tmp_path / "r.json"
    main(["--quick", "--only", "peak,train", "--dtype", "bfloat16", "--device", "cpu", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["machine"]["dtype"] == "bfloat16"
    assert "(bfloat16)" in results["tables"]["peak"]["title"]
    assert results["tables"]["train"]["title"].endswith("bfloat16 autocast")
    assert seen and set(seen) == {torch.bfloat16}, f"the steps ran under {set(seen)}"


def test_the_step_profile_times_the_chunked_loss_and_three_newton_schulz_steps(capsys):
    assert step_profile.main(["--quick", "--skip-profile", "--settings", "loss,ns3", "--dtypes", "float32",
                              "--backend", "math"]) == 0
    out = capsys.readouterr().out
    assert "| the loss 256 rows at a time" in out and "| Newton-Schulz steps 3 (vs 5) | float32 |" in out, out


def test_the_profile_dtypes_follow_the_cpu_unless_asked():
    """Both dtypes where the CPU has native bf16, float32 alone where bf16 would be emulated (a profile of it
    took 7 minutes on a 2-core EPYC without bf16), and exactly what --dtypes asks either way, bf16 first."""
    both, f32 = (torch.bfloat16, torch.float32), (torch.float32,)
    assert step_profile.profiled_dtypes(None, native_bf16=True) == both
    assert step_profile.profiled_dtypes(None, native_bf16=False) == f32
    assert step_profile.profiled_dtypes("float32", native_bf16=True) == f32
    assert step_profile.profiled_dtypes("float32,bfloat16", native_bf16=False) == both
    assert step_profile.profiled_dtypes("bfloat16", native_bf16=False) == (torch.bfloat16,)


def test_without_native_bf16_the_profile_is_float32_alone(capsys, monkeypatch):
    monkeypatch.setattr(step_profile, "cpu_has_native_bf16", lambda: False)
    assert step_profile.main(["--quick", "--settings", "bf16,ns3"]) == 0
    out = capsys.readouterr().out
    assert "| op group | float32 |" in out and "bf16 autocast |" not in out, out
    assert "no native bf16" in out
    rows = [line for line in out.splitlines() if line.startswith("| bf16 autocast (vs float32)")]
    assert not rows, "the bf16 row times emulated bf16"
    assert "| Newton-Schulz steps 3 (vs 5) | float32 |" in out


def test_a_bad_dtype_is_an_error_line_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as e:
        step_profile.main(["--quick", "--dtypes", "float16"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error: --dtypes 'float16'" in err and "bfloat16, float32" in err, err


def test_the_bench_step_runs_each_model_under_the_asked_autocast(monkeypatch):
    """bench.run --dtype bfloat16 compares the two steps under one autocast: each model's forward pass of a
    training step must see bf16 autocast on, ours and Hugging Face's alike (a spy on the autocast function alone
    cannot tell which side entered it)."""
    from bench import train_step

    seen: dict[str, set] = {}
    real_ours, real_hf = train_step.build_ours, train_step.build_hf

    def spied(name, model):
        def record(module, args, kwargs):
            seen.setdefault(name, set()).add((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))

        model.register_forward_pre_hook(record, with_kwargs=True)
        return model

    monkeypatch.setattr(train_step, "build_ours", lambda cfg, device: spied("ours", real_ours(cfg, device)))
    monkeypatch.setattr(train_step, "build_hf", lambda ours, device: spied("hf", real_hf(ours, device)))
    ours_step, hf_step, *_ = train_step.make_steps(train_step.QUICK_CASES[0], torch.device("cpu"), torch.bfloat16)
    seen.clear()  # make_steps' own check of the two logits runs outside the steps
    ours_step()
    hf_step()
    assert seen == {"ours": {(True, torch.bfloat16)}, "hf": {(True, torch.bfloat16)}}, seen


@pytest.mark.parametrize("gain, want", [(0.97, ("float32", 1, "rows")), (0.90, ("bfloat16", 2, "columns"))])
def test_the_decoding_benchs_auto_column_says_what_sampling_decoded_in(capsys, monkeypatch, tmp_path, torch_threads,
                                                                     gain, want):
    """"auto picks" is what generate_text decoded in under auto (on_decoding), margins included: a 3% gain is
    inside them (float32, one thread, the rows), a 10% gain is not. The uncached path keeps every thread and the
    rows."""
    from attention_lab.runtime import decoding

    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(decoding, "time_decoding", lambda decode, device: {torch.float32: 1.0, torch.bfloat16: gain})
    monkeypatch.setattr(decoding, "time_candidates", lambda run, counts: {1: 1.0, 2: gain})
    monkeypatch.setattr(decoding, "time_layouts", lambda decode: {"rows": 1.0, "columns": gain})
    assert decoding_dtype.main(["--quick"]) == 0
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| cached") or line.startswith("| uncached")]
    assert [r[6] for r in rows] == [f"{want[0]}, {want[1]} thread(s), {want[2]}", f"{want[0]}, 2 thread(s), rows"], rows


def test_the_decoding_bench_refuses_more_tokens_than_the_context_holds(capsys):
    """Past block_size the KV cache is rebuilt from a full window at every step: a 500-token run after its 16-token
    prompt once timed that, and read bf16 as 0.7x float32 where the cached steps alone were 1.1x."""
    with pytest.raises(SystemExit) as e:
        decoding_dtype.main(["--tokens", "497"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--tokens 497" in err and "at most 496" in err, err
