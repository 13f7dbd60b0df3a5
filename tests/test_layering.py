"""The import rule of attention_lab/__init__.py, enforced: every module's imports read with ast (imports inside
functions included), each checked against its room's allowed rooms, and no circle of imports anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attention_lab import ROOMS

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("model", "data", "attention_lab", "bench", "train.py", "sample.py")
PROJECT = ("model", "data", "attention_lab", "bench", "train", "sample")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for src in SOURCES:
        p = REPO / src
        for f in [p] if p.is_file() else sorted(p.rglob("*.py")):
            if "remote_code" in f.parts:  # shipped into exported folders: imports transformers only
                continue
            found[module_name(f)] = f
    return found


def imports_of(name: str, path: Path) -> set[str]:
    """The project modules `name` imports, as dotted names (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {m for m in out if m.split(".")[0] in PROJECT}


def room_of(name: str) -> str:
    matches = [room for room in ROOMS if name == room or name.startswith(room + ".")]
    if not matches:
        raise AssertionError(f"{name} is in no room of attention_lab.ROOMS: add its room there")
    return max(matches, key=len)


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges = {}
    for name, path in mods.items():
        # `from pkg import x` names a module when pkg.x is one, else a name inside pkg: keep the real modules
        edges[name] = {m for m in imports_of(name, path) if m in mods and m != name}
    return edges


def violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, targets in edges.items():
        room = room_of(name)
        for target in targets:
            other = room_of(target)
            if other != room and other not in ROOMS[room]:
                bad.append(f"{name} imports {target}: {room} may import only "
                           f"{', '.join(ROOMS[room]) or 'nothing of the project'}")
    return sorted(bad)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_import_follows_the_rooms_rule():
    bad = violations(graph())
    assert not bad, "imports against the rule of attention_lab/__init__.py:\n  " + "\n  ".join(bad)


def test_no_circle_of_imports():
    found = circles(graph())
    assert not found, "circles of imports (break each by moving the shared piece down a layer):\n  " + "\n  ".join(
        " <-> ".join(c) for c in found)


def test_the_rule_keeps_its_promises():
    """The table itself must not drift into allowing what the layering forbids."""
    forbidden = {
        "model": PROJECT, "data": ("model", "attention_lab", "bench", "train", "sample"),
        "attention_lab.interp": ("attention_lab.store", "attention_lab.training"),
        "attention_lab.store": ("attention_lab.interp",),
        "attention_lab.viewer": ("attention_lab.training",),
        "attention_lab.interop": ("attention_lab.training",),
        "bench": ("train", "sample"),
    }
    for room, never in forbidden.items():
        allowed = ROOMS[room]
        assert not any(a == n or a.startswith(n + ".") for a in allowed for n in never), (
            f"attention_lab.ROOMS lets {room} import {allowed}, which includes one of {never}")


@pytest.mark.parametrize("source, target, ok", [
    ("attention_lab.interp.heads", "attention_lab.store.layout", False),
    ("attention_lab.store.logger", "attention_lab.interp.figures", False),
    ("data.prepare", "attention_lab.store.checkpoint", False),
    ("bench.train_step", "train", False),
    ("attention_lab.training.loop", "attention_lab.interp.heads", True),
])
def test_the_checker_itself(source, target, ok):
    assert (violations({source: {target}}) == []) == ok
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_entry_points_start_without_the_corpus_libraries():
    """`datasets` (and pandas and pyarrow under it) load where a corpus is read (data/sources.py), not where train.py
    or sample.py start: a run on prepared tokens began 2.6 s later with them (6.0 s to import train.py on a 2-core
    EPYC, 3.4 s without), and every claim run, test and `make train` starts so."""
    import subprocess
    import sys

    code = ("import sys, train, sample; "
            "print(' '.join(n for n in ('datasets', 'pandas', 'pyarrow') if n in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", f"imported as train.py and sample.py start: {proc.stdout.strip()}"
