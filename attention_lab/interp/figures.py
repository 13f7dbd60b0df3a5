"""Attention maps drawn: heatmaps per layer, role fingerprints, loss-by-position and role timelines.

Shapes: L n_layer, nh n_head, T tokens (at most block_size), H x W image pixels.

Side-effect-light on purpose: the trainer calls these at every evaluation (on the film's fixed prompt) and
sample.py calls them once per sample. Nothing here writes files, prints, or touches pyplot's global figure
registry: figures are plain `matplotlib.figure.Figure` objects on an Agg canvas, freed like any object.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure


def token_label(s: str, max_chars: int = 12) -> str:
    """A token string made visible on an axis: whitespace shown, mathtext's '$' escaped, long ones cut."""
    s = s.replace("\n", "↵").replace("\r", "␍").replace("\t", "⇥").replace(" ", "␣")
    if len(s) > max_chars:
        s = s[: max_chars - 1] + "…"
    return s.replace("$", r"\$") if s else "∅"


def label_step(t: int, max_labels: int) -> int:
    """Label every k-th token so that at most max_labels labels share an axis."""
    return max(1, math.ceil(t / max(1, max_labels)))


def attention_figure(
    weights_layer: np.ndarray,
    labels: Sequence[str],
    title: str = "",
    *,
    max_labels: int = 48,
    max_cells: int = 256,
    dpi: int = 80,
) -> Figure:
    """One layer's heads as a grid of heatmaps (query rows, key columns): (nh, T, T) -> Figure.

    Long texts: the whole T x T map is drawn (so diagonals and the first-token column stay visible) and
    every k-th token is labelled, k chosen so that at most `max_labels` labels share an axis; the title says
    when labels were thinned. Beyond `max_cells` tokens, p x p blocks are max-pooled (the title says so), so
    that a one-token-wide diagonal or column never falls between pixels. Colours are sqrt-scaled (PowerNorm 0.5)
    over [0, 1], the same for every head, so small weights stay visible and heads compare; the masked future
    (upper triangle) is light grey.
    Heads share their axes: query labels on the left column, key labels on the bottom row.
    """
    return _attention_layout(weights_layer, labels, title, max_labels=max_labels, max_cells=max_cells, dpi=dpi)[0]


class AttentionFrames:
    """One prompt's heatmaps drawn again and again: every layer at every evaluation, as the trainer does, or every
    layer of one sample, as sample.py does. A layer's figure differs from another's only in its heatmaps and its
    title, so the figure is laid out and its axes, tick labels and colour bar drawn once; each frame redraws only
    the heads' heatmaps and the title over that background (matplotlib's blitting). The pixels are those a fresh
    `attention_figure` draws (tests/test_attention_maps.py); a frame takes 15-90 ms where a fresh figure took
    0.6-1.2 s on 2 AMD EPYC cores (docs/benchmarks.md).
    """

    def __init__(self, labels: Sequence[str], *, max_labels: int = 48, max_cells: int = 256, dpi: int = 72):
        self.labels, self.max_labels, self.max_cells, self.dpi = list(labels), max_labels, max_cells, dpi
        self._layout: tuple | None = None  # (shape and whether titled, figure, images, suptitle, background)

    def pixels(self, weights_layer: np.ndarray, title: str) -> np.ndarray:
        """(nh, T, T) -> RGB pixels (H, W, 3) uint8 of one layer's figure with these weights and this title."""
        w = np.asarray(weights_layer, dtype=np.float32)
        key = (w.shape, bool(title))  # a title takes room above the heads
        if self._layout is None or self._layout[0] != key:  # a first frame (or another shape): lay it out
            fig, images, suptitle = _attention_layout(w, self.labels, title, max_labels=self.max_labels,
                                                      max_cells=self.max_cells, dpi=self.dpi)
            self._layout = (key, fig, images, suptitle, _still_background(fig, (*images, suptitle)))
        _, fig, images, suptitle, background = self._layout
        shown, full_title = _heatmap_values(w, len(self.labels), title, self.max_labels, self.max_cells)
        canvas = fig.canvas
        canvas.restore_region(background)
        for image, values in zip(images, shown):
            image.set_data(np.ma.masked_invalid(values))
            image.axes.draw_artist(image)
        if suptitle is not None:
            suptitle.set_text(full_title)
            _draw_quietly(lambda: fig.draw_artist(suptitle))
        return _rgb(canvas)


