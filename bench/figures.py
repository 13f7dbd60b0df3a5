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


def _evaluations(draw, evaluations: list[np.ndarray]) -> float:
    """Seconds to draw every layer of each evaluation's weights."""
    t0 = time.perf_counter()
    for step, w in enumerate(evaluations):
        for layer in range(w.shape[0]):
            draw(layer, w[layer], f"layer {layer}, step {step}")
    return time.perf_counter() - t0


def _fingerprint_rows(ctx: Context, cfg: dict, rng: np.random.Generator) -> list[dict]:
    """The head-role fingerprint (the tracked roles and the probe's ablation, as the trainer draws it), fresh
    against FingerprintFrames, per evaluation."""
    from attention_lab.interp.figures import FingerprintFrames, figure_to_array, role_fingerprint_figure
    from attention_lab.interp.roles import TRACKED_ROLES

    rows = []
    for what, n_layer, n_head, _ in SHAPES[2:] if ctx.quick else (SHAPES[0], SHAPES[2]):
        evaluations = [{r: rng.random((n_layer, n_head)) for r in (*TRACKED_ROLES, "ablation (probe repeat, nats)")}
                       for _ in range(cfg["evaluations"])]
        log(f"figures: the fingerprint, {n_layer} layers x {n_head} heads ...")
        fresh, frames = [], []
        for _ in range(cfg["reps"]):
            t0 = time.perf_counter()
            for step, scores in enumerate(evaluations):
                figure_to_array(role_fingerprint_figure(scores, f"head roles at step {step}"))
            fresh.append(time.perf_counter() - t0)
            kept, t0 = FingerprintFrames(), time.perf_counter()
            for step, scores in enumerate(evaluations):
                kept.pixels(scores, f"head roles at step {step}")
            frames.append(time.perf_counter() - t0)
        n = cfg["evaluations"]
        rows.append({"figure": "head-role fingerprint", "shape": what.split(",")[0], "layers": n_layer,
                     "heads": n_head, "tokens": None, "fresh_s": median(fresh) / n, "frames_s": median(frames) / n,
                     "speedup": median(fresh) / median(frames)})
    return rows


def run(ctx: Context) -> Table:
    from attention_lab.interp.figures import AttentionFrames, attention_figure, figure_to_array

    cfg = QUICK if ctx.quick else FULL
    rng = np.random.default_rng(0)
    rows = []
    for what, n_layer, n_head, t in SHAPES[:1] if ctx.quick else SHAPES:
        labels = [f"t{i}" for i in range(t)]
        evaluations = [_weights(rng, n_layer, n_head, t) for _ in range(cfg["evaluations"])]
        log(f"figures: {what}, {n_layer} layers x {n_head} heads, {t} tokens ...")
        fresh, frames = [], []
        for _ in range(cfg["reps"]):  # alternated, so that a busy moment weighs on both
            fresh.append(_evaluations(
                lambda layer, w, title: figure_to_array(attention_figure(w, labels, title, dpi=72)), evaluations))
            kept = AttentionFrames(labels)
            frames.append(_evaluations(lambda layer, w, title: kept.pixels(w, title), evaluations))
        n = cfg["evaluations"]
        rows.append({"figure": "every layer's heatmaps", "shape": what, "layers": n_layer, "heads": n_head, "tokens": t,
                     "fresh_s": median(fresh) / n, "frames_s": median(frames) / n,
                     "speedup": median(fresh) / median(frames)})
    rows += _fingerprint_rows(ctx, cfg, rng)
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
