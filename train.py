"""Train the GPT with next-token prediction at every position.

    python train.py                                  # the default CPU run on Shakespeare (< 10 minutes)
    python train.py model.n_layer=6 optim.lr=6e-4    # Hydra overrides
    python train.py experiment=debug                 # a preset from configs/experiment/
    torchrun --nproc_per_node 2 train.py ...         # data-parallel over 2 processes (GPUs, or CPUs with gloo)

Each run writes runs/<name>/<time>/ (every path: attention_lab/store/layout.py). The story: compose the config
(Hydra, checked by attention_lab/training/config.py), set up (data, model, optimizer, TrainState, callbacks),
loop (optimizer steps; every eval_interval an evaluation, the callbacks and a checkpoint), finish.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import time
from pathlib import Path

from attention_lab.runtime.omp import bound_spinning

bound_spinning()  # before torch loads OpenMP: a waiting thread spins briefly, then sleeps (attention_lab/runtime/omp.py)

import torch  # noqa: E402

from attention_lab.runtime import cli, distributed  # noqa: E402
from attention_lab.runtime.device import eval_mode, pick_device, pick_dtype  # noqa: E402
from attention_lab.runtime.flops import kept_peak_flops  # noqa: E402
from attention_lab.store.checkpoint import CheckpointError, find_checkpoint, save_checkpoint  # noqa: E402
from attention_lab.store.layout import RunLayout  # noqa: E402
from attention_lab.store.logger import RunLogger  # noqa: E402
from attention_lab.store.runlock import RunLock, RunLocked  # noqa: E402
from attention_lab.training.backend import settle_attn_backend  # noqa: E402
from attention_lab.training.callbacks import EvalContext, build_callbacks  # noqa: E402
from attention_lab.training.compiling import measured_step, settle_compile  # noqa: E402
from attention_lab.training.config import Config, register_configs, to_config  # noqa: E402
from attention_lab.training.learner import recorded_config  # noqa: E402
from attention_lab.training.loop import (  # noqa: E402
    StopRequest,
    Throughput,
    schedule_position,
    snapshot_part,
    steps_left,
    train_step,
    validation_loss,
)
from attention_lab.training.loss_chunk import settle_loss_chunk  # noqa: E402
from attention_lab.training.optim import configure_optimizer, lr_at, lr_multiplier  # noqa: E402
from attention_lab.training.run import Run, finish, wrap_model  # noqa: E402
from attention_lab.training.start import TrainingError, load_model, resolve_model_config  # noqa: E402
from attention_lab.training.state import TrainState  # noqa: E402
from data.batches import BatchSampler, eval_batches  # noqa: E402
from data.prepare import bits_per_byte, prepare_data  # noqa: E402
from model import arch_of, num_params  # noqa: E402


def train(cfg: Config, run_dir: Path, overrides: list[str] | None = None) -> dict:
    """Run the training described by cfg, writing to run_dir. Returns the final metrics."""
    tc = cfg.train
    info = distributed.init(tc.device)
    run_dir = distributed.same_on_all(str(run_dir), info)  # each rank's Hydra picked a time stamp: use rank 0's
    device = distributed.process_device(pick_device(tc.device, "train.device"), info)  # auto: CUDA, MPS, CPU
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
        # they abort the process (SIGABRT, "terminate called without an active exception"). Free them now (a
        # collection walks every object of the process: 0.25 s inside a test session, so only where it is needed)
        del run
        if info.enabled:
            gc.collect()
        distributed.shutdown(wait_for_all=finished)


def setup_run(cfg: Config, run_dir: Path, overrides: list[str], info, device, dtype, log: RunLogger) -> Run:
    """Data, model (fresh, resumed or from GPT-2), optimizer, batch streams and callbacks, ready to loop."""
    tc = cfg.train
    data = prepare_data(cfg.data, log=log.print)  # one process prepares; the others wait on the cache's lock
    # model.attn_backend=auto becomes sdpa or math here (measured on a CPU, or as a resumed checkpoint recorded it):
    # the model, config.json and every checkpoint get the concrete one
    cfg, measuring = settle_attn_backend(cfg, run_dir, device, dtype, info, log.print)
    model, model_cfg, saved, saved_meta = load_model(cfg, resolve_model_config(cfg, data), data, run_dir, log.print)
    raw_model = model.to(device).train()
    # data streams: one global random stream, each process reads its own slice of every global batch
    sampler = BatchSampler(data.tokens("train"), model_cfg.block_size, tc.batch_size, seed=tc.seed, rank=info.rank,
                           world_size=info.world_size, repeat_frac=tc.repeat_frac)
    state = TrainState(configure_optimizer(raw_model, cfg.optim, device), sampler, device)
    # train.compile=auto becomes true or false here (on an AMX CPU, the run's own step timed eager and compiled;
    # the weights and the optimizer put back as they were), then train.loss_chunk=auto a number (measured on a CPU
    # at the model's shape, or 0 inside a compiled model): config.json records both
    step = measured_step(cfg, state.optimizer, model_cfg.vocab_size, device, dtype)
    cfg, compiled, measuring_compile = settle_compile(cfg, raw_model, state.optimizer, step, device, dtype, info,
                                                      log.print)
    cfg, measuring_loss = settle_loss_chunk(cfg, model_cfg.n_embd, model_cfg.block_size, model_cfg.vocab_size,
                                            device, dtype, info, log.print)
    model = wrap_model(raw_model, cfg.train, device, info, log.print, compiled)  # compiled and/or DDP; raw stays plain
    n_params = num_params(raw_model)
    # the MFU denominator: the matmul peak in the dtype the run computes in (bf16 runs 2-8x float32 on some CPUs),
    # measured once on this machine and kept (runtime/flops.py), or as the config gives it
    if tc.peak_flops:
        peak, peak_source = tc.peak_flops, "config"
    else:
        peak, measured = kept_peak_flops(device, dtype)
        peak, peak_source = peak * info.world_size, "measured" if measured else "kept"
    run = Run(cfg, RunLayout(run_dir), overrides, info, device, dtype, log, data, model_cfg, raw_model, model, state,
              torch.amp.GradScaler(device.type) if dtype == torch.float16 else None,
              eval_batches(data.tokens("val"), model_cfg.block_size, tc.batch_size, tc.eval_batches),
              build_callbacks(cfg, data, model_cfg, log.print) if info.is_main else [], n_params, peak,
              counted_startup=measuring + measuring_compile + measuring_loss)
    if saved is not None:
        state.load_state_dict(saved)
        run.last_eval = {k: v for k, v in saved_meta.items() if k in ("val_loss", "val_bpb")}
        for callback in run.callbacks:
            callback.resume(run_dir, state.step)
    log.provenance(recorded_config(cfg, raw_model), overrides, {  # a learner's attention: their file and its hash
        "data_dir": str(data.dir.resolve()), "world_size": info.world_size, "n_params": n_params, "peak_flops": peak,
        "peak_dtype": str(dtype)[6:], "peak_source": peak_source, "device": str(device)})
    shape = (f"{model_cfg.n_layer} layers x {model_cfg.n_head} heads x {model_cfg.n_embd} wide, "
             f"{model_cfg.pos_encoding} positions" if arch_of(model_cfg) == "gpt" else
             f"an LSTM: {model_cfg.n_layer} layers x {model_cfg.n_embd} wide (embedding and hidden size)"
             + ("" if cfg.model.lstm_hidden else ", as many parameters as the GPT of these model settings"))
    log.print(f"model: {n_params / 1e6:.2f}M parameters (embeddings counted once, positions not), {shape}, "
              f"context {model_cfg.block_size}; device {device}, "
              f"{str(dtype).removeprefix('torch.')}" + (f", {info.world_size} processes" if info.enabled else ""))
    log.print(f"data: {data.meta['train']['tokens']:,} train / {data.meta['val']['tokens']:,} val tokens, "
              f"vocab {model_cfg.vocab_size} ({data.meta['tokenizer']}); {run.tokens_per_step:,} tokens per step; "
              f"run dir {run_dir}")
    return run


def run_loop(run: Run) -> dict:
    """Step until max_steps, the time budget or a stop request; evaluate and save on the way. With
    train.stop=budget the time budget alone ends the run, on the run's clock (resumes included)."""
    tc, state, log, info = run.cfg.train, run.state, run.log, run.info
    start_step, session_t0 = state.step, time.time() - run.counted_startup  # from auto's measurement, if one ran
    run.run_start = session_t0 - state.seconds
    by_budget = tc.stop == "budget" and tc.max_minutes is not None
    t_start = run.run_start if by_budget else session_t0  # the budget's and the schedule's clock
    run.session_start = t_start
    meter = Throughput(state.step, run.tokens_per_step, run.flops_per_step, run.peak_flops)
    progress = open_progress(tc, state, by_budget) if info.is_main and tc.progress else None
    if not steps_left(state.step, tc.max_steps, tc.max_minutes, tc.stop):
        log.print(f"{run.layout.root} already finished {state.step} of {tc.max_steps} steps; nothing to train. "
                  "Raise train.max_steps to go on.")
    if by_budget:
        log.print(f"budget: the run stops when {tc.max_minutes:g} min are spent (train.stop=budget); its schedule, "
                  f"sized for {tc.max_steps} steps, follows the clock")
    spent = by_budget and state.seconds >= 60 * tc.max_minutes
    if spent:
        log.print(f"{run.layout.root} already spent its time budget of {tc.max_minutes} min; nothing to train. "
                  "Raise train.max_minutes to go on.")
    interrupted = False
    done_parts = snapshot_part(state.step, time.time() - t_start, tc.max_steps, tc.max_minutes, tc.snapshots,
                               tc.stop)  # resumed: those before
    with StopRequest() as stop:
        while steps_left(state.step, tc.max_steps, tc.max_minutes, tc.stop) and not spent:
            loss, grad_norm, lr = optimizer_step(run)
            if progress is not None:
                progress.update(min(progress.total, time.time() - t_start) - progress.n if by_budget else 1)
            last = not steps_left(state.step, tc.max_steps, tc.max_minutes, tc.stop)  # the step cap reached
            if state.step % tc.log_interval == 0 or last:
                values = {"loss": loss, "bpb": bits_per_byte(loss, run.data.meta, "train"), "lr": lr,
                          "grad_norm": grad_norm, **meter.read(state.step)}
                log.metrics(state.step, values, tb_prefix="train")
                if progress is not None:
                    progress.set_postfix(step=state.step, loss=f"{loss:.3f}", tok_s=f"{values['tokens_per_s']:,.0f}",
                                         refresh=False)
            # every process must take the same branch below: agree on both flags
            out_of_time = tc.max_minutes is not None and time.time() - t_start > 60 * tc.max_minutes
            out_of_time = distributed.any_true(out_of_time, info, run.device)
            interrupted = distributed.any_true(stop.requested, info, run.device)
            part = snapshot_part(state.step, time.time() - t_start, tc.max_steps, tc.max_minutes, tc.snapshots,
                                 tc.stop)
            if state.step % tc.eval_interval == 0 or last or out_of_time:
                with meter.paused():  # evaluation time does not count against tokens/s
                    metrics = run_evaluation(run)
                log.print(("\n" if progress is not None else "")
                          + f"step {state.step:>6}: train loss {loss:.4f}, val loss {metrics['val_loss']:.4f} "
                            f"nats/token, {metrics['val_bpb']:.3f} bits/byte")
            elif interrupted:
                save(run, False, {"interrupted": True})
            elif tc.snapshots and distributed.any_true(done_parts < part < tc.snapshots, info, run.device):
                with meter.paused():  # a film frame and a light checkpoint at each 1/snapshots of the run
                    take_snapshot(run)
            done_parts = part
            if out_of_time and not interrupted:
                log.print(f"time budget of {tc.max_minutes} min spent: stopped at step {state.step}"
                          + ("" if by_budget else f" of {tc.max_steps}"))
                break
            if interrupted:
                log.print(f"stopped at step {state.step}; checkpoint saved in {run.layout.checkpoints}. Resume with: "
                          f"python train.py {' '.join(run.overrides)} hydra.run.dir={run.layout.root}".replace("  ", " "))
                break
    if progress is not None:
        progress.close()
    return finish(run, start_step, time.time() - session_t0, interrupted)


