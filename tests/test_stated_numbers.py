"""The suite's own numbers as the README states them: the count and time of the last full run in docs/testing.md,
and the README's line agreeing with it, so neither goes stale while the suite grows (a newcomer reads "about 4
minutes", waits 11 and thinks something is broken).

The time is a measurement named with its machine and date in docs/testing.md (the suite cannot time itself
without depending on how busy the machine is); the count is checked against what this session collected whenever
the whole suite runs.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS_RE = re.compile(r"The last full run: \*\*([\d,]+) tests in (\d+) min (\d+) s\*\*(.{0,300})", re.S)
README_RE = re.compile(r"`make test` runs `pytest` over `tests/` \(also `\.ci/run`\): ([\d,]+) tests, about (\d+)\s+"
                       r"minutes")
DRIFT = 0.05  # the count may grow by 5% before the docs must be re-measured


def stated() -> tuple[int, int, str, int, int]:
    docs = (REPO / "docs" / "testing.md").read_text()
    readme = (REPO / "README.md").read_text()
    d, r = DOCS_RE.search(docs), README_RE.search(readme)
    assert d, "docs/testing.md must say 'The last full run: **N tests in M min S s**' followed by where and when"
    assert r, "README.md must say '`make test` runs `pytest` over `tests/` (also `.ci/run`): N tests, about M minutes'"
    return int(d[1].replace(",", "")), int(d[2]) * 60 + int(d[3]), d[4], int(r[1].replace(",", "")), int(r[2])


def test_the_readme_says_what_the_last_full_run_measured():
    count, seconds, where, readme_count, readme_minutes = stated()
    assert readme_count == count, f"README says {readme_count} tests, docs/testing.md's last full run {count}"
    assert abs(readme_minutes * 60 - seconds) <= 60, \
        f"README says about {readme_minutes} minutes, the last full run took {seconds // 60} min {seconds % 60} s"
    assert re.search(r"20\d\d-\d\d-\d\d", where) and re.search(r"(AMD|Intel|Apple|ARM|Arm)", where), \
        f"the time names its machine and date: {where!r}"


def test_the_stated_count_is_the_suite_this_session_collected(request):
    """Only meaningful when the whole suite runs (`make test`, CI); a run of some files checks the wording only."""
    count = stated()[0]
    cfg = request.config
    whole = cfg.args in ([], ["tests"], ["tests/"], [str(REPO / "tests")]) and not cfg.option.keyword \
        and not cfg.option.markexpr
    collected = len(request.session.items)
    if whole:
        assert abs(collected - count) <= DRIFT * count, (
            f"docs/testing.md and README.md say {count} tests; this run collected {collected}. Re-measure the suite "
            "(pytest -q on 2 cores) and update 'The last full run' in docs/testing.md and the README's line.")
