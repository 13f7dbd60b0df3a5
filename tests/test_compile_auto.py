"""train.compile=auto (attention_lab/training/compiling.py): train.py turns it into true or false before the first
step: compiled on CUDA, never on MPS, under torchrun on a CPU or on a CPU without AMX-BF16, and on an AMX CPU when
the run's own step, timed eager and compiled, trains more tokens in the budget after paying for the compile.

The decision is driven by stubbed timings and stubbed CPU capabilities, in both directions; nothing is timed.
The one test with the real inductor checks that a compiled step computes what the eager one does (forward,
gradients, three optimizer steps), and that a compiled run resumes exactly.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import train as train_mod
from attention_lab.runtime import decoding
from attention_lab.runtime.distributed import DistInfo
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training import compiling
from attention_lab.training.compiling import (
    MARGIN,
    choose_compile,
    measured_step,
    time_compile,
    worth_compiling,
)
from attention_lab.training.config import compose
from attention_lab.training.optim import configure_optimizer
from model import GPT

CPU = torch.device("cpu")
ONE = DistInfo()
BUDGET = 480.0  # the default run's 8 minutes


pytestmark = pytest.mark.usefixtures("fresh_measurements")  # conftest.py: a measurement file of its own


def cpu_with(monkeypatch, amx: bool) -> None:
    """torch.cpu.get_capabilities as a CPU with or without AMX-BF16 reports it."""
    real = torch.cpu.get_capabilities()
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {**real, "amx_bf16": amx, "amx_tile": amx})


def stub(seconds: dict[str, float], calls: list):
    """A measurement returning `seconds` and the model itself as its 'compiled' wrapper, noting each call."""
    def measure(model, optimizer, step):
        calls.append(model)
        return dict(seconds), model
    return measure


def refuse(*args):
    raise AssertionError("measured, though nothing should have been measured here")


def config(*overrides: str):
    return compose(["experiment=debug", "train.compile=auto", *overrides])


FAST = {"eager": 0.30, "compiled": 0.22, "compile": 30.0}  # the AMX Xeon's default step, about
SLOW_TO_COMPILE = {"eager": 0.30, "compiled": 0.29, "compile": 180.0}  # the AVX512-BF16 EPYC's, about


# ------------------------------------------------------------------------------------------------- the decision


@pytest.mark.parametrize("seconds, budget, want", [
    (FAST, BUDGET, True),
    (SLOW_TO_COMPILE, BUDGET, False),
    # faster per step, but the compile eats the gain in a short budget: (60 - 30) / 0.22 < 60 / 0.30
    (FAST, 60.0, False),
    # no budget: the step alone decides, the margin included
    (FAST, None, True),
    ({"eager": 1.0, "compiled": 1.0 - MARGIN / 2, "compile": 1.0}, None, False),
    ({"eager": 1.0, "compiled": 1.0 - 2 * MARGIN, "compile": 1.0}, None, True),
    # a compiled step slower than eager never compiles, whatever the budget
    ({"eager": 0.2, "compiled": 0.3, "compile": 0.0}, BUDGET, False),
])
def test_compiling_is_worth_it_only_when_the_budget_trains_more_tokens(seconds, budget, want):
    assert worth_compiling(seconds, budget) is want, f"{seconds}, budget {budget}: want {want}"


def test_auto_on_a_cpu_with_amx_measures_and_follows_the_measurement_in_both_directions(monkeypatch):
    """Planted bug: auto compiling (or not) whatever its measurement said."""
    cpu_with(monkeypatch, amx=True)
    model = GPT(config().model.gpt(vocab_size=65))
    for batch, seconds, want in ((4, FAST, True), (5, SLOW_TO_COMPILE, False)):  # two shapes: two measurements
        calls = []
        choice = choose_compile(config("train.max_minutes=8", f"train.batch_size={batch}"), model, None, None, CPU,
                                torch.float32, ONE, measure=stub(seconds, calls))
        assert calls == [model], "auto on an AMX CPU must time the run's own step"
        assert choice.compile is want, f"{seconds}: compile={choice.compile}, want {want}"
        assert (choice.compiled is model) is want, "the measured wrapper is trained with only when compiling"
        assert choice.seconds > 0 and f"{seconds['compile']:.0f} s of compiling" in choice.line, choice.line


def test_a_measurement_that_decides_against_compiling_leaves_the_deterministic_flags_as_they_were(monkeypatch):
    """Planted bug: the eager run keeping the deterministic algorithms its measurement's compile turned on."""
    cpu_with(monkeypatch, amx=True)
    model = GPT(config().model.gpt(vocab_size=65))

    def compiling_measure(seconds):  # as time_compile does: compiled_for_training turns the flags on
        def measure(model, optimizer, step):
            torch.use_deterministic_algorithms(True, warn_only=True)
            return dict(seconds), model
        return measure

    compiling.restore_determinism((False, False, True))
    for batch, seconds, want in ((4, FAST, True), (5, SLOW_TO_COMPILE, False)):
        compiling.restore_determinism((False, False, True))
        choice = choose_compile(config("train.max_minutes=8", f"train.batch_size={batch}"), model, None, None, CPU,
                                torch.float32, ONE, measure=compiling_measure(seconds))
        assert choice.compile is want
        if want:  # the compiled run needs them: inductor reads the flag at the first step
            assert compiling.determinism() == (True, True, True)
        else:
            assert compiling.determinism() == (False, False, True), "an eager run must not keep the compile's flags"


