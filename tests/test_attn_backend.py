"""model.attn_backend=auto (attention_lab/training/backend.py): train.py turns it into sdpa or math before the model is
built, from a measurement on a CPU (sdpa on a GPU), kept across processes in decoding.py's measurement file; the
run records the concrete backend, and a resumed run keeps it.

Nothing here is timed: the decision is driven by stubbed timings (and a fake clock), and the one real
measurement only runs, unjudged. Speed itself lives in bench/step_profile.py and docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train as train_mod
from attention_lab.runtime import decoding
from attention_lab.runtime.distributed import DistInfo
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training import backend
from attention_lab.training.backend import (
    MARGIN,
    choose_backend,
    faster_backend,
    settle_attn_backend,
    time_attention,
    time_candidates,
)
from attention_lab.training.config import compose
from model import GPT

REPO = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
MATH_WINS, SDPA_WINS = {"sdpa": 2.0, "math": 1.0}, {"sdpa": 1.0, "math": 2.0}


pytestmark = pytest.mark.usefixtures("fresh_measurements")  # conftest.py: a measurement file of its own


def stub(seconds: dict[str, float], calls: list | None = None):
    """A measurement that returns `seconds`, appending its arguments to `calls`."""
    def measure(layer, batch, device, dtype):
        if calls is not None:
            calls.append((layer, batch, device, dtype))
        return dict(seconds)
    return measure


def refuse(*args):
    raise AssertionError("measured, though nothing should have been measured here")


def config(*overrides: str):
    return compose(["experiment=debug", "model.attn_backend=auto", *overrides])


# ------------------------------------------------------------------------------------------------- the decision


@pytest.mark.parametrize("seconds, want", [
    (MATH_WINS, "math"), (SDPA_WINS, "sdpa"), ({"sdpa": 1.0, "math": 1.0}, "sdpa"),
    ({"sdpa": 1.0, "math": 1.0 - MARGIN / 2}, "sdpa"),  # faster, but inside the margin: the reference stays
    ({"sdpa": 1.0, "math": 1.0 - 2 * MARGIN}, "math"),
])
def test_math_is_picked_only_when_faster_than_sdpa_by_the_margin(seconds, want):
    assert faster_backend(seconds) == want, f"{seconds}: want {want} (math must be {MARGIN:.0%} faster)"


class FakeClock:
    """A clock that run(name) advances by cost[name] seconds."""

    def __init__(self, cost: dict[str, float]):
        self.now, self.cost, self.calls = 0.0, cost, []

    def __call__(self) -> float:
        return self.now

    def run(self, name: str) -> None:
        self.calls.append(name)
        self.now += self.cost[name]


@pytest.mark.parametrize("cost", [MATH_WINS, SDPA_WINS])
def test_the_measurement_takes_the_backends_in_turn_and_keeps_the_medians(cost):
    clock = FakeClock(cost)
    seconds = time_candidates(clock.run, rounds=3, clock=clock)
    assert seconds == cost, f"measured {seconds}, the runs cost {cost}"
    assert clock.calls == ["sdpa", "math"] * 4, f"one untimed call each, then 3 rounds in turn: {clock.calls}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_real_measurement_runs_both_backends_and_leaves_the_rng_alone(dtype):
    """The run seeds its RNG before the measurement and builds its model after: an RNG the measurement moved
    would give a run that measured other initial weights than one that read the stored choice."""
    layer = config().model.gpt(vocab_size=86)
    before = torch.get_rng_state()
    seconds = time_attention(layer, 2, CPU, dtype, rounds=1)
    assert set(seconds) == {"sdpa", "math"} and all(s > 0 for s in seconds.values()), seconds
    assert torch.equal(torch.get_rng_state(), before), "time_attention drew from the run's RNG"


@pytest.mark.parametrize("seconds, want", [(MATH_WINS, "math"), (SDPA_WINS, "sdpa")])
def test_auto_on_a_cpu_picks_what_its_measurement_says_at_the_runs_shape_and_dtype(seconds, want):
    cfg = config("train.batch_size=3")
    calls = []
    choice = choose_backend(cfg, CPU, torch.bfloat16, measure=stub(seconds, calls))
    assert choice.backend == want, f"measured {seconds}, auto picked {choice.backend}"
    (layer, batch, device, dtype), = calls
    assert (batch, layer.block_size, layer.n_head, layer.head_size, dtype) == (3, 32, 2, 16, torch.bfloat16), \
        "measured at another shape or dtype than the run's"
    for part in (f"auto picked {want}", f"sdpa {seconds['sdpa'] * 1e3:.1f} ms", f"math {seconds['math'] * 1e3:.1f} ms",
                 "measured now"):
        assert part in choice.line, f"the console line should say {part!r}: {choice.line}"


def test_a_stored_measurement_is_read_without_measuring_and_each_dtype_and_shape_has_its_own():
    cfg = config()
    assert choose_backend(cfg, CPU, torch.bfloat16, measure=stub(MATH_WINS)).backend == "math"
    decoding.forget_measurements()  # the next process
    again = choose_backend(cfg, CPU, torch.bfloat16, measure=refuse)
    assert again.backend == "math", "the stored measurement, read back"
    assert again.seconds == 0.0 and "as measured before" in again.line, again
    for other_dtype, other_cfg in ((torch.float32, cfg), (torch.bfloat16, config("train.batch_size=8")),
                                   (torch.bfloat16, config("model.block_size=64"))):
        calls = []
        got = choose_backend(other_cfg, CPU, other_dtype, measure=stub(SDPA_WINS, calls)).backend
        where = f"{other_dtype}, {other_cfg.train.batch_size} x {other_cfg.model.block_size}"
        assert calls and got == "sdpa", f"{where}: read another dtype's or shape's measurement"
    entries = json.loads(decoding.cache_file().read_text())["entries"]
    assert len(entries) == 4 and all(e["key"]["model"].startswith("attention backend") for e in entries), entries


def test_a_choice_kept_from_fewer_rounds_is_measured_again_with_the_rounds_of_now():
    """A file written when auto timed 5 rounds (its key without "rounds") kept sdpa on an EPYC where math is the
    faster step: the next run must measure again, not read it, and the new entry names its rounds."""
    cfg = config()
    choose_backend(cfg, CPU, torch.bfloat16, measure=stub(SDPA_WINS))
    data = json.loads(decoding.cache_file().read_text())
    (entry,) = data["entries"]
    shape = json.loads(entry["key"]["model"].removeprefix("attention backend "))
    assert shape["rounds"] == backend.ROUNDS, f"the kept key should name the rounds it was timed over: {shape}"
    del shape["rounds"]  # the key an older measurement wrote
    entry["key"]["model"] = "attention backend " + json.dumps(shape, sort_keys=True)
    decoding.cache_file().write_text(json.dumps(data))
    decoding.forget_measurements()  # the next process
    calls = []
    again = choose_backend(cfg, CPU, torch.bfloat16, measure=stub(MATH_WINS, calls))
    assert calls and again.backend == "math", f"read the older measurement's sdpa: {again.line}"


def test_time_attention_times_enough_rounds_for_a_noisy_cpu_by_default(monkeypatch):
    seen = []
    monkeypatch.setattr(backend, "time_candidates", lambda run, names, rounds, clock: seen.append(rounds) or
                        {name: 1.0 for name in names})
    time_attention(config().model.gpt(), 2, CPU, torch.float32)
    assert seen == [backend.ROUNDS] and backend.ROUNDS >= 11, \
        f"{seen} rounds: 5 picked the slower backend in 2 of 9 fresh processes (docs/benchmarks.md)"


def test_a_measurement_made_now_reports_its_seconds_for_the_budget():
    def slow(layer, batch, device, dtype):
        time.sleep(0.05)
        return dict(MATH_WINS)

    assert choose_backend(config(), CPU, torch.float32, measure=slow).seconds >= 0.05


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_gpu_gets_sdpa_and_is_never_measured(device):
    choice = choose_backend(config(), torch.device(device), torch.bfloat16, measure=refuse)
    assert choice.backend == "sdpa" and device in choice.line, choice


@pytest.mark.parametrize("overrides", [["model.arch=lstm"], ["model.attention=linear", "model.pos_encoding=learned"],
                                       ["model.causal_mask=after_softmax"]])
def test_nothing_is_measured_where_there_is_no_backend_to_choose(overrides):
    choice = choose_backend(config(*overrides), CPU, torch.float32, measure=refuse)
    assert choice.backend == "sdpa" and "nothing measured" in choice.line, choice


def test_a_resumed_run_keeps_its_recorded_backend_unmeasured():
    for recorded in ("math", "sdpa"):
        choice = choose_backend(config(), CPU, torch.float32, recorded=recorded, measure=refuse)
        assert choice.backend == recorded, f"the checkpoint says {recorded}, auto gave {choice.backend}"


def test_a_named_backend_is_kept_as_asked():
    for name in ("math", "sdpa"):
        cfg = compose(["experiment=debug", f"model.attn_backend={name}"])
        settled, seconds = settle_attn_backend(cfg, Path("/nonexistent"), CPU, torch.float32, DistInfo(), print)
        assert settled.model.attn_backend == name and seconds == 0.0


# ------------------------------------------------------------------------------------------------- the config


def test_the_cpu_presets_default_to_auto_and_an_unknown_backend_is_refused():
    assert compose([]).model.attn_backend == "auto"
    assert compose([]).model.gpt().attn_backend == "sdpa", "a model built outside train.py takes the reference"
    with pytest.raises(ValueError, match=r"model\.attn_backend='flash' is not one of auto, math, sdpa"):
        compose(["model.attn_backend=flash"])


def test_train_py_says_error_for_an_unknown_backend(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), "experiment=debug", "model.attn_backend=flash",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, f"one error: line and exit 2\n{proc.stderr[-3000:]}"
    assert "model.attn_backend='flash'" in errors[0] and "auto, math, sdpa" in errors[0], errors[0]
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------------- train.py


def debug_run(cache: Path, *overrides: str):
    return config(f"data.cache_dir={cache}", "train.sample_tokens=0", "train.tensorboard=false",
                  "train.log_interval=1", "optim.decay_steps=20", "train.eval_interval=10", *overrides)


def backend_of(model: GPT) -> set[str]:
    return {block.attn.backend for block in model.transformer.h}


@pytest.mark.parametrize("seconds, want", [(MATH_WINS, "math"), (SDPA_WINS, "sdpa")])
def test_a_debug_run_with_auto_trains_and_records_the_backend_it_picked(tmp_path, data_cache, monkeypatch,
                                                                         seconds, want):
    calls = []
    monkeypatch.setattr(backend, "time_attention", stub(seconds, calls))
    run = tmp_path / "run"
    train_mod.train(debug_run(data_cache, "train.max_steps=10"), run)
    assert len(calls) == 1, f"measured {len(calls)} times"
    recorded = json.loads((run / "config.json").read_text())["model"]["attn_backend"]
    assert recorded == want, f"config.json records {recorded!r}; auto picked {want}"
    ckpt = load_checkpoint(run, "latest")
    assert ckpt.config.attn_backend == want, "the checkpoint's model_config.json must name the concrete backend"
    assert backend_of(ckpt.build_model()) == {want}, "sample.py and evaluation would build another backend"
    console = (run / "console.log").read_text()
    assert f"attention: auto picked {want}" in console, console[:2000]


def test_a_resumed_auto_run_keeps_its_backend_and_equals_the_uninterrupted_run(tmp_path, data_cache, monkeypatch):
    """The resumed half runs where the measurement would now pick sdpa (another machine, or a changed load, with
    nothing stored): it must go on with the math it began with, to the last bit of every loss."""
    monkeypatch.setattr(backend, "time_attention", stub(MATH_WINS))
    full, split = tmp_path / "full", tmp_path / "split"
    train_mod.train(debug_run(data_cache, "train.max_steps=20"), full)
    train_mod.train(debug_run(data_cache, "train.max_steps=10"), split)

    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path / "another_cache"))
    decoding.forget_measurements()
    monkeypatch.setattr(backend, "time_attention", stub(SDPA_WINS))
    train_mod.train(debug_run(data_cache, "train.max_steps=20"), split)
    assert load_checkpoint(split, "latest").config.attn_backend == "math", "the resumed run switched backend"
    assert json.loads((split / "config.json").read_text())["model"]["attn_backend"] == "math"
    assert "as this run's checkpoint recorded it" in (split / "console.log").read_text()
    losses = {}
    for run in (full, split):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        losses[run.name] = {r["step"]: r["loss"] for r in rows if "loss" in r}
    for step in range(11, 21):
        assert losses["split"][step] == losses["full"][step], f"step {step}: the resumed run's loss differs"


def test_a_checkpoint_saved_with_a_named_backend_loads_and_resumes_under_auto(tmp_path, data_cache, monkeypatch):
    """Checkpoints from before auto name sdpa or math, as a run with a named backend saves them today."""
    monkeypatch.setattr(backend, "time_attention", refuse)
    run = tmp_path / "old"
    train_mod.train(debug_run(data_cache, "model.attn_backend=math", "train.max_steps=10"), run)
    assert backend_of(load_checkpoint(run, "latest").build_model()) == {"math"}
    train_mod.train(debug_run(data_cache, "train.max_steps=12"), run)  # auto now: resumed, not measured
    assert load_checkpoint(run, "latest").config.attn_backend == "math"


def test_settle_hands_train_py_the_seconds_its_measurement_took(monkeypatch):
    """train.py counts what settle_attn_backend returns in the budget: the real measurement's seconds, not 0."""
    def slow(layer, batch, device, dtype):
        time.sleep(0.05)
        return dict(MATH_WINS)

    monkeypatch.setattr(backend, "time_attention", slow)
    settled, seconds = settle_attn_backend(config(), Path("/nonexistent"), CPU, torch.float32, DistInfo(), print)
    assert settled.model.attn_backend == "math" and seconds >= 0.05, \
        f"measured for 0.05 s, handed train.py {seconds} s to count"