def _heatmap_values(w: np.ndarray, t: int, title: str, max_labels: int, max_cells: int) -> tuple[np.ndarray, str]:
    """What the heatmaps show, (nh, n, n) with NaN for the masked future, and the title with its notes."""
    step = label_step(t, max_labels)
    pool = math.ceil(t / max_cells)
    notes = [f"{t} tokens, one label per {step}"] if step > 1 else []
    if pool > 1:
        notes.append(f"max-pooled {pool}x{pool}")
    if notes:
        title = f"{title}  ({'; '.join(notes)})".strip()
    return pool_max(np.where(np.triu(np.ones((t, t), dtype=bool), k=1), np.nan, w), pool), title


def _attention_layout(weights_layer, labels, title, *, max_labels, max_cells, dpi):
    """attention_figure's figure, with the artists a frame redraws: (figure, the heads' images, the suptitle)."""
    w = np.asarray(weights_layer, dtype=np.float32)
    if w.ndim != 3 or w.shape[1] != w.shape[2]:
        raise ValueError(f"attention_figure needs weights of shape (n_head, T, T), got {w.shape}")
    nh, t, _ = w.shape
    if len(labels) != t:
        raise ValueError(f"attention_figure got {len(labels)} labels for {t} tokens")
    step = label_step(t, max_labels)
    ticks = np.arange(0, t, step)
    tick_labels = [token_label(labels[i]) for i in ticks]
    pool = math.ceil(t / max_cells)
    shown, title = _heatmap_values(w, t, title, max_labels, max_cells)  # (nh, n, n); NaN: future
    edge = shown.shape[-1] * pool - 0.5  # the pooled image, in token coordinates

    # Layout in inches, by hand: constrained layout would measure every tick label several times, and the
    # trainer draws these at every evaluation.
    fontsize = 8 if len(ticks) <= 24 else 7
    ncols = min(nh, 4)
    nrows = math.ceil(nh / ncols)
    side = max(2.2, 0.13 * len(ticks))  # heatmap edge: room for one label per tick
    label_room = 0.35 + 0.075 * max(len(s) for s in tick_labels) * fontsize / 8  # tick labels + axis label
    gap, head_title, suptitle, colorbar = 0.2, 0.3, 0.45 if title else 0.1, 1.0
    width = label_room + ncols * side + (ncols - 1) * gap + colorbar
    height = suptitle + nrows * (head_title + side) + (nrows - 1) * gap + label_room
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)

    cmap = colormaps["viridis"].with_extremes(bad="#e6e6e6")
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    images = []
    for h in range(nh):
        row, col = divmod(h, ncols)
        left = label_room + col * (side + gap)
        top = suptitle + head_title + row * (head_title + side + gap)
        ax = fig.add_axes((left / width, 1 - (top + side) / height, side / width, side / height))
        # the heatmap above the ticks (zorder 1 over the axis's 0.5): a frame drawn over the background lands
        # the same pixels where a tick mark meets the image's edge
        images.append(ax.imshow(
            np.ma.masked_invalid(shown[h]), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest",
            extent=(-0.5, edge, edge, -0.5), zorder=1,
        ))
        ax.set_axisbelow(True)
        ax.set_xlim(-0.5, t - 0.5)
        ax.set_ylim(t - 0.5, -0.5)
        ax.spines[:].set_visible(False)  # a frame would cover the first-token column of long texts
        ax.set_title(f"head {h}", fontsize=fontsize + 1, pad=3)
        ax.tick_params(length=2, pad=1)
        if col == 0:
            ax.set_yticks(ticks, tick_labels, fontsize=fontsize)
            ax.set_ylabel("query", fontsize=fontsize + 1)
        else:
            ax.set_yticks([])
        if h + ncols >= nh:  # nothing below it: the bottom of its column
            ax.set_xticks(ticks, tick_labels, rotation=90, fontsize=fontsize)
            ax.set_xlabel("key", fontsize=fontsize + 1)
        else:
            ax.set_xticks([])
    bar_height = min(side, 3.0)
    bar_top = suptitle + head_title + bar_height
    cax = fig.add_axes(((width - colorbar + 0.2) / width, 1 - bar_top / height, 0.15 / width, bar_height / height))
    fig.colorbar(images[-1], cax=cax).set_label("attention weight", fontsize=fontsize)
    cax.tick_params(labelsize=fontsize)
    title_text = fig.suptitle(title, fontsize=fontsize + 3, y=1 - 0.12 / height, va="top") if title else None
    return fig, images, title_text