def open_progress(tc, state, by_budget: bool):
    """The console's progress bar. A run that its time budget ends (by_budget: train.stop=budget) counts the budget's
    seconds, so the bar's end and its ETA are the clock's; a run that max_steps ends counts steps."""
    from tqdm.auto import tqdm

    if by_budget:
        total = round(60 * tc.max_minutes)
        return tqdm(total=total, initial=min(total, round(state.seconds)), desc="train", unit="s", dynamic_ncols=True,
                    leave=False, bar_format="{l_bar}{bar}| {n:.0f}/{total} s of the time budget [{elapsed}<{remaining}"
                                            "{postfix}]")
    return tqdm(total=tc.max_steps, initial=state.step, desc="train", unit="step", dynamic_ncols=True, leave=False)


def optimizer_step(run: Run) -> tuple[float, float, float]:
    """Set the learning rate, take one optimizer step, stop on a non-finite loss -> (loss, grad norm, lr)."""
    tc, oc, state = run.cfg.train, run.cfg.optim, run.state
    at = schedule_position(state.step, time.time() - run.session_start, tc.max_steps, tc.max_minutes, tc.stop)
    state.optimizer.set_lr_multiplier(lr_multiplier(at, oc, tc.max_steps))
    lr = lr_at(at, oc, tc.max_steps)  # AdamW's; Muon's follows the same multiplier
    loss, grad_norm = train_step(run.model, state.optimizer, state.sampler, tc.grad_accum, run.device, run.dtype,
                                 oc.grad_clip, run.scaler, tc.loss_chunk)
    loss = distributed.mean(loss, run.info, run.device)
    if not math.isfinite(loss):
        where = find_checkpoint(run.layout.root, "latest") if run.layout.latest_pointer.exists() else None
        raise TrainingError(
            f"the training loss became {loss} at step {state.step + 1}; the run stops without saving. "
            + (f"The last good checkpoint is {where}. " if where else "")
            + "Lower optim.lr, raise optim.warmup_steps, or keep optim.grad_clip on."
        )
    state.step += 1
    state.tokens_seen += run.tokens_per_step
    return loss, grad_norm, lr


