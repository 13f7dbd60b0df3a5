"""model.attn_backend=auto: which of the model's two attention backends a run trains with, decided by train.py
before the model is built (model/ only ever sees sdpa or math).

Both backends compute the same function (tests/test_model_invariants.py): sdpa is torch's fused kernel, math the
explicit softmax(mask(Q K^T / sqrt(d_k))) V. Their speed differs by machine and dtype: on a 2-core AMD EPYC with
AVX512-BF16 and no AMX, a whole training step was 1.09x-1.32x faster with math under bf16 autocast and 0.85x-0.88x
as fast in float32 (docs/benchmarks.md, issue 44). So auto decides per run:

    a resumed run          the backend its checkpoint recorded, unmeasured: a run goes on as it began
    nothing to choose for  sdpa, unmeasured: an LSTM, linear attention, causal_mask=after_softmax (math either
                           way), a learner's attention (model.attn_impl), GPT-2 weights (train.init_from)
    CUDA, MPS              sdpa, unmeasured: the fused kernels are what a GPU is for
    a CPU                  one attention layer's forward + backward at the run's shape (micro-batch, context,
                           heads, head size) under the run's dtype, each backend in turn over a few rounds, the
                           medians compared (time_attention); math only when it is faster than sdpa by more than
                           MARGIN (faster_backend): sdpa is the reference, kept on a tie

The CPU's measurement is kept where dtype auto's decoding measurement is (attention_lab/runtime/decoding.py
kept_seconds: one JSON file, keyed by the CPU, torch, its bf16/AMX flags and the thread count, and here by the
dtype and the layer's shape), so a machine pays it once per shape (a dozen forward and backward passes of one layer).
Its time is counted in the run's time budget, like any other work of the run (train.py run_loop). The run's
config.json and every checkpoint record the backend picked, never auto, so sample.py, evaluation and a resume
build the concrete one.

    time_attention(cfg, batch, device, dtype)   seconds per layer step, by backend (interleaved, medians)
    faster_backend(seconds)                      the decision, a pure function of those numbers
    choose_backend(...)                          the choice and its console line (measured, stored or unmeasured)
    settle_attn_backend(cfg, ...)                what train.py calls: the Config with a concrete backend
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from attention_lab.runtime import decoding, distributed
from attention_lab.runtime.device import autocast
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.config import Config
from attention_lab.training.start import resume_source
from model import ATTENTION_BACKENDS, CausalSelfAttention, GPTConfig
from model.positions import build_positional_encoding

BACKENDS = ("sdpa", "math")  # sdpa first: the reference, timed first in each round
# math must beat sdpa by this fraction of sdpa's time to be chosen: a tie, or a difference inside the noise of
# shared cores, keeps the fused kernel (the same margin as decoding's dtype auto)
MARGIN = 0.05
# rounds of the one-layer timing: on a 2-core AMD EPYC with AVX512-BF16 the layer's time moved by a third from
# round to round, and 5 rounds picked sdpa in 2 of 9 fresh processes where the whole step was 1.09x faster with
# math (the 8-minute runs' tokens/s: 1.11x-1.20x) (15 rounds: math in 8 of 8; about 1 s, once per machine and shape;
# docs/benchmarks.md, issue 44)
ROUNDS = 15


def time_candidates(run: Callable[[str], object], names: tuple[str, ...] = BACKENDS, rounds: int = 5,
                    clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per run(name): one untimed call each first (allocations, kernel choice), then `rounds` rounds that
    take the names in turn (A, B, A, B, ...), so a neighbour's load falls on both alike; the median of each."""
    for name in names:
        run(name)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            start = clock()
            run(name)
            seconds[name].append(clock() - start)
    return {name: statistics.median(times) for name, times in seconds.items()}


def time_attention(cfg: GPTConfig, batch: int, device: torch.device, dtype: torch.dtype, rounds: int = ROUNDS,
                   clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per forward + backward of one attention layer (CausalSelfAttention, cfg's first layer, in training
    mode) on a (batch, block_size, n_embd) input under the dtype's autocast, per backend; the two layers share
    their weights. The global RNG is left as it was: the run's initial weights and data order must not depend on
    whether a measurement ran."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layers = {name: CausalSelfAttention(dataclasses.replace(cfg, attn_backend=name)).to(device).train()
                  for name in BACKENDS}
        layers["math"].load_state_dict(layers["sdpa"].state_dict())
        pe = build_positional_encoding(cfg).to(device)
        pos = torch.arange(cfg.block_size, device=device)
        rotation = pe.rotation(pos)  # RoPE's tables, once per forward pass as in the model (None otherwise)
        x = torch.randn(batch, cfg.block_size, cfg.n_embd, device=device, requires_grad=True)  # (B, T, C)

        def step(name: str) -> None:
            layer = layers[name]
            with autocast(device, dtype):
                y = layer(x, pe, rotation, pos)[0]  # (B, T, C)
            y.float().sum().backward()  # the loss is taken in float32, as the model's is
            layer.zero_grad(set_to_none=True)
            x.grad = None

        return time_candidates(step, BACKENDS, rounds, clock)


