"""Work that runs at every evaluation, plugged into the training loop as small objects.

The loop calls `on_evaluate(ctx)` on each callback after the validation loss is known, on the main process
only, with the model in eval mode. A callback may add numbers to `ctx.metrics` (they land in metrics.jsonl and
in TensorBoard under `val/`) and write what it likes through `ctx.log`. `after_evaluate(ctx)` runs once the
evaluation's metrics line and checkpoint are written (the film reads them). `resume(run_dir, step)` lets a
callback pick up what an earlier session of the run recorded. A new probe is a new class here, not a new branch
in the loop; `build_callbacks` says which run. The figures (matplotlib) are imported by the callbacks that
draw, when they first draw: a run without TensorBoard (the claims' quick runs) never loads them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from attention_lab.interp.capture import capture_attention
from attention_lab.interp.heads import PhaseChangeDetector, head_name, measure_heads, repeated_tokens_probe
from attention_lab.interp.measures import attention_stats
from attention_lab.interp.roles import ROLES, TRACKED_ROLES
from attention_lab.runtime.device import autocast
from attention_lab.store.layout import RunLayout
from attention_lab.store.logger import RunLogger
from attention_lab.training.config import Config
from attention_lab.training.learner import future_leak_callback
from attention_lab.viewer.page import build_film
from data.batches import eval_batches
from data.files import atomic_write, write_json_atomic
from data.prepare import PreparedData
from model import GPT, GPTConfig, LSTMConfig, generate, has_attention

if TYPE_CHECKING:
    from attention_lab.interp.figures import AttentionFrames, FingerprintFrames


@dataclass
class EvalContext:
    step: int
    model: GPT  # the plain module (never compiled or DDP-wrapped), in eval mode
    device: torch.device
    dtype: torch.dtype
    log: RunLogger
    run_dir: Path
    metrics: dict = field(default_factory=dict)  # val_loss, val_bpb, ...; callbacks may add to it


class Callback:
    def on_evaluate(self, ctx: EvalContext) -> None:
        """After the validation loss, before the metrics line and the checkpoint are written."""

    def after_evaluate(self, ctx: EvalContext) -> None:
        """After the metrics line and the checkpoint are written."""

    def on_snapshot(self, ctx: EvalContext) -> None:
        """Between evaluations (train.snapshots), before a light checkpoint: only what costs milliseconds (no
        validation loss; ctx.metrics is empty)."""

    def resume(self, run_dir: Path, step: int) -> None:
        """A resumed run: what an earlier session recorded up to `step` is on disk."""


class TextSample(Callback):
    """Text generated from the film's prompt (train.probe_prompt), seeded by the step so training's random stream
    is untouched."""

    def __init__(self, tokenizer, prompt_ids: list[int], n_tokens: int, seed: int):
        self.tokenizer, self.prompt_ids, self.n_tokens, self.seed = tokenizer, prompt_ids, n_tokens, seed

    def on_evaluate(self, ctx: EvalContext) -> None:
        if ctx.log.writer is None or self.n_tokens == 0:
            return
        idx = torch.tensor([self.prompt_ids], device=ctx.device)
        gen = torch.Generator(device=ctx.device).manual_seed(self.seed + ctx.step)
        out = generate(ctx.model, idx, self.n_tokens, temperature=0.8, top_k=200, generator=gen)
        ctx.log.text("sample", self.tokenizer.decode(out[0].tolist()), ctx.step)


class ProbeAttention(Callback):
    """The film's prompt's attention maps (train.probe_prompt; "probe" alone names the repeated-tokens
    probe of HeadRoles): heatmaps in TensorBoard and one float16 array per evaluation.

    Writes run_dir/attention/probe.json once and attention/step_XXXXXXXX.npy (L, nh, T, T) at every
    evaluation: the frames of the run's attention film (attention_lab/viewer/page.py).
    """

    def __init__(self, tokenizer, prompt_ids: list[int], description: str = "the film's prompt"):
        self.tokenizer, self.prompt_ids, self.description = tokenizer, prompt_ids, description
        self.heatmaps: AttentionFrames | None = None  # the TensorBoard figures: laid out once, redrawn per evaluation

    def on_evaluate(self, ctx: EvalContext) -> None:
        weights = self.frame(ctx)
        if ctx.log.writer is not None:
            from attention_lab.interp.figures import AttentionFrames, log_attention_to_tensorboard  # matplotlib

            self.heatmaps = self.heatmaps or AttentionFrames(self.tokenizer.token_strings(self.prompt_ids))
            log_attention_to_tensorboard(ctx.log.writer, weights, self.heatmaps.labels, ctx.step, "attention",
                                         frames=self.heatmaps)

    def on_snapshot(self, ctx: EvalContext) -> None:
        """A film frame between evaluations: the prompt's attention (one forward pass over its tokens), no heatmaps."""
        self.frame(ctx)

    def frame(self, ctx: EvalContext) -> np.ndarray:
        """The prompt's attention at this step, written as the film's frame (and probe.json, once) -> the weights."""
        weights = capture_attention(ctx.model, torch.tensor([self.prompt_ids], device=ctx.device))
        run = RunLayout(ctx.run_dir)
        run.attention.mkdir(parents=True, exist_ok=True)
        if not run.probe.exists():
            write_json_atomic(run.probe, {"tokens": self.tokenizer.token_strings(self.prompt_ids),
                                          "ids": list(self.prompt_ids), "description": self.description})
        with atomic_write(run.frame(ctx.step), "wb") as f:
            np.save(f, weights.astype(np.float16))
        return weights


