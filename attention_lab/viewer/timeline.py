"""Read a run's TensorBoard events back and print its head-role timeline and phase changes.

    python -m attention_lab.tb_report runs/default/2026-11-22_16-00-00
    python -m attention_lab.tb_report RUN_DIR --json timeline.json --plot timeline.png

It reads only the event files (tb/), the way TensorBoard does, so it checks what a person would see there:
for every evaluation, the strongest head of each role, the probe's first-half and repeated-half losses, and the
phase changes the trainer detected.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from attention_lab.interp.roles import ROLES, TRACKED_ROLES
from attention_lab.runtime import cli
from attention_lab.store.layout import RunLayout

TAG = re.compile(r"^heads/(?P<role>[a-z_]+)/L(?P<layer>\d+)H(?P<head>\d+)$")


def read_events(run_dir: Path) -> dict:
    """{"roles": {role: {head: {step: value}}}, "model": {name: {step: value}}, "phase_changes": [(step, text)]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = RunLayout(run_dir).tb
    if not tb.is_dir():
        raise FileNotFoundError(f"{tb} does not exist: is {run_dir} a run folder (runs/<name>/<time>)?")
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    out = {"roles": {}, "model": {}, "phase_changes": []}
    for tag in acc.Tags()["scalars"]:
        m = TAG.match(tag)
        if m:
            head = f"L{m['layer']}H{m['head']}"
            out["roles"].setdefault(m["role"], {})[head] = {e.step: e.value for e in acc.Scalars(tag)}
        elif tag.startswith("model/") or tag.startswith("val/"):
            out["model"][tag] = {e.step: e.value for e in acc.Scalars(tag)}
    if "phase_changes/text_summary" in acc.Tags()["tensors"]:
        from tensorboard.util.tensor_util import make_ndarray

        for e in acc.Tensors("phase_changes/text_summary"):
            out["phase_changes"].append((e.step, make_ndarray(e.tensor_proto).item().decode()))
    return out


def timeline(events: dict, roles=TRACKED_ROLES) -> list[dict]:
    """One row per evaluation: the strongest head and its score for each role, plus the model curves."""
    steps = sorted({s for heads in events["roles"].values() for series in heads.values() for s in series})
    rows = []
    for step in steps:
        row = {"step": step}
        for role in roles:
            heads = events["roles"].get(role, {})
            if heads:
                best = max(heads, key=lambda h: heads[h].get(step, float("-inf")))
                row[role] = (best, heads[best].get(step))
        for name in ("model/probe_first_loss", "model/probe_repeat_loss", "val/val_bpb"):
            if step in events["model"].get(name, {}):
                row[name.split("/")[1]] = events["model"][name][step]
        rows.append(row)
    return rows


# what the table's numbers are, said under it (issue 36: the probe's loss above ln(vocab) read as a bug)
UNITS = ("role columns: the strongest head and its role score (0 to 1; docs/heads.md says how each is measured)\n"
         "probe 1st, repeat: the repeated-tokens probe's loss on its first half and on its repeat, nats/token "
         "(random tokens:\n  a model trained on text gives them less than uniform odds, so the first half can "
         "exceed ln(vocab); the repeat falls when a head copies)\n"
         "val bpb: bits/byte on the held-out validation windows")


def format_timeline(rows: list[dict], roles=TRACKED_ROLES) -> str:
    header = f"{'step':>6}" + "".join(f"  {r:>22}" for r in roles) + f"  {'probe 1st':>9} {'repeat':>7} {'val bpb':>8}"
    lines = [header]
    for row in rows:
        cells = "".join(f"  {row[r][0] + ' ' + format(row[r][1], '.2f'):>22}" if r in row else f"  {'-':>22}"
                        for r in roles)
        tail = "".join(f" {row[k]:>{w}.3f}" if k in row else f" {'-':>{w}}"
                       for k, w in (("probe_first_loss", 9), ("probe_repeat_loss", 7), ("val_bpb", 8)))
        lines.append(f"{row['step']:>6}{cells} {tail}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", type=Path, help="also write the timeline and phase changes to this JSON file")
    p.add_argument("--plot", type=Path, help="also draw the timeline (strongest head per role, losses) as a PNG")
    args = p.parse_args(argv)
    if RunLayout(args.run_dir).model_arch() == "lstm":
        return cli.fail(f"{args.run_dir} is a run of the LSTM baseline (model.arch=lstm): it has no heads, so no "
                        "head-role timeline")
    try:
        events = read_events(args.run_dir)
    except FileNotFoundError as e:
        return cli.fail(e)
    if not events["roles"]:
        return cli.fail(f"{args.run_dir} has no head-role scalars (heads/<role>/L<l>H<h>); was it trained with "
                        "train.head_roles=false, or before head roles were logged?")
    rows = timeline(events)
    print(format_timeline(rows))
    print(UNITS)
    print(f"\nroles logged: {', '.join(r for r in ROLES if r in events['roles'])}; "
          f"{len(next(iter(events['roles'].values())))} heads")
    print("phase changes:" if events["phase_changes"] else "phase changes: none detected")
    for step, text in events["phase_changes"]:
        for line in text.split("\n\n"):
            print(f"  {line}")
    if args.json:
        args.json.write_text(json.dumps({"timeline": rows, "phase_changes": events["phase_changes"]}, indent=1))
    if args.plot:
        plot_timeline(events, rows, args.plot, title=f"{args.run_dir.name}: role scores and losses over training")
    return 0


def plot_timeline(events: dict, rows: list[dict], path: Path, title: str = "") -> None:
    import matplotlib.image

    from attention_lab.interp.figures import figure_to_array, role_timeline_figure

    steps = [r["step"] for r in rows]
    series = {}
    for role in (r for r in TRACKED_ROLES if r != "first_token"):  # the sink is flat most of a run
        heads = events["roles"].get(role, {})
        if heads:  # the head that ends strongest, followed over the whole run
            best = max(heads, key=lambda h: heads[h][max(heads[h])])
            series[f"{role} ({best})"] = [heads[best].get(s, float("nan")) for s in steps]
    losses = {}
    for tag, name in (("model/probe_first_loss", "probe, first half"), ("model/probe_repeat_loss", "probe, repeat"),
                      ("val/val_loss", "validation")):
        if tag in events["model"]:
            xs = sorted(events["model"][tag])
            losses[name] = (xs, [events["model"][tag][x] for x in xs])
    marks = []
    for step, text in events["phase_changes"]:
        for line in text.split("\n\n"):
            if "induction" in line:
                marks.append((step, line.split(": ", 1)[-1]))
    fig = role_timeline_figure(steps, series, losses, marks, title)
    matplotlib.image.imsave(path, figure_to_array(fig))


if __name__ == "__main__":
    sys.exit(main())
