"""Behaviours a code-only round of planted bugs got through the whole suite (issue 38), each tested for the reason a
user cares about, not for the edit itself. A learner's attention under the KV cache is in
tests/test_exercises_training.py (it reuses that file's trained learner run); here, the claims' sweep.

The sweep's bracketing: an arm whose best rate lies two or more grid steps beyond the grid's edge must be followed
out from the rates tried so far, one step at a time, until the best is inside what was tried (or BRACKET runs out,
and the report says so); below the grid, past the preset's schedule floor too (a rate under optim.min_lr was a
config error until runs.job gave it a floor of its own). Training and scoring are replaced by a known curve of
bits/byte against the rate, so the true best is known and the whole of run_claim (the choice, the seeds' rate,
results.json, the report) runs in seconds.

Issue 45's rounds: a rate ruled out by a rising loss, a swept claim along its variable (every value's seeds at the
rate chosen at sweep_at), and where `--quick` writes. The page's and the lab's are beside their own tests
(test_viewer.py, test_sample_rebuild.py, test_lab_server.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from attention_lab.claims import CLAIMS, experiment, report, runs, select
from attention_lab.claims.catalog import BASE, BASE_LR, MIN_LR
from attention_lab.training.config import compose

GRID = (1 / 3, 1.0, 3.0)


def _lr(multiple: float) -> str:
    return f"{BASE_LR * multiple:g}"


@pytest.fixture
def fake_training(monkeypatch):
    """run_claim with every run 'trained' at once (a run folder with the files a finished run leaves: metrics,
    config, the done marker) and scored by a curve with its minimum at best[arm] (a multiple of the base rate):
    bits/byte = 2 + 0.1 * log3(lr / best)^2, plus 0.001 per seed. -> (best, trained), `trained` the (arm,
    multiple, seed) of every run launched, in order."""
    best: dict[str, float] = {}
    trained: list[tuple[str, float, int]] = []
    lr_of: dict[str, float] = {}

    def launch(self, todo):
        for j in todo:
            d = self.run_dir(j)
            d.mkdir(parents=True, exist_ok=True)
            lr = j.lr if j.lr is not None else BASE_LR
            rows = [{"step": 12, "loss": 2.2, "tokens_per_s": 1000.0}, {"step": 12, "val_loss": 2.1},
                    {"step": 24, "loss": 2.0, "tokens_per_s": 1000.0}, {"step": 24, "val_loss": 2.0}]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (d / "config.json").write_text(json.dumps({"optim": {"lr": lr}}))
            (d / "checkpoints").mkdir(exist_ok=True)
            (d / runs.DONE).write_text(json.dumps({"seconds": 1.0, "launch": runs.launch_of(())}))
            self.seconds.append(1.0)
            lr_of[d.name] = lr
            trained.append((j.arm, lr / BASE_LR, j.seed))

    def measure(claim, run_dir, held, quick):
        name = Path(run_dir).name
        arm, seed = name.split("-lr")[0], int(name.rsplit("-s", 1)[1])
        bpb = 2.0 + 0.1 * math.log(lr_of[name] / (BASE_LR * best[arm]), 3) ** 2 + 0.001 * seed
        bpb += 0.0003 * (seed * seed % 5) * (arm == "tied")  # the arms' seed noise not identical
        return {"bpb": bpb, "step": 24} | {m: 0.5 for m in claim.measures}

    held = SimpleNamespace(part=SimpleNamespace(documents=["play"], part="choose"))
    monkeypatch.setattr(runs.Runner, "_launch", launch)
    monkeypatch.setattr(experiment, "load_checkpoint", lambda run, which="latest": SimpleNamespace(
        config=SimpleNamespace(block_size=32)))
    monkeypatch.setattr(experiment, "Held", SimpleNamespace(of=lambda run, part, block, n: held))
    monkeypatch.setattr(experiment, "data_dir_of", lambda run, at: Path("data"))  # one data folder for every fake run
    monkeypatch.setattr(experiment, "measure", measure)
    monkeypatch.setattr(report, "plot", lambda *a: None)
    return best, trained


def _run(tmp_path, bracket: int):
    claim = select(CLAIMS["qk"], (1, 2, 3), ("separate", "tied"), GRID)
    rep = experiment.run_claim(claim, tmp_path / "qk", log=lambda *a: None, progress=False, bracket=bracket)
    return claim, json.loads((tmp_path / "qk" / "results.json").read_text()), rep.read_text()


def _sweep_row(text: str, arm: str) -> dict[str, str]:
    """The report's sweep table as {column heading: the arm's cell}."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| arm |") and "| lr " in line)
    names = [c.strip() for c in lines[head].strip("|").split("|")]
    row = next(line for line in lines[head:] if line.startswith(f"| {arm} |"))
    return dict(zip(names, (c.strip() for c in row.strip("|").split("|"))))


