"""The claims' published numbers, read back from docs/claims.md (the page `python -m attention_lab.claims docs`
assembles from the reports): a claim's "### Arms" table as rows of strings, and the two series the ideas plot."""

from __future__ import annotations

import re
from pathlib import Path

CLAIMS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "claims.md"


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


def recall_by_distance(markdown: str) -> dict[str, dict[int, float]]:
    """The recall claim: "transformer" / "lstm" -> {distance: bits per recalled item (4 = chance)}: recall_bits
    (the one-item task) or copy_bits (the earlier copied block)."""
    out: dict[str, dict[int, float]] = {}
    for row in arms_table(markdown, "recall"):
        m = re.match(r"^(.*), distance=(\d+)$", row.get("arm", ""))
        value = _number(row.get("recall_bits", row.get("copy_bits", "")))  # the one-item task's, or the block's
        if m and value is not None:
            out.setdefault(m.group(1), {})[int(m.group(2))] = value
    return out


def read_page(path: Path = CLAIMS_PAGE) -> str:
    """docs/claims.md's text, or "" where the page is absent (a copy of the library without its docs)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""
