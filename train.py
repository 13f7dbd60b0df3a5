"""Train the GPT with next-token prediction at every position.

    python train.py                                  # the default CPU run on Shakespeare (< 10 minutes)
    python train.py model.n_layer=6 optim.lr=6e-4    # Hydra overrides
    python train.py experiment=debug                 # a preset from configs/experiment/
    torchrun --nproc_per_node 2 train.py ...         # data-parallel over 2 processes (GPUs, or CPUs with gloo)

Each run writes runs/<name>/<time>/: config and provenance, metrics.jsonl, checkpoints/, tb/ (TensorBoard).
The functions here (build_model, configure_optimizer, lr_at, train_step, evaluate, train) are importable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math

from attention_lab.omp import bound_spinning

bound_spinning()  # before torch loads OpenMP: a waiting thread spins briefly, then sleeps (attention_lab/omp.py)

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from attention_lab import distributed
from attention_lab.callbacks import Callback, EvalContext, HeadRoles, ProbeAttention, TextSample
from attention_lab.checkpoint import CheckpointError, find_checkpoint, load_checkpoint, save_checkpoint
from attention_lab.config import Config, register_configs, to_config
from attention_lab.device import autocast, pick_device, pick_dtype
from attention_lab.heads import repeated_tokens_probe
from attention_lab.logger import RunLogger
from attention_lab.optim import Optimizers, configure_optimizer, lr_at, lr_multiplier
from attention_lab.runlock import RunLock, RunLocked
from data.batches import BatchSampler, eval_batches
from data.prepare import PreparedData, bits_per_byte, prepare_data
from model import GPT, GPTConfig, flops_per_token, num_params

# the fields that decide the shapes of the weights: a checkpoint must agree on all of them to be resumed
SHAPE_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias", "pos_encoding",
                "tie_embeddings", "mlp_ratio")


class TrainingError(RuntimeError):
    """A problem the user can fix (bad config for this corpus, checkpoint mismatch, diverged loss)."""


# ----------------------------------------------------------------------------------------------------------
# building blocks


def build_model(cfg: GPTConfig) -> GPT:
    return GPT(cfg)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, sampler: BatchSampler, grad_accum: int,
               device: torch.device, dtype: torch.dtype, grad_clip: float,
               scaler: torch.amp.GradScaler | None = None) -> tuple[float, float]:
    """One optimizer step over grad_accum micro-batches -> (mean loss, gradient norm before clipping)."""
    total = 0.0
    for micro in range(grad_accum):
        x, y = sampler.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # DDP averages gradients across processes on every backward; only the last micro-batch needs it
        sync = micro == grad_accum - 1 or not isinstance(model, DDP)
        with (contextlib.nullcontext() if sync else model.no_sync()), autocast(device, dtype):
            loss = model(x, y).loss / grad_accum
        (scaler.scale(loss) if scaler else loss).backward()
        total += loss.item()
    optimizers = getattr(optimizer, "optimizers", [optimizer])  # attention_lab.optim.Optimizers holds one or two
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
def evaluate(model: GPT, batches: list, device: torch.device, dtype: torch.dtype) -> float:
    """Mean next-token loss (nats per token) over fixed batches."""
    was_training = model.training
    model.eval()
    losses = []
    for x, y in batches:
        with autocast(device, dtype):
            losses.append(model(x.to(device), y.to(device)).loss.item())
    model.train(was_training)
    return sum(losses) / len(losses)


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


# ----------------------------------------------------------------------------------------------------------
# the run


def check_resumable(saved: GPTConfig, wanted: GPTConfig, where: Path) -> None:
    diff = [f"{f}: checkpoint {getattr(saved, f)!r}, config {getattr(wanted, f)!r}"
            for f in SHAPE_FIELDS if getattr(saved, f) != getattr(wanted, f)]
    if diff:
        raise TrainingError(
            f"cannot resume from {where}: the checkpoint's model has another shape ({'; '.join(diff)}). "
            "Use the same model settings as the checkpoint, or start a fresh run (another hydra.run.dir, "
            "without train.resume)."
        )


def resolve_model_config(cfg: Config, data: PreparedData) -> GPTConfig:
    """The model config with the tokenizer's vocabulary size, checked against the corpus."""
    model_cfg = dataclasses.replace(cfg.model, vocab_size=data.meta["vocab_size"])
    for split in ("train", "val"):
        n = data.meta[split]["tokens"]
        if n < model_cfg.block_size + 1:
            raise TrainingError(
                f"the {split} split has {n} tokens, fewer than one context window plus one "
                f"(model.block_size={model_cfg.block_size}); lower model.block_size or use a larger corpus"
            )
    return model_cfg