def pool_max(w: np.ndarray, pool: int) -> np.ndarray:
    """(nh, T, T) -> (nh, n, n), n = ceil(T / pool): the max of each pool x pool block, ignoring NaN."""
    if pool <= 1:
        return w
    nh, t, _ = w.shape
    n = math.ceil(t / pool)
    padded = np.pad(w, ((0, 0), (0, n * pool - t), (0, n * pool - t)), constant_values=np.nan)
    blocks = padded.reshape(nh, n, pool, n, pool)
    # fmax skips NaN (a block wholly in the future stays NaN) without nanmax's all-NaN warnings
    return np.fmax.reduce(np.fmax.reduce(blocks, axis=4), axis=2)


def figure_to_array(fig: Figure) -> np.ndarray:
    """Render a figure to RGB pixels (H, W, 3) uint8, for SummaryWriter.add_image(..., dataformats="HWC")."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    _draw_quietly(canvas.draw)
    return _rgb(canvas)


def _rgb(canvas: FigureCanvasAgg) -> np.ndarray:
    """The canvas's pixels as RGB (H, W, 3) uint8: a copy, the caller's to keep while the canvas is drawn again."""
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _still_background(fig: Figure, moving) -> object:
    """Draw the figure without its `moving` artists (None skipped) and keep those pixels, the background each
    frame restores before it draws them (matplotlib's blitting: animated artists are left out of a full draw)."""
    for artist in moving:
        if artist is not None:
            artist.set_animated(True)
    _draw_quietly(fig.canvas.draw)
    return fig.canvas.copy_from_bbox(fig.bbox)


def _draw_quietly(draw) -> None:
    """Draw without matplotlib's warning for each glyph its font lacks (a token may be any character)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        draw()


def markdown_code(text: str) -> str:
    """Text shown verbatim by TensorBoard's markdown text plugin (an indented code block)."""
    return "\n".join("    " + line for line in text.split("\n"))


def log_attention_to_tensorboard(
    writer,
    weights: np.ndarray,
    labels: Sequence[str],
    step: int,
    tag_prefix: str = "attention",
    *,
    token_ids: Sequence[int] | None = None,
    max_labels: int = 48,
    dpi: int = 72,
    frames: AttentionFrames | None = None,
) -> list[str]:
    """Add one heatmap image per layer to a SummaryWriter: tags `<tag_prefix>/layer_00`, ...

    weights (L, nh, T, T); labels: the T token strings. With token_ids, also add the measured head-role table
    (attention_lab/interp/heads.py) as text under `<tag_prefix>/head_summary`. A caller that logs the same prompt
    again and again passes its `frames` (AttentionFrames of these labels), which draw the figures' still parts
    once. Returns the tags written; the caller flushes/closes the writer.
    """
    w = np.asarray(weights)
    frames = frames or AttentionFrames(labels, max_labels=max_labels, dpi=dpi)
    tags = []
    for layer in range(w.shape[0]):
        tag = f"{tag_prefix}/layer_{layer:02d}"
        writer.add_image(tag, frames.pixels(w[layer], f"layer {layer}, step {step}"), step, dataformats="HWC")
        tags.append(tag)
    if token_ids is not None:
        tag = f"{tag_prefix}/head_summary"
        from attention_lab.interp.heads import format_head_table, head_rows, role_scores

        table = format_head_table(head_rows(role_scores(w, np.asarray(list(token_ids))[-w.shape[-1]:])))
        writer.add_text(tag, markdown_code(table), step)
        tags.append(tag)
    return tags


def role_fingerprint_figure(scores: dict[str, np.ndarray], title: str = "", dpi: int = 72) -> Figure:
    """One small layers x heads grid per role, each cell coloured by its score and labelled with its value."""
    return _fingerprint_layout(scores, title, dpi)[0]


class FingerprintFrames:
    """The trainer's head-role fingerprint at every evaluation: the grids, their titles and head and layer labels
    are laid out and drawn once (for one set of roles at one model shape); each frame redraws only the cells'
    colours and numbers and the title over them, as AttentionFrames does for the heatmaps. The pixels are those
    a fresh `role_fingerprint_figure` draws (tests/test_attention_maps.py)."""

    def __init__(self, dpi: int = 72):
        self.dpi = dpi
        self._layout: tuple | None = None  # (roles and shape, figure, images, cell texts, spines, suptitle, background)

    def pixels(self, scores: dict[str, np.ndarray], title: str) -> np.ndarray:
        """{role: (L, nh)} -> RGB pixels (H, W, 3) uint8 of the fingerprint with these scores and this title."""
        values = {role: np.asarray(v, dtype=np.float64) for role, v in scores.items()}
        key = (tuple(values), next(iter(values.values())).shape, bool(title))
        if self._layout is None or self._layout[0] != key:
            fig, images, texts, suptitle = _fingerprint_layout(values, title, self.dpi)
            spines = [spine for image in images for spine in image.axes.spines.values()]
            background = _still_background(fig, (*images, *texts, *spines, suptitle))
            self._layout = (key, fig, images, texts, spines, suptitle, background)
        _, fig, images, texts, spines, suptitle, background = self._layout
        fig.canvas.restore_region(background)
        cells = iter(texts)
        for image, v in zip(images, values.values()):  # in a fresh figure's order: the cells, the frame, the numbers
            image.set_data(v)
            image.axes.draw_artist(image)
        for spine in spines:
            spine.axes.draw_artist(spine)
        for v in values.values():
            for x in v.flat:
                text = next(cells)
                label, colour = _fingerprint_cell(x)
                text.set_text(label)
                text.set_color(colour)
                _draw_quietly(lambda: text.axes.draw_artist(text))
        if suptitle is not None:
            suptitle.set_text(title)
            _draw_quietly(lambda: fig.draw_artist(suptitle))
        return _rgb(fig.canvas)


def _fingerprint_cell(v: float) -> tuple[str, str]:
    """A fingerprint cell's number (".42", or "1.0" and beyond) and its colour on the magma map."""
    return (f"{v:.2f}"[1:] if 0 <= v < 1 else f"{v:.1f}"), ("white" if v < 0.6 else "black")


def _fingerprint_layout(scores, title, dpi):
    """role_fingerprint_figure's figure, with the artists a frame redraws: (figure, each role's image, the cells'
    texts role by role in row-major order, the suptitle)."""
    roles = list(scores)
    n_layer, n_head = np.asarray(scores[roles[0]]).shape
    cell = 0.42
    side_w, side_h = max(1.6, n_head * cell), max(1.0, n_layer * cell)
    ncols = min(len(roles), 3)
    nrows = math.ceil(len(roles) / ncols)
    width = 0.6 + ncols * (side_w + 0.5)
    height = (0.5 if title else 0.1) + nrows * (side_h + 0.75)
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    images, texts = [], []
    for i, role in enumerate(roles):
        row, col = divmod(i, ncols)
        left = 0.5 + col * (side_w + 0.5)
        top = (0.5 if title else 0.1) + 0.35 + row * (side_h + 0.75)
        ax = fig.add_axes((left / width, 1 - (top + side_h) / height, side_w / width, side_h / height))
        values = np.asarray(scores[role], dtype=np.float64)
        images.append(ax.imshow(values, cmap="magma", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"))
        for (layer, head), v in np.ndenumerate(values):
            label, colour = _fingerprint_cell(v)
            texts.append(ax.text(head, layer, label, ha="center", va="center", fontsize=7, color=colour))
        ax.set_title(role.replace("_", " "), fontsize=9, pad=3)
        ax.set_xticks(range(n_head), [f"H{h}" for h in range(n_head)], fontsize=7)
        ax.set_yticks(range(n_layer), [f"L{layer}" for layer in range(n_layer)], fontsize=7)
        ax.tick_params(length=0, pad=1)
    suptitle = fig.suptitle(title, fontsize=10, y=1 - 0.1 / height, va="top") if title else None
    return fig, images, texts, suptitle


def position_loss_figure(steps: Sequence[int], losses: np.ndarray, title: str = "", dpi: int = 72) -> Figure:
    """Olsson et al.'s picture: loss (colour) at every context position (x) at every evaluation (y)."""
    losses = np.asarray(losses, dtype=np.float64)  # (n_evals, T)
    fig = Figure(figsize=(6.0, max(2.0, 1.2 + 0.18 * len(steps))), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.12, 0.2, 0.72, 0.65))
    image = ax.imshow(losses, cmap="viridis", aspect="auto", interpolation="nearest",
                      extent=(-0.5, losses.shape[1] - 0.5, len(steps) - 0.5, -0.5))
    ax.set_yticks(range(len(steps)), [str(s) for s in steps], fontsize=7)
    ax.set_ylabel("step", fontsize=8)
    ax.set_xlabel("position in the context", fontsize=8)
    ax.tick_params(labelsize=7)
    cax = fig.add_axes((0.87, 0.2, 0.03, 0.65))
    fig.colorbar(image, cax=cax).set_label("loss (nats)", fontsize=8)
    cax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    return fig


def role_timeline_figure(steps: Sequence[int], series: dict[str, Sequence[float]], losses: dict[str, Sequence],
                         marks: Sequence[tuple[int, str]] = (), title: str = "", dpi: int = 80) -> Figure:
    """Role scores over training (top: one line per series, e.g. the strongest head of each role) above the
    losses (bottom: {name: (steps, values)}), with detected phase changes as vertical lines."""
    fig = Figure(figsize=(7.0, 4.6), dpi=dpi)
    FigureCanvasAgg(fig)
    top = fig.add_axes((0.1, 0.5, 0.62, 0.38))
    bottom = fig.add_axes((0.1, 0.1, 0.62, 0.32), sharex=top)
    for name, values in series.items():
        top.plot(steps, values, label=name, linewidth=1.6)
    top.set_ylim(0, 1)
    top.set_ylabel("role score", fontsize=8)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    for name, (xs, ys) in losses.items():
        bottom.plot(xs, ys, label=name, linewidth=1.4)
    bottom.set_ylabel("loss (nats)", fontsize=8)
    bottom.set_xlabel("step", fontsize=8)
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    for ax in (top, bottom):
        ax.tick_params(labelsize=7)
        for step, _ in marks:
            ax.axvline(step, color="crimson", linewidth=0.8, linestyle="--")
    for step, label in marks:
        top.annotate(label, (step, 0.97), fontsize=6.5, color="crimson", rotation=90, ha="right", va="top")
    if title:
        top.set_title(title, fontsize=9)
    return fig
