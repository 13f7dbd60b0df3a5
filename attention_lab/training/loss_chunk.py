"""train.loss_chunk=auto: whether a run takes its loss all at once or a block of positions at a time, decided by
train.py from a measurement before the first step (the model only ever sees a number).

Both ways give the same loss and gradient (model.gpt.chunked_next_token_loss; tests/test_chunked_loss.py): the
plain loss casts all B*T x V logits to float32 and keeps their log-softmax, the chunked one casts CHUNK rows at
a time and recomputes their softmax in the backward pass. Which is faster depends on the machine: on a 2-core
slice of an Intel Xeon with AMX, 256 rows at a time made the whole bf16 step 1.12x faster and the float32 step
1.03x; on a 2-core AMD EPYC with AVX512-BF16 it was 0.99x in bf16, on an EPYC without native bf16 0.96x in
float32 (docs/benchmarks.md, issue 44). So auto decides per run:

    a number               that number (0: all at once), unmeasured
    CUDA, MPS              0, unmeasured: nothing was measured there
    a compiled run         0, unmeasured: inductor fuses the loss into the compiled model (the compiled step with
                           the loss whole was 1.05x the compiled step with it chunked, 2-core AMX Xeon, issue 44)
    a CPU                  the output layer's matmul and the loss, forward and backward, at the run's micro-batch,
                           context, width and vocabulary under the run's dtype, each way in turn over a few rounds,
                           the medians compared (time_loss); chunks only when that is faster by more than MARGIN
                           (faster_chunk): all at once is the reference, kept on a tie

The measurement is kept where model.attn_backend=auto keeps its own (attention_lab/runtime/decoding.py
kept_seconds: keyed by the CPU, torch, its bf16/AMX flags, the thread count, and here the dtype and the shape), so
a machine pays it once per shape; its time is counted in the run's budget. A resumed run on the same machine
reads the same kept measurement, so it takes its loss the same way; config.json records the number picked.

    time_loss(rows, n_embd, vocab, device, dtype)   seconds per output layer + loss step, by way (medians)
    faster_chunk(seconds)                            the decision, a pure function of those numbers
    choose_loss_chunk(cfg, device, dtype)            the number and its console line
    settle_loss_chunk(cfg, ...)                      what train.py calls: the Config with a number
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attention_lab.runtime import distributed
from attention_lab.runtime.device import autocast
from attention_lab.training.backend import kept_measurement, time_candidates
from attention_lab.training.config import Config
from model.gpt import chunked_next_token_loss, next_token_loss

CHUNK = 256  # rows a block when auto chunks: the size measured in docs/benchmarks.md
WAYS = ("whole", "chunked")  # whole first: the reference, timed first in each round
MARGIN = 0.05  # chunks only when more than 5% faster, as the attention backend's and decoding's autos


def time_loss(rows: int, n_embd: int, vocab: int, device: torch.device, dtype: torch.dtype, rounds: int = 5,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per forward + backward of the output layer and the loss over `rows` positions (the run's micro-batch
    times its context), by way: all at once (next_token_loss, as model(x, y).loss) and CHUNK rows at a time.
    The global RNG is left as it was: a run's weights and data must not depend on whether this ran."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = torch.nn.Linear(n_embd, vocab, bias=False).to(device)
        x = torch.randn(1, rows, n_embd, device=device, requires_grad=True)  # (1, rows, C): the final hidden states
        y = torch.randint(0, vocab, (1, rows), device=device)

        def step(way: str) -> None:
            with autocast(device, dtype):
                logits = head(x)  # (1, rows, V)
                loss = next_token_loss(logits, y) if way == "whole" else chunked_next_token_loss(logits, y, CHUNK)
            loss.backward()
            head.zero_grad(set_to_none=True)
            x.grad = None

        return time_candidates(step, WAYS, rounds, clock)


def faster_chunk(seconds: dict[str, float], margin: float = MARGIN) -> int:
    """CHUNK when the chunked way's time is under (1 - margin) of the whole way's; 0 (all at once) otherwise."""
    return CHUNK if seconds["chunked"] < (1 - margin) * seconds["whole"] else 0


@dataclass(frozen=True)
class ChunkChoice:
    rows: int  # train.loss_chunk: 0 (all at once) or rows a block
    line: str  # the console line: what auto picked and why ("" when the run named a number)
    seconds: float = 0.0  # the wall time of a measurement made now (0: stored, or nothing measured)


def loss_key(rows: int, n_embd: int, vocab: int, dtype: torch.dtype) -> str:
    """The measurement's key beyond the machine (decoding.measurement_key adds the CPU, torch, flags, threads)."""
    shape = {"rows": rows, "n_embd": n_embd, "vocab": vocab, "chunk": CHUNK, "dtype": str(dtype).removeprefix("torch.")}
    return "loss chunk " + json.dumps(shape, sort_keys=True)


def choose_loss_chunk(cfg: Config, n_embd: int, block_size: int, vocab: int, device: torch.device,
                      dtype: torch.dtype, measure: Callable[..., dict[str, float]] | None = None) -> ChunkChoice:
    """auto's train.loss_chunk for this run (module docstring). measure(rows, n_embd, vocab, device, dtype) ->
    {way: seconds}: time_loss unless given (tests pass stubs)."""
    asked = cfg.train.loss_chunk
    if asked != "auto":
        return ChunkChoice(int(asked), "")
    if device.type != "cpu":
        return ChunkChoice(0, f"loss: all at once (train.loss_chunk=auto on {device.type}: nothing measured)")
    if cfg.train.compile is True:
        return ChunkChoice(0, "loss: all at once, inside the compiled model (train.loss_chunk=auto with "
                              "train.compile: inductor fuses it; nothing measured)")
    rows = cfg.train.batch_size * block_size
    seconds, spent, where = kept_measurement(loss_key(rows, n_embd, vocab, dtype), WAYS,
                                             lambda: (measure or time_loss)(rows, n_embd, vocab, device, dtype))
    picked = faster_chunk(seconds)
    return ChunkChoice(picked, (
        f"loss: auto picked {f'{picked} rows at a time' if picked else 'all at once'}: the output layer and the loss, "
        f"forward+backward over {rows} positions x {vocab} logits, {str(dtype).removeprefix('torch.')}: all at once "
        f"{seconds['whole'] * 1e3:.1f} ms, {CHUNK} rows at a time {seconds['chunked'] * 1e3:.1f} ms (chunks must be "
        f"{MARGIN:.0%} faster to be picked); {where}"), spent)


def settle_loss_chunk(cfg: Config, n_embd: int, block_size: int, vocab: int, device: torch.device,
                      dtype: torch.dtype, info: distributed.DistInfo, say=print) -> tuple[Config, float]:
    """cfg with train.loss_chunk a number: as asked, or auto's choice (its line said), made by the main process and
    taken by every other. Returns (the Config, the seconds a measurement took now, counted in the budget)."""
    if cfg.train.loss_chunk != "auto":
        return cfg, 0.0
    choice = choose_loss_chunk(cfg, n_embd, block_size, vocab, device, dtype) if info.is_main else None
    choice = distributed.same_on_all(choice, info)
    say(choice.line)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, loss_chunk=choice.rows)), choice.seconds
