"""One trainer per run folder: a lock held while a process trains into it.

    with RunLock(run_dir):      # RunLocked if another live process holds it
        train(...)

Two trainers in one folder would both run to the end, interleaving metrics.jsonl, console.log, TensorBoard
events and checkpoints. The lock is an OS file lock (`filelock`, flock on Unix) on `run_dir/.train.lock`: the
kernel drops it when its process dies, however it dies, so a lock left by a killed trainer never blocks a
resume. Beside it `.train.lock.json` names the holder (pid, host, start time, command line) for the error the
next trainer prints; it is rewritten by each new holder, so a stale one from a killed process is harmless.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from attention_lab.store.layout import RunLayout


class RunLocked(RuntimeError):
    """Another live process trains into this run folder; the message names the folder and that process."""


def read_owner(run_dir: Path) -> dict | None:
    """The holder record the last trainer wrote, or None if there is none or it is unreadable."""
    try:
        owner = json.loads(RunLayout(run_dir).lock_owner.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def describe_owner(owner: dict | None) -> str:
    if not owner:
        return "another process (it recorded no pid)"
    where = f" on {owner['host']}" if owner.get("host") and owner.get("host") != socket.gethostname() else ""
    since = ""
    if isinstance(owner.get("started"), (int, float)):
        since = f", running since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(owner['started']))}"
    command = f": {owner['command']}" if owner.get("command") else ""
    return f"process {owner.get('pid', '?')}{where}{since}{command}"


class RunLock:
    """Context manager: hold run_dir's trainer lock, or raise RunLocked naming the folder and the holder's pid.

    timeout: seconds to wait for a busy lock (0 = fail at once, the right thing for a trainer).
    """

    def __init__(self, run_dir: str | os.PathLike, timeout: float = 0.0):
        self.run_dir = Path(run_dir)
        self.timeout = timeout
        self._lock: FileLock | None = None

    def acquire(self) -> "RunLock":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(RunLayout(self.run_dir).lock), timeout=self.timeout)
        try:
            lock.acquire()
        except Timeout:
            raise RunLocked(
                f"{self.run_dir} is in use: {describe_owner(read_owner(self.run_dir))} is training into it. "
                "Two trainers in one run folder would interleave its logs and checkpoints. Wait for that run to "
                "finish (or stop it), or train into another folder (hydra.run.dir=...)."
            ) from None
        self._lock = lock
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                 "command": " ".join([os.path.basename(sys.executable), *sys.argv])}
        # plain write, not atomic: only the holder writes it, and a reader copes with a torn file (no pid shown)
        RunLayout(self.run_dir).lock_owner.write_text(json.dumps(owner) + "\n", encoding="utf-8")
        return self

    def release(self) -> None:
        if self._lock is not None:
            # the record goes first: once the lock is free a new holder may write its own
            try:
                if (read_owner(self.run_dir) or {}).get("pid") == os.getpid():
                    RunLayout(self.run_dir).lock_owner.unlink()
            except OSError:
                pass
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
