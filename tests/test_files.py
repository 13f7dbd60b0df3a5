"""Written files: the umask's modes (never a temporary's private 0600/0700), folders synced after renames, and a
full disk while checkpointing reported as such, with the earlier checkpoints intact."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import torch

import attention_lab.store.checkpoint as checkpoint_mod
import data.files as files_mod
from attention_lab.store.checkpoint import CheckpointError, DiskFullError, load_checkpoint, save_checkpoint
from data.config import DataConfig
from data.files import atomic_write, write_json_atomic
from data.prepare import prepare_data
from model import GPT, GPTConfig


@pytest.fixture(params=[0o022, 0o027, 0o002], ids=lambda m: f"umask{m:03o}")
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_plain_modes(root: Path, umask: int) -> None:
    """Every file and folder below root (root included) has the mode open()/mkdir give under `umask`."""
    want_file, want_dir = 0o666 & ~umask, 0o777 & ~umask
    for p in [root, *root.rglob("*")]:
        want = want_dir if p.is_dir() else want_file
        assert mode(p) == want, f"{p} has mode {mode(p):o}, a plain write under umask {umask:03o} gives {want:o}"


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8))


def save(root: Path, step: int, **kwargs) -> Path:
    return save_checkpoint(root, step, tiny_model(step), '{"version": "1.0"}', {"val_loss": 1.0 / step},
                           {"step": step}, **kwargs)


# --------------------------------------------------------------------------------------------------------- modes


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit, OSError], ids=["ctrl-c", "exit", "error"])
def test_an_interrupted_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path, stop):
    """Ctrl-C (KeyboardInterrupt) and sys.exit (SystemExit) are not Exceptions: the temporary is removed for them
    too, and the file keeps its earlier contents."""
    target = tmp_path / "meta.json"
    target.write_text("old\n")
    with pytest.raises(stop):
        with atomic_write(target) as f:
            f.write("half of the new")
            raise stop()
    assert target.read_text() == "old\n", "the earlier file is untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"], "no temporary left beside it"


def test_atomic_write_gives_the_umask_mode(tmp_path, umask):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what a non-atomic write gives, for comparison
    with atomic_write(tmp_path / "atomic.bin", "wb") as f:
        f.write(b"x")
    write_json_atomic(tmp_path / "summary.json", {"a": 1})  # sample.py's summary.json / tokens.json writer
    for name in ("atomic.bin", "summary.json"):
        assert mode(tmp_path / name) == mode(plain) == 0o666 & ~umask, (
            f"{name}: mode {mode(tmp_path / name):o}, its plain neighbour has {mode(plain):o}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atomic.bin", "plain.txt", "summary.json"], "temp left"


def test_checkpoint_folders_and_files_get_the_umask_modes(tmp_path, umask):
    root = tmp_path / "checkpoints"
    save(root, 1)
    save(root, 2, best=True)
    assert_plain_modes(root, umask)
    assert {p.name for p in root.iterdir()} == {"step_00000001", "step_00000002", "latest.json", "best.json"}


def test_prepared_data_gets_the_umask_modes(tmp_path, umask):
    text = tmp_path / "corpus"
    text.mkdir()
    for i in range(4):
        (text / f"doc{i}.txt").write_text("to be or not to be\n" * (20 + i))
    prepared = prepare_data(DataConfig(source="text", files=[str(text)], tokenizer="char", name="modes",
                                       cache_dir=str(tmp_path / "cache"), val_fraction=0.25), log=lambda s: None)
    names = {p.name for p in prepared.dir.iterdir()}
    assert {"train.bin", "val.bin", "meta.json", "tokenizer.json"} <= names, names
    assert_plain_modes(prepared.dir, umask)


# ------------------------------------------------------------------------------------------------- durability


@pytest.fixture
def fsyncs(monkeypatch):
    """Records (path, what existed at that moment) for every os.fsync, by the descriptor's /proc link."""
    calls: list[tuple[str, set[str]]] = []
    real = os.fsync

    def spy(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        listing = set(os.listdir(path)) if os.path.isdir(path) else set()
        calls.append((path, listing))
        return real(fd)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name the synced descriptors")
    monkeypatch.setattr(os, "fsync", spy)
    return calls


def test_a_checkpoint_is_synced_and_its_rename_too(tmp_path, fsyncs):
    root = tmp_path / "checkpoints"
    final = save(root, 3)
    synced = [path for path, _ in fsyncs]
    assert any(p.endswith("model.safetensors") for p in synced), f"the weights were never synced: {synced}"
    assert any(p.endswith("train_state.pt") for p in synced), f"the train state was never synced: {synced}"
    after_rename = [listing for path, listing in fsyncs if path == str(root)]
    assert any(final.name in listing for listing in after_rename), (
        f"{root} was not synced after {final.name} was renamed into it; the rename could be lost on power loss")
    assert any("latest.json" in listing for listing in after_rename), "latest.json's rename was never synced"


def test_atomic_write_syncs_the_folder_after_the_rename(tmp_path, fsyncs):
    write_json_atomic(tmp_path / "meta.json", {})
    assert (str(tmp_path), {"meta.json"}) in fsyncs, f"no sync of {tmp_path} holding meta.json: {fsyncs}"


# -------------------------------------------------------------------------------------------------- full disk


def test_full_disk_while_saving_names_the_disk_and_the_checkpoint_to_resume_from(tmp_path, monkeypatch):
    root = tmp_path / "run" / "checkpoints"
    good = save(root, 10)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_mod, "save_model", no_space)
    with pytest.raises(DiskFullError) as info:
        save(root, 20)
    message = str(info.value)
    assert isinstance(info.value, CheckpointError), "train.py reports CheckpointErrors as one error line, exit 2"
    for part in ("disk is full", str(root), "mounted at", str(good), f"hydra.run.dir={root.parent}"):
        assert part in message, f"{part!r} missing from the message:\n{message}"
    assert sorted(p.name for p in root.iterdir()) == ["best.json", "latest.json", "step_00000010"] or \
        sorted(p.name for p in root.iterdir()) == ["latest.json", "step_00000010"], (
        f"a half-written checkpoint or temp folder was left behind: {sorted(p.name for p in root.iterdir())}")
    ckpt = load_checkpoint(root.parent, "latest")
    assert ckpt.path == good and ckpt.step == 10, f"the earlier checkpoint is no longer the latest: {ckpt.path}"
    ckpt.build_model()  # and it still loads


