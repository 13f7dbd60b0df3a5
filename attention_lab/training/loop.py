"""The training loop's small parts: one optimizer step, the validation loss, the time-budget schedule position,
throughput and MFU, and the stop request (Ctrl-C / SIGTERM). train.py strings them into the loop.
"""

from __future__ import annotations

import contextlib
import signal
import time

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from attention_lab.runtime.device import autocast, eval_mode
from data.batches import BatchSampler
from model import GPT
from model.gpt import chunked_next_token_loss


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, sampler: BatchSampler, grad_accum: int,
               device: torch.device, dtype: torch.dtype, grad_clip: float,
               scaler: torch.amp.GradScaler | None = None, loss_chunk: int = 0) -> tuple[float, float]:
    """One optimizer step over grad_accum micro-batches -> (mean loss, gradient norm before clipping).

    loss_chunk > 0: the same loss over that many positions' logits at a time (train.loss_chunk)."""
    total = 0.0
    for micro in range(grad_accum):
        x, y = sampler.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # DDP averages gradients across processes on every backward; only the last micro-batch needs it
        sync = micro == grad_accum - 1 or not isinstance(model, DDP)
        with (contextlib.nullcontext() if sync else model.no_sync()), autocast(device, dtype):
            if loss_chunk:
                loss = chunked_next_token_loss(model(x).logits, y, loss_chunk) / grad_accum
            else:
                loss = model(x, y).loss / grad_accum
        (scaler.scale(loss) if scaler else loss).backward()
        total += loss.item()
    optimizers = getattr(optimizer, "optimizers", [optimizer])  # attention_lab.training.optim.Optimizers: 1 or 2
    if scaler:
        for opt in optimizers:
            scaler.unscale_(opt)
    norm_limit = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), norm_limit).item()
    if scaler:
        for opt in optimizers:
            scaler.step(opt)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, grad_norm


@torch.no_grad()
def validation_loss(model: GPT, batches: list, device: torch.device, dtype: torch.dtype) -> float:
    """Mean next-token loss (nats per token) over the trainer's fixed validation batches (a sample of windows;
    attention_lab/training/evaluate.py scores the whole split instead)."""
    losses = []
    with eval_mode(model):
        for x, y in batches:
            with autocast(device, dtype):
                losses.append(model(x.to(device), y.to(device)).loss.item())
    return sum(losses) / len(losses)


def schedule_position(step: int, seconds_spent: float, max_steps: int, max_minutes: float | None,
                      stop: str = "steps") -> int:
    """The step the learning-rate schedule is at. Without a time budget (train.max_minutes), the step itself.

    stop="steps": the step, or the share of the budget spent times max_steps when that is further along. So a
    machine slower than the budget assumed still reaches the end of the schedule (the decay that makes the final
    loss) when its time is up, instead of stopping half-way at a high learning rate. The clock is this session's.
    stop="budget": the share of the budget spent times max_steps, on every machine: the schedule follows the
    clock, and a faster machine takes more steps along it (max_steps is then the steps the budget was sized for,
    the schedule's unit, not a cap). The clock is the run's, carried across resumes (TrainState.seconds)."""
    if max_minutes is None:
        return step
    by_time = int(seconds_spent / (60 * max_minutes) * max_steps)
    return by_time if stop == "budget" else max(step, by_time)


def steps_left(step: int, max_steps: int, max_minutes: float | None, stop: str = "steps") -> bool:
    """Whether the step count lets the loop take another step: below max_steps, or always when the time budget
    alone ends the run (stop="budget" with max_minutes): a faster machine never stops early at max_steps."""
    return (stop == "budget" and max_minutes is not None) or step < max_steps


def snapshot_part(step: int, seconds_spent: float, max_steps: int, max_minutes: float | None, snapshots: int,
                  stop: str = "steps") -> int:
    """How many of train.snapshots equal parts of the run are done (0..snapshots), counted as the schedule counts
    (schedule_position: steps, or the share of the time budget when further along), so snapshots spread over a
    run that stops on its time budget as well as over one that reaches max_steps."""
    if snapshots <= 0:
        return 0
    at = schedule_position(step, seconds_spent, max_steps, max_minutes, stop)
    return min(snapshots, at * snapshots // max_steps)


class Throughput:
    """Tokens/s and MFU over the steps since the last read, with evaluation time left out (`paused`)."""

    def __init__(self, step: int, tokens_per_step: int, flops_per_step: float, peak_flops: float):
        self.tokens_per_step, self.flops_per_step, self.peak_flops = tokens_per_step, flops_per_step, peak_flops
        self.t0, self.step0 = time.time(), step

    @contextlib.contextmanager
    def paused(self):
        t = time.time()
        yield
        self.t0 += time.time() - t

    def read(self, step: int) -> dict:
        dt = max(time.time() - self.t0, 1e-9)
        steps = step - self.step0
        self.t0, self.step0 = time.time(), step
        return {"tokens_per_s": steps * self.tokens_per_step / dt,
                "mfu": steps * self.flops_per_step / dt / self.peak_flops}


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM asks the loop to save and stop after the current step; a second Ctrl-C aborts."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        print("\nstop requested: finishing this step and saving a checkpoint (Ctrl-C again to abort)", flush=True)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
