"""Interactive attention pages: one self-contained HTML file per sample, and a run's training film.

    python -m attention_lab.viewer runs/<name>/<time>          # the run's film -> <run>/attention.html
    python -m attention_lab.viewer runs/<name>/<time>/samples/<time>   # a sample folder: the page sample.py wrote
    python -m attention_lab.viewer <sample folder> --checkpoint <ckpt>    # ... recomputed whole from its tokens

A sample folder's page comes back from page.json (what it shows beyond attention.npy) byte for byte; a folder
without one (sample.py --no-html, or made by hand) gets the maps and summary.json's scores, but never in place of
a page that shows more: that is refused with the --checkpoint command that rebuilds it whole.

A page is one file: the template, style and script of attention_lab/viewer/assets/ and one JSON data island
filled here. Nothing is fetched at view time, so it opens from disk, offline, in any recent browser.

Shapes: L n_layer, nh n_head, T tokens. Attention travels as uint8 levels q = round(255 * sqrt(w)) of each head's
lower triangle (the T (T + 1) / 2 weights a causal head can hold, row by row), base64-encoded: one byte instead of
four, half the matrix, and the square root keeps small weights apart where the eye looks (the colours are
sqrt-scaled, as in the PNGs of attention_maps.py, on a white-to-blue scale: _colormap). A weight comes back as (q / 255)^2, within 1/255 of itself.

The film reads what the trainer writes at every evaluation; every part may be missing (the page says which):

    attention/probe.json            {"tokens": [str], "ids": [int], "description": str}
    attention/step_XXXXXXXX.npy     float16 (L, nh, T, T): the film's prompt's attention at that step
    attention/heads.jsonl           per evaluation {"step", "scores": {role: L x nh}, "ablation": {"probe", "val"},
                                    "model": {"probe_first_loss", "probe_repeat_loss", "icl_score"}}
    attention/phase_changes.json    [{"step", "head", "metric", "before", "after", "message"}]
    metrics.jsonl                   {"step", "loss", ...} (training) and {"step", "val_loss", "val_bpb", ...}
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from attention_lab.interp.roles import LABEL_ROLES, LABEL_THRESHOLD, MEASURES, MIXED, Role, role_labels
from attention_lab.runtime import cli
from attention_lab.store.layout import RunLayout, SampleLayout
from data.files import atomic_write, human_bytes

ASSETS = "assets"
SCRIPTS = ("explorer.js", "charts.js", "inside.js", "main.js")  # concatenated in this order into the page's one script
# the live lab's page: the same scripts and lab.js, which main.js's boot (last: it runs on load) hands the page to
LAB_SCRIPTS = ("explorer.js", "charts.js", "inside.js", "lab.js", "main.js")
# Raw bytes of attention levels a film may hold (base64 adds a third): about 4.8 MB of page, so a film stays under
# 5 MB; beyond it, evaluations are dropped evenly (the first, the last and phase changes kept). A 6-layer, 6-head
# model on a 128-token probe needs 297 kB per evaluation.
FILM_MAX_BYTES = 3_600_000
# probe.json descriptions the subtitle need not repeat: the default's, and an older run's name for the film's prompt
# ("probe" alone names the repeated-tokens probe of the head roles)
UNSAID = ("", "the film's prompt", "the probe prompt")
# A sample page keeps every weight up to this many bytes (a 6 x 6 model at 512 tokens needs 4.7 MB); past it,
# only the last tokens that fit are shown.
SAMPLE_MAX_BYTES = 48_000_000
MAX_TRAIN_POINTS = 1500  # training-loss points in the film's chart (every k-th line of metrics.jsonl)

# ------------------------------------------------------------------------------------------------------------
# encoding


def quantise(weights: np.ndarray) -> np.ndarray:
    """(L, nh, T, T) attention -> uint8 (L, nh, T (T + 1) / 2): round(255 sqrt(w)) of each lower triangle, row by
    row (row q holds keys 0..q). NaN counts as 0; weights are clipped to [0, 1]."""
    w = np.asarray(weights, dtype=np.float32)
    t = w.shape[-1]
    rows, cols = np.tril_indices(t)
    tri = np.nan_to_num(w[..., rows, cols], nan=0.0).clip(0.0, 1.0)
    return np.rint(np.sqrt(tri) * 255.0).astype(np.uint8)


def dequantise(levels: np.ndarray, t: int) -> np.ndarray:
    """The inverse of quantise, up to rounding: uint8 (..., T (T + 1) / 2) -> float32 (..., T, T), zero above the
    diagonal."""
    levels = np.asarray(levels)
    out = np.zeros(levels.shape[:-1] + (t, t), dtype=np.float32)
    rows, cols = np.tril_indices(t)
    out[..., rows, cols] = (levels.astype(np.float32) / 255.0) ** 2
    return out


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


# The maps' colour scale, every page's (sample pages, the film, the live lab): matplotlib's name and the words the
# legend says it in. The words travel in the page beside the colours (data "colormap_words"), so a legend never
# names colours its maps are not drawn in (issue 42's walk: a film written while the scale was viridis said
# "white 0, dark blue 1" over purple-to-yellow maps).
COLOUR_SCALE = ("Blues", "white 0, dark blue 1")


def _colormap() -> str:
    """The maps' colours at 256 levels (RGB uint8, base64), indexed by the sqrt level directly: COLOUR_SCALE,
    white (weight 0) to dark blue (1). A light background keeps the many near-zero weights quiet and the sqrt
    level lifts the small ones, so a thumbnail's stripes and columns show at a glance (the legend says so)."""
    from matplotlib import colormaps

    rgb = colormaps[COLOUR_SCALE[0]](np.linspace(0.0, 1.0, 256))[:, :3]
    return _b64(np.rint(rgb * 255).astype(np.uint8))


