"""train.compile=auto: whether a run's model is compiled by torch.compile (inductor), decided by train.py before the
first step (the model only ever sees a compiled wrapper or none).

Compiling fuses what the matmuls leave around them: GELU, LayerNorm, the residual adds, RoPE and QK-norm, the
autocast casts and the loss over the vocabulary become a few generated loops instead of dozens of passes over
memory. What that buys depends on the CPU, and so does the price, which is paid inside the run's time budget
(docs/benchmarks.md, issue 44): on a 2-core Intel Xeon with AMX the default bf16 step ran 1.23x-1.36x faster after
12-38 s of compiling; on a 2-core AMD EPYC with AVX512-BF16 and no AMX it compiled for 183 s for 1.01x, and on the
debug shape of an EPYC without native bf16 for 62 s. So auto decides per run:

    true or false          as asked, unmeasured
    CUDA                   compiled, unmeasured: the GPU preset's choice (configs/train/gpu.yaml)
    MPS                    not compiled: nothing was ever run on a Mac here
    torchrun on a CPU      not compiled, unmeasured: the measurement would time the processes' collectives
    a CPU without AMX      not compiled, unmeasured: minutes of compiling for a step no faster (above)
    a CPU with AMX-BF16    the run's own training step (its model, optimizer, micro-batch, dtype and attention
                           backend), eager against compiled over a few rounds, the medians compared, and
                           the compile's own seconds (worth_compiling): compiled when the budget left after
                           compiling still trains more tokens than eager would in the whole budget, by more than
                           MARGIN

Both sides take the loss all at once inside the model, as a compiled run does (inductor fuses it; a compiled run's
train.loss_chunk=auto is 0, unmeasured). The measurement takes real optimizer steps on synthetic tokens, then puts
the weights and the optimizer back as they were and leaves the global RNG untouched: a run's numbers never depend
on whether it measured. It is kept
where the other autos keep theirs (attention_lab/runtime/decoding.py kept_seconds: keyed by the CPU, torch, its
flags and the thread count, and here the model's config, the micro-batch, the optimizer and the dtype), so a machine
pays the measurement once per shape; a run that measures counts the time in its budget, and when it compiles,
trains with the wrapper it measured (no second compile). config.json records true or false, never auto.

    measured_step(cfg, optimizer, vocab, device, dtype)  the step timed: the run's own, on fixed random tokens
    time_compile(model, optimizer, step, rounds)   seconds: eager step, compiled step, the compile
    worth_compiling(seconds, budget_s)                   the decision, a pure function of those numbers
    choose_compile(...)                                  the decision and its console line
    settle_compile(cfg, ...)                             what train.py calls: the Config with true or false
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from attention_lab.runtime import distributed
from attention_lab.training.backend import kept_measurement, time_candidates
from attention_lab.training.config import Config
from attention_lab.training.loop import train_step

NAMES = ("eager", "compiled", "compile")  # the measurement: a step of each, and the first compiled step's seconds
MARGIN = 0.05  # compiled only when it trains more than 5% more tokens in the budget, as the other autos' margin


def compiled_for_training(model: nn.Module) -> nn.Module:
    """torch.compile(model), with torch's deterministic algorithms on for the process (warnings only): inductor
    otherwise lowers the embedding's backward on a CPU to a scatter of atomic adds, whose float sums differ from
    run to run, and a resumed run would part from the uninterrupted one in the last bits within a few steps.
    With the flag, that one kernel falls back to eager's (deterministic) one. The flag stays on for the process
    (inductor reads it when it lowers a graph: at the first step, and at any recompile; when auto's measurement
    then decides against compiling, choose_compile puts the flags back as they were); torch's filling of new
    memory, which the flag would also switch on, stays off (it costs every allocation a pass). A model on a GPU
    compiles without the flag: there it would also steer CUDA's own kernels, and nothing was measured on one."""
    if next(model.parameters()).device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
    return torch.compile(model)


def determinism() -> tuple[bool, bool, bool]:
    """torch's deterministic-algorithms flags now: (on, warn only, fill new memory); restore_determinism puts them
    back. A measurement that compiles and then decides against compiling leaves the eager run as it found it."""
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory)


def restore_determinism(flags: tuple[bool, bool, bool]) -> None:
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
    torch.utils.deterministic.fill_uninitialized_memory = flags[2]


def time_compile(model: nn.Module, optimizer, step: Callable[[nn.Module], object], rounds: int = 3,
                 clock: Callable[[], float] = time.perf_counter,
                 compile_fn: Callable[[nn.Module], nn.Module] = compiled_for_training
                 ) -> tuple[dict[str, float], nn.Module]:
    """({"eager": s, "compiled": s, "compile": s}, the compiled wrapper): step(module) is one training step
    (forward, backward, `optimizer`'s step) through `module`, `model` or its compiled wrapper, interleaved over
    `rounds` after one untimed call each (time_candidates); "compile" is the first compiled call's seconds, the
    compile included. The weights, the optimizer's state and the global RNG are as they were before."""
    weights, moments = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    with torch.random.fork_rng(devices=[]):
        compiled = compile_fn(model)
        start = clock()
        step(compiled)
        compile_s = clock() - start
        modules = {"eager": model, "compiled": compiled}
        seconds = time_candidates(lambda name: step(modules[name]), ("eager", "compiled"), rounds, clock)
    model.load_state_dict(weights)
    optimizer.load_state_dict(moments)
    optimizer.zero_grad(set_to_none=True)
    return {**seconds, "compile": compile_s}, compiled