@pytest.mark.parametrize("steps_out", [2, -2], ids=["two steps above the grid", "two steps below the grid"])
def test_an_arm_whose_best_rate_is_two_steps_beyond_the_grid_is_followed_out_and_trained_there(
        tmp_path, fake_training, steps_out):
    """The LSTM's best rate was 0.081, two steps beyond the grid's 0.009: stepping out once, from the grid, would
    train its seeds at 0.027, a rate that is not its best, with the report calling the choice bracketed.
    Planted bug: bracket_steps_from_the_grid."""
    best, trained = fake_training
    edge, step = (GRID[-1], 3.0) if steps_out > 0 else (GRID[0], 1 / 3)
    best["separate"], best["tied"] = edge * step ** 2, 1.0  # separate: 27x (0.081) or 1/27x; tied inside the grid
    claim, doc, text = _run(tmp_path, bracket=4)
    want = BASE_LR * best["separate"]
    tried = sorted(map(float, doc["sweep"]["separate"]))
    assert doc["rates"]["separate"] == pytest.approx(want), (
        f"separate's seeds train at lr {doc['rates']['separate']:g}, not at its best {want:g}; the sweep tried {tried}")
    assert [r["lr"] for r in doc["results"]["separate"]] == pytest.approx([want] * 3)
    out = [BASE_LR * edge * step ** k for k in (1, 2, 3)]  # one step, the best, and the step past it that lost
    assert tried == pytest.approx(sorted([BASE_LR * r for r in GRID] + out)), (
        "the sweep steps out one grid ratio at a time, from the rates tried so far, until its best is inside")
    if steps_out < 0:  # below the preset's schedule floor, which a config refuses above its rate
        assert all(float(r["lr"]) < MIN_LR for r in doc["results"]["separate"])
    assert doc["rates"]["tied"] == pytest.approx(BASE_LR), "tied's best is inside the grid"
    assert sorted(map(float, doc["sweep"]["tied"])) == pytest.approx([BASE_LR * r for r in GRID]), (
        "an arm whose best is inside the grid is not bracketed")
    sweep_runs = [m for a, m, s in trained if a == "separate" and s in claim.sweep_seeds]
    assert sorted(set(sweep_runs)) == pytest.approx(sorted(t / BASE_LR for t in tried), rel=1e-5) and \
        len(sweep_runs) == len(tried) * len(claim.sweep_seeds), "each rate tried once on each sweep seed"
    cells = _sweep_row(text, "separate")
    bold = [name for name, cell in cells.items() if cell.startswith("**")]
    assert bold == [next(n for n in cells if n.startswith(f"lr {want:g}"))] and cells["chosen"] == f"{want:g}", cells
    assert "Chosen at the edge of what was tried" not in text, "the best is inside what was tried: nothing to warn of"


def test_an_arm_still_at_the_edge_when_the_bracket_runs_out_is_named_in_the_report(tmp_path, fake_training):
    """Four steps out with two allowed: the seeds train at the best rate tried, and the report says the choice sat at
    the edge of what was tried."""
    best, _ = fake_training
    best["separate"], best["tied"] = 3.0 ** 5, 1.0
    _, doc, text = _run(tmp_path, bracket=2)
    assert doc["rates"]["separate"] == pytest.approx(BASE_LR * 3.0 ** 3), "the best of what was tried: two steps out"
    assert "Chosen at the edge of what was tried: separate (" in text


def test_the_schedule_floor_the_bracketing_knows_is_the_presets():
    assert compose(list(BASE)).optim.min_lr == MIN_LR and compose(list(BASE)).optim.lr == BASE_LR