def evaluations_in(metrics: Path, step: int) -> set[int]:
    """The steps at which metrics.jsonl recorded a validation loss, up to `step`."""
    if not metrics.exists():
        return set()
    rows = (json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip())
    return {r["step"] for r in rows if "val_loss" in r and r["step"] <= step}


HEAD_RUNS = "heads"  # tb/heads/L<l>H<h>/: a TensorBoard run per head
HEAD_TAG = "head role"  # its tags: "head role/<role>", a chart per role in the SCALARS tab, a line per head


class HeadRoles(Callback):
    """Per-head role scores, ablation effects and model-level copying curves at every evaluation.

    Writes (main process): TensorBoard scalars `heads/<role>/L<l>H<h>` (one custom-scalars chart per role),
    `ablation/{probe,val}/L<l>H<h>`, `model/{probe_first_loss,probe_repeat_loss,icl_score}`, the images
    `heads/fingerprint` and `model/position_loss_map`, and the text `phase_changes`; the same numbers in
    metrics.jsonl (key "heads"); attention/heads.jsonl and attention/phase_changes.json for the film.
    """

    def __init__(self, probe: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor, *, every: int = 1,
                 ablate: bool = True, lookback: int = 3):
        self.probe, self.val_x, self.val_y = probe, val_x, val_y
        self.every, self.ablate = every, ablate
        self.detector = PhaseChangeDetector(lookback=lookback)
        self.calls = 0
        self.steps: list[int] = []
        self.position_losses: list[np.ndarray] = []
        self.changes: list[dict] = []
        self.layout_written = False
        self.fingerprint: FingerprintFrames | None = None  # the TensorBoard fingerprint: laid out once, redrawn

    def resume(self, run_dir: Path, step: int) -> None:
        """Replay the evaluations an earlier session of this run recorded (up to `step`), so phase changes are
        measured against the whole history and each is reported once; drop records past `step` (they came
        after the checkpoint this run resumes from)."""
        layout = RunLayout(run_dir)
        path = layout.heads
        if not path.exists():
            return
        kept = [r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if r["step"] <= step]
        with atomic_write(path) as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        # the every-N cadence counts evaluations, measured or not: those metrics.jsonl recorded up to `step`
        self.calls = len(evaluations_in(layout.metrics, step))
        for r in kept:
            self.steps.append(r["step"])
            self.position_losses.append(np.asarray(r["position_loss"]))
            scores = {k: np.asarray(v) for k, v in r["scores"].items()}
            model = r["model"]
            self.changes += [c.to_dict() for c in self.detector.update(r["step"], scores, model["probe_first_loss"],
                                                                      model["probe_repeat_loss"])]

    def on_evaluate(self, ctx: EvalContext) -> None:
        self.calls += 1
        if (self.calls - 1) % self.every:
            return
        dev = ctx.device
        with autocast(dev, ctx.dtype):
            report = measure_heads(ctx.model, self.probe.to(dev), self.val_x.to(dev), self.val_y.to(dev),
                                   ablate=self.ablate)
        self.steps.append(ctx.step)
        self.position_losses.append(report.position_loss)
        ctx.metrics.update(report.model_metrics())
        heads = {role: report.scores[role].round(4).tolist() for role in ROLES}
        record = {"step": ctx.step, "scores": heads,
                  "text_scores": {role: report.text_scores[role].round(4).tolist() for role in ROLES},
                  "model": report.model_metrics(), "position_loss": report.position_loss.round(4).tolist()}
        if report.ablation_probe is not None:
            record["ablation"] = {"probe": report.ablation_probe.round(4).tolist(),
                                  "val": report.ablation_val.round(4).tolist()}
        changes = self.detector.update(ctx.step, report.scores, report.probe_first_loss, report.probe_repeat_loss)
        for change in changes:
            ctx.log.print(f"phase change: {change.message}"
                          + (f"; repeated-half loss now {report.probe_repeat_loss:.2f} "
                             f"(first half {report.probe_first_loss:.2f}) nats/token" if change.head else ""))
        self.changes += [c.to_dict() for c in changes]
        record["phase_changes"] = [c.to_dict() for c in changes]
        ctx.log.metrics(ctx.step, {"heads": record})
        self._write_files(ctx, record)

        writer = ctx.log.writer
        if writer is None:
            return
        if not self.layout_written:
            writer.add_custom_scalars(self.layout())
            self.layout_written = True
        for role in ROLES:
            for (layer, head), v in np.ndenumerate(report.scores[role]):
                writer.add_scalar(f"heads/{role}/{head_name(layer, head)}", float(v), ctx.step)
                # the same number in the head's own TensorBoard run: one colour and one name per head in a chart
                ctx.log.series_scalar(f"{HEAD_RUNS}/{head_name(layer, head)}", f"{HEAD_TAG}/{role}", float(v), ctx.step)
        if report.ablation_probe is not None:
            for name, values in (("probe", report.ablation_probe), ("val", report.ablation_val)):
                for (layer, head), v in np.ndenumerate(values):
                    writer.add_scalar(f"ablation/{name}/{head_name(layer, head)}", float(v), ctx.step)
                    ctx.log.series_scalar(f"{HEAD_RUNS}/{head_name(layer, head)}", f"head ablation/{name}", float(v),
                                          ctx.step)
        for key, v in report.model_metrics().items():
            writer.add_scalar(f"model/{key}", v, ctx.step)
        from attention_lab.interp.figures import FingerprintFrames, figure_to_array, position_loss_figure

        shown = {r: report.scores[r] for r in TRACKED_ROLES}
        if report.ablation_probe is not None:
            shown["ablation (probe repeat, nats)"] = report.ablation_probe
        self.fingerprint = self.fingerprint or FingerprintFrames()
        fingerprint = self.fingerprint.pixels(shown, f"head roles at step {ctx.step} (repeated-tokens probe)")
        writer.add_image("heads/fingerprint", fingerprint, ctx.step, dataformats="HWC")
        fig = position_loss_figure(self.steps, np.stack(self.position_losses), "validation loss by position")
        writer.add_image("model/position_loss_map", figure_to_array(fig), ctx.step, dataformats="HWC")
        if changes:
            writer.add_text("phase_changes", "\n\n".join(c.message for c in changes), ctx.step)

    def layout(self) -> dict:
        """TensorBoard custom-scalars layout: one chart per role (a line per head), ablation, model curves."""
        # a line per head: the heads' own runs (tb/heads/L<l>H<h>/, colour and name per head), not 16 tags of one run
        charts = {role: ["Multiline", [f"^{HEAD_TAG}/{role}$"]] for role in ROLES}
        return {
            "head roles (repeated-tokens probe; a line per head, named in the tooltip)": charts,
            "head ablation (loss change, nats/token; a line per head)": {
                name: ["Multiline", [f"^head ablation/{name}$"]] for name in ("probe", "val")},
            "copying": {"probe halves": ["Multiline", ["model/probe_first_loss", "model/probe_repeat_loss"]],
                        "in-context learning score": ["Multiline", ["model/icl_score"]]},
        }

    def _write_files(self, ctx: EvalContext, record: dict) -> None:
        run = RunLayout(ctx.run_dir)
        run.attention.mkdir(parents=True, exist_ok=True)
        with open(run.heads, "a", encoding="utf-8") as f:
            f.write(json.dumps({k: v for k, v in record.items() if k != "phase_changes"}) + "\n")
        if record["phase_changes"]:
            write_json_atomic(run.phase_changes, self.changes)


