"""The tutorials' notebooks (notebooks/, jupytext percent-format sources) run top to bottom in a Jupyter kernel
(nbclient), at the small settings below injected after each notebook's parameter cell (papermill's way), in a
scratch folder that shares the session's prepared corpus. Each runs twice:

    solved    SOLVED = True puts the project's answer (attention_lab.exercises.answer) in every "your turn": every
              check passes ("pass: NAME" in the cell's output), every figure is drawn (image/png outputs, counted)
    unsolved  as a learner gets it, up to its last "your turn": every "your turn" cell stops on its stub's own
              message ("not written yet", the stub's words, "then rerun"), the run carrying on past it (allow_errors)

`make notebooks` writes them as .ipynb for Jupyter; it runs here into a scratch folder (no Jupyter server).
Planted bugs (tests/mutations.py): notebook_show_call_broken, notebook_mask_one_off, notebook_leaky_example_not_leaky,
notebook_stub_passes_unwritten, notebook_figure_never_drawn, answer_calls_sdpa.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
SMALL = {"STEPS": 4, "WINDOWS": 4, "SIZES": (32, 64)}  # seconds, not minutes: the suite's budget
# the figures each notebook draws when solved (image/png outputs): the least the test accepts
FIGURES = {"01_soft_lookup_and_scale": 3, "02_mask_heads_positions": 4, "03_context_lstm_quadratic": 3,
           "04_train_your_attention": 2, "05_build_the_block": 2}
SECONDS: dict[str, float] = {}


def run_notebook(path: Path, folder: Path, settings: dict, allow_errors: bool = False, to_last_turn: bool = False
                 ) -> nbformat.NotebookNode:
    """Execute the notebook at `path` with `settings` assigned right after its parameter cell (only the names that
    cell defines), the kernel's working folder `folder`; to_last_turn: only up to its last "your turn" cell (what
    comes after needs the stubs written). Returns the executed notebook."""
    nb = jupytext.read(path)
    if to_last_turn:
        nb.cells = nb.cells[: max(i for i, c in enumerate(nb.cells) if "your-turn" in c.metadata.get("tags", [])) + 1]
    at = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), None)
    assert at is not None, f"{path.name} has no cell tagged 'parameters' for the test to override"
    names = {line.split("=")[0].strip() for line in nb.cells[at].source.splitlines() if "=" in line}
    injected = "\n".join(f"{k} = {v!r}" for k, v in settings.items() if k in names)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(injected, metadata={"tags": ["injected-parameters"]}))
    # the kernel imports this checkout (a planted copy's, under tests/mutations.py), not the one installed editable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(folder)}}).execute(env=env)
    return nb


def your_turns(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and "your-turn" in c.metadata.get("tags", [])]


def cell_text(cell) -> str:
    return "\n".join(o.get("text", "") or f"{o.get('ename', '')}: {o.get('evalue', '')}"
                     for o in cell.get("outputs", []))


def figures(nb) -> int:
    """The figures the executed notebook drew: its image/png outputs."""
    return sum("image/png" in o.get("data", {})
               for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def exercise_of(cell) -> str:
    found = re.search(r'check\("(\w+)", \w+, stop=True\)', cell.source)
    assert found, f"a your-turn cell does not end in check(NAME, fn, stop=True):\n{cell.source}"
    return found.group(1)


def stub_message(cell) -> str:
    """The words of the stub's `raise NotImplementedError(...)` (adjacent string literals joined)."""
    for node in ast.walk(ast.parse(cell.source)):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and getattr(node.exc.func, "id", "") == \
                "NotImplementedError" and node.exc.args and isinstance(node.exc.args[0], ast.Constant):
            return node.exc.args[0].value
    raise AssertionError(f"a your-turn cell has no raise NotImplementedError('...'):\n{cell.source}")


def test_the_notebooks_are_the_tutorials_path_in_order():
    names = [p.stem for p in NOTEBOOKS]
    assert names == ["01_soft_lookup_and_scale", "02_mask_heads_positions", "03_context_lstm_quadratic",
                     "04_train_your_attention", "05_build_the_block"], names
    for path in NOTEBOOKS:
        nb = jupytext.read(path)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} keeps outputs"
        assert "google.colab" in nb.cells[2].source or any("google.colab" in c.source for c in nb.cells[:4]), (
            f"{path.name}: its first code cells do not install the project in Colab")
        params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        assert re.search(r"^SOLVED = False\b", params.source, re.M), f"{path.name}: no SOLVED = False parameter"
        turns = your_turns(nb)
        assert turns, f"{path.name} has no cell tagged your-turn"
        for cell in turns:
            words = stub_message(cell)
            assert "then rerun" in words, f"{path.name}: the stub's message does not say to rerun: {words!r}"
            assert re.search(rf'if SOLVED:\n\s+\w+ = answer\("{exercise_of(cell)}"\)', cell.source), (
                f"{path.name}: the your-turn cell of {exercise_of(cell)} does not take answer(NAME) under SOLVED")
    assert not list(NOTEBOOKS[0].parent.glob("*.ipynb")), "keep the notebooks as percent-format .py (no outputs)"