def run_evaluation(run: Run) -> dict:
    """Validation loss on every process; the callbacks, the metrics line and a checkpoint on the main one."""
    state, t0 = run.state, time.time()
    val_loss = distributed.mean(validation_loss(run.raw_model, run.val_batches, run.device, run.dtype), run.info,
                                run.device)
    metrics = {"val_loss": val_loss, "val_bpb": bits_per_byte(val_loss, run.data.meta),
               "seconds_val": time.time() - t0}
    is_best = val_loss < state.best_val
    state.best_val = min(state.best_val, val_loss)
    ctx = EvalContext(state.step, run.raw_model, run.device, run.dtype, run.log, run.layout.root, metrics)
    with eval_mode(run.raw_model), torch.no_grad():
        for callback in run.callbacks:
            t0 = time.time()
            callback.on_evaluate(ctx)
            metrics[f"seconds_{type(callback).__name__}"] = time.time() - t0
    run.log.flush()
    run.log.metrics(state.step, metrics, tb_prefix="val")
    save(run, is_best, dict(metrics))
    for callback in run.callbacks:
        callback.after_evaluate(ctx)
    run.last_eval = metrics
    return metrics


def take_snapshot(run: Run) -> None:
    """Between evaluations (train.snapshots): the callbacks' cheap part (a film frame) and a light checkpoint."""
    if not run.info.is_main:
        return
    t0, state = time.time(), run.state
    ctx = EvalContext(state.step, run.raw_model, run.device, run.dtype, run.log, run.layout.root)
    with eval_mode(run.raw_model), torch.no_grad():
        for callback in run.callbacks:
            callback.on_snapshot(ctx)
    save_checkpoint(run.layout.checkpoints, state.step, run.raw_model, run.data.tokenizer.to_str(), {}, snapshot=True)
    run.log.metrics(state.step, {"seconds_snapshot": time.time() - t0})


def save(run: Run, best: bool, extra: dict) -> Path | None:
    run.state.seconds = time.time() - run.run_start  # the run's clock, for a resume (train.stop=budget)
    if not run.info.is_main:
        return None
    return save_checkpoint(run.layout.checkpoints, run.state.step, run.raw_model, run.data.tokenizer.to_str(), extra,
                           run.state.state_dict(), best=best, keep_last=run.cfg.train.keep_checkpoints)


register_configs()


def _main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(version_base="1.3", config_path="configs", config_name="config")
    def main(dcfg) -> None:
        hc = HydraConfig.get()

        def run() -> None:
            train(to_config(dcfg), Path(hc.runtime.output_dir), list(hc.overrides.task))

        if code := cli.run(run, TrainingError, CheckpointError, RunLocked):
            sys.exit(code)

    main()


if __name__ == "__main__":
    _main()
