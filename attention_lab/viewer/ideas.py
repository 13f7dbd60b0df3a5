"""The pictures of `python -m attention_lab.ideas`: one matplotlib Figure per idea, from the numbers
attention_lab/interp/ideas.py measured (and, for positions and the RNN, the claims' published numbers). Nothing
here writes files or prints; figures live on their own Agg canvas (no pyplot registry), as interp/figures.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attention_lab.interp.figures import label_step, token_label
from attention_lab.interp.ideas import Lookup, MaskRow, Residual, ScaleStats, ShuffleTest, position_buckets


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _pair_bars(ax, lk: Lookup, what: str) -> None:
    n_layer, n_head = lk.ab.shape
    x = np.arange(n_layer * n_head)
    ax.bar(x - 0.2, lk.ab.flatten(), 0.4, label="q(a)·k(b): what a looks for, in what b offers")
    ax.bar(x + 0.2, lk.ba.flatten(), 0.4, label="q(b)·k(a): what b looks for, in what a offers")
    ax.axhline(0, color="grey", lw=0.7)
    ax.set_xticks(x, [f"L{layer}H{h}" for layer in range(n_layer) for h in range(n_head)], fontsize=7)
    ax.set_xlabel("head (block L, head H)")
    ax.set_ylabel("score q·k / sqrt(d_k)")
    ax.set_title(what, fontsize=9)
    ax.legend(fontsize=7, loc="best")


def _asymmetry_maps(fig, grid, lk: Lookup, labels: Sequence[str], layer: int, title: str) -> None:
    maps = lk.asymmetry_content[layer]  # (nh, T, T)
    top = max(float(np.abs(maps).max()), 1e-6)
    axes = grid.subplots(1, maps.shape[0], squeeze=False)[0]
    for h, ax in enumerate(axes):
        im = ax.imshow(maps[h], cmap="RdBu_r", vmin=-top, vmax=top, interpolation="nearest")
        ax.set_title(f"L{layer}H{h}", fontsize=8)
        ticks = range(0, len(labels), label_step(len(labels), 24))
        ax.set_xticks(ticks, [token_label(labels[i], 8) for i in ticks], rotation=90, fontsize=6)
        ax.set_yticks(ticks, [token_label(labels[i], 8) for i in ticks] if h == 0 else [], fontsize=6)
        ax.set_xlabel("key j (offers)", fontsize=7)
        for i, j in ((lk.a, lk.b), (lk.b, lk.a)):
            ax.add_patch(_box(j, i))
    axes[0].set_ylabel("query i (looks for)", fontsize=7)
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="S[i, j] - S[j, i]")
    grid.suptitle(title, fontsize=9)


def _box(x: float, y: float):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.2)


def lookup_figure(lk: Lookup, labels: Sequence[str], layer: int, run: str,
                  tied: Lookup | None = None, tied_labels: Sequence[str] | None = None, tied_run: str = "") -> Figure:
    """Bars: q_a·k_b beside q_b·k_a for every head; maps: S - S^T of one block's heads before positions (the
    two tokens boxed); then the same for a qk_tied model when given."""
    rows = 2 if tied is None else 4
    fig = _figure(11, 3.6 * rows)
    grids = fig.subfigures(rows, 1)
    a, b = token_label(labels[lk.a]), token_label(labels[lk.b])
    _pair_bars(grids[0].subplots(), lk, f"{run}: a = '{a}' (token {lk.a}), b = '{b}' (token {lk.b})")
    _asymmetry_maps(fig, grids[1], lk, labels, layer,
                    f"asymmetry before positions, block {layer}: red = i looks for j more than j looks for i")
    if tied is not None:
        ta, tb = token_label(tied_labels[tied.a]), token_label(tied_labels[tied.b])
        _pair_bars(grids[2].subplots(), tied, f"qk_tied model {tied_run}, a = '{ta}', b = '{tb}': k = q, so both "
                                              "bars are equal")
        _asymmetry_maps(fig, grids[3], tied, tied_labels, 0, "qk_tied, block 0: S - S^T is 0 everywhere")
    fig.suptitle("What a word looks for (its query) differs from what it offers (its key)", fontsize=11)
    return fig


def scale_figure(st: ScaleStats, run: str) -> Figure:
    """Left: the spread of the scores with and without 1/sqrt(d_k); right: the softmax's largest weight and
    entropy both ways, per block."""
    fig = _figure(11, 4.2)
    left, mid, right = fig.subplots(1, 3)
    bins = np.linspace(min(st.raw_sample.min(), -1), max(st.raw_sample.max(), 1), 80)
    left.hist(st.raw_sample, bins=bins, alpha=0.6, label=f"q·k (std {st.std_raw.mean():.2f})")
    left.hist(st.scaled_sample, bins=bins, alpha=0.6, label=f"q·k / sqrt({st.d_k}) (std {st.std_scaled.mean():.2f})")
    if st.bound is not None:  # one legend entry for the pair of lines
        for sign in (-1, 1):
            left.axvline(sign * st.bound, color="crimson", ls="--", lw=1,
                         label=f"±{st.bound:g}: QK-norm's bound on q·k / sqrt({st.d_k})" if sign > 0 else None)
    left.set_xlabel("score of a query and a key it sees")
    left.set_ylabel("how many (query, key) pairs")
    left.set_title("the scores' spread", fontsize=9)
    left.set_ylim(0, left.get_ylim()[1] * 1.4)  # room for the legend above the scaled scores' tall peak
    left.legend(fontsize=7, loc="upper left")
    layers = np.arange(len(st.std_raw))
    mid.plot(layers, st.max_weight_raw, "o-", label="without the scale")
    mid.plot(layers, st.max_weight_scaled, "o-", label="with 1/sqrt(d_k) (the model)")
    mid.set_ylim(0, 1.05)
    mid.set_xticks(layers, [f"block {i}" for i in layers])
    mid.set_ylabel("largest weight in a query's row (mean)")
    mid.set_title("softmax: near 1 = one key takes everything", fontsize=9)
    mid.legend(fontsize=7)
    right.plot(layers, st.entropy_raw, "o-", label="without the scale")
    right.plot(layers, st.entropy_scaled, "o-", label="with 1/sqrt(d_k) (the model)")
    right.set_xticks(layers, [f"block {i}" for i in layers])
    right.set_ylabel("entropy of a query's weights (nats, mean)")
    right.set_title("softmax: 0 = all on one key", fontsize=9)
    right.legend(fontsize=7)
    norm = " with QK-norm (|q| = |k| = sqrt(d_k))" if st.qk_norm else ""
    fig.suptitle(f"{run}: d_k = {st.d_k}, the model multiplies q·k by {st.scale:.4g}{norm}", fontsize=10)
    return fig


def meaning_figure(curves: dict[str, np.ndarray], baseline: np.ndarray, similarity: np.ndarray, word: str,
                   run: str) -> Figure:
    """Left: each word's mean cosine across its contexts, layer by layer, and unrelated tokens' (the floor);
    right: one word's context-by-context similarity after the last block."""
    fig = _figure(11, 4.4)
    left, right = fig.subplots(1, 2, width_ratios=(1.4, 1))
    x = np.arange(len(baseline))
    for name, c in curves.items():
        left.plot(x, c, "o-", label=f"'{name}'")
    left.plot(x, baseline, "k--", label="two unrelated tokens (the floor)")
    left.set_xticks(x, ["embedding"] + [f"after block {i}" for i in range(len(x) - 1)], fontsize=8)
    left.set_ylabel("mean cosine between one word's vectors\nin different contexts")
    left.set_ylim(min(0.0, float(baseline.min()) - 0.05), 1.05)
    left.set_title("1 = the same vector whatever the context", fontsize=9)
    left.legend(fontsize=7)
    n = len(similarity)
    im = right.imshow(similarity, cmap="viridis", vmin=min(0.0, float(similarity.min())), vmax=1)
    right.set_xticks(range(n), [f"c{i}" for i in range(n)], fontsize=7)
    right.set_yticks(range(n), [f"c{i}" for i in range(n)], fontsize=7)
    right.set_xlabel("context (printed by the command)")
    right.set_ylabel("context")
    right.set_title(f"'{word}' after the last block: cosine of each pair", fontsize=9)
    fig.colorbar(im, ax=right, shrink=0.8, label="cosine")
    fig.suptitle(f"{run}: context changes a word's vector, block by block", fontsize=10)
    return fig


