"""The claims' published numbers, read back from docs/claims.md (the page `python -m attention_lab.claims docs`
assembles from the reports): a claim's "### Arms" table as rows of strings, and the positions series the ideas
plot; the recall claim's seeds from its results file (docs/claims/results_recall.json), so the plot can show
each seed and the median."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CLAIMS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "claims.md"
RESULTS = CLAIMS_PAGE.parent / "claims"  # each claim's results_CLAIM.json, every seed's numbers


def arms_table(markdown: str, claim: str) -> list[dict[str, str]]:
    """The rows of the "### Arms" table under "## `claim`": column name -> cell text. [] when the page has no
    such section or table."""
    section = re.search(rf"^## `{re.escape(claim)}`\n(.*?)(?=^## |\Z)", markdown, flags=re.S | re.M)
    if section is None:
        return []
    # "### Arms" in a claim's own report, "#### Arms" on docs/claims.md (one level down under "The fine print")
    arms = re.search(r"^#{3,4} Arms\n+((?:\|.*\|\n?)+)", section.group(1), flags=re.M)
    if arms is None:
        return []
    lines = [line.strip() for line in arms.group(1).strip().splitlines()]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:  # lines[1] is the |---| rule
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == len(header):
            rows.append(dict(zip(header, cells)))
    return rows


def _number(cell: str) -> float | None:
    m = re.match(r"^[-+]?[\d,]*\.?\d+(?:e[-+]?\d+)?", cell.strip())
    return float(m.group(0).replace(",", "")) if m else None


def positions_by_length(markdown: str) -> dict[str, dict[str, float]]:
    """The positions claim: arm -> {"1x": bits/byte, "2x": ..., "4x": ...} (the scored length over the trained
    one; a "-" cell, learned positions past their table, left out)."""
    out = {}
    for row in arms_table(markdown, "positions"):
        values = {n: _number(row.get(f"bpb_windows_{n}", "-")) for n in ("1x", "2x", "4x")}
        out[row["arm"]] = {n: v for n, v in values.items() if v is not None}
    return {arm: v for arm, v in out.items() if v}


@dataclass(frozen=True)
class SeedValues:
    """One arm's number at one value of its variable: each verdict seed's, and which of them the claim's outlier
    rule flagged (more than 10 scaled MADs from the arm's median; kept in the verdicts, said beside them)."""

    seeds: tuple[int, ...]
    values: tuple[float, ...]
    flagged: tuple[bool, ...]

    @property
    def median(self) -> float:
        """The median over the seeds: one far seed (a flagged one) moves it little, where it drags a mean."""
        return float(np.median(self.values))


def recall_seeds(results: dict) -> dict[str, dict[int, SeedValues]]:
    """The recall claim's results (docs/claims/results_recall.json: "results" holds every verdict seed's run at
    the rate the verdicts were read at) -> "transformer" / "lstm" -> {distance: each seed's recall_bits (bits per
    recalled item, 4 = chance), the flagged ones marked}, the transformer first. {} when the results hold no
    recall arms."""
    flagged = {(o.get("arm"), o.get("seed")) for o in results.get("outliers", []) if o.get("metric") == "recall_bits"}
    out: dict[str, dict[int, SeedValues]] = {}
    for arm, runs in (results.get("results") or {}).items():
        m = re.match(r"^(.*), distance=(\d+)$", arm)
        runs = sorted((r for r in runs if isinstance(r.get("recall_bits"), (int, float))), key=lambda r: r["seed"])
        if m and runs:
            out.setdefault(m.group(1), {})[int(m.group(2))] = SeedValues(
                tuple(r["seed"] for r in runs), tuple(float(r["recall_bits"]) for r in runs),
                tuple((arm, r["seed"]) in flagged for r in runs))
    return {arm: dict(sorted(out[arm].items())) for arm in sorted(out, key=lambda a: a != "transformer")}


def read_results(claim: str, folder: Path = RESULTS) -> dict:
    """docs/claims/results_CLAIM.json (what `python -m attention_lab.claims CLAIM` wrote), or {} where it is
    absent or unreadable (a copy of the library without its docs)."""
    try:
        return json.loads((Path(folder) / f"results_{claim}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def read_page(path: Path = CLAIMS_PAGE) -> str:
    """docs/claims.md's text, or "" where the page is absent (a copy of the library without its docs)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""