def test_torch_save_failure_on_a_full_disk_is_reported_as_a_full_disk(tmp_path, monkeypatch):
    """torch.save hides ENOSPC behind "[enforce fail at inline_container.cc] unexpected pos": judged by free space."""
    root = tmp_path / "checkpoints"

    def torch_save_fails(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3712 vs 3600")

    monkeypatch.setattr(checkpoint_mod.torch, "save", torch_save_fails)
    usage = files_mod.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(files_mod.shutil, "disk_usage", lambda p: usage._replace(free=4096))
    with pytest.raises(DiskFullError, match="disk is full.*No checkpoint of this run is complete yet"):
        save(root, 1)
    assert list(root.iterdir()) == [], "the failed checkpoint's temp folder was left behind"

    # with space to spare the same error is some other problem: passed on as it is, never called a full disk
    monkeypatch.setattr(files_mod.shutil, "disk_usage", lambda p: usage._replace(free=10 << 30))
    with pytest.raises(RuntimeError, match="unexpected pos") as info:
        save(root, 1)
    assert not isinstance(info.value, DiskFullError)


def test_describe_disk_names_the_mount_point(tmp_path):
    text = files_mod.describe_disk(tmp_path / "not" / "yet" / "there")
    mount = files_mod.mount_point(tmp_path)
    assert f"mounted at {mount}" in text and "free of" in text, text
    assert os.path.ismount(mount) and str(tmp_path).startswith(str(mount)), mount
    assert json.dumps(text)  # printable
