"""What a new user meets at the command line: one `error:` line and exit status 2 for a dataset the hub cannot
provide and for a disk that fills up while checkpointing; a re-run of a finished run says that nothing was trained."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import train as train_mod
from attention_lab.training.config import compose
from data.sources import DatasetUnavailable

REPO = Path(__file__).resolve().parent.parent


def run_train(args: list[str], *, prelude: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """python train.py ARGS in a fresh process; `prelude` runs first (to patch a library in that process)."""
    code = (f"{prelude}\nimport runpy, sys\nsys.argv = ['train.py', *{args!r}]\n"
            "runpy.run_path('train.py', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})})


def assert_one_error_line(proc: subprocess.CompletedProcess, *parts: str) -> str:
    assert proc.returncode == 2, f"exit status {proc.returncode}, expected 2\nstderr:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, f"a traceback instead of one error line:\n{proc.stderr[-3000:]}"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"expected one error: line, got {errors}\nstderr:\n{proc.stderr[-3000:]}"
    for part in parts:
        assert part in errors[0], f"{part!r} missing from the error line:\n{errors[0]}"
    return errors[0]


def test_unreachable_hub_dataset_is_one_error_line(tmp_path):
    proc = run_train(["experiment=debug", "data=tinystories", "data.path=no/such-dataset",
                      f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"],
                     env={"HF_HUB_OFFLINE": "1"})
    assert_one_error_line(proc, "could not load the dataset data.path='no/such-dataset'", "spelling",
                          "HF_HUB_OFFLINE is set", "local path")


def test_unreachable_hub_dataset_error_says_what_to_check_when_online(tmp_path, monkeypatch):
    """Without HF_HUB_OFFLINE the advice is about the network; the hub is faked unreachable (no network here)."""
    import datasets

    def unreachable(path, **kwargs):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    cfg = compose(["experiment=debug", "data=tinystories", "data.path=someone/tiny-storiez",
                   f"data.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(DatasetUnavailable, match="someone/tiny-storiez.*Couldn't reach.*network connection"):
        train_mod.train(cfg, tmp_path / "run")
    assert issubclass(DatasetUnavailable, FileNotFoundError), "train.py turns FileNotFoundError into error: + exit 2"


DISK_FILLS_AT_THE_SECOND_SAVE = """
import errno
import attention_lab.store.checkpoint as checkpoint
real, calls = checkpoint.save_model, []
def save_model(*args, **kwargs):
    calls.append(1)
    if len(calls) >= 2:
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(*args, **kwargs)
checkpoint.save_model = save_model
"""


def test_full_disk_while_checkpointing_is_one_error_line_with_exit_status_2(tmp_path, data_cache):
    run_dir = tmp_path / "run"
    proc = run_train(["experiment=debug", f"data.cache_dir={data_cache}", f"hydra.run.dir={run_dir}"],
                     prelude=DISK_FILLS_AT_THE_SECOND_SAVE)
    good = run_dir / "checkpoints" / "step_00000010"
    assert_one_error_line(proc, "the disk is full", "step 20", str(run_dir / "checkpoints"), "mounted at",
                          f"last complete checkpoint is {good}", f"hydra.run.dir={run_dir}")
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["best.json", "latest.json", "step_00000010"], f"left behind: {names}"


def test_rerunning_a_finished_run_says_nothing_was_trained_and_shows_the_last_loss(tmp_path, data_cache):
    cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}", "train.max_steps=10"])
    first = train_mod.train(cfg, tmp_path)
    again = train_mod.train(cfg, tmp_path)
    assert again["steps_this_session"] == 0 and again["step"] == 10, again
    assert again["val_loss"] == pytest.approx(first["val_loss"]), "the last evaluated loss was not carried over"
    last = (tmp_path / "console.log").read_text().splitlines()[-1]
    assert "nothing trained" in last, f"the closing line should say that nothing was trained: {last}"
    assert "nan" not in last and f"{first['val_loss']:.4f}" in last, f"the last loss is not shown: {last}"
