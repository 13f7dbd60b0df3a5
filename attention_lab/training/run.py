"""One training run's objects and its two ends: `Run` (everything the loop reads and updates), `wrap_model` (the
compiled / DDP wrappers, applied from the outside) and `finish` (the final metrics and the closing line).
train.py builds a Run in setup_run and advances it in run_loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from attention_lab.runtime import distributed
from attention_lab.store.checkpoint import DEFAULT_PRESET
from attention_lab.store.layout import RunLayout
from attention_lab.store.logger import RunLogger
from attention_lab.training.callbacks import Callback, Film
from attention_lab.training.compiling import compiled_for_training
from attention_lab.training.config import Config, TrainConfig
from attention_lab.training.state import TrainState
from data.prepare import PreparedData
from model import GPT, GPTConfig, LSTMConfig, flops_per_token


@dataclass
class Run:
    """Everything the loop reads and updates: built by setup_run, advanced by run_loop."""

    cfg: Config
    layout: RunLayout
    overrides: list[str]
    info: distributed.DistInfo
    device: torch.device
    dtype: torch.dtype
    log: RunLogger
    data: PreparedData
    model_cfg: GPTConfig | LSTMConfig  # model.arch: the GPT, or the LSTM baseline
    raw_model: GPT  # the plain module (or an LSTMLM): checkpoints and evaluation use it, never the compiled/DDP wrapper
    model: nn.Module  # what the training step calls (maybe compiled, maybe DDP)
    state: TrainState  # step, best loss, tokens, optimizer, sampler, RNG: what a checkpoint restores
    scaler: torch.amp.GradScaler | None
    val_batches: list
    callbacks: list[Callback]
    n_params: int
    peak_flops: float  # the matmul peak in the run's dtype: the MFU denominator
    last_eval: dict = field(default_factory=dict)  # the latest evaluation's metrics (also from a checkpoint)
    # startup work the run's clocks count (the budget's, the schedule's, TrainState.seconds): auto's measurement of the
    # attention backend (training/backend.py), so a run that measures trains for its budget less that time
    counted_startup: float = 0.0
    session_start: float = field(default_factory=time.time)  # zero of the schedule's and the budget's clock
    run_start: float = field(default_factory=time.time)  # zero of the run's clock (TrainState.seconds), resumes included

    @property
    def tokens_per_step(self) -> int:
        tc = self.cfg.train
        return tc.batch_size * tc.grad_accum * self.info.world_size * self.model_cfg.block_size

    @property
    def flops_per_step(self) -> float:
        return flops_per_token(self.model_cfg, self.n_params) * self.tokens_per_step


def wrap_model(model: nn.Module, tc: TrainConfig, device: torch.device, info: distributed.DistInfo,
               say=print, compiled: nn.Module | None = None) -> nn.Module:
    """What the training step calls: the plain module, compiled when train.compile is true (settled: never auto
    here), DDP-wrapped under torchrun. compiled: the wrapper train.compile=auto's measurement already compiled
    (attention_lab/training/compiling.py), taken as it is. Checkpoints and evaluation keep using the plain module."""
    if tc.compile is True and compiled is not None:
        model = compiled
    elif tc.compile is True:
        if device.type == "cpu":
            say("note: torch.compile on CPU compiles for a minute or more before the first step")
        if device.type == "mps":  # never on by default: no preset compiles on a Mac, and none was tried on one
            say("note: torch.compile on Apple's MPS was never tried here; train.compile=false if it fails")
        model = compiled_for_training(model)
    if info.enabled:
        model = DDP(model, device_ids=[info.local_rank] if device.type == "cuda" else None)
    return model


def finish(run: Run, start_step: int, elapsed: float, interrupted: bool) -> dict:
    """The final metrics, TensorBoard's hparams entry and the closing console line."""
    state, trained = run.state, run.state.step - start_step
    film = next((c for c in run.callbacks if isinstance(c, Film)), None)
    final = {"step": state.step, "val_loss": run.last_eval.get("val_loss", float("nan")),
             "val_bpb": run.last_eval.get("val_bpb", float("nan")), "best_val_loss": state.best_val,
             "minutes": elapsed / 60, "steps_this_session": trained, "seconds_film": film.seconds if film else 0.0}
    if run.info.is_main and not interrupted and trained > 0:
        run.log.hparams(run.cfg.hparams(run.model_cfg),
                        {"val_loss": final["val_loss"], "val_bpb": final["val_bpb"], "best_val_loss": state.best_val})
    where = run.layout.checkpoints
    if trained == 0:
        last = (f"; last evaluation: val loss {final['val_loss']:.4f} nats/token, {final['val_bpb']:.3f} bits/byte"
                if run.last_eval else "")
        run.log.print(f"done: nothing trained (the run is at step {state.step} of {run.cfg.train.max_steps}){last}; "
                      f"checkpoints in {where}")
    else:
        run.log.print(f"done: {state.step} steps in {elapsed / 60:.1f} min; val loss {final['val_loss']:.4f} "
                      f"nats/token, {final['val_bpb']:.3f} bits/byte (best {state.best_val:.4f}); "
                      f"checkpoints in {where}"
                      + (f"; attention film {film.path}" if film and film.path else ""))
        if run.cfg.name == DEFAULT_PRESET and not run.cfg.model.attn_impl and not interrupted:
            # the default run grows few clear heads (docs/heads.md): say where one is seen forming
            run.log.print("next: watch an attention head form (an induction head, within minutes on a CPU): "
                          "python train.py experiment=induction  (docs/heads.md)")
    return final