def positions_figure(sinusoid: np.ndarray, angles: np.ndarray, published: dict[str, dict[str, float]] | None,
                     run: str, shuffle: ShuffleTest | None = None) -> Figure:
    """The shuffle test (block 0's output at the last query, the earlier tokens shuffled, with and without
    positions), the sinusoid table, RoPE's angles (as cos, by position and channel pair), and the positions
    claim's bits/byte per encoding at 1x, 2x and 4x the trained length."""
    fig = _figure(17 if shuffle is not None else 13, 4.4)
    axes = fig.subplots(1, 4 if shuffle is not None else 3)
    if shuffle is not None:
        _shuffle_bars(axes[0], shuffle)
    a, b, c = axes[-3:]
    half = sinusoid.shape[1] // 2  # the sines (even dimensions), then the cosines (odd): each a smooth sweep
    im = a.imshow(np.concatenate([sinusoid[:, 0::2], sinusoid[:, 1::2]], axis=1), aspect="auto", cmap="RdBu_r",
                  vmin=-1, vmax=1, interpolation="nearest")
    a.axvline(half - 0.5, color="black", lw=0.8)
    a.set_xlabel(f"pair i: sin(p·w_i) (left {half}), cos(p·w_i) (right {half})")
    a.set_ylabel("position in the text")
    a.set_title("the sinusoid table, its columns sorted: PE[p, 2i] = sin(p·w_i)\n(left), PE[p, 2i+1] = cos(p·w_i) "
                "(right), w_i = 10000^(-2i/d)", fontsize=9)
    fig.colorbar(im, ax=a, shrink=0.8)
    im = b.imshow(np.cos(angles), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    b.set_xlabel("channel pair i of a head (fast turning on the left)")
    b.set_ylabel("position p")
    b.set_title("RoPE turns pair i by p·base^(-2i/d_k): cos of the angle", fontsize=9)
    fig.colorbar(im, ax=b, shrink=0.8)
    if published:
        lengths = ["1x", "2x", "4x"]
        for arm, values in published.items():
            xs = [i for i, n in enumerate(lengths) if n in values]
            c.plot(xs, [values[lengths[i]] for i in xs], "o-", label=arm)
        c.set_xticks(range(3), ["trained length", "2x", "4x"])
        c.set_xlabel("length of the text scored")
        c.set_ylabel("bits/byte on the test plays (lower is better)")
        c.set_title("claim 'positions' (docs/claims.md), 5 seeds", fontsize=9)
        c.legend(fontsize=7)
    else:
        c.text(0.5, 0.5, "docs/claims.md has no positions table", ha="center", transform=c.transAxes)
        c.set_axis_off()
    fig.suptitle(f"Positions: a set has no order until one is added ({run})", fontsize=10)
    return fig


def _shuffle_bars(ax, sh: ShuffleTest) -> None:
    floor = 1e-8  # a change of exactly 0 has no place on a log scale
    x = np.arange(len(sh.change_off))
    ax.bar(x - 0.2, np.maximum(sh.change_off, floor), 0.4, color="C2", label="positions switched off")
    ax.bar(x + 0.2, np.maximum(sh.change_on, floor), 0.4, color="C3", label=f"with {sh.encoding} (the model)")
    ax.axhline(sh.size, color="grey", ls="--", lw=0.8)
    ax.text(-0.4, sh.size * 1.3, f"length of the output itself ({sh.size:.2f})", fontsize=7, color="grey")
    ax.set_yscale("log")
    ax.set_ylim(floor, sh.size * 10)
    ax.set_xticks(x, [f"shuffle {i + 1}" for i in x], fontsize=7)
    ax.set_ylabel("|change| of the last query's output (log)")
    ax.set_title(f"a set: shuffle the earlier tokens (block {sh.layer},\ntrained weights); no positions, no change",
                 fontsize=9)
    ax.legend(fontsize=7, loc="center right")


def rnn_figure(curves: dict[str, np.ndarray], recall: dict | None, speed: dict[str, float], threads: int, run: str,
               behind: bool = False) -> Figure:
    """Loss by position for the transformer and the LSTM; the recall claim's seeds by distance (recall: arm ->
    {distance: an object with .seeds, .values, .flagged and .median}, attention_lab/ideas/published.py's
    SeedValues), the median drawn; tokens a second."""
    fig = _figure(13, 4.4)
    a, b, c = fig.subplots(1, 3)
    for i, (name, curve) in enumerate(curves.items()):
        pos = np.arange(1, len(curve) + 1)
        a.plot(pos, curve, lw=0.6, alpha=0.3, color=f"C{i}")
        ends, means = position_buckets(curve)
        a.plot(ends, means, "o-", color=f"C{i}", label=f"{name} (dots: mean over 1, 2, 3-4, 5-8, ...)")
    a.set_xscale("log", base=2)
    a.set_xlabel("position in the context (tokens seen)")
    a.set_ylabel("loss on held-out text (nats/token)")
    a.set_title("loss by position: does more context help?", fontsize=9)
    a.legend(fontsize=7)
    if behind:
        a.text(0.5, 0.5, "the LSTM is too undertrained to compare:\nits loss is far above at every position",
               transform=a.transAxes, ha="center", fontsize=8, color="crimson")
    if recall:
        _recall_panel(b, recall)
    else:
        b.text(0.5, 0.5, "docs/claims/ has no recall results", ha="center", transform=b.transAxes)
        b.set_axis_off()
    names = list(speed)
    c.bar(names, [speed[n] for n in names], color=["C0", "C1"][: len(names)])
    for i, n in enumerate(names):
        c.text(i, speed[n], f"{speed[n]:,.0f}", ha="center", va="bottom", fontsize=8)
    c.set_ylabel("tokens a second, forward + backward")
    c.set_title(f"training speed here, {threads} thread(s) each", fontsize=9)
    fig.suptitle(f"Attention against an LSTM of equal parameters ({run})", fontsize=10)
    return fig


RECALL_TOP = 6.0  # bits per recalled item; a seed above it is drawn at the edge with its value written


def _recall_panel(ax, recall: dict) -> None:
    """Each arm's median over its seeds by distance (the line), every seed a dot, a seed the claim's outlier rule
    flagged a cross; a seed off the top is drawn at the top with its value."""
    for i, (arm, pts) in enumerate(recall.items()):
        d = sorted(pts)
        ax.plot(d, [pts[x].median for x in d], "o-", color=f"C{i}", label=f"{arm}: median of the seeds")
        for x in d:
            for k, (seed, v, bad) in enumerate(zip(pts[x].seeds, pts[x].values, pts[x].flagged)):
                xs = x * 2 ** ((k - (len(pts[x].values) - 1) / 2) * 0.06)  # spread the seeds a little apart
                ax.plot(xs, min(v, RECALL_TOP), "x" if bad else ".", color="crimson" if bad else f"C{i}",
                        ms=7 if bad else 4, alpha=0.9 if bad else 0.5)
                if v > RECALL_TOP:
                    ax.annotate(f"seed {seed}: {v:.1f}", (xs, RECALL_TOP), textcoords="offset points", xytext=(-4, -10),
                                ha="right", fontsize=7, color="crimson")
    ax.plot([], [], "x", color="crimson", label="a flagged seed (far from its arm)")
    ax.axhline(4.0, color="grey", ls="--", lw=0.8)
    ax.text(min(min(p) for p in recall.values()), 4.1, "chance: 4 bits", fontsize=7, va="bottom")
    ax.set_ylim(-0.2, RECALL_TOP + 0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distance d: the one letter to recall is d tokens back")
    ax.set_ylabel("bits per recalled item (0 = perfect)")
    seeds = max(len(p.values) for pts in recall.values() for p in pts.values())
    ax.set_title(f"claim 'recall' (docs/claims.md), {seeds} seeds each:\nthe line is their median, a dot each seed",
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower right")


def mask_figure(row: MaskRow, labels: Sequence[str], run: str) -> Figure:
    """Left: the head's scores with the future grey (-inf), the query's row boxed; then that row's scores; its
    weights three ways on a log scale (the model's -inf, the future's weights zeroed after a softmax over every
    key, the future's scores 0); right: what each way's row sums to, the visible keys' part and the future's."""
    fig = _figure(19, 4.8)
    a, b, c, d = fig.subplots(1, 4, width_ratios=(1, 1, 1.3, 0.6))
    s = np.where(np.isfinite(row.scores_all), row.scores_all, np.nan)
    im = a.imshow(s, cmap="viridis", interpolation="nearest")
    a.set_facecolor("#d9d9d9")
    t = len(labels)
    a.add_patch(_box_row(row.query, t))
    ticks = range(t)
    names = [token_label(s_, 8) for s_ in labels]
    a.set_xticks(ticks, names, rotation=90, fontsize=6)
    a.set_yticks(ticks, names, fontsize=6)
    a.set_xlabel("key j (grey: the future, score -inf)")
    a.set_ylabel("query i")
    a.set_title(f"block {row.layer}, head {row.head}: every score", fontsize=9)
    fig.colorbar(im, ax=a, shrink=0.8, label="score")
    x = np.arange(t)
    future = x > row.query
    b.bar(x[~future], row.scores[~future], 0.6, color="C0")
    for j in x[future]:
        b.text(j, 0.0, "-inf", rotation=90, fontsize=7, ha="center", va="bottom", color="crimson")
    b.axvspan(row.query + 0.5, t - 0.5, color="#eeeeee", zorder=0)
    b.axhline(0, color="grey", lw=0.7)
    b.set_xticks(x, names, rotation=90, fontsize=6)
    b.set_xlabel("key (shaded: after the query, hidden by the mask)")
    b.set_ylabel("score (softmax's input)")
    b.set_title(f"the row of query {row.query} '{token_label(labels[row.query])}': scores", fontsize=9)
    floor = 1e-5  # an exact 0 has no place on a log scale: drawn as a bar to the floor, labelled
    ways = ((row.weights, "C1", "-inf before the softmax (the model)"),
            (row.weights_after, "C4", "0 after the softmax (weights zeroed)"),
            (row.weights_zero, "crimson", "a score of 0 before it, instead of -inf"))
    for i, (w, color, label) in enumerate(ways):
        c.bar(x + (i - 1) * 0.27, np.maximum(w, floor), 0.27, color=color, alpha=0.85, label=label)
    for j in x[future]:
        c.text(j - 0.135, floor * 1.5, "0 exactly", rotation=90, fontsize=6, ha="center", va="bottom", color="C1")
    c.set_yscale("log")
    c.set_ylim(floor, 30)  # room above the tallest bar for the legend
    c.axvspan(row.query + 0.5, t - 0.5, color="#eeeeee", zorder=0)
    c.set_xticks(x, names, rotation=90, fontsize=6)
    c.set_xlabel("key (shaded: after the query)")
    c.set_ylabel("weight after softmax (log scale)")
    c.set_title("each key's weight: zeroed after the softmax, every visible\nweight shrinks; with scores of 0 the "
                "future takes some", fontsize=9)
    c.legend(fontsize=7, loc="upper left")
    kinds = ["-inf\nbefore", "0 after", "score 0\nbefore"]
    seen = [float(w[~future].sum()) for w, _, _ in ways]
    taken = [float(w[future].sum()) for w, _, _ in ways]
    d.bar(kinds, seen, color="C0", label="the visible keys' weights")
    d.bar(kinds, taken, bottom=seen, color="crimson", alpha=0.7, label="the future keys' weights")
    for i, (v, f) in enumerate(zip(seen, taken)):
        d.text(i, v + f + 0.02, f"{v:.3f}" + (f"\n+ {f:.3f}" if f > 0 else ""), ha="center", va="bottom", fontsize=7)
    d.axhline(1.0, color="grey", ls="--", lw=0.8)
    d.set_ylim(0, 1.35)
    d.set_ylabel("the row's weights, summed")
    d.set_title(f"what the row sums to; zeroed after,\nthe sum still moves with the future's\nscores "
                f"(d sum / d scores = {row.after_grad[future].sum():.2f})", fontsize=8)
    d.legend(fontsize=6, loc="upper right")
    fig.suptitle(f"The causal mask: -inf before the softmax, not 0 after it ({run})", fontsize=10)
    return fig


def _box_row(query: int, t: int):
    from matplotlib.patches import Rectangle

    return Rectangle((-0.5, query - 0.5), t, 1, fill=False, edgecolor="crimson", lw=1.5)


def residual_figure(res: Residual, lens_words: Sequence[Sequence[str]], labels: Sequence[str], run: str) -> Figure:
    """Left: the size of the embedding and of what each attention and MLP adds, and the stream's own size;
    right: the logit lens's top next token after the embeddings and each block, at every position (colour: its
    probability)."""
    n = len(res.attn_norm)
    fig = _figure(13, 4.8)
    a, b = fig.subplots(1, 2, width_ratios=(1, 2))
    names = ["embedding"] + [f"{kind} {i}" for i in range(n) for kind in ("attn", "MLP")]
    values = [res.embed_norm] + [v for i in range(n) for v in (res.attn_norm[i], res.mlp_norm[i])]
    colors = ["grey"] + ["C0", "C1"] * n
    a.bar(range(len(values)), values, color=colors)
    a.plot(np.arange(n + 1) * 2, res.stream_norm, "k.-", label="the stream itself (entering\neach block; last: leaving)")
    a.set_xticks(range(len(values)), names, rotation=60, fontsize=7)
    a.set_ylabel("mean length of the vector added (per token)")
    a.set_title("what each sublayer adds to the residual stream", fontsize=9)
    a.legend(fontsize=7, loc="center right")
    probs = res.lens.probs[:, :, 0]  # (L + 1, T)
    t = probs.shape[1]
    im = b.imshow(probs, cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    for layer, words in enumerate(lens_words):
        for i, w in enumerate(words):
            b.text(i, layer, token_label(w, 7), ha="center", va="center", fontsize=6, rotation=90,
                   color="white" if probs[layer, i] > 0.6 else "black")
    b.set_yticks(range(n + 1), ["embedding"] + [f"after block {i}" for i in range(n)], fontsize=7)
    b.set_xticks(range(t), [token_label(s, 8) for s in labels], rotation=90, fontsize=6)
    b.set_xlabel("input token (the prediction is for the token after it)")
    b.set_title("logit lens: the top next token read off the stream at each depth", fontsize=9)
    fig.colorbar(im, ax=b, shrink=0.8, label="its probability")
    fig.suptitle(f"The residual stream through the blocks ({run})", fontsize=10)
    return fig


def warmup_figure(steps: np.ndarray, lr: np.ndarray, muon: np.ndarray | None, logged: tuple | None,
                  warmup_steps: int, run: str, phases: tuple[int, int] | None = None,
                  muon_ratio: float | None = None, pauses: Sequence[tuple[int, float]] | None = None) -> Figure:
    """The schedule the run followed (the rates it logged) as the main curve, the planned one (lr_at at every
    step of max_steps) faint behind it; Muon's rate (the same shape, muon_ratio times larger) on the right axis,
    scaled so it lies on AdamW's curve: AdamW's is drawn wide and pale, Muon's thin and dashed on top, so both
    show. pauses: (step, seconds) of the evaluations of a run whose schedule followed a time budget's clock,
    marked where the logged rate drops across one. Without logged rates the plan is drawn plainly."""
    fig = _figure(9, 4.8)
    ax = fig.subplots()
    if logged is not None:
        ax.plot(logged[0], logged[1], "-", lw=4, color="C0", alpha=0.5, solid_capstyle="butt",
                label="AdamW's rate as the run followed it (logged)")
        ax.plot(steps, lr, lw=1.2, color="C0", alpha=0.35, ls="--",
                label=f"the plan, step by step over {len(steps)} steps (lr_at): not followed")
        if phases is not None:
            ax.axvspan(0, phases[0], color="#fde7c8", zorder=0, label=f"warmup as followed: to step {phases[0]}")
            ax.axvline(phases[1], color="grey", lw=0.8, ls=":")
            ax.text(phases[1], ax.get_ylim()[1] * 0.5, f"decay from about step {phases[1]} ", fontsize=7, ha="right")
        marked = [(s, sec) for s, sec in (pauses or ()) if logged[0][0] <= s < logged[0][-1]]
        if marked:
            at = np.interp([s for s, _ in marked], logged[0], logged[1])  # a little above, not on the drop
            ax.plot([s for s, _ in marked], at + 0.06 * float(np.max(logged[1])), "v", color="black", ms=6, ls="none",
                    label=f"an evaluation (about {np.mean([sec for _, sec in marked]):.0f} s, no training step): the "
                          "schedule follows\nthe clock and moves on meanwhile, so in the decay the rate drops there")
    else:
        ax.plot(steps, lr, label="AdamW's rate (lr_at; the run logged none)", lw=1.6)
        ax.axvspan(0, warmup_steps, color="#fde7c8", zorder=0, label=f"warmup: {warmup_steps} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("AdamW learning rate")
    if muon is not None:
        right = ax.twinx()
        times = f" ({muon_ratio:g}x AdamW's)" if muon_ratio is not None else ""
        muon_label = (f"Muon's rate{times}, read on the right axis:\nthe same shape, dashed on AdamW's"
                      if muon_ratio is not None else "Muon's rate (right axis)")
        if logged is not None and muon_ratio is not None:
            right.plot(logged[0], logged[1] * muon_ratio, color="C3", lw=1.2, ls="--", label=muon_label)
        else:
            right.plot(steps, muon, color="C3", lw=1.2, ls="--", label=muon_label)
        if muon_ratio is not None:  # the same shape: one curve read on either axis
            low, high = ax.get_ylim()
            right.set_ylim(low * muon_ratio, high * muon_ratio)
        right.set_ylabel("Muon learning rate (the blocks' matrices)")
    # one legend below the plot, for both axes: inside it would cover the curves' ends
    handles = [h for a in fig.axes for h in a.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=2)
    ax.set_title(f"The learning-rate schedule of {run}", fontsize=10)
    return fig
