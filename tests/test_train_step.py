"""The training step's less travelled paths: gradient accumulation, the float16 GradScaler, torch.compile.

Each test names the planted bug it catches (tests/mutations.py plants them). The step is checked against a
plain reference, not against itself: accumulation against one big batch, float16 against float32.
"""

from __future__ import annotations

import json

import pytest
import torch

import train as train_mod
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.config import compose
from model import GPT, GPTConfig

CPU = torch.device("cpu")


class FixedBatches:
    """A sampler stand-in that hands out the given (x, y) batches in order."""

    def __init__(self, batches):
        self.batches = list(batches)

    def next_batch(self):
        return self.batches.pop(0)


def tiny(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))


def batch(n: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(64, (n, 16), generator=gen), torch.randint(64, (n, 16), generator=gen)


def step_with(model: GPT, batches, grad_accum: int, dtype=torch.float32, scaler=None, grad_clip: float = 0.0,
              loss_chunk: int = 0):
    """One train_step with SGD at lr 1, so each parameter moves by exactly minus its (clipped) gradient."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loss, norm = train_mod.train_step(model, opt, FixedBatches(batches), grad_accum, CPU, dtype, grad_clip, scaler,
                                      loss_chunk)
    moves = {n: p.detach() - before[n] for n, p in model.named_parameters()}
    return loss, norm, moves


@pytest.mark.parametrize("grad_clip", [0.0, 0.5])
def test_grad_accum_equals_one_big_batch(grad_clip):
    """Planted bugs: micro-batch losses not divided by grad_accum (gradients grow with it); the reported loss is
    the last micro-batch's instead of their mean. 2 micro-batches of 4 == 1 batch of 8: loss, norm and update."""
    x, y = batch(8)
    big = step_with(tiny(), [(x, y)], 1, grad_clip=grad_clip)
    acc = step_with(tiny(), [(x[:4], y[:4]), (x[4:], y[4:])], 2, grad_clip=grad_clip)
    assert acc[0] == pytest.approx(big[0], rel=1e-6), f"mean loss: accumulated {acc[0]} vs one batch {big[0]}"
    assert acc[1] == pytest.approx(big[1], rel=1e-5), f"gradient norm: accumulated {acc[1]} vs one batch {big[1]}"
    for name, move in big[2].items():
        torch.testing.assert_close(acc[2][name], move, atol=1e-6, rtol=1e-4,
                                   msg=lambda m: f"{name}: the accumulated update differs from one batch's: {m}")


def test_float16_with_grad_scaler_matches_float32():
    """Planted bugs: gradients not unscaled before clipping (the norm and the clip see 65536x gradients); the
    loss not scaled before backward (the unscale then shrinks every gradient 65536x)."""
    x, y = batch(8)
    ref = step_with(tiny(), [(x, y)], 1, grad_clip=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    half = step_with(tiny(), [(x, y)], 1, dtype=torch.float16, scaler=scaler, grad_clip=1.0)
    assert half[0] == pytest.approx(ref[0], rel=1e-2), f"float16 loss {half[0]} vs float32 {ref[0]}"
    assert half[1] == pytest.approx(ref[1], rel=2e-2), \
        f"float16 gradient norm {half[1]} vs float32 {ref[1]}: are the gradients unscaled before clipping?"
    for name, move in ref[2].items():
        # float16 matmuls: about 3 significant digits
        torch.testing.assert_close(half[2][name], move, atol=2e-3 * move.abs().max().item() + 1e-6, rtol=5e-2,
                                   msg=lambda m: f"{name}: the float16 + GradScaler update differs: {m}")
    assert scaler.get_scale() == 2.0 ** 16, "a finite step must keep the scale"


def test_grad_scaler_skips_a_step_whose_gradients_overflow():
    """Planted bug: optimizer.step() instead of scaler.step() (an overflowing step then writes inf/nan into the
    weights instead of being skipped). A scale of 2^60 makes float16's backward overflow."""
    x, y = batch(4)
    model = tiny()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 60)
    _, norm, moves = step_with(model, [(x, y)], 1, dtype=torch.float16, scaler=scaler, grad_clip=1.0)
    assert not torch.isfinite(torch.tensor(norm)), f"the overflow did not happen (norm {norm}); raise init_scale"
    for name, move in moves.items():
        assert torch.equal(move, torch.zeros_like(move)), f"{name} changed on a step the scaler should skip"
    assert scaler.get_scale() == 2.0 ** 59, "the scaler halves its scale after an overflow"
    assert all(p.grad is None for p in model.parameters()), "gradients must be cleared after the step"


def _losses(run):
    return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}