def kept_measurement(key: str, names: tuple[str, ...], measure: Callable[[], dict[str, float]]
                     ) -> tuple[dict[str, float], float, str]:
    """A training setting's measurement, kept for this machine (decoding.kept_seconds): (seconds by name, the wall
    time spent measuring now, for the run's budget: 0 when it was kept, and the console line's words for where it
    came from)."""
    start = time.perf_counter()
    seconds, measured = decoding.kept_seconds(key, names, measure)
    spent = time.perf_counter() - start if measured else 0.0
    where = (f"measured now in {spent:.1f} s, counted in the run's time; kept in {decoding.cache_file()}" if measured
             else f"as measured before on this machine, kept in {decoding.cache_file()}")
    return seconds, spent, where


def faster_backend(seconds: dict[str, float], margin: float = MARGIN) -> str:
    """math when its time is under (1 - margin) of sdpa's; sdpa otherwise."""
    return "math" if seconds["math"] < (1 - margin) * seconds["sdpa"] else "sdpa"


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # sdpa or math
    line: str  # the console line: what auto picked and why
    seconds: float = 0.0  # the wall time of a measurement made now (0: stored, or nothing measured)


def nothing_to_time(cfg: Config) -> str | None:
    """Why this run's attention has no backend to choose (a phrase), or None when there is one."""
    m = cfg.model
    if m.arch != "gpt":
        return f"model.arch={m.arch} has no attention"
    if m.attn_impl:
        return "your attention (model.attn_impl) replaces both backends"
    if m.attention == "linear":
        return "linear attention has no softmax to compute either way"
    if m.causal_mask == "after_softmax":
        return "causal_mask=after_softmax runs the math path with either"
    if cfg.train.init_from:
        return "GPT-2 weights (train.init_from) are loaded with sdpa"
    return None


def layer_key(cfg: GPTConfig, batch: int, dtype: torch.dtype) -> str:
    """The measurement's key beyond the machine: the dtype and everything the first layer's attention step
    depends on (decoding.measurement_key adds the CPU, torch, its flags and the thread count)."""
    fields = ("block_size", "n_embd", "n_head", "n_kv_head", "bias", "pos_encoding", "qk_norm", "dropout",
              "attn_sinks", "attention", "attn_scale", "causal_mask", "qk_tied", "attend_self")
    shape = {f: getattr(cfg, f) for f in fields} | {"window": cfg.layer_window(0), "batch": batch,
                                                   "dtype": str(dtype).removeprefix("torch."),
                                                   "rounds": ROUNDS}  # a choice kept from fewer rounds is made again
    return "attention backend " + json.dumps(shape, sort_keys=True)


def choose_backend(cfg: Config, device: torch.device, dtype: torch.dtype, recorded: str | None = None,
                   measure: Callable[..., dict[str, float]] | None = None) -> BackendChoice:
    """auto's backend for this run (module docstring). recorded: the backend the checkpoint a run resumes from
    was trained with (None: a fresh run). measure(cfg, batch, device, dtype) -> {backend: seconds}: time_attention
    unless given (tests pass stubs)."""
    if recorded in ATTENTION_BACKENDS:
        return BackendChoice(recorded, f"attention: {recorded}, as this run's checkpoint recorded it "
                                       "(model.attn_backend=auto measures when a run starts, not when it resumes)")
    why = nothing_to_time(cfg)
    if why is not None:
        return BackendChoice("sdpa", f"attention: sdpa (model.attn_backend=auto: {why}; nothing measured)")
    if device.type != "cpu":
        return BackendChoice("sdpa", f"attention: sdpa (model.attn_backend=auto on {device.type}: the fused kernel, "
                                     "nothing measured)")
    layer, batch = cfg.model.gpt(), cfg.train.batch_size
    seconds, spent, where = kept_measurement(layer_key(layer, batch, dtype), BACKENDS,
                                             lambda: (measure or time_attention)(layer, batch, device, dtype))
    picked = faster_backend(seconds)
    return BackendChoice(picked, (
        f"attention: auto picked {picked}: one layer's forward+backward at batch {batch} x {layer.block_size} "
        f"tokens, {layer.n_head} heads x {layer.head_size}, {str(dtype).removeprefix('torch.')}: "
        f"sdpa {seconds['sdpa'] * 1e3:.1f} ms, math {seconds['math'] * 1e3:.1f} ms (math must be "
        f"{MARGIN:.0%} faster to be picked); {where}"), spent)


def recorded_backend(cfg: Config, run_dir: Path) -> str | None:
    """The backend the checkpoint this run resumes from recorded; None for a fresh start."""
    source = resume_source(cfg, run_dir)
    if source is None:
        return None
    return getattr(load_checkpoint(source, which="latest").config, "attn_backend", None)  # an LSTM's has none


def settle_attn_backend(cfg: Config, run_dir: Path, device: torch.device, dtype: torch.dtype,
                        info: distributed.DistInfo, say=print) -> tuple[Config, float]:
    """cfg with model.attn_backend sdpa or math: as asked, or auto's choice (choose_backend, its line said), made
    by the main process and taken by every other (under torchrun they would otherwise time each other's load).
    Returns (the Config, the seconds a measurement took now: the run counts them in its time budget)."""
    if cfg.model.attn_backend != "auto":
        return cfg, 0.0
    choice = None
    if info.is_main:
        choice = choose_backend(cfg, device, dtype, recorded_backend(cfg, run_dir))
    choice = distributed.same_on_all(choice, info)
    say(choice.line)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attn_backend=choice.backend)), choice.seconds