def train(cfg: Config, run_dir: Path, overrides: list[str] | None = None) -> dict:
    """Run the training described by cfg, writing to run_dir. Returns the final metrics."""
    tc = cfg.train
    info = distributed.init(tc.device)
    run_dir = distributed.same_on_all(str(run_dir), info)  # each rank's Hydra picked a time stamp: use rank 0's
    device = pick_device(tc.device, "train.device")
    if info.enabled and device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
    dtype = pick_dtype(tc.dtype, device)
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    torch.manual_seed(tc.seed)
    log = RunLogger(run_dir, enabled=info.is_main, tensorboard=tc.tensorboard)
    run, finished = None, False
    try:
        # one trainer per run folder (the main process holds it for all); RunLocked names the holder's pid
        with RunLock(run_dir) if info.is_main else contextlib.nullcontext():
            run = setup_run(cfg, Path(run_dir), overrides or [], info, device, dtype, log)
            final = run_loop(run)
            finished = True
            return final
    finally:
        log.close()
        # DDP's reducer holds the process group, whose gloo threads hold tensors: freed only at interpreter exit,
        # they abort the process (SIGABRT, "terminate called without an active exception"). Free them now.
        del run
        gc.collect()
        distributed.shutdown(wait_for_all=finished)


@dataclass
class Run:
    """Everything the loop reads and updates: built by setup_run, advanced by run_loop."""

    cfg: Config
    run_dir: Path
    overrides: list[str]
    info: distributed.DistInfo
    device: torch.device
    dtype: torch.dtype
    log: RunLogger
    data: PreparedData
    model_cfg: GPTConfig
    raw_model: GPT  # the plain module: checkpoints and evaluation use it, never the compiled/DDP wrapper
    model: nn.Module  # what the training step calls (maybe compiled, maybe DDP)
    optimizer: Optimizers
    scaler: torch.amp.GradScaler | None
    sampler: BatchSampler
    val_batches: list
    callbacks: list[Callback]
    flops_per_step: float
    peak_flops: float
    step: int = 0
    best_val: float = float("inf")
    tokens_seen: int = 0
    last_eval: dict = field(default_factory=dict)  # the latest evaluation's metrics (also from a checkpoint)
    session_start: float = field(default_factory=time.time)  # when this process's loop began (time budget)
    film_path: Path | None = None  # <run>/attention.html once written
    film_seconds: float = 0.0  # spent rewriting it this session

    @property
    def ckpt_root(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def tokens_per_step(self) -> int:
        tc = self.cfg.train
        return tc.batch_size * tc.grad_accum * self.info.world_size * self.model_cfg.block_size


def setup_run(cfg: Config, run_dir: Path, overrides: list[str], info, device, dtype, log: RunLogger) -> Run:
    """Data, model (fresh, resumed or from GPT-2), optimizer, batch streams and callbacks, ready to loop."""
    tc = cfg.train
    # data: one process prepares, the others wait on the cache's lock and then reuse what it wrote
    data = prepare_data(cfg.data, log=log.print)
    model_cfg = resolve_model_config(cfg, data)
    model, model_cfg, state = load_model(cfg, model_cfg, data, run_dir, log)
    model.to(device).train()
    raw_model = model
    optimizer = configure_optimizer(raw_model, cfg.optim, device)
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    if tc.compile:
        if device.type == "cpu":
            log.print("note: torch.compile on CPU compiles for a minute or more before the first step")
        model = torch.compile(model)
    if info.enabled:
        model = DDP(model, device_ids=[info.local_rank] if device.type == "cuda" else None)

    # data streams: one global random stream, each process reads its own slice of every global batch
    sampler = BatchSampler(data.tokens("train"), model_cfg.block_size, tc.batch_size, seed=tc.seed,
                           rank=info.rank, world_size=info.world_size, repeat_frac=tc.repeat_frac)
    val_batches = eval_batches(data.tokens("val"), model_cfg.block_size, tc.batch_size, tc.eval_batches)
    n_params = num_params(raw_model)
    peak = tc.peak_flops
    if peak is None:
        from attention_lab.flops import measure_peak_flops

        peak = measure_peak_flops(device) * info.world_size
    run = Run(cfg, run_dir, overrides, info, device, dtype, log, data, model_cfg, raw_model, model, optimizer,
              scaler, sampler, val_batches, build_callbacks(cfg, data, model_cfg), 0.0, peak)
    run.flops_per_step = flops_per_token(model_cfg, n_params) * run.tokens_per_step
    if state is not None:
        restore_state(run, state)
        for callback in run.callbacks:
            if hasattr(callback, "resume") and info.is_main:
                callback.resume(run_dir, run.step)
    log.provenance(cfg, overrides, {"data_dir": str(data.dir.resolve()), "world_size": info.world_size,
                                    "n_params": n_params, "peak_flops": peak, "device": str(device)})
    log.print(f"model: {n_params / 1e6:.2f}M parameters (embeddings counted once, positions not), "
              f"{model_cfg.n_layer} layers x {model_cfg.n_head} heads x {model_cfg.n_embd} wide, "
              f"{model_cfg.pos_encoding} positions, context {model_cfg.block_size}; device {device}, "
              f"{str(dtype).removeprefix('torch.')}" + (f", {info.world_size} processes" if info.enabled else ""))
    log.print(f"data: {data.meta['train']['tokens']:,} train / {data.meta['val']['tokens']:,} val tokens, "
              f"vocab {model_cfg.vocab_size} ({data.meta['tokenizer']}); {run.tokens_per_step:,} tokens per step; "
              f"run dir {run_dir}")
    return run


def load_model(cfg: Config, model_cfg: GPTConfig, data: PreparedData, run_dir: Path, log: RunLogger):
    """The model from this run's (or train.resume's) latest checkpoint, from GPT-2 weights, or fresh.

    Returns (model, its config, the checkpoint's train state or None).
    """
    tc = cfg.train
    tokenizer = data.tokenizer
    has_checkpoint = (run_dir / "checkpoints" / "latest.json").exists()
    resume_from = Path(tc.resume) if tc.resume else (run_dir if has_checkpoint else None)
    if resume_from is not None:
        ckpt = load_checkpoint(resume_from, which="latest")
        if tc.init_from:  # the run began from GPT-2 weights: the checkpoint has that model's shape
            model_cfg = dataclasses.replace(model_cfg, **{f: getattr(ckpt.config, f) for f in SHAPE_FIELDS})
        check_resumable(ckpt.config, model_cfg, ckpt.path)
        if ckpt.tokenizer_json != tokenizer.to_str():
            raise TrainingError(
                f"cannot resume from {ckpt.path}: it was trained with another tokenizer than the prepared data's "
                f"({data.dir}). Use the same data settings as that run."
            )
        model = ckpt.build_model("cpu", model_cfg)  # this run's dropout and backend, the checkpoint's weights
        state = ckpt.train_state() | {"meta": ckpt.meta}
        log.print(f"resuming from {ckpt.path} (step {state['step']})")
        return model, model_cfg, state
    if tc.init_from:
        from attention_lab.hf import load_gpt2

        model = load_gpt2(tc.init_from)
        if model.config.vocab_size != model_cfg.vocab_size:
            raise TrainingError(
                f"train.init_from={tc.init_from} has a {model.config.vocab_size}-token vocabulary but the prepared "
                f"data's tokenizer has {model_cfg.vocab_size}; use that model's tokenizer: "
                "data.tokenizer=file data.tokenizer_file=<its tokenizer.json>"
            )
        return model, model.config, None
    return build_model(model_cfg), model_cfg, None


def restore_state(run: Run, state: dict) -> None:
    """Optimizer, data stream, RNG and counters from a checkpoint's train state: resume is exact."""
    run.optimizer.load_state_dict(state["optimizer"])
    run.sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"]["torch"])
    if run.device.type == "cuda" and state["rng"].get("cuda") is not None:
        torch.cuda.set_rng_state(state["rng"]["cuda"], run.device)
    run.step, run.best_val, run.tokens_seen = state["step"], state["best_val_loss"], state["tokens_seen"]
    run.last_eval = {k: v for k, v in state.get("meta", {}).items() if k in ("val_loss", "val_bpb")}


def build_callbacks(cfg: Config, data: PreparedData, model_cfg: GPTConfig) -> list[Callback]:
    """What runs at every evaluation besides the validation loss (main process only)."""
    tc = cfg.train
    tokenizer = data.tokenizer
    probe_ids = tokenizer.encode(tc.probe_prompt)[-model_cfg.block_size:] or [tokenizer.eot_id]
    callbacks = [TextSample(tokenizer, probe_ids, tc.sample_tokens, tc.seed), ProbeAttention(tokenizer, probe_ids)]
    if tc.head_roles:
        callbacks.append(head_roles_callback(cfg, data, model_cfg))
    return callbacks


def head_roles_callback(cfg: Config, data: PreparedData, model_cfg: GPTConfig) -> HeadRoles:
    """Role scores on a repeated-random-tokens probe (tokens the training split holds) and on validation windows."""
    tc = cfg.train
    # the probe feeds 2 * half - 1 tokens, so both halves fit the context; 64 random tokens are plenty to
    # tell copying from guessing, and a longer probe would only make every evaluation slower
    half = min(model_cfg.block_size // 2, 64)
    probe = repeated_tokens_probe(np.unique(data.tokens("train")), half, tc.probe_batch, seed=tc.seed)
    val = eval_batches(data.tokens("val"), model_cfg.block_size, 4 * tc.probe_batch, 1)  # loss by position: 4x
    val_x, val_y = next(iter(val))
    # a phase change may take a fifth of the run to complete (the induction preset's: 400 of 2000 steps):
    # look a quarter of the run back, at least 3 evaluations
    lookback = max(3, round(0.25 * tc.max_steps / (tc.eval_interval * tc.head_roles_every)))
    return HeadRoles(probe, val_x, val_y, every=tc.head_roles_every, ablate=tc.head_ablation, lookback=lookback)


def save(run: Run, best: bool, extra: dict) -> Path | None:
    if not run.info.is_main:
        return None
    device = run.device
    train_state = {
        "step": run.step, "optimizer": run.optimizer.state_dict(), "sampler": run.sampler.state_dict(),
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
        "best_val_loss": run.best_val, "tokens_seen": run.tokens_seen,
    }
    return save_checkpoint(run.ckpt_root, run.step, run.raw_model, run.data.tokenizer.to_str(), extra, train_state,
                           best=best, keep_last=run.cfg.train.keep_checkpoints)


def run_evaluation(run: Run) -> dict:
    """Validation loss on every process, then the callbacks (main process), then a checkpoint."""
    t0 = time.time()
    val_loss = evaluate(run.raw_model, run.val_batches, run.device, run.dtype)
    seconds_val = time.time() - t0
    val_loss = distributed.mean(val_loss, run.info, run.device)
    metrics = {"val_loss": val_loss, "val_bpb": bits_per_byte(val_loss, run.data.meta), "seconds_val": seconds_val}
    is_best = val_loss < run.best_val
    run.best_val = min(run.best_val, val_loss)
    if run.info.is_main:
        ctx = EvalContext(run.step, run.raw_model, run.device, run.dtype, run.log, run.run_dir, metrics)
        was_training = run.raw_model.training
        run.raw_model.eval()
        with torch.no_grad():
            for callback in run.callbacks:
                t0 = time.time()
                callback.on_evaluate(ctx)
                metrics[f"seconds_{type(callback).__name__}"] = time.time() - t0
        run.raw_model.train(was_training)
        run.log.flush()
    run.log.metrics(run.step, metrics, tb_prefix="val")
    save(run, is_best, dict(metrics))
    if run.info.is_main and run.cfg.train.film:
        rebuild_film(run)
    run.last_eval = metrics
    return metrics


def rebuild_film(run: Run) -> None:
    """<run>/attention.html from what this and every earlier evaluation wrote (after metrics.jsonl has the
    evaluation's line). A page that cannot be built costs a warning, never the run."""
    from attention_lab.viewer import build_film

    t0 = time.time()
    try:
        path = build_film(run.run_dir)
    except (OSError, ValueError, KeyError) as e:
        run.log.print(f"warning: the attention film was not rewritten: {e}")
        return
    if run.film_path is None:
        run.log.print(f"attention film: {path} (rewritten at every evaluation; open it in a browser)")
    run.film_path = path
    run.film_seconds += time.time() - t0


def run_loop(run: Run) -> dict:
    """Step until max_steps, the time budget or a stop request; evaluate and save on the way."""
    tc = run.cfg.train
    log, info = run.log, run.info
    start_step, t_start = run.step, time.time()
    run.session_start = t_start
    meter = Throughput(run)
    progress = None
    if info.is_main and tc.progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=tc.max_steps, initial=run.step, desc="train", dynamic_ncols=True, leave=False)
    if run.step >= tc.max_steps:
        log.print(f"{run.run_dir} already finished {run.step} of {tc.max_steps} steps; nothing to train. "
                  "Raise train.max_steps to go on.")
    interrupted = False
    with StopRequest() as stop:
        while run.step < tc.max_steps:
            loss, grad_norm, lr = optimizer_step(run)
            if progress is not None:
                progress.update(1)
            if run.step % tc.log_interval == 0 or run.step == tc.max_steps:
                values = meter.read(loss, grad_norm, lr)
                log.metrics(run.step, values, tb_prefix="train")
                if progress is not None:
                    progress.set_postfix(loss=f"{loss:.3f}", tok_s=f"{values['tokens_per_s']:,.0f}", refresh=False)
            # every process must take the same branch below: agree on both flags
            out_of_time = tc.max_minutes is not None and time.time() - t_start > 60 * tc.max_minutes
            out_of_time = distributed.any_true(out_of_time, info, run.device)
            interrupted = distributed.any_true(stop.requested, info, run.device)
            if run.step % tc.eval_interval == 0 or run.step == tc.max_steps or out_of_time:
                with meter.paused():  # evaluation time does not count against tokens/s
                    metrics = run_evaluation(run)
                log.print(("\n" if progress is not None else "")
                          + f"step {run.step:>6}: train loss {loss:.4f}, val loss {metrics['val_loss']:.4f} "
                            f"nats/token, {metrics['val_bpb']:.3f} bits/byte")
            elif interrupted:
                save(run, False, {"interrupted": True})
            if out_of_time and not interrupted:
                log.print(f"time budget of {tc.max_minutes} min spent: stopped at step {run.step} of {tc.max_steps}")
                break
            if interrupted:
                log.print(f"stopped at step {run.step}; checkpoint saved in {run.ckpt_root}. Resume with: "
                          f"python train.py {' '.join(run.overrides)} hydra.run.dir={run.run_dir}".replace("  ", " "))
                break
    if progress is not None:
        progress.close()
    return finish(run, start_step, time.time() - t_start, interrupted)


def optimizer_step(run: Run) -> tuple[float, float, float]:
    """Set the learning rate, take one optimizer step, stop on a non-finite loss -> (loss, grad norm, lr)."""
    tc, oc = run.cfg.train, run.cfg.optim
    at = schedule_position(run)
    run.optimizer.set_lr_multiplier(lr_multiplier(at, oc, tc.max_steps))
    lr = lr_at(at, oc, tc.max_steps)  # AdamW's; Muon's follows the same multiplier
    loss, grad_norm = train_step(run.model, run.optimizer, run.sampler, tc.grad_accum, run.device, run.dtype,
                                 oc.grad_clip, run.scaler)
    loss = distributed.mean(loss, run.info, run.device)
    if not math.isfinite(loss):
        where = find_checkpoint(run.ckpt_root, "latest") if (run.ckpt_root / "latest.json").exists() else None
        raise TrainingError(
            f"the training loss became {loss} at step {run.step + 1}; the run stops without saving. "
            + (f"The last good checkpoint is {where}. " if where else "")
            + "Lower optim.lr, raise optim.warmup_steps, or keep optim.grad_clip on."
        )
    run.step += 1
    run.tokens_seen += run.tokens_per_step
    return loss, grad_norm, lr


def schedule_position(run: Run) -> int:
    """The step the learning-rate schedule is at: the step itself, or, with a time budget (train.max_minutes),
    the share of the budget spent times max_steps when that is further along. So a machine slower than the
    budget assumed still reaches the end of the schedule (the decay that makes the final loss) when its time
    is up, instead of stopping half-way at a high learning rate. The clock is this session's."""
    tc = run.cfg.train
    if tc.max_minutes is None:
        return run.step
    spent = (time.time() - run.session_start) / (60 * tc.max_minutes)
    return max(run.step, int(spent * tc.max_steps))


class Throughput:
    """Tokens/s and MFU over the steps since the last read, with evaluation time left out."""

    def __init__(self, run: Run):
        self.run = run
        self.t0, self.step0 = time.time(), run.step

    @contextlib.contextmanager
    def paused(self):
        t = time.time()
        yield
        self.t0 += time.time() - t

    def read(self, loss: float, grad_norm: float, lr: float) -> dict:
        run = self.run
        dt = max(time.time() - self.t0, 1e-9)
        steps = run.step - self.step0
        self.t0, self.step0 = time.time(), run.step
        return {"loss": loss, "bpb": bits_per_byte(loss, run.data.meta, "train"), "lr": lr, "grad_norm": grad_norm,
                "tokens_per_s": steps * run.tokens_per_step / dt, "mfu": steps * run.flops_per_step / dt / run.peak_flops}


def finish(run: Run, start_step: int, elapsed: float, interrupted: bool) -> dict:
    """The final metrics, TensorBoard's hparams entry and the closing console line."""
    trained = run.step - start_step
    final = {"step": run.step, "val_loss": run.last_eval.get("val_loss", float("nan")),
             "val_bpb": run.last_eval.get("val_bpb", float("nan")), "best_val_loss": run.best_val,
             "minutes": elapsed / 60, "steps_this_session": trained, "seconds_film": run.film_seconds}
    if run.info.is_main and not interrupted and trained > 0:
        hp = {f"model.{k}": v for k, v in dataclasses.asdict(run.model_cfg).items()}
        hp |= {f"optim.{k}": v for k, v in dataclasses.asdict(run.cfg.optim).items()}
        hp |= {"train.batch_size": run.cfg.train.batch_size, "train.max_steps": run.cfg.train.max_steps,
               "data.name": run.cfg.data.name}
        run.log.hparams(hp, {"val_loss": final["val_loss"], "val_bpb": final["val_bpb"], "best_val_loss": run.best_val})
    if trained == 0:
        last = (f"; last evaluation: val loss {final['val_loss']:.4f} nats/token, {final['val_bpb']:.3f} bits/byte"
                if run.last_eval else "")
        run.log.print(f"done: nothing trained (the run is at step {run.step} of {run.cfg.train.max_steps}){last}; "
                      f"checkpoints in {run.ckpt_root}")
    else:
        run.log.print(f"done: {run.step} steps in {elapsed / 60:.1f} min; val loss {final['val_loss']:.4f} "
                      f"nats/token, {final['val_bpb']:.3f} bits/byte (best {run.best_val:.4f}); "
                      f"checkpoints in {run.ckpt_root}"
                      + (f"; attention film {run.film_path}" if run.film_path else ""))
    return final


# ----------------------------------------------------------------------------------------------------------
# entry point

register_configs()


def _main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(version_base="1.3", config_path="configs", config_name="config")
    def main(dcfg) -> None:
        hc = HydraConfig.get()
        try:
            cfg = to_config(dcfg)
            train(cfg, Path(hc.runtime.output_dir), list(hc.overrides.task))
        except (TrainingError, CheckpointError, RunLocked, ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    main()


if __name__ == "__main__":
    _main()