def test_train_dtype_float16_runs_every_step_through_a_grad_scaler(tmp_path, data_cache, monkeypatch):
    """Planted bug: the trainer builds no GradScaler for float16. The scaler's own step is counted."""
    steps = []

    class CountingScaler(torch.amp.GradScaler):
        def step(self, optimizer, *args, **kwargs):
            steps.append(type(optimizer).__name__)
            return super().step(optimizer, *args, **kwargs)

    monkeypatch.setattr(torch.amp, "GradScaler", CountingScaler)
    common = ["experiment=debug", f"data.cache_dir={data_cache}", "train.max_steps=4", "train.eval_interval=4",
              "train.log_interval=1", "train.sample_tokens=0", "train.head_roles=false", "train.tensorboard=false"]
    train_mod.train(compose(common + ["train.dtype=float32"]), tmp_path / "fp32")
    assert steps == [], "float32 needs no GradScaler"
    train_mod.train(compose(common + ["train.dtype=float16"]), tmp_path / "fp16")
    assert len(steps) == 4, f"float16: the GradScaler stepped {len(steps)} times in 4 steps"
    a, b = _losses(tmp_path / "fp32"), _losses(tmp_path / "fp16")
    assert sorted(b) == [1, 2, 3, 4]
    for s in a:
        assert b[s] == pytest.approx(a[s], rel=1e-2), f"step {s}: float16 loss {b[s]} vs float32 {a[s]}"


def test_compile_trains_the_same_numbers_and_saves_the_plain_module(tmp_path, data_cache, monkeypatch):
    """Planted bug: the checkpoint saved from the compiled wrapper (keys prefixed `_orig_mod.`), or train.compile
    ignored. Inductor takes over 30 s to compile on 2 CPU cores, so torch.compile runs with the `eager` backend:
    the same Dynamo capture and wrapper, without code generation."""
    real_compile = torch.compile
    compiled = []

    def eager_compile(model, *args, **kwargs):
        compiled.append(type(model).__name__)
        return real_compile(model, backend="eager")

    monkeypatch.setattr(torch, "compile", eager_compile)
    common = ["experiment=debug", f"data.cache_dir={data_cache}", "train.max_steps=4", "train.eval_interval=2",
              "train.log_interval=1", "train.sample_tokens=0", "train.head_roles=false", "train.tensorboard=false"]
    train_mod.train(compose(common), tmp_path / "plain")
    assert compiled == [], "train.compile=false must not compile"
    train_mod.train(compose(common + ["train.compile=true"]), tmp_path / "compiled")
    assert compiled == ["GPT"], f"train.compile=true must compile the model once, compiled {compiled}"
    a, b = _losses(tmp_path / "plain"), _losses(tmp_path / "compiled")
    assert sorted(b) == [1, 2, 3, 4]
    for s in a:
        assert b[s] == pytest.approx(a[s], rel=1e-5), f"step {s}: compiled loss {b[s]} vs plain {a[s]}"
    ckpt = load_checkpoint(tmp_path / "compiled", "latest")
    keys = list(ckpt.build_model().state_dict())
    assert not any(k.startswith("_orig_mod.") for k in keys), f"wrapper prefixes in the checkpoint: {keys[:3]}"
    # and the compiled run's checkpoint resumes without compile
    final = train_mod.train(compose(common[:2] + ["train.max_steps=6"] + common[3:]), tmp_path / "compiled")
    assert final["step"] == 6


