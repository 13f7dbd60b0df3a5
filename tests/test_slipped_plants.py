"""Behaviours a code-only round of planted bugs got through the whole suite (issue 38), each tested for the reason a
user cares about, not for the edit itself. A learner's attention under the KV cache is in
tests/test_exercises_training.py (it reuses that file's trained learner run); here, the claims' sweep.

The sweep's bracketing: an arm whose best rate lies two or more grid steps beyond the grid's edge must be followed
out from the rates tried so far, one step at a time, until the best is inside what was tried (or BRACKET runs out,
and the report says so). Training and scoring are replaced by a known curve of bits/byte against the rate, so the
true best is known and the whole of run_claim (the choice, the seeds' rate, results.json, the report) runs in
well under a second."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from attention_lab.claims import CLAIMS, experiment, report, runs, select
from attention_lab.claims.catalog import BASE_LR

GRID = (1 / 3, 1.0, 3.0)


def _lr(multiple: float) -> str:
    return f"{BASE_LR * multiple:g}"


@pytest.fixture
def fake_training(monkeypatch):
    """run_claim with every run 'trained' at once and scored by a curve with its minimum at best[arm] (a multiple
    of the base rate): bits/byte = 2 + 0.1 * log3(lr / best)^2, plus 0.001 per seed. -> (best, trained), `trained`
    the (arm, multiple, seed) of every run launched, in order."""
    best: dict[str, float] = {}
    trained: list[tuple[str, float, int]] = []
    lr_of: dict[str, float] = {}

    def launch(self, todo):
        for j in todo:
            d = self.run_dir(j)
            d.mkdir(parents=True, exist_ok=True)
            (d / runs.DONE).write_text(json.dumps({"seconds": 1.0}))
            self.seconds.append(1.0)
            lr = j.lr if j.lr is not None else BASE_LR
            lr_of[d.name] = lr
            trained.append((j.arm, lr / BASE_LR, j.seed))

    def arm_of(run_dir: Path) -> tuple[str, float, int]:
        arm, seed = run_dir.name.split("-lr")[0], int(run_dir.name.rsplit("-s", 1)[1])
        return arm, lr_of[run_dir.name], seed

    def measure(claim, run_dir, held, quick):
        arm, lr, seed = arm_of(Path(run_dir))
        return {"bpb": 2.0 + 0.1 * math.log(lr / (BASE_LR * best[arm]), 3) ** 2 + 0.001 * seed, "step": 24}

    held = SimpleNamespace(part=SimpleNamespace(documents=["play"], part="choose"))
    monkeypatch.setattr(runs.Runner, "_launch", launch)
    monkeypatch.setattr(experiment, "load_checkpoint", lambda run, which="latest": SimpleNamespace(
        config=SimpleNamespace(block_size=32)))
    monkeypatch.setattr(experiment, "Held", SimpleNamespace(of=lambda run, part, block, n: held))
    monkeypatch.setattr(experiment, "measure", measure)
    monkeypatch.setattr(experiment, "metrics_of", lambda d: {
        "seconds": 1.0, "train_loss": 2.0, "tokens_per_s": 1000.0, "val_curve": [[24, 2.0]],
        "max_train_loss_late": 2.1, "lr": lr_of[Path(d).name]})
    monkeypatch.setattr(report, "plot", lambda *a: None)
    return best, trained


def _run(tmp_path, bracket: int):
    claim = select(CLAIMS["qk"], (1, 2, 3), ("separate", "tied"), GRID)
    rep = experiment.run_claim(claim, tmp_path / "qk", log=lambda *a: None, progress=False, bracket=bracket)
    return json.loads((tmp_path / "qk" / "results.json").read_text()), rep.read_text()


@pytest.mark.parametrize("steps_out", [2, -2], ids=["two steps above the grid", "two steps below the grid"])
def test_an_arm_whose_best_rate_is_two_steps_beyond_the_grid_is_followed_out_and_trained_there(
        tmp_path, fake_training, steps_out):
    """The LSTM's best rate was 0.081, two steps beyond the grid's 0.009: stepping out once, from the grid, would
    train its seeds at 0.027, a rate that is not its best, with the report calling the choice bracketed.
    Planted bug: bracket_steps_from_the_grid."""
    best, trained = fake_training
    edge, step = (GRID[-1], 3.0) if steps_out > 0 else (GRID[0], 1 / 3)
    best["separate"], best["tied"] = edge * step ** 2, 1.0  # separate: 27x (0.081) or 1/27x; tied inside the grid
    doc, text = _run(tmp_path, bracket=4)
    want = BASE_LR * best["separate"]
    tried = sorted(map(float, doc["sweep"]["separate"]))
    assert doc["rates"]["separate"] == pytest.approx(want), (
        f"separate's seeds train at lr {doc['rates']['separate']:g}, not at its best {want:g}; the sweep tried {tried}")
    assert [r["lr"] for r in doc["results"]["separate"]] == pytest.approx([want] * 3)
    out = [BASE_LR * edge * step ** k for k in (1, 2, 3)]  # one step, the best, and the step past it that lost
    assert tried == pytest.approx(sorted([BASE_LR * r for r in GRID] + out)), (
        "the sweep steps out one grid ratio at a time, from the rates tried so far, until its best is inside")
    assert doc["rates"]["tied"] == pytest.approx(BASE_LR), "tied's best is inside the grid"
    assert sorted(map(float, doc["sweep"]["tied"])) == pytest.approx([BASE_LR * r for r in GRID]), (
        "an arm whose best is inside the grid is not bracketed")
    assert sum(a == "separate" for a, _, _ in trained) == 6 * 2 + 1, (
        "each of separate's 6 rates trained once on the sweep's 2 seeds, then seed 3 at the best")
    row = next(line for line in text.splitlines() if line.startswith("| separate |") and "**" in line)
    assert row.endswith(f"| {want:g} |") and f"**{2.0015:.4f}** (2.00, 2.00)" in row, row
    assert "Chosen at the edge of what was tried" not in text, "the best is inside what was tried: nothing to warn of"
    assert "up to 4 more: separate." in text


def test_an_arm_still_at_the_edge_when_the_bracket_runs_out_is_named_in_the_report(tmp_path, fake_training):
    """Four steps out with two allowed: the seeds train at the best rate tried, and the report says the choice sat at
    the edge of what was tried."""
    best, _ = fake_training
    best["separate"], best["tied"] = 3.0 ** 5, 1.0
    doc, text = _run(tmp_path, bracket=2)
    assert doc["rates"]["separate"] == pytest.approx(BASE_LR * 3.0 ** 3), "the best of what was tried: two steps out"
    assert "Chosen at the edge of what was tried: separate (" in text