def _finite(x):
    """Nested lists of numbers with NaN/inf as None (JSON has no NaN) and 4 decimals."""
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return round(v, 4) if math.isfinite(v) else None


def json_safe(obj):
    """obj as JSON can carry it: numpy arrays and scalars as lists and numbers, every non-finite float as None
    (JSON has no NaN or infinity), keys as strings. The pages' islands and the live lab's answers."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def role_info(roles) -> dict:
    """{role: {"short", "label", "unit", "help"}} in the role table's order (attention_lab/interp/roles.py), then
    any others in the order given."""
    roles = list(dict.fromkeys(roles))
    ordered = [r for r in MEASURES if r in roles] + [r for r in roles if r not in MEASURES]
    out = {}
    for name in ordered:
        m = MEASURES.get(name) or Role(name, name[:6], name.replace("_", " "), "",
                                       "nats" if name.startswith("ablation") else "score")
        out[name] = {"short": m.short, "label": m.label, "unit": m.unit, "help": m.help}
    return out


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(ASSETS, name).read_text(encoding="utf-8")


def render_page(data: dict, title: str, *, lab: bool = False) -> str:
    """The page: the template with its style, script, title and the JSON data island filled in. lab: the live
    lab's page (lab_page): the template's lab section (assets/lab.html) and lab.js join the same components."""
    # "<" escaped as \u003c: no "</script>" or "<!--" inside the island can end it early, whatever the tokens say
    island = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    fills = {
        "title": html.escape(title),
        "kind": html.escape(data["kind"]),
        "style": _asset("viewer.css"),
        # the lab is served over HTTP, where a browser asks for /favicon.ico unless the page names an (empty) icon
        "head": '<link rel="icon" href="data:,">\n' if lab else "",
        "lab": _asset("lab.html") if lab else "",
        "script": "\n".join(_asset(name) for name in (LAB_SCRIPTS if lab else SCRIPTS)),
        "data": island,
        # the role filter starts where the model view's label starts: one threshold, roles.LABEL_THRESHOLD
        "threshold": f"{LABEL_THRESHOLD:g}",
    }
    # one pass over the template only: nothing filled in is searched for markers again
    return re.sub(r"\{\{(\w+)\}\}", lambda m: fills[m.group(1)], _asset("page.html"))


# The lab's example text: in the box and analysed when the page opens (a first look with maps, issue 42's walk
# found an empty page), and behind the "try an example" button. 57 characters: it fits a context of 64.
LAB_EXAMPLE = "ROMEO: But soft, what light through yonder window breaks?"


def lab_page(limits: Mapping | None = None, *, title: str = "attention lab", text: str = LAB_EXAMPLE) -> str:
    """The live lab's page (attention_lab/lab serves it at GET /): the sample page's template, style and
    components, with the lab's section and lab.js. Its data island holds no text's data, only {"kind": "lab",
    "limits", "text", "example"}: every answer of the server's /api/analyze (a sample page's island plus `live`,
    docs/lab.md) is rendered into the same components in place. limits: the server's input bounds (shown next to
    the inputs); text: what the text box holds when the page opens, analysed at once (default: LAB_EXAMPLE, so the
    first look shows maps; typing replaces it; empty: nothing until the user types). Nothing is fetched but the
    lab's own /api."""
    data = {"kind": "lab", "subtitle": "type a text: every pause redraws the maps", "notes": [],
            "limits": json_safe(dict(limits or {})), "text": str(text), "example": LAB_EXAMPLE}
    return render_page(data, title, lab=True)


