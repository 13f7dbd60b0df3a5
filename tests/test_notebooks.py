"""The tutorials' notebooks (notebooks/, jupytext percent-format sources) run top to bottom in a Jupyter kernel
(nbclient), at the small settings below injected after each notebook's parameter cell (papermill's way), in a
scratch folder that shares the session's prepared corpus. A notebook whose API call breaks fails here with the
cell and the traceback. Planted bug: notebook_show_call_broken (tests/mutations.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.py"))
SMALL = {"STEPS": 4, "WINDOWS": 4, "SIZES": (32, 64)}  # seconds, not minutes: the suite's budget
SECONDS: dict[str, float] = {}


def run_notebook(path: Path, folder: Path, settings: dict) -> nbformat.NotebookNode:
    """Execute the notebook at `path` with `settings` assigned right after its parameter cell (only the names that
    cell defines), the kernel's working folder `folder`. Returns the executed notebook."""
    nb = jupytext.read(path)
    at = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), None)
    assert at is not None, f"{path.name} has no cell tagged 'parameters' for the test to override"
    names = {line.split("=")[0].strip() for line in nb.cells[at].source.splitlines() if "=" in line}
    injected = "\n".join(f"{k} = {v!r}" for k, v in settings.items() if k in names)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(injected, metadata={"tags": ["injected-parameters"]}))
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def test_the_notebooks_are_the_tutorials_path_in_order():
    names = [p.stem for p in NOTEBOOKS]
    assert names == ["01_soft_lookup_and_scale", "02_mask_heads_positions", "03_context_lstm_quadratic",
                     "04_train_your_attention"], names
    for path in NOTEBOOKS:
        nb = jupytext.read(path)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} keeps outputs"
        assert "google.colab" in nb.cells[2].source or any("google.colab" in c.source for c in nb.cells[:4]), (
            f"{path.name}: its first code cells do not install the project in Colab")
    assert not list(NOTEBOOKS[0].parent.glob("*.ipynb")), "keep the notebooks as percent-format .py (no outputs)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_runs_top_to_bottom(path, tmp_path, data_cache):
    t0 = time.perf_counter()
    nb = run_notebook(path, tmp_path, {**SMALL, "DATA_CACHE": str(data_cache)})
    SECONDS[path.stem] = time.perf_counter() - t0
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    if path.stem.startswith("01"):
        assert "pass: scores" in text and "exp without subtracting the row's max" in text, text[-2000:]
    if path.stem.startswith("04"):
        last = nb.cells[-1].outputs
        assert any("text/html" in o.get("data", {}) and "<iframe" in o["data"]["text/html"] for o in last), (
            "attention_lab.show did not display its page inline")
        assert "config.json:" in text and "pass: attention" in text, text[-2000:]
        leaky_example_leaks(tmp_path)
    print(f"{path.stem}: {SECONDS[path.stem]:.1f} s at {SMALL}")


def leaky_example_leaks(folder: Path) -> None:
    """Notebook 04's leaky example is what it says, whatever its few steps let the run say: its file is the correct
    one with the mask after the softmax (named so by the check), and its run's honest loss is not its loss as
    trained, which a causal attention's is to float rounding (1e-5). Planted bug: notebook_leaky_example_not_leaky
    (the edit's target text no longer in the file: the 'leaky' run trains the correct attention)."""
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