def test_auto_measures_once_per_shape_then_reads_what_it_kept(monkeypatch):
    cpu_with(monkeypatch, amx=True)
    model, calls = GPT(config().model.gpt(vocab_size=65)), []
    first = choose_compile(config(), model, None, None, CPU, torch.float32, ONE, measure=stub(FAST, calls))
    decoding.forget_measurements()  # a new process: the file answers
    again = choose_compile(config(), model, None, None, CPU, torch.float32, ONE, measure=refuse)
    assert len(calls) == 1 and first.compile and again.compile
    assert again.seconds == 0.0 and again.compiled is None, "a kept measurement costs the run nothing"
    other = choose_compile(config("train.batch_size=8"), model, None, None, CPU, torch.float32, ONE,
                           measure=stub(SLOW_TO_COMPILE, calls))
    assert len(calls) == 2 and not other.compile, "another micro-batch is another measurement"


@pytest.mark.parametrize("where, amx, info, want", [
    ("cpu", False, ONE, False),  # a CPU without AMX: minutes of compiling for nothing (EPYCs)
    ("cpu", True, DistInfo(world_size=2), False),  # torchrun: the processes would time each other
    ("mps", True, ONE, False),
    ("cuda", False, ONE, True),
])
def test_auto_without_a_measurement(monkeypatch, where, amx, info, want):
    """Planted bug: auto compiling on a CPU without AMX (the EPYCs: 62-183 s of compiling for 0.85-1.01x)."""
    cpu_with(monkeypatch, amx=amx)
    choice = choose_compile(config(), None, None, None, torch.device(where), torch.float32, info, measure=refuse)
    assert choice.compile is want and choice.seconds == 0.0, choice.line


def test_a_named_choice_is_taken_as_it_is(monkeypatch):
    cpu_with(monkeypatch, amx=True)
    for value, want in (("true", True), ("false", False)):
        choice = choose_compile(config(f"train.compile={value}"), None, None, None, CPU, torch.float32, ONE,
                                measure=refuse)
        assert choice.compile is want and choice.line == ""


def test_bad_values_are_refused_in_words():
    with pytest.raises(ValueError, match="train.compile='sometimes' must be auto, true or false"):
        compose(["experiment=debug", "train.compile=sometimes"])


# ----------------------------------------------------------------------------------------- the measurement


def test_the_measurement_puts_back_the_weights_the_optimizer_and_the_rng():
    """Planted bugs: the measured steps' updates left in the model, or their dropout masks drawn from the run's own
    random stream (the run would start from weights, or draw masks, that depend on whether it measured or read a
    kept measurement). The 'compiler' here is the identity: the restore is what is tested."""
    cfg = compose(["experiment=debug", "optim=muon", "model.dropout=0.1"])  # the steps draw dropout masks
    torch.manual_seed(0)
    model = GPT(cfg.model.gpt(vocab_size=65)).train()
    optimizer = configure_optimizer(model, cfg.optim, CPU)
    weights, moments = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    rng = torch.get_rng_state()
    ticks = iter(range(100))
    seconds, wrapper = time_compile(model, optimizer, measured_step(cfg, optimizer, 65, CPU, torch.float32),
                                    rounds=2, clock=lambda: float(next(ticks)), compile_fn=lambda m: m)
    assert set(seconds) == {"eager", "compiled", "compile"} and wrapper is model
    assert torch.equal(torch.get_rng_state(), rng), "the measurement must leave the global RNG as it was"
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), f"{name} changed by the measurement"
    assert optimizer.state_dict() == moments, "the optimizer's state must be as before the measured steps"