def test_no_stub_or_answer_hides_attention_in_a_fused_call():
    """The notebooks and the answers write attention out; none calls the fused kernel that hides it."""
    for path in [*NOTEBOOKS, ROOT / "attention_lab" / "exercises" / "answers.py"]:
        assert "scaled_dot_product_attention" not in path.read_text(), (
            f"{path.relative_to(ROOT)} calls scaled_dot_product_attention: write the scores, mask and softmax out")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_runs_solved_with_its_figures(path, tmp_path, data_cache):
    t0 = time.perf_counter()
    nb = run_notebook(path, tmp_path, {**SMALL, "DATA_CACHE": str(data_cache), "SOLVED": True})
    SECONDS[f"{path.stem} solved"] = time.perf_counter() - t0
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    for cell in your_turns(nb):
        assert f"pass: {exercise_of(cell)}" in cell_text(cell), f"{path.name}: {cell_text(cell)[-1500:]}"
    drawn = figures(nb)
    assert drawn >= FIGURES[path.stem], f"{path.name} drew {drawn} figures, expected at least {FIGURES[path.stem]}"
    pages = sum("<iframe" in o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code"
                for o in c.get("outputs", []))
    if not path.stem.startswith("05"):
        assert pages >= 1, f"{path.name}: attention_lab.show did not display the model's page inline"
    if path.stem.startswith("01"):
        assert "exp without subtracting the row's max" in text, text[-2000:]
    if path.stem.startswith("04"):
        assert "config.json:" in text and "pass: attention" in text, text[-2000:]
        leaky_example_leaks(tmp_path)
    if path.stem.startswith("05"):
        stages = re.findall(r"^stage (\d): .* validation loss (\d+\.\d+)", text, re.M)
        assert [s for s, _ in stages] == ["0", "1", "2", "3", "4", "5"], (
            f"notebook 05's stages: {stages}\n{text[-2000:]}")
    print(f"{path.stem}: {SECONDS[f'{path.stem} solved']:.1f} s solved at {SMALL}, {drawn} figures")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_unsolved_stops_at_each_stub_with_its_message(path, tmp_path, data_cache):
    t0 = time.perf_counter()
    nb = run_notebook(path, tmp_path, {**SMALL, "DATA_CACHE": str(data_cache)}, allow_errors=True, to_last_turn=True)
    SECONDS[f"{path.stem} unsolved"] = time.perf_counter() - t0
    for cell in your_turns(nb):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert errors and errors[0]["ename"] == "NotPassedYet", (
            f"{path.name}: the unwritten {exercise_of(cell)} does not stop its cell: {cell_text(cell)[-1500:]}")
        said = errors[0]["evalue"]
        assert "not written yet" in said and stub_message(cell) in said and "solution" in said, (
            f"{path.name}: the unwritten {exercise_of(cell)} stops without its stub's message: {said}")
    print(f"{path.stem}: {SECONDS[f'{path.stem} unsolved']:.1f} s unsolved")


def test_make_notebooks_writes_ipynb_that_open_as_the_sources(tmp_path):
    """`make notebooks` converts every notebook to .ipynb (here into a scratch folder; the .venv's install step is
    taken as done) and says how to open them; each converted notebook holds the source's cells and tags."""
    out = tmp_path / "ipynb"
    venv = Path(sys.executable).parent.parent
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "notebooks", f"VENV={venv}", f"PY={sys.executable}",
                           f"NOTEBOOKS_OUT={out}", "-o", f"{venv}/.installed"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "jupyter lab" in done.stdout and str(out) in done.stdout, done.stdout
    written = sorted(p.stem for p in out.glob("*.ipynb"))
    assert written == [p.stem for p in NOTEBOOKS], written
    for path in NOTEBOOKS:
        converted = nbformat.read(out / f"{path.stem}.ipynb", as_version=4)
        nbformat.validate(converted)
        source = jupytext.read(path)
        assert [c.source for c in converted.cells] == [c.source for c in source.cells], f"{path.name} changed"
        assert len(your_turns(converted)) == len(your_turns(source)) >= 1, f"{path.name}: tags lost"
        assert converted.metadata["kernelspec"]["name"] == "python3"
    assert "notebooks/ipynb/" in (ROOT / ".gitignore").read_text(), "notebooks/ipynb/ is not gitignored"


def leaky_example_leaks(folder: Path) -> None:
    """Notebook 04's leaky example is what it says, whatever its few steps let the run say: its file is not the
    learner's attention, the check names its mistake (the mask after the softmax), and its run's honest loss is
    not its loss as trained, which a causal attention's is to float rounding (1e-5). Planted bug:
    notebook_leaky_example_not_leaky (the leaky file masks before the softmax: the 'leaky' run trains a correct
    attention)."""
    import json

    from attention_lab.exercises import check

    mine, leaky = folder / "my_attention" / "attention.py", folder / "my_attention" / "leaky.py"
    assert leaky.read_text() != mine.read_text(), "notebook 04's leaky.py is its correct attention.py unchanged"
    r = check("attention", leaky, quiet=True)
    assert r.mistake == "mask_after_softmax", f"notebook 04's leaky example: {r.status} / {r.mistake!r}\n{r.message}"
    rows = [json.loads(line) for line in (folder / "runs" / "notebook_04_leaky" / "metrics.jsonl").read_text()
            .splitlines() if "honest_loss" in line]
    assert rows and all(abs(r["honest_loss"] - r["leaky_loss"]) > 1e-5 for r in rows), (
        f"notebook 04's leaky run scores the same both ways, as a causal attention does: {rows}")
