"""The trainer's TensorBoard figures at each evaluation: each drawn from nothing, against the frames the trainer
draws (attention_lab.interp.figures: AttentionFrames for every layer's heatmaps, FingerprintFrames for the head-role
fingerprint; axes and labels drawn once, what changes redrawn over them).

Shapes: the default CPU model's (4 layers of 4 heads) and the debug preset's (2 of 2); the heatmaps on the film's
prompt (train.probe_prompt, about 20 tokens) and on a 128-token one. Random weights and scores stand in for a
model's: the figures' cost does not depend on the values.
"""

from __future__ import annotations

import time

import numpy as np

from .common import Column, Context, Table, log, median

FULL = dict(reps=3, evaluations=4)
QUICK = dict(reps=1, evaluations=2)
SHAPES = (("default CPU model, the film's prompt", 4, 4, 20), ("default CPU model, 128 tokens", 4, 4, 128),
          ("debug preset, the film's prompt", 2, 2, 20))


def _weights(rng: np.random.Generator, n_layer: int, n_head: int, t: int) -> np.ndarray:
    w = np.tril(rng.random((n_layer, n_head, t, t), dtype=np.float32))
    return w / w.sum(-1, keepdims=True)


def _timed(draw, evaluations: list) -> float:
    """Seconds for draw(step, evaluation) over the evaluations, in order."""
    t0 = time.perf_counter()
    for step, evaluation in enumerate(evaluations):
        draw(step, evaluation)
    return time.perf_counter() - t0


def _fresh_against_frames(fresh, frames, evaluations: list, reps: int) -> dict:
    """fresh(step, evaluation) draws an evaluation from nothing; frames() makes a new drawer of the same signature
    over a kept layout (its first evaluation lays it out). Seconds per evaluation, medians of alternated reps."""
    fresh_s, frames_s = [], []
    for _ in range(reps):  # alternated, so that a busy moment weighs on both
        fresh_s.append(_timed(fresh, evaluations))
        frames_s.append(_timed(frames(), evaluations))
    n = len(evaluations)
    return {"fresh_s": median(fresh_s) / n, "frames_s": median(frames_s) / n,
            "speedup": median(fresh_s) / median(frames_s)}


def _heatmap_rows(ctx: Context, cfg: dict, rng: np.random.Generator) -> list[dict]:
    """Every layer's heatmaps on the film's prompt (and a longer one), fresh against AttentionFrames."""
    from attention_lab.interp.figures import AttentionFrames, attention_figure, figure_to_array

    def every_layer(draw):
        return lambda step, w: [draw(w[layer], f"layer {layer}, step {step}") for layer in range(len(w))]

    rows = []
    for what, n_layer, n_head, t in SHAPES[:1] if ctx.quick else SHAPES:
        labels = [f"t{i}" for i in range(t)]
        evaluations = [_weights(rng, n_layer, n_head, t) for _ in range(cfg["evaluations"])]
        log(f"figures: {what}, {n_layer} layers x {n_head} heads, {t} tokens ...")
        times = _fresh_against_frames(
            every_layer(lambda w, title: figure_to_array(attention_figure(w, labels, title, dpi=72))),
            lambda: every_layer(AttentionFrames(labels).pixels), evaluations, cfg["reps"])
        rows.append({"figure": "every layer's heatmaps", "shape": what, "layers": n_layer, "heads": n_head,
                     "tokens": t} | times)
    return rows


def _fingerprint_rows(ctx: Context, cfg: dict, rng: np.random.Generator) -> list[dict]:
    """The head-role fingerprint (the tracked roles and the probe's ablation, as the trainer draws it), fresh
    against FingerprintFrames."""
    from attention_lab.interp.figures import FingerprintFrames, figure_to_array, role_fingerprint_figure
    from attention_lab.interp.roles import TRACKED_ROLES

    def kept_fingerprint():
        kept = FingerprintFrames()
        return lambda step, scores: kept.pixels(scores, f"head roles at step {step}")

    rows = []
    for what, n_layer, n_head, _ in SHAPES[2:] if ctx.quick else (SHAPES[0], SHAPES[2]):
        evaluations = [{r: rng.random((n_layer, n_head)) for r in (*TRACKED_ROLES, "ablation (probe repeat, nats)")}
                       for _ in range(cfg["evaluations"])]
        log(f"figures: the fingerprint, {n_layer} layers x {n_head} heads ...")
        times = _fresh_against_frames(
            lambda step, scores: figure_to_array(role_fingerprint_figure(scores, f"head roles at step {step}")),
            kept_fingerprint, evaluations, cfg["reps"])
        rows.append({"figure": "head-role fingerprint", "shape": what.split(",")[0], "layers": n_layer,
                     "heads": n_head, "tokens": None} | times)
    return rows


def run(ctx: Context) -> Table:
    cfg = QUICK if ctx.quick else FULL
    rng = np.random.default_rng(0)
    rows = _heatmap_rows(ctx, cfg, rng) + _fingerprint_rows(ctx, cfg, rng)
    return Table(
        name="figures",
        title="TensorBoard figures per evaluation: drawn from nothing vs the trainer's frames",
        machine=ctx.machine,
        columns=[Column("figure", "figure"), Column("shape", "shape"), Column("layers", "layers"), Column("heads", "heads per layer"),
                 Column("tokens", "tokens"), Column("fresh_s", "fresh figures, s per evaluation", "{:.3f}"),
                 Column("frames_s", "frames, s per evaluation", "{:.3f}"), Column("speedup", "ratio", "{:.1f}x")],
        rows=rows,
        notes=[f"{cfg['evaluations']} evaluations in a row: every layer's heatmaps, or the fingerprint, each time; "
               f"the median of {cfg['reps']} alternated repetitions, per evaluation. The frames' first evaluation "
               "lays the figure out (one for all the layers) and draws it whole, which is in their time.",
               "The frames' pixels equal a fresh figure's (tests/test_attention_maps.py)."],
    )
