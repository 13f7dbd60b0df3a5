"""The quadratic wall as one picture: `python -m bench.plot bench/results.json docs/attention_wall.png`.

Left: one attention call, forward + backward, against T (log-log), for every method of bench/attention.py's
table, with the explicit path's predicted memory where it stopped. Right: cached decoding, milliseconds per
token against the cached length, for every variant. The machine line of the run is the title.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .common import machine_line


def draw(results: dict, out: Path) -> Path:
    wall, decode = results["tables"]["attention"], results["tables"]["decode"]
    fig = Figure(figsize=(12, 5), dpi=110)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    methods = list(dict.fromkeys(r["method"] for r in wall["rows"]))
    for method in methods:
        rows = [r for r in wall["rows"] if r["method"] == method and r.get("both_ms")]
        left.plot([r["T"] for r in rows], [r["both_ms"] for r in rows], marker="o", label=method)
    for r in wall["rows"]:
        if r.get("note"):
            left.annotate(r["note"].replace("not run: ", "explicit: "), (r["T"], 8), fontsize=7, rotation=90,
                          ha="center", va="bottom", color="grey")
    left.set(xscale="log", yscale="log", xlabel="T (tokens)", ylabel="forward + backward, ms",
             title="one attention call (6 heads of 64)")
    left.set_xscale("log", base=2)
    left.legend(fontsize=8)
    left.grid(True, which="both", alpha=0.3)
    for variant in dict.fromkeys(r["variant"] for r in decode["rows"]):
        rows = [r for r in decode["rows"] if r["variant"] == variant]
        right.plot([r["length"] for r in rows], [r["ms"] for r in rows], marker="o", label=variant)
    right.set(xlabel="cached tokens", ylabel="ms per decoded token", title="cached decoding (baby model, 1 thread)")
    right.set_xscale("log", base=2)
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    right.grid(True, alpha=0.3)
    fig.suptitle(machine_line(results["machine"]), fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path, help="the JSON `python -m bench.run --only attention` wrote")
    p.add_argument("out", type=Path, help="the PNG to write")
    args = p.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        print(draw(results, args.out))
    except (OSError, KeyError, json.JSONDecodeError) as e:
        print(f"error: cannot draw {args.results} ({e}); give the JSON of `python -m bench.run --only attention`",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