def test_the_measurement_counts_in_the_runs_time_budget(tmp_path, data_cache, monkeypatch, measurement_took):
    """A measurement said to have taken 2 minutes leaves nothing of a 1-minute budget: the run stops after its
    first step (the budget is checked after each)."""
    monkeypatch.setattr(backend, "time_attention", stub(SDPA_WINS))
    measurement_took("settle_attn_backend", 120.0)
    run = tmp_path / "run"
    train_mod.train(debug_run(data_cache, "train.max_steps=20", "train.max_minutes=1"), run)
    assert load_checkpoint(run, "latest").step == 1, "the run's clock left out the measurement's time"
    assert "time budget of 1.0 min spent: stopped at step 1" in (run / "console.log").read_text()


# ------------------------------------------------------------------------------------------------- same numbers


@pytest.mark.parametrize("dtype, logits_atol, grad_rel, windows", [
    (torch.float32, 1e-5, 1e-5, 2),
    # bf16 keeps 8 bits of mantissa (a rounding is up to 0.4%): the two paths round at different places, so they
    # differ by bf16's own error (measured on the AMD EPYC: 0.016 on logits of size ~4, 1.1% of a gradient's norm).
    # One whole window: on a CPU without native bf16 each window's backward takes 4.6 s (the batch is float32's)
    (torch.bfloat16, 0.05, 0.03, 1),
])
def test_math_and_sdpa_agree_at_the_default_shape(dtype, logits_atol, grad_rel, windows):
    """The default model (4 layers x 4 heads x 256, context 512, RoPE + QK-norm, dropout 0), whole windows: the
    logits, the loss and every parameter's gradient, in float32 and under bf16 autocast. Tolerances stated above."""
    cfg = compose([]).model.gpt(vocab_size=4096)
    assert cfg.dropout == 0.0 and cfg.block_size == 512
    torch.manual_seed(0)
    models = {name: GPT(dataclasses.replace(cfg, attn_backend=name)).train() for name in ("math", "sdpa")}
    models["sdpa"].load_state_dict(models["math"].state_dict())
    g = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(0, cfg.vocab_size, (windows, cfg.block_size), generator=g) for _ in range(2))
    out = {}
    for name, model in models.items():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            result = model(idx, targets)
        result.loss.backward()
        out[name] = result.logits.float(), result.loss.detach(), dict(model.named_parameters())
    torch.testing.assert_close(out["sdpa"][0], out["math"][0], atol=logits_atol, rtol=0,
                               msg=lambda m: f"{dtype}: sdpa's logits differ from math's\n{m}")
    torch.testing.assert_close(out["sdpa"][1], out["math"][1], atol=logits_atol, rtol=0)
    for name, p in out["sdpa"][2].items():
        ref = out["math"][2][name].grad
        rel = ((p.grad - ref).norm() / ref.norm()).item()
        assert rel < grad_rel, f"{dtype}: {name}'s gradient differs between backends by {rel:.2%} of its norm"
