"""Atomic, durable file writes: a reader sees the old file or the new one, never half of one.

Two details a plain `mkstemp` + `os.replace` gets wrong:
  * mode: temporary files are created 0600 and temporary folders 0700, private to their owner. Renamed into
    place they would keep that mode while their neighbours are 0644/0755, so a colleague, or a TensorBoard or
    web server run by another user, could not read them. Everything published here gets the mode a plain
    `open(path, "w")` / `mkdir` would give under the process's umask.
  * durability: after a power loss a rename survives only if the folder holding it was synced too, so the
    folder is fsync'd after every rename (its contents before it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where the kernel says it (Linux >= 4.7)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _umask_lock:  # elsewhere the only way to read it is to set it and put it back
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode open(path, "w") gives a new file: 0666 less the umask (0644 under the usual 022)."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """The mode mkdir gives a new folder: 0777 less the umask (0755 under the usual 022)."""
    return 0o777 & ~current_umask()


def fsync_dir(path: Path) -> None:
    """Make the entries of folder `path` (a rename into it, a new file) durable. No-op where folders cannot be
    opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a folder; nothing more can be done there
        pass
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file below folder `path`, then each folder (deepest first): its contents reach the disk."""
    path = Path(path)
    for root, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


def make_temp_dir(parent: Path, prefix: str, suffix: str = ".tmp") -> Path:
    """A new folder under `parent` with a unique name and the umask's folder mode (mkdtemp alone gives 0700)."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=prefix, suffix=suffix))
    os.chmod(tmp, dir_mode())
    return tmp


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written folder `tmp` onto `final` (a folder that does not exist) durably: its files are
    synced first, then the rename, then the parent folder that records it.

    Everything inside gets the umask's modes first: some writers (safetensors) write through a private
    temporary file of their own and leave 0600 behind.
    """
    fmode, dmode = file_mode(), dir_mode()
    for root, dirs, files in os.walk(tmp):
        for name in files:
            os.chmod(os.path.join(root, name), fmode)
        for name in dirs:
            os.chmod(os.path.join(root, name), dmode)
    os.chmod(tmp, dmode)
    fsync_tree(tmp)
    os.replace(tmp, final)
    fsync_dir(Path(final).parent)


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "w"):
    """Write to a temp file in the same directory, then os.replace it onto `path` (only if the block succeeds).

    The file gets the umask's mode, its contents are synced before the rename, and the folder after it.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            if hasattr(os, "fchmod"):  # POSIX; elsewhere files have no such mode bits
                os.fchmod(f.fileno(), file_mode())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj) -> None:
    with atomic_write(path) as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# --- a full disk ---------------------------------------------------------------------------------------------------

DISK_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
DISK_FULL_TEXTS = ("no space left on device", "disk quota exceeded", "storagefull")
ALMOST_NO_SPACE = 1 << 20  # bytes; below this a failed write is put down to the full disk


def is_disk_full(exc: BaseException, path: Path) -> bool:
    """Whether `exc`, raised while writing under `path`, means that the disk (or the user's quota) is full.

    An OSError says so by errno, and some libraries keep its text; others replace it with their own message
    (torch.save: "[enforce fail at inline_container.cc] unexpected pos ..."), so a failed write while the file
    system has almost no space left counts too. Call it before removing what the failed write left behind.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        if any(text in str(e).lower() for text in DISK_FULL_TEXTS):
            return True
        e = e.__cause__ or e.__context__
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return False
    try:
        return shutil.disk_usage(path).free < ALMOST_NO_SPACE
    except OSError:
        return False


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding `path` (the nearest existing ancestor's)."""
    p = Path(os.path.abspath(path))
    while not p.exists():
        p = p.parent
    while not os.path.ismount(p):
        p = p.parent
    return p


def describe_disk(path: Path) -> str:
    """'/dev/sda1 mounted at /data (12.0 MiB free of 100.0 GiB)', as far as the system tells."""
    mount = mount_point(path)
    device = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[1].replace("\\040", " ") == str(mount):
                device = fields[0]  # the last match wins: a later mount hides an earlier one
    where = f"{device} mounted at {mount}" if device else f"the file system mounted at {mount}"
    try:
        usage = shutil.disk_usage(mount)
    except OSError:
        return where
    return f"{where} ({human_bytes(usage.free)} free of {human_bytes(usage.total)})"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