def test_a_rate_where_a_sweep_runs_loss_ended_above_its_first_evaluation_is_ruled_out_and_counted(
        tmp_path, fake_training, monkeypatch):
    """A sweep run whose loss stays finite but whose final training loss ends above its first evaluation's diverged
    under the stated rule, like a NaN: its rate is never chosen, even where the others' mean scores best there,
    and the sweep table and the diverged counts name it. Planted bug: sweep_rules_out_only_non_finite."""
    best, _ = fake_training
    best["separate"], best["tied"] = 1.2, 1.0  # separate scores best at the grid's 1x, next best at 3x
    claim = select(CLAIMS["qk"], (1, 2, 3), ("separate", "tied"), GRID)
    seed = claim.sweep_seeds[0]
    launch = runs.Runner._launch

    def rising(self, todo):  # that one run ends worse than it was at its first evaluation (2.1), all finite
        launch(self, todo)
        for j in todo:
            if j.arm == "separate" and j.seed == seed and j.lr == pytest.approx(BASE_LR):
                rows = [{"step": 12, "loss": 2.2, "tokens_per_s": 1000.0}, {"step": 12, "val_loss": 2.1},
                        {"step": 24, "loss": 3.1, "tokens_per_s": 1000.0}, {"step": 24, "val_loss": 3.0}]
                (self.run_dir(j) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    monkeypatch.setattr(runs.Runner, "_launch", rising)
    _, doc, text = _run(tmp_path, bracket=0)
    said = f"sweep seed {seed}'s final training loss 3.1 ended above its first evaluation's 2.1 at lr {BASE_LR:g}"
    assert doc["rates"]["separate"] == pytest.approx(BASE_LR * 3.0), (
        f"the sweep chose lr {doc['rates']['separate']:g} for separate, though {said}: its verdict seeds train at a "
        "rate the divergence rule refuses")
    assert doc["diverged"]["separate"]["sweep"][0] == 1 and list(doc["sweep_diverged"]["separate"]) == [_lr(1.0)], (
        f"{said}, but the diverged counts say {doc['diverged']['separate']['sweep'][0]} of the sweep's runs diverged")
    cell = _sweep_row(text, "separate")[f"lr {BASE_LR:g}"]
    assert cell.endswith(f"diverged: seed {seed}"), f"{said}, but the report's sweep table shows {cell!r} there"
    assert doc["rates"]["tied"] == pytest.approx(BASE_LR), "tied's runs all trained: its best rate stands"


def test_a_swept_claim_along_its_variable_trains_every_values_seeds_at_the_rate_chosen_at_sweep_at(
        tmp_path, fake_training, monkeypatch):
    """A claim along a variable, swept (`--rates 0.333,1,3` clears its fixed rate): its rates are chosen at the
    variable's sweep_at value, and the verdict seeds at every other value train at that value's chosen rate, as
    results.json's `rates` says. Planted bug: along_other_values_take_their_own_rate (each arm at another value
    points its rate_of at itself, never swept, so its seeds train at the preset's own rate and its rate is null)."""
    _, trained = fake_training
    claim = select(CLAIMS["heads"], (1, 2), ("1 head", "4 heads"), GRID)
    var = claim.variable
    at = var.sweep_at if var.sweep_at is not None else var.values[0]
    others = [v for v in var.values if v != at]
    assert others, "the heads claim is tested at more than one width"

    def measure(claim, run_dir, held, quick):  # every arm's best at 3x the base rate, read from the run's config
        lr = json.loads((Path(run_dir) / "config.json").read_text())["optim"]["lr"]
        seed = int(Path(run_dir).name.rsplit("-s", 1)[1])
        return {"bpb": 2.0 + 0.1 * math.log(lr / (BASE_LR * 3.0), 3) ** 2 + 0.001 * seed, "step": 24} | {
            m: 0.5 for m in claim.measures}

    monkeypatch.setattr(experiment, "measure", measure)
    experiment.run_claim(claim, tmp_path / "heads", log=lambda *a: None, progress=False, bracket=0, rate_check=False)
    doc = json.loads((tmp_path / "heads" / "results.json").read_text())
    for a in claim.arms:
        for v in others:
            here = f"{a.name}, {var.name}={v:g}"
            seeds = sorted({m for arm, m, s in trained if arm == here and s in claim.seeds and m != 1.0})
            assert doc["rates"].get(here) == pytest.approx(BASE_LR * 3.0), (
                f"results.json gives {here!r} the rate {doc['rates'].get(here)!r}, not the {BASE_LR * 3.0:g} chosen at "
                f"{var.name}={at:g}: its verdict seeds trained at the preset's own rate, so the verdict at "
                f"{var.name}={v:g} mixes a chosen rate with an unchosen one")
            assert seeds == pytest.approx([3.0]), (
                f"{here!r}'s verdict seeds trained at {seeds} x the base rate besides the common rate, not at the 3x "
                f"chosen at {var.name}={at:g}")


def test_a_quick_run_writes_into_its_own_folder_and_leaves_the_claims_real_results_alone(tmp_path, monkeypatch):
    """`python -m attention_lab.claims qk --quick` is a smoke run: it writes into claims/qk-quick, never claims/qk,
    where the real run's results.json is what `docs` reads. Planted bug: quick_run_writes_into_the_real_claim_folder
    (the quick run's results.json, `quick: true`, replaced the real one and its 24-step runs were reused as finished)."""
    from attention_lab.claims import cli

    real = tmp_path / "qk" / "results.json"
    real.parent.mkdir()
    real.write_text(json.dumps({"claim": "qk", "quick": False}))
    before = real.read_bytes()
    outs = []

    def run_claim(claim, out, quick, **kw):  # what a run leaves: its results.json, where it was told to write
        outs.append((Path(out), quick))
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "results.json").write_text(json.dumps({"claim": claim.name, "quick": quick}))
        return Path(out) / "report.md"

    monkeypatch.setattr(cli, "run_claim", run_claim)
    assert cli.main(["qk", "--quick", "--launcher", "basic", "--root", str(tmp_path)]) == 0
    assert outs == [(tmp_path / "qk-quick", True)], (
        f"`qk --quick` wrote into {outs[0][0]}, not {tmp_path / 'qk-quick'}: a smoke run's numbers in the claim's "
        "own folder")
    assert real.read_bytes() == before, (
        "`qk --quick` replaced claims/qk/results.json: `docs` would show the smoke run, not the claim's verdict")
    assert cli.main(["qk", "--launcher", "basic", "--root", str(tmp_path)]) == 0
    assert outs[-1] == (tmp_path / "qk", False), f"the real run writes into claims/qk, not {outs[-1][0]}"