class FixedBatch:
    """A sampler of one batch (x, y), always the same: what the measured step trains on (train_step reads
    next_batch), so the run's own data stream is never touched."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.batch = (x, y)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch


def measured_step(cfg: Config, optimizer, vocab: int, device: torch.device,
                  dtype: torch.dtype) -> Callable[[nn.Module], object]:
    """step(module): one of the run's training steps (loop.train_step: forward, backward, clipping, the optimizer)
    through module on a fixed micro-batch of random tokens (cfg's batch x context), the loss all at once."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        tokens = torch.randint(0, vocab, (cfg.train.batch_size, cfg.model.block_size + 1)).to(device)
    batch = FixedBatch(tokens[:, :-1], tokens[:, 1:])  # (B, T) each: next-token targets
    return lambda module: train_step(module, optimizer, batch, 1, device, dtype, cfg.optim.grad_clip)


def worth_compiling(seconds: dict[str, float], budget_s: float | None, margin: float = MARGIN) -> bool:
    """Whether compiling trains more: with a time budget, (budget - compile) / compiled step > (1 + margin) x
    budget / eager step (the tokens each way trains in the budget); without one, a compiled step faster than
    eager's by more than margin."""
    eager, compiled, compile_s = seconds["eager"], seconds["compiled"], seconds["compile"]
    if budget_s is None:
        return compiled < (1 - margin) * eager
    return (budget_s - compile_s) / compiled > (1 + margin) * budget_s / eager


@dataclass(frozen=True)
class CompileChoice:
    compile: bool
    line: str  # the console line: what auto picked and why ("" when the run asked for true or false)
    seconds: float = 0.0  # the wall time of a measurement made now (0: kept, or nothing measured)
    compiled: nn.Module | None = None  # the wrapper the measurement compiled, when it is the one to train with


def compile_key(cfg: Config, dtype: torch.dtype) -> str:
    """The measurement's key beyond the machine (decoding.measurement_key adds the CPU, torch, its flags and the
    thread count): the model's config, the micro-batch, the optimizer and the dtype."""
    shape = {"model": dataclasses.asdict(cfg.model), "batch": cfg.train.batch_size, "optim": cfg.optim.name,
             "muon_ns_steps": cfg.optim.muon_ns_steps, "dtype": str(dtype).removeprefix("torch.")}
    return "compile " + json.dumps(shape, sort_keys=True, default=str)


def unmeasured(cfg: Config, device: torch.device, info: distributed.DistInfo) -> CompileChoice | None:
    """auto's choice where nothing is measured (module docstring), or None where the step is to be timed."""
    if device.type == "cuda":
        return CompileChoice(True, "compile: yes (train.compile=auto on cuda: nothing measured)")
    if device.type != "cpu":
        return CompileChoice(False, f"compile: no (train.compile=auto on {device.type}: never tried there)")
    if info.enabled:
        return CompileChoice(False, "compile: no (train.compile=auto under torchrun on a CPU: nothing measured)")
    if not torch.cpu.get_capabilities().get("amx_bf16"):
        return CompileChoice(False, "compile: no (train.compile=auto on a CPU without AMX-BF16: compiling took "
                                    "minutes for a step no faster on the CPUs measured; docs/benchmarks.md)")
    return None


def choose_compile(cfg: Config, model: nn.Module, optimizer, step: Callable[[nn.Module], object],
                   device: torch.device, dtype: torch.dtype, info: distributed.DistInfo,
                   measure: Callable[..., tuple[dict[str, float], nn.Module | None]] | None = None) -> CompileChoice:
    """auto's train.compile for this run (module docstring). measure(model, optimizer, step) -> (seconds, the
    compiled wrapper): time_compile unless given (tests pass stubs)."""
    asked = cfg.train.compile
    if asked != "auto":
        return CompileChoice(bool(asked), "")
    fixed = unmeasured(cfg, device, info)
    if fixed is not None:
        return fixed
    wrapper: list[nn.Module | None] = [None]
    flags = determinism()  # compiled_for_training turns them on; an eager run must not keep them

    def timed() -> dict[str, float]:
        seconds, wrapper[0] = (measure or time_compile)(model, optimizer, step)
        return seconds

    seconds, spent, where = kept_measurement(compile_key(cfg, dtype), NAMES, timed)
    budget = None if cfg.train.max_minutes is None else 60 * cfg.train.max_minutes
    picked = worth_compiling(seconds, budget)
    if not picked:
        restore_determinism(flags)
    return CompileChoice(picked, (
        f"compile: auto {'compiles' if picked else 'does not compile'} the model: a training step at batch "
        f"{cfg.train.batch_size} x {cfg.model.block_size} tokens, {str(dtype).removeprefix('torch.')}: eager "
        f"{seconds['eager'] * 1e3:.0f} ms, compiled {seconds['compiled'] * 1e3:.0f} ms after "
        f"{seconds['compile']:.0f} s of compiling"
        + (f", paid inside the {cfg.train.max_minutes:g}-minute budget" if budget is not None else "")
        + f" (compiling must train {MARGIN:.0%} more tokens to be picked); {where}"),
        spent, wrapper[0] if picked else None)


def settle_compile(cfg: Config, model: nn.Module, optimizer, step: Callable[[nn.Module], object],
                   device: torch.device, dtype: torch.dtype, info: distributed.DistInfo,
                   say=print) -> tuple[Config, nn.Module | None, float]:
    """cfg with train.compile true or false: as asked, or auto's choice (its line said). Returns (the Config, the
    wrapper the measurement compiled when it is the one to train with, the seconds a measurement took now:
    counted in the budget). step(module): one training step through module, its loss as a compiled run takes
    it (all at once, inside the model: train.loss_chunk=auto then picks 0, loss_chunk.py)."""
    if cfg.train.compile != "auto":
        return cfg, None, 0.0
    choice = choose_compile(cfg, model, optimizer, step, device, dtype, info)
    say(choice.line)
    return (dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile=choice.compile)), choice.compiled,
            choice.seconds)