class Film(Callback):
    """<run>/attention.html, the training film, rebuilt from what this and every earlier evaluation wrote (after
    metrics.jsonl has the evaluation's line). A page that cannot be built costs a warning, never the run."""

    def __init__(self):
        self.path: Path | None = None
        self.seconds = 0.0  # spent rewriting it this session

    def after_evaluate(self, ctx: EvalContext) -> None:
        t0 = time.time()
        try:
            path = build_film(ctx.run_dir)
        except (OSError, ValueError, KeyError) as e:
            ctx.log.print(f"warning: the attention film was not rewritten: {e}")
            return
        if self.path is None:
            ctx.log.print(f"attention film: {path} (rewritten at every evaluation; open it in a browser)")
        self.path = path
        self.seconds += time.time() - t0


class AttentionShape(Callback):
    """Per layer, on fixed validation windows: the attention entropy (normalised by log of the visible keys: 1 =
    uniform) and the largest pre-softmax score (attention_lab/interp/measures.py). They land in metrics.jsonl and
    TensorBoard as val/attn_entropy_L<l> and val/attn_max_score_L<l>: the softmax saturating and the logits
    growing over training, which the scale claim is about. One forward pass of probe_batch windows."""

    def __init__(self, x: torch.Tensor):
        self.x = x

    def on_evaluate(self, ctx: EvalContext) -> None:
        stats = attention_stats(ctx.model, self.x.to(ctx.device))
        for layer, (entropy, top) in enumerate(zip(stats.entropy, stats.max_score)):
            ctx.metrics[f"attn_entropy_L{layer}"] = round(float(entropy), 5)
            if np.isfinite(top):  # a linear-attention layer has no softmax scores
                ctx.metrics[f"attn_max_score_L{layer}"] = round(float(top), 5)