def test_train_py_records_auto_s_choice_and_takes_the_loss_whole_when_compiled(tmp_path, data_cache, monkeypatch):
    """train.py settles auto before the first step: config.json says true or false, a compiled run's
    train.loss_chunk=auto is 0 and not measured, and the measurement's seconds count in the budget."""
    cpu_with(monkeypatch, amx=True)
    wrappers = []

    def measure(model, optimizer, step):  # 'compiled': a wrapper that counts the steps taken through it
        wrappers.append(Counting(model))
        return dict(FAST), wrappers[-1]

    monkeypatch.setattr(compiling, "time_compile", measure)
    monkeypatch.setattr("attention_lab.training.loss_chunk.time_loss", refuse)
    common = ["experiment=debug", f"data.cache_dir={data_cache}", "train.compile=auto", "train.loss_chunk=auto",
              "train.max_steps=2", "train.eval_interval=2", "train.sample_tokens=0", "train.head_roles=false",
              "train.tensorboard=false", "train.max_minutes=8"]
    train_mod.train(compose(common), tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["compile"] is True and saved["train"]["loss_chunk"] == 0, saved["train"]
    assert len(wrappers) == 1 and wrappers[0].calls == 2, (
        "both steps must go through the wrapper the measurement compiled (not the plain model, not a second compile)")
    keys = list(load_checkpoint(tmp_path / "run", "latest").build_model().state_dict())
    assert not any(k.startswith(("_orig_mod.", "inner.")) for k in keys), f"the wrapper was saved: {keys[:3]}"


class Counting(torch.nn.Module):
    """A stand-in for the compiled wrapper: the model's forward, counted."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner, self.calls = model, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def test_the_measurement_counts_in_the_runs_time_budget(tmp_path, data_cache, monkeypatch):
    """A measurement said to have taken 2 minutes leaves nothing of a 1-minute budget: the run stops after its
    first step, as with the other autos' measurements."""
    cpu_with(monkeypatch, amx=True)
    real = train_mod.settle_compile
    monkeypatch.setattr(train_mod, "settle_compile", lambda *a, **k: (*real(*a, **k)[:2], 120.0))
    monkeypatch.setattr(compiling, "time_compile", lambda model, optimizer, step: (dict(SLOW_TO_COMPILE), model))
    run = tmp_path / "run"
    train_mod.train(compose(["experiment=debug", f"data.cache_dir={data_cache}", "train.compile=auto",
                             "train.max_steps=20", "train.max_minutes=1", "train.sample_tokens=0",
                             "train.head_roles=false", "train.tensorboard=false"]), run)
    assert "time budget of 1.0 min spent: stopped at step 1" in (run / "console.log").read_text()


def test_the_cpu_preset_defaults_to_auto_and_the_tests_and_claims_presets_do_not():
    assert compose([]).train.compile == "auto"
    for preset in ("debug", "claims"):
        assert compose([f"experiment={preset}"]).train.compile is False, f"{preset}'s numbers would follow a timing"


# ------------------------------------------------------------------------------------------- the real inductor


def off(x: torch.Tensor, reference: torch.Tensor) -> float:
    """||x - reference|| / ||reference||: the relative error of a whole tensor."""
    return ((x - reference).norm() / reference.norm().clamp_min(1e-12)).item()


def test_inductor_computes_the_eager_step_and_a_compiled_run_resumes_exactly(tmp_path, data_cache, monkeypatch,
                                                                             whole_and_resumed):
    """Each compiled path equals the reference within a stated tolerance, compiled (inductor, float32) against
    eager over three Muon + AdamW steps (Newton-Schulz in float32): each loss to 1e-4 relative, each gradient and
    each weight after the steps to 1e-3 and 1e-4 in norm (||compiled - eager|| / ||eager||: fusions reorder float32
    sums, and the steps carry the differences on); and a compiled run stopped and resumed logs the losses of the
    run trained whole, exactly (both compile the same graphs)."""
    cfg = compose(["experiment=debug", "optim=muon", "optim.muon_ns_dtype=float32"])
    torch.manual_seed(0)
    eager = GPT(cfg.model.gpt(vocab_size=65)).train()
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin)
    opts = [configure_optimizer(m, cfg.optim, CPU) for m in (eager, twin)]
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randint(0, 65, (4, cfg.model.block_size), generator=g)
        y = torch.randint(0, 65, (4, cfg.model.block_size), generator=g)
        losses = []
        for module, opt in zip((eager, compiled), opts):
            loss = module(x, y).loss
            loss.backward()
            losses.append(loss.detach())
        assert torch.allclose(losses[0], losses[1], rtol=1e-4), f"step {step}: loss {losses}"
        for (name, a), b in zip(eager.named_parameters(), twin.parameters()):
            assert off(b.grad, a.grad) < 1e-3, f"step {step}: {name}'s gradient off by {off(b.grad, a.grad):.1e}"
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (name, a), b in zip(eager.named_parameters(), twin.parameters()):
        assert off(b, a) < 1e-4, f"{name} after three steps off by {off(b, a):.1e}"
    real_wrap = train_mod.wrap_model

    def as_a_new_process(*args, **kwargs):  # a resume is a new process: nothing compiled before it
        torch._dynamo.reset()
        return real_wrap(*args, **kwargs)

    monkeypatch.setattr(train_mod, "wrap_model", as_a_new_process)
    whole, resumed = whole_and_resumed(
        ["experiment=debug", f"data.cache_dir={data_cache}", "train.compile=true", "train.max_steps=6",
         "train.eval_interval=3", "train.log_interval=1", "train.sample_tokens=0", "train.head_roles=false",
         "train.tensorboard=false"], 3)
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
    for s in (4, 5, 6):
        assert resumed[s] == whole[s], f"step {s}: resumed {resumed[s]} vs whole {whole[s]}"
