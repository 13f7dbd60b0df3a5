"""The run you meant: with no --run, sample.py and the lab open the latest run of the default preset (not the
debug run trained after it), say which run first (path, preset, step, bits/byte), and open debug or exercise runs
only when named (--run) or asked for (--preset)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

import sample
import train as train_mod
from attention_lab.lab.models import Registry
from attention_lab.store.checkpoint import CheckpointError, choose_run
from attention_lab.training.config import compose

FAST = ["train.max_steps=4", "train.eval_interval=4", "train.sample_tokens=0", "train.tensorboard=false",
        "train.film=false"]


def trained(runs: Path, name: str, cache: Path, *overrides: str) -> Path:
    """A real (tiny) train.py run of preset `name` in runs/<name>/<time>, as Hydra lays it out."""
    run_dir = runs / name / time.strftime("%Y-%m-%d_%H-%M-%S")
    train_mod.train(compose(["experiment=debug", f"name={name}", f"data.cache_dir={cache}", *FAST, *overrides]),
                    run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_cache) -> tuple[Path, Path, Path]:
    """runs/: a default-preset run, then a debug run saved after it (the newest)."""
    root = tmp_path_factory.mktemp("runs")
    default = trained(root, "default", data_cache)
    debug = trained(root, "debug", data_cache)
    later = time.time() + 5  # the debug run is the one saved last, whatever the clock's resolution
    for p in (debug / "checkpoints").iterdir():
        os.utime(p, (later, later))
    return root, default, debug


def first_line(err: str) -> str:
    return err.strip().splitlines()[0]


def test_after_a_debug_run_sample_py_opens_the_default_run_and_says_so(runs, capsys):
    root, default, debug = runs
    rc = sample.main(["--runs-root", str(root), "--prompt", "ROMEO:", "--max-new-tokens", "3", "--no-attention",
                      "--seed", "0", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 0, err
    line = first_line(err)
    meta = json.loads(next((default / "checkpoints").glob("step_*/meta.json")).read_text())
    assert line.startswith(f"run: {default} (preset default; "), f"sample.py should open the default run first:\n{err}"
    assert "step 4" in line and f"{meta['val_bpb']:.3f} bits/byte" in line, line
    assert "the latest run of the default preset" in line and "--run" in line, line
    assert str(debug) not in err, err


def test_debug_runs_open_only_when_named_or_asked_for(runs, tmp_path, capsys):
    root, default, debug = runs
    rc = sample.main(["--runs-root", str(root), "--preset", "debug", "--prompt", "R", "--max-new-tokens", "2",
                      "--no-attention", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 0 and first_line(err).startswith(f"run: {debug} (preset debug; "), err
    rc = sample.main(["--run", str(debug), "--prompt", "R", "--max-new-tokens", "2", "--no-attention"])
    assert rc == 0 and first_line(capsys.readouterr().err).startswith(f"run: {debug} (preset debug; ")

    only_debug = tmp_path / "runs"
    shutil.copytree(debug, only_debug / "debug" / debug.name)
    rc = sample.main(["--runs-root", str(only_debug), "--prompt", "R", "--no-attention"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "--preset debug" in err and "python train.py" in err, err


def test_the_lab_opens_the_same_run(runs):
    root, default, debug = runs
    registry = Registry.open([], runs_root=root)
    assert [e.root for e in registry.entries.values()] == [default]
    assert registry.summaries["0"].startswith(f"run: {default} (preset default; ")
    assert Registry.open([], runs_root=root, preset="debug").entries["0"].root == debug
    with pytest.raises(CheckpointError, match="no run of preset 'induction'.*the presets there: debug, default"):
        choose_run(root, "induction")


def test_an_exercise_run_is_not_the_default(runs, tmp_path):
    """A run trained with a learner's attention (model.attn_impl) is skipped like a debug run."""
    root, default, _ = runs
    config = json.loads((default / "config.json").read_text())
    config["model"]["attn_impl"] = "my_attention/attention.py:attention"
    exercise = tmp_path / "default" / "x"
    shutil.copytree(default / "checkpoints", exercise / "checkpoints")
    (exercise / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="exercise runs"):
        choose_run(tmp_path)


def test_a_newer_run_of_another_preset_does_not_displace_the_default_run(runs, tmp_path, capsys):
    """An older default run beside a newer run of another ordinary preset (experiment=baby_gpu: not debug, not
    claims, not an exercise): sample.py opens the default run and says so, not the newer one under its name."""
    _, default, _ = runs
    older = tmp_path / "default" / default.name
    shutil.copytree(default, older)
    newer = tmp_path / "baby_gpu" / "later"
    shutil.copytree(default, newer)
    config = json.loads((newer / "config.json").read_text())
    config["name"] = "baby_gpu"
    (newer / "config.json").write_text(json.dumps(config))
    later = time.time() + 5
    for p in [newer, *(newer / "checkpoints").iterdir()]:
        os.utime(p, (later, later))
    assert choose_run(tmp_path, "baby_gpu").path == newer  # it is the newest run there
    rc = sample.main(["--runs-root", str(tmp_path), "--prompt", "R", "--max-new-tokens", "2", "--no-attention",
                      "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 0, err
    line = first_line(err)
    assert line.startswith(f"run: {older} (preset default; "), f"the default run should open, not {newer}:\n{err}"
    assert "the latest run of the default preset" in line and str(newer) not in err, err