def build_callbacks(cfg: Config, data: PreparedData, model_cfg: GPTConfig | LSTMConfig,
                    say=print) -> list[Callback]:
    """What runs at every evaluation besides the validation loss (main process only). A model without attention
    (model.arch=lstm) gets the text sample only, and `say` tells once what it skips."""
    tc = cfg.train
    tokenizer = data.tokenizer
    probe_ids = tokenizer.encode(tc.probe_prompt)[-model_cfg.block_size:] or [tokenizer.eot_id]
    sample = TextSample(tokenizer, probe_ids, tc.sample_tokens, tc.seed)
    if not has_attention(model_cfg):
        say("model.arch=lstm has no attention: no attention maps (files or TensorBoard images), head roles, "
            "phase changes, head ablation or attention film for this run")
        return [sample]
    val_x, _ = next(iter(eval_batches(data.tokens("val"), model_cfg.block_size, tc.probe_batch, 1)))
    callbacks = [sample, ProbeAttention(tokenizer, probe_ids), AttentionShape(val_x)]
    if tc.head_roles:
        callbacks.append(head_roles_callback(cfg, data, model_cfg))
    if tc.film:
        callbacks.append(Film())
    if cfg.model.attn_impl:  # a learner's attention: the honest loss beside the loss as trained
        callbacks.append(future_leak_callback(cfg, data, model_cfg))
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