def test_mfu_divides_by_the_matmul_peak_of_the_runs_own_dtype_measured_once_then_kept(tmp_path, data_cache,
                                                                                    monkeypatch):
    """A bf16 run's MFU is measured against the bf16 matmul peak (2-8x the float32 one on CPUs with AVX512-BF16
    or AMX), not against float32's, which would overstate it by that factor. The peak is measured by the first run
    and kept: the next run (a fresh process) reads it; a run in another dtype measures its own; a peak the config
    gives is taken as it is. provenance.json says which."""
    from attention_lab.runtime import decoding, flops

    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path / "cache"))
    decoding.forget_measurements()
    asked = []

    def rates(device, dtype, **kw):  # FLOP/s per matmul size: the best is 2048's
        asked.append(dtype)
        peak = {torch.float32: 1e11, torch.bfloat16: 4e11}[dtype]
        return {n: [peak / 4, peak if n == 2048 else peak / 2] for n in flops.CPU_SIZES}

    monkeypatch.setattr(flops, "matmul_rates", rates)
    common = ["experiment=debug", f"data.cache_dir={data_cache}", "train.peak_flops=null", "train.max_steps=2",
              "train.eval_interval=2", "train.log_interval=1", "train.sample_tokens=0", "train.head_roles=false",
              "train.film=false"]

    def provenance(name: str, *more: str) -> dict:
        decoding.forget_measurements()  # each run a new process: what it knows comes from the file
        train_mod.train(compose([*common, *more]), tmp_path / name)
        return json.loads((tmp_path / name / "provenance.json").read_text())

    first = provenance("bf16", "train.dtype=bfloat16")
    assert asked == [torch.bfloat16], f"the peak was measured in {asked}, the run computes in bfloat16"
    assert first["peak_flops"] == pytest.approx(4e11) and first["peak_dtype"] == "bfloat16", first
    assert first["peak_source"] == "measured"
    again = provenance("bf16_again", "train.dtype=bfloat16")
    assert asked == [torch.bfloat16], "the second run read the kept peak instead of measuring again"
    assert again["peak_flops"] == pytest.approx(4e11) and again["peak_source"] == "kept", again
    other = provenance("fp32", "train.dtype=float32")
    assert asked == [torch.bfloat16, torch.float32], "float32's peak is its own measurement, not bf16's kept one"
    assert other["peak_flops"] == pytest.approx(1e11) and other["peak_source"] == "measured", other
    given = provenance("given", "train.dtype=bfloat16", "train.peak_flops=7e11")
    assert given["peak_flops"] == 7e11 and given["peak_source"] == "config" and len(asked) == 2, given


def test_the_kept_peak_is_the_best_sizes_rate_and_a_gpus_is_measured_in_each_process(tmp_path, monkeypatch):
    from attention_lab.runtime import decoding, flops

    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path / "cache"))
    decoding.forget_measurements()
    calls = []

    def rates(device, dtype, **kw):
        calls.append(torch.device(device).type)
        return {512: [3e9, 1e9], 1024: [2e9, 6e9], 2048: [5e9]} if calls[-1] == "cpu" else {4096: [8e12], 8192: [9e12]}

    peak, measured = flops.kept_peak_flops("cpu", torch.float32, rates)
    assert peak == pytest.approx(6e9) and measured, "the best sample of the best size"
    stored = json.loads(decoding.cache_file().read_text())["entries"]
    assert any(e["key"]["model"] == str(("matmul peak", "float32")) for e in stored), stored
    decoding.forget_measurements()
    assert flops.kept_peak_flops("cpu", torch.float32, rates) == (pytest.approx(6e9), False) and calls == ["cpu"]
    assert flops.kept_peak_flops("cuda:0", torch.bfloat16, rates) == (9e12, True)
    assert flops.kept_peak_flops("cuda:0", torch.bfloat16, rates) == (9e12, False), "once per process"
    monkeypatch.setattr(flops, "_GPU_PEAKS", {})  # a new process
    assert flops.kept_peak_flops("cuda:0", torch.bfloat16, rates)[1] and calls == ["cpu", "cuda", "cuda"]