# ------------------------------------------------------------------------------------------------------------
# one sample


def label_rule() -> dict:
    """The model view's label rule, as the legend states it (roles.role_label): the roles that may name a head
    (short names), the threshold and the word for none."""
    names = {"previous_token": "previous token", "duplicate_token": "duplicate token", "induction": "induction",
             "first_token": "first token", "self": "self", MIXED: MIXED}
    return {"threshold": LABEL_THRESHOLD, "roles": [MEASURES[r].short for r in LABEL_ROLES], "none": MIXED,
            "names": {r: names.get(r, r.replace("_", " ")) for r in (*LABEL_ROLES, MIXED)}}


def score_record(step, roles: dict) -> dict:
    """One evaluation's scores for the page: {"step", "roles": {role: L x nh}, "labels": L x nh role names (or
    "mixed"), roles.role_label of each head; [] when no labelling role was measured}."""
    return {"step": step, "roles": roles, "labels": role_labels(roles)}


def moving_role(scores: Sequence[Mapping]) -> str | None:
    """The role the film's head-role chart opens on: of the roles that label heads (LABEL_ROLES), the one whose
    curves move most over the run, max over heads of (largest - smallest score across the evaluations). A role
    no head moves in is a flat line near 0 (induction, in a default run that grows no induction head); None
    without two evaluations to compare."""
    best, best_range = None, 0.0
    for role in LABEL_ROLES:
        series = [np.asarray(r["roles"][role], dtype=float) for r in scores if role in r.get("roles", {})]
        if len(series) < 2:
            continue
        stack = np.stack(series)  # (evaluations, L, nh); a score not measured is NaN and left out
        moved = np.fmax.reduce(stack, axis=0) - np.fmin.reduce(stack, axis=0)
        moved = moved[np.isfinite(moved)]
        spread = float(moved.max()) if moved.size else 0.0
        if spread > best_range:
            best, best_range = role, spread
    return best


# where a sample page opens, in one line (the page says it under the head view; opening_view computes it)
OPENING_RULE = ("two thirds of the way up the layers, at the last whole word (a token of two or more letters not "
                "glued to a letter of the token before or after it) at or before three quarters of the text")
_ESCAPE = re.compile(r"\\(?:x[0-9a-fA-F]{2}|[ntr])")  # token_strings' escapes: \n, \t, \r, \xe2 are no letters


