"""One trainer per run folder: a second one is refused naming the folder and the holder's pid; a lock left by a
killed process does not block."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_lab.store.layout import RunLayout
from attention_lab.store.runlock import RunLock, RunLocked

REPO = Path(__file__).resolve().parent.parent

HOLDER = """
import sys, time
from attention_lab.store.runlock import RunLock
with RunLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def start_holder(run_dir: Path) -> subprocess.Popen:
    """Another process that takes the lock on run_dir and keeps it (until killed, at most a minute)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "locked":
        proc.kill()
        pytest.fail(f"the holder process did not take the lock: {line!r} {proc.stderr.read()}")
    return proc


def test_a_second_process_is_refused_naming_the_folder_and_the_holders_pid(tmp_path):
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(RunLocked) as info:
            with RunLock(tmp_path):
                pass
        message = str(info.value)
        assert str(tmp_path) in message, f"the folder is not named: {message}"
        assert f"process {holder.pid}" in message, f"the holder's pid {holder.pid} is not named: {message}"
        assert json.loads(RunLayout(tmp_path).lock_owner.read_text())["pid"] == holder.pid, "the refused one overwrote it"
    finally:
        holder.kill()
        holder.wait()
    # killed (no chance to clean up): its lock must not block the next trainer
    with RunLock(tmp_path):
        assert json.loads(RunLayout(tmp_path).lock_owner.read_text())["pid"] == os.getpid()
    assert not RunLayout(tmp_path).lock_owner.exists(), "the holder record should go when the lock is released"


def test_a_stale_lock_file_of_a_dead_process_does_not_block(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (RunLayout(tmp_path).lock).write_text("")
    RunLayout(tmp_path).lock_owner.write_text(json.dumps({"pid": dead.pid, "host": "here", "started": time.time()}))
    with RunLock(tmp_path):
        assert json.loads(RunLayout(tmp_path).lock_owner.read_text())["pid"] == os.getpid()


def test_the_lock_is_released_on_an_exception_and_can_be_taken_again(tmp_path):
    with pytest.raises(KeyError):
        with RunLock(tmp_path):
            raise KeyError("boom")
    with RunLock(tmp_path):
        pass


def test_train_refuses_a_locked_run_folder_before_writing_anything(tmp_path, data_cache):
    import train as train_mod
    from attention_lab.training.config import compose

    run_dir = tmp_path / "run"
    holder = start_holder(run_dir)
    try:
        cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}"])
        with pytest.raises(RunLocked, match=f"{run_dir}.*process {holder.pid}"):
            train_mod.train(cfg, run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    written = sorted(p.name for p in run_dir.iterdir())
    assert written == sorted([RunLayout(run_dir).lock.name, RunLayout(run_dir).lock_owner.name]), f"the refused trainer wrote into the folder: {written}"
