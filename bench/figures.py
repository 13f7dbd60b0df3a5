"""The trainer's TensorBoard heatmaps at each evaluation: every layer's figure drawn from nothing, against the
frames the trainer draws (attention_lab.interp.figures.AttentionFrames: axes and labels drawn once, the heatmaps
and title redrawn over them).

Shapes: the default CPU model's (4 layers of 4 heads) and the debug preset's (2 of 2), on the film's prompt
(train.probe_prompt, about 20 tokens) and on a 128-token one. Random causal weights stand in for a model's: the
figures' cost does not depend on the values.
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
        rows.append({"shape": what, "layers": n_layer, "heads": n_head, "tokens": t,
                     "fresh_s": median(fresh) / n, "frames_s": median(frames) / n,
                     "speedup": median(fresh) / median(frames)})
    return Table(
        name="figures",
        title="TensorBoard heatmaps per evaluation: drawn from nothing vs the trainer's frames",
        machine=ctx.machine,
        columns=[Column("shape", "shape"), Column("layers", "layers"), Column("heads", "heads per layer"),
                 Column("tokens", "tokens"), Column("fresh_s", "fresh figures, s per evaluation", "{:.3f}"),
                 Column("frames_s", "frames, s per evaluation", "{:.3f}"), Column("speedup", "ratio", "{:.1f}x")],
        rows=rows,
        notes=[f"{cfg['evaluations']} evaluations in a row, every layer's figure each time; the median of "
               f"{cfg['reps']} alternated repetitions, per evaluation. The frames' first evaluation lays the "
               "figures out and draws them whole, which is in their time.",
               "The frames' pixels equal a fresh figure's (tests/test_attention_maps.py)."],
    )