def test_a_peak_kept_from_a_busy_moment_is_mended_by_a_faster_measurement_and_never_lowered(tmp_path, monkeypatch):
    """The peak is a best-of: the trainer's kept peak, first measured while the machine was busy (too low: every
    later run's MFU too high), is raised size by size by a later full measurement (bench/peak.py's,
    flops.keep_better_peak), in this process and the next; a slower measurement lowers nothing; a measurement of
    other sizes (bench --quick) or on a GPU keeps nothing."""
    from attention_lab.runtime import decoding, flops

    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path / "cache"))
    decoding.forget_measurements()
    busy = {512: [1e9], 1024: [2e9], 2048: [3e9]}
    assert flops.kept_peak_flops("cpu", torch.float32, lambda d, t: busy) == (pytest.approx(3e9), True)
    idle = {512: [5e9, 1e9], 1024: [4e9], 2048: [2e9]}  # 512 and 1024 faster now, 2048 slower
    assert flops.keep_better_peak("cpu", torch.float32, idle) == (pytest.approx(3e9), pytest.approx(5e9))
    decoding.forget_measurements()  # a new process reads the file
    never = lambda d, t: pytest.fail("a kept peak is not measured again")  # noqa: E731
    assert flops.kept_peak_flops("cpu", torch.float32, never) == (pytest.approx(5e9), False)
    kept = json.loads(decoding.cache_file().read_text())["entries"]
    (seconds,) = [e["seconds"] for e in kept if e["key"]["model"] == str(("matmul peak", "float32"))]
    assert seconds == pytest.approx({"512": 2 * 512**3 / 5e9, "1024": 2 * 1024**3 / 4e9, "2048": 2 * 2048**3 / 3e9})
    slower = {512: [1e9], 1024: [1e9], 2048: [1e9]}
    assert flops.keep_better_peak("cpu", torch.float32, slower) == (pytest.approx(5e9), pytest.approx(5e9))
    assert flops.kept_peak_flops("cpu", torch.float32, never)[0] == pytest.approx(5e9)
    assert flops.keep_better_peak("cpu", torch.bfloat16, idle) == (0.0, pytest.approx(5e9)), "bf16 keeps its own"
    assert flops.kept_peak_flops("cpu", torch.float32, never)[0] == pytest.approx(5e9), "float32's is untouched"
    assert flops.keep_better_peak("cpu", torch.float32, {256: [9e9, 9e9]}) is None, "bench --quick's sizes"
    assert flops.keep_better_peak("cuda:0", torch.float32, idle) is None, "a GPU's peak is never kept"
    assert flops.kept_peak_flops("cpu", torch.float32, never)[0] == pytest.approx(5e9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_the_chunked_loss_step_equals_the_plain_step(dtype, grad_accum):
    """train.loss_chunk: the loss a block of positions at a time gives the plain step's loss, gradient norm and
    update (float32: to rounding; bf16 autocast: both sides' bf16 logits are the same, the loss is reduced in
    float32 on both, and the bf16 gradient of the logits may differ by one rounding step)."""
    x, y = batch(8)
    y[0, :3] = -1  # ignored targets, as a masked claim gives
    micro = [(x, y)] if grad_accum == 1 else [(x[:4], y[:4]), (x[4:], y[4:])]
    plain = step_with(tiny(), micro, grad_accum, dtype=dtype, grad_clip=1.0)
    chunked = step_with(tiny(), list(micro), grad_accum, dtype=dtype, grad_clip=1.0, loss_chunk=5)
    exact = dtype == torch.float32
    assert chunked[0] == pytest.approx(plain[0], rel=1e-6 if exact else 1e-4)
    assert chunked[1] == pytest.approx(plain[1], rel=1e-5 if exact else 1e-2)
    for name, move in plain[2].items():
        tol = 1e-6 if exact else 2e-2 * move.abs().max().item() + 1e-6
        torch.testing.assert_close(chunked[2][name], move, atol=tol, rtol=1e-4 if exact else 5e-2,
                                   msg=lambda m: f"{name}: the chunked loss's update differs: {m}")


def test_a_debug_run_with_the_chunked_loss_resumes_exactly(whole_and_resumed, data_cache, chunks_taken):
    """train.loss_chunk on: the trainer computes its loss that way, and a run stopped at step 6 and resumed logs
    the uninterrupted run's losses."""
    chunks = chunks_taken
    overrides = ["experiment=debug", f"data.cache_dir={data_cache}", "train.loss_chunk=37", "train.max_steps=12",
                 "optim.schedule=wsd", "optim.decay_steps=6", "train.log_interval=1", "train.head_roles=false",
                 "train.sample_tokens=0"]
    a, b = whole_and_resumed(overrides, stop_at=6)
    assert sorted(a) == list(range(1, 13)) and [a[s] for s in range(7, 13)] == [b[s] for s in range(7, 13)]
    assert chunks and set(chunks) == {37}, "train.loss_chunk=37 did not reach the training step"