def opening_view(tokens: Sequence[str], n_layer: int) -> dict:
    """Where a sample page opens: {"layer", "query", "rule"} (OPENING_RULE). Layer floor(2 L / 3): layer 0 mostly
    reads the token itself (issue 42's walk opened on it, at a newline, and met heads reading "self"); a later
    layer reads further back. The query: the last whole word at index <= 3 (T - 1) / 4 (two or more letters, not
    glued to a letter of its neighbours: " bear" in " bear|,", not "ors" in "maw|ors"), so keys after it stay to
    be seen at -inf in step inside; failing that the last token with a letter (a character model), else the
    middle token."""
    text = [_ESCAPE.sub("", str(tok)) for tok in tokens]
    t, last = len(text), (3 * (len(text) - 1)) // 4

    def whole_word(i: int) -> bool:
        glued_before = i > 0 and text[i - 1][-1:].isalpha() and text[i][:1].isalpha()
        glued_after = i + 1 < t and text[i][-1:].isalpha() and text[i + 1][:1].isalpha()
        return sum(c.isalpha() for c in text[i]) >= 2 and not glued_before and not glued_after

    def has_letter(i: int) -> bool:
        return any(c.isalpha() for c in text[i])

    query = next((i for test in (whole_word, has_letter) for i in range(last, -1, -1) if test(i)), max(0, (t - 1) // 2))
    return {"layer": (2 * n_layer) // 3, "query": int(query), "rule": OPENING_RULE}


def _check_attention(attention, tokens: Sequence[str]) -> np.ndarray:
    a = np.asarray(attention, dtype=np.float32)
    if a.ndim != 4 or a.shape[2] != a.shape[3] or a.shape[2] == 0:
        raise ValueError(f"attention must have shape (n_layer, n_head, T, T) with T >= 1, got {a.shape}")
    if len(tokens) != a.shape[2]:
        raise ValueError(f"got {len(tokens)} tokens for attention over {a.shape[2]}")
    return a


def _check_scores(head_scores: Mapping | None, n_layer: int, n_head: int) -> dict:
    out = {}
    for role, values in (head_scores or {}).items():
        if values is None:
            continue
        v = np.asarray(values, dtype=np.float64)
        if v.shape != (n_layer, n_head):
            raise ValueError(f"head_scores[{role!r}] must have shape (n_layer, n_head) = {(n_layer, n_head)}, "
                             f"got {v.shape}")
        out[str(role)] = _finite(v.tolist())
    return out


def write_sample_page(path, attention, tokens: Sequence[str], head_scores: Mapping | None = None, title: str = "",
                      *, max_bytes: int = SAMPLE_MAX_BYTES, inside: dict | None = None) -> Path:
    """Write one forward pass's attention as an interactive page (atomically); returns its path.

    attention: float (L, nh, T, T), rows summing to 1 over keys <= query; tokens: the T display strings;
    head_scores: optional {role: (L, nh)}: attention_lab.interp.roles.ROLES (0..1) and ablation effects ("ablation",
    "ablation_probe", "ablation_val": loss change in nats when the head is zeroed). Beyond max_bytes of weights
    (uint8, lower triangles) only the last tokens that fit are kept, and the page says so. inside: the "step
    inside" panel's data (attention_lab/viewer/report.py inside_data), for the same T tokens; left out when the
    tokens are cut.
    """
    data = sample_data(attention, tokens, head_scores, max_bytes=max_bytes, inside=inside)
    return write_page(path, data, title or f"attention over {data['T']} tokens")


def write_page(path, data: dict, title: str) -> Path:
    """render_page(data, title) written to path atomically; returns the path."""
    path = Path(path)
    with atomic_write(path) as f:
        f.write(render_page(data, title))
    return path


def sample_data(attention, tokens: Sequence[str], head_scores: Mapping | None = None, *,
                max_bytes: int = SAMPLE_MAX_BYTES, inside: dict | None = None) -> dict:
    """The sample page's JSON data island (write_sample_page's arguments): what attention.html embeds and what
    the live lab's /api/analyze answers."""
    a = _check_attention(attention, tokens)
    n_layer, n_head, t, _ = a.shape
    scores = _check_scores(head_scores, n_layer, n_head)
    notes = []
    keep = t
    while keep > 1 and n_layer * n_head * keep * (keep + 1) // 2 > max_bytes:
        keep -= max(1, keep // 64)
    if keep < t:
        notes.append(f"showing the last {keep} of {t} tokens (all {t} would take more than "
                     f"{human_bytes(max_bytes)}); their rows do not sum to 1: earlier keys are cut off")
        a, tokens = a[:, :, t - keep:, t - keep:], list(tokens)[t - keep:]
    data = {
        "kind": "sample",
        "subtitle": f"{n_layer} layers x {n_head} heads, {len(tokens)} tokens"
                    + ("" if scores else "; no head-role scores given"),
        "notes": notes,
        "tokens": [str(s) for s in tokens],
        "L": n_layer, "H": n_head, "T": len(tokens),
        "colormap": _colormap(),
        "colormap_words": COLOUR_SCALE[1],
        "roles": role_info(scores),
        "frames": [{"step": None, "label": "this text", "attn": _b64(quantise(a))}],
        "scores": [score_record(None, scores)] if scores else [],
        "label_rule": label_rule(),
        "start": opening_view(tokens, n_layer),  # the static page opens here (main.js bootSample); the lab does not
    }
    if inside is not None and keep == t:
        data["inside"] = inside
    return data


# ------------------------------------------------------------------------------------------------------------
# the training film


def _read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a .jsonl file, skipping lines that do not parse (one being written, say)."""
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("step"), int):
            out.append(obj)
    return out


def _pick_frames(steps: Sequence[int], n_max: int, keep: Sequence[int] = ()) -> list[int]:
    """Indices of at most n_max of `steps` (sorted): the first, the last, the first evaluation at or after each
    step in `keep`, then evenly spread ones."""
    n = len(steps)
    if n <= n_max:
        return list(range(n))
    chosen = {0, n - 1}
    for s in keep:
        after = [i for i, x in enumerate(steps) if x >= s]
        if after and len(chosen) < n_max:
            chosen.add(after[0])
    for i in np.linspace(0, n - 1, n_max).round().astype(int):
        if len(chosen) >= n_max:
            break
        chosen.add(int(i))
    return sorted(chosen)


def film_data(run_dir, *, max_bytes: int = FILM_MAX_BYTES) -> tuple[dict, str]:
    """(data island, title) of a run's film; every missing or unreadable part becomes a note on the page."""
    run_dir = Path(run_dir)
    run = RunLayout(run_dir)
    folder = run.attention
    notes: list[str] = []

    frames: list[tuple[int, np.ndarray]] = []
    for step, p in run.frames().items():
        try:  # memory-mapped: only the frames the page keeps are read in full
            a = np.load(p, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            notes.append(f"{p.name} cannot be read ({e}); left out")
            continue
        if a.ndim != 4 or a.shape[2] != a.shape[3]:
            notes.append(f"{p.name} has shape {a.shape}, not (n_layer, n_head, T, T); left out")
            continue
        frames.append((step, a))
    frames.sort(key=lambda f: f[0])
    if frames:
        shape = frames[-1][1].shape
        odd = [s for s, a in frames if a.shape != shape]
        if odd:
            notes.append(f"left out {len(odd)} evaluations whose attention is not {shape} (steps {odd[:5]})")
            frames = [(s, a) for s, a in frames if a.shape == shape]
    elif folder.is_dir():
        notes.append("no attention frames (attention/step_*.npy) recorded")
    else:
        notes.append(f"no attention folder in {run_dir}: this run recorded no attention maps (an older run?)")

    records: dict[int, dict] = {}
    heads_path = run.heads
    if heads_path.exists():
        for r in _read_jsonl(heads_path):
            records[r["step"]] = r  # a resumed run may repeat a step: the later line wins
    elif folder.is_dir():
        notes.append("no head-role scores (attention/heads.jsonl) recorded")
    records = dict(sorted(records.items()))

    changes: list[dict] = []
    pc_path = run.phase_changes
    if pc_path.exists():
        try:
            raw = json.loads(pc_path.read_text(encoding="utf-8"))
            changes = [c for c in raw if isinstance(c, dict) and isinstance(c.get("step"), int)]
        except (OSError, json.JSONDecodeError, TypeError) as e:
            notes.append(f"phase_changes.json cannot be read ({e})")
    for c in changes:
        c.setdefault("message", f"step {c['step']}: {c.get('head') or ''} {c.get('metric', '')}".strip())
    changes.sort(key=lambda c: c["step"])

    curves: dict[str, dict[int, float]] = {k: {} for k in ("train_loss", "val_loss", "val_bpb", "probe_first_loss",
                                                            "probe_repeat_loss", "icl_score")}
    metrics_path = run.metrics
    if metrics_path.exists():
        for r in _read_jsonl(metrics_path):
            if "val_loss" in r:
                for key in ("val_loss", "val_bpb", "probe_first_loss", "probe_repeat_loss", "icl_score"):
                    if key in r:
                        curves[key][r["step"]] = r[key]
            elif "loss" in r:
                curves["train_loss"][r["step"]] = r["loss"]
    else:
        notes.append("no metrics.jsonl: no loss curve")
    for step, r in records.items():
        model = r.get("model") if isinstance(r.get("model"), dict) else {}
        for key, v in model.items():
            if key in curves:
                curves[key][step] = v
    train = sorted(curves["train_loss"].items())
    if len(train) > MAX_TRAIN_POINTS:
        stride = math.ceil(len(train) / MAX_TRAIN_POINTS)
        curves["train_loss"] = dict(train[::stride] + ([train[-1]] if (len(train) - 1) % stride else []))

    # the model's shape: from the frames, else from the scores
    n_layer = n_head = t = 0
    if frames:
        n_layer, n_head, t, _ = frames[-1][1].shape
    else:
        for r in records.values():
            for v in (r["scores"].values() if isinstance(r.get("scores"), dict) else ()):
                shape = np.asarray(v).shape
                if len(shape) == 2:
                    n_layer, n_head = shape
                    break
            if n_layer:
                break

    tokens = [f"#{i}" for i in range(t)]
    description = ""
    probe_path = run.probe
    if probe_path.exists():
        try:
            probe = json.loads(probe_path.read_text(encoding="utf-8"))
            description = str(probe.get("description", ""))
            if frames and len(probe.get("tokens", [])) == t:
                tokens = [str(s) for s in probe["tokens"]]
            elif frames:
                notes.append(f"probe.json holds {len(probe.get('tokens', []))} tokens, the attention {t}: "
                             "tokens shown by position")
        except (OSError, json.JSONDecodeError, AttributeError) as e:
            notes.append(f"probe.json cannot be read ({e}): tokens shown by position")
    elif frames:
        notes.append("no probe.json: tokens shown by position")

    scores = []
    for step, r in records.items():
        roles = dict(r["scores"]) if isinstance(r.get("scores"), dict) else {}
        ablation = r.get("ablation") if isinstance(r.get("ablation"), dict) else {}
        for name, values in ablation.items():
            roles[f"ablation_{name}"] = values
        kept = {}
        for role, values in roles.items():
            if np.asarray(values, dtype=object).shape == (n_layer, n_head):
                kept[role] = _finite(values)
        scores.append(score_record(step, kept))
    role_names = [role for s in scores for role in s["roles"]]

    total = len(frames)
    per_frame = n_layer * n_head * t * (t + 1) // 2
    n_max = max(2, max_bytes // max(per_frame, 1))
    picked = _pick_frames([s for s, _ in frames], n_max, [c["step"] for c in changes])
    if len(picked) < total:
        notes.append(f"showing {len(picked)} of {total} evaluations: all of them would take more than "
                     f"{human_bytes(max_bytes)} (the first, the last and those at phase changes are kept)")
    encoded = [{"step": frames[i][0], "attn": _b64(quantise(frames[i][1]))} for i in picked]

    parts = [f"{n_layer} layers x {n_head} heads" if n_layer else "no attention recorded"]
    if t:
        parts.append(f"the film's prompt: {t} tokens" + (f" ({description})" if description not in UNSAID else ""))
    if frames:
        parts.append(f"{total} frames (evaluations and snapshots), steps {frames[0][0]}\u2013{frames[-1][0]}")
    if scores:
        parts.append("head roles measured at " + (f"{len(scores)} evaluations" if len(scores) > 1 else "1 evaluation"))
    data = {
        "kind": "film",
        "subtitle": "; ".join(parts),
        "notes": notes,
        "tokens": tokens,
        "L": int(n_layer), "H": int(n_head), "T": int(t),
        "colormap": _colormap(),
        "colormap_words": COLOUR_SCALE[1],
        "roles": role_info(role_names),
        "chart_role": moving_role(scores),
        "frames": encoded,
        "frames_total": total,
        "scores": scores,
        "label_rule": label_rule(),
        "curves": {k: [[s, _finite(v)] for s, v in sorted(d.items())] for k, d in curves.items() if d},
        "phase_changes": [json_safe(c) for c in changes],
    }
    name = "/".join(run_dir.resolve().parts[-2:])
    return data, f"{name}: attention over training"


def build_film(run_dir, *, max_bytes: int = FILM_MAX_BYTES) -> Path:
    """Write run_dir/attention.html (atomically): the run's attention at every evaluation on a step slider, with
    the loss and head-role curves and the phase changes. Returns its path. Missing parts degrade to notes."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a folder")
    data, title = film_data(run_dir, max_bytes=max_bytes)
    return write_page(RunLayout(run_dir).film, data, title)


# ------------------------------------------------------------------------------------------------------------
# command line


ISLAND = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.S)


def read_island(page: Path) -> dict:
    """The JSON data island of a page written by render_page ({} when there is none to read)."""
    try:
        found = ISLAND.search(page.read_text(encoding="utf-8", errors="replace"))
        return json.loads(found.group(1)) if found else {}
    except (OSError, ValueError):
        return {}


def page_sections(data: Mapping) -> set[str]:
    """What a sample page's data island shows beyond the maps, in words."""
    out = set()
    if data.get("inside"):
        out.add("step inside a head, the logit lens and the circuits")
    if data.get("scores"):
        out |= {f"the {role} scores" for role in data["scores"][0].get("roles", {})}
    return out


def save_page_data(path: Path, data: Mapping, title: str) -> Path:
    """page.json beside attention.npy: the sample page's island without the attention levels (attention.npy
    holds them), and its title: restore_page_data gives the page back."""
    frames = [{k: v for k, v in f.items() if k != "attn"} for f in data["frames"]]
    with atomic_write(Path(path)) as f:  # keys in the island's order, so the page comes back byte for byte
        json.dump({"title": title, "data": dict(data, frames=frames)}, f, ensure_ascii=False, separators=(",", ":"),
                  allow_nan=False)
    return Path(path)


def restore_page_data(saved: Mapping, weights: np.ndarray) -> tuple[dict, str]:
    """save_page_data's (island, title), the attention levels re-encoded from attention.npy (the page showed its
    last data["T"] tokens)."""
    data = dict(saved["data"])
    a = _check_attention(weights, ["?"] * weights.shape[2])
    t, keep = a.shape[2], int(data["T"])
    if keep > t or (a.shape[0], a.shape[1]) != (data["L"], data["H"]):
        raise ValueError(f"page.json describes {data['L']} layers x {data['H']} heads x {keep} tokens but "
                         f"attention.npy holds {a.shape}: it is the page of another text; rebuild the whole page "
                         "with --checkpoint")
    attn = _b64(quantise(a[:, :, t - keep:, t - keep:]))
    data["frames"] = [dict(f, attn=attn) for f in data["frames"]]
    return data, str(saved["title"])


class PoorerPage(ValueError):
    """A rebuild would replace a page with one that shows less."""


def page_for_sample_folder(folder: Path) -> Path:
    """attention.html for a folder sample.py wrote: the same page from page.json and attention.npy; without
    page.json (a folder from sample.py --no-html or written by hand), the maps and summary.json's scores, unless
    that would replace a page that shows more (PoorerPage: the page is left as it is)."""
    sample = SampleLayout(folder)
    weights = np.load(sample.weights, allow_pickle=False)
    tokens = json.loads(sample.tokens.read_text(encoding="utf-8"))["tokens"]
    if sample.page_data.exists():
        data, title = restore_page_data(json.loads(sample.page_data.read_text(encoding="utf-8")), weights)
        if data["tokens"] != [str(s) for s in tokens[len(tokens) - data["T"]:]]:
            raise ValueError(f"{sample.page_data} is the page of another text than tokens.json's (a later sample.py "
                             f"--no-html into the same folder?); rebuild the whole page with --checkpoint")
        return write_page(sample.page, data, title)
    scores: dict[str, list] = {}
    summary = sample.summary
    if summary.exists():  # {"heads": [{"layer", "head", <role>: value, "ablation": value, ...}]}
        rows = json.loads(summary.read_text(encoding="utf-8")).get("heads", [])
        n_layer, n_head = weights.shape[:2]
        for role in MEASURES:
            if rows and all(role in r for r in rows):
                grid = np.full((n_layer, n_head), np.nan)
                for r in rows:
                    grid[r["layer"], r["head"]] = r[role]
                scores[role] = grid
    data = sample_data(weights, tokens, scores)
    lost = page_sections(read_island(sample.page)) - page_sections(data) if sample.page.exists() else set()
    if lost:
        checkpoint = json.loads(sample.tokens.read_text(encoding="utf-8")).get("checkpoint") or "<its checkpoint>"
        raise PoorerPage(
            f"{sample.page} shows {', '.join(sorted(lost))}, which {folder} has no page.json to rebuild; left it "
            f"as it is. To rebuild the whole page: python -m attention_lab.viewer {folder} --checkpoint {checkpoint}")
    return write_page(sample.page, data, f"{folder.name}: attention")


def main(argv: Sequence[str] | None = None, rebuild=None) -> int:
    """The command line. rebuild(folder, checkpoint) -> page: the whole recomputation behind --checkpoint
    (report.rebuild_sample, which imports this module: `python -m attention_lab.viewer` passes it in)."""
    p = argparse.ArgumentParser(
        prog="python -m attention_lab.viewer",
        description="Write attention.html for a run folder (the training film) or a sample folder of sample.py.",
    )
    p.add_argument("folder", type=Path, help="run folder (runs/<name>/<time>) or sample folder (holds attention.npy)")
    p.add_argument("--max-mb", type=float, default=FILM_MAX_BYTES / 1e6,
                   help=f"film: attention bytes to keep before dropping evaluations (default {FILM_MAX_BYTES / 1e6})")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="sample folder: recompute everything (maps, scores, step inside, logit lens, circuits) for "
                        "tokens.json's tokens with this checkpoint folder")
    args = p.parse_args(argv)
    folder = args.folder
    if not folder.is_dir():
        return cli.fail(f"{folder} is not a folder; give a run folder (runs/<name>/<time>) or a sample folder")
    if not SampleLayout(folder).is_sample() and not RunLayout(folder).is_run():
        return cli.fail(f"{folder} holds no attention/ folder or metrics.jsonl; give a run folder "
                        "(runs/<name>/<time>) or a sample folder (attention.npy + tokens.json)")
    if RunLayout(folder).model_arch() == "lstm":
        return cli.fail(f"{folder} is a run of the LSTM baseline (model.arch=lstm): it has no attention to show")
    try:
        if SampleLayout(folder).is_sample() and args.checkpoint is not None:
            if rebuild is None:
                return cli.fail("--checkpoint recomputes with the model: run it as python -m attention_lab.viewer")
            path = rebuild(folder, args.checkpoint)
        elif SampleLayout(folder).is_sample():
            path = page_for_sample_folder(folder)
        elif args.checkpoint is not None:
            return cli.fail(f"--checkpoint recomputes a sample folder (attention.npy + tokens.json); {folder} is a "
                            "run folder, whose film is rebuilt from its files: leave --checkpoint out")
        else:
            path = build_film(folder, max_bytes=int(args.max_mb * 1e6))
    except PoorerPage as e:
        return cli.fail(e)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        return cli.fail(f"cannot build the page for {folder}: {e}")
    print(f"{path} ({human_bytes(path.stat().st_size)}): open it in a browser, e.g. file://{path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
