"""`make test`'s schedule: each pytest process takes a whole file at a time, the longest files first
(tests/conftest.py), so that no long file starts while the other core has nothing left to do."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import conftest

TESTS = Path(__file__).resolve().parent


def test_every_file_named_longest_exists_and_is_named_once():
    missing = [name for name in conftest.LONGEST_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"tests/conftest.py's LONGEST_FIRST names files that are gone: {missing}"
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_the_longest_files_come_first_in_their_order_and_each_file_keeps_its_own():
    def item(file: str, test: str):
        return SimpleNamespace(path=TESTS / file, name=test)

    first, second = conftest.LONGEST_FIRST[:2]
    items = [item("test_a.py", "a1"), item(second, "s1"), item("test_z.py", "z1"), item(first, "f1"),
             item(second, "s2"), item("test_a.py", "a2"), item(first, "f2")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.name for i in items] == ["f1", "f2", "s1", "s2", "a1", "z1", "a2"], [i.name for i in items]


def test_make_test_runs_whole_files_in_the_collected_order():
    """xdist's own order (--loadscope-reorder, its default) puts the files with the most tests first, whatever
    conftest's order says."""
    rule = re.search(r"^test:.*\n\t(.+)$", (TESTS.parent / "Makefile").read_text(encoding="utf-8"), re.M).group(1)
    assert "--dist loadfile" in rule and "--no-loadscope-reorder" in rule, rule
