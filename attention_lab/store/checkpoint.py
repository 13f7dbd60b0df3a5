"""Checkpoints on disk: written atomically, found by pointer, loaded with clear errors.

A run directory holds (the names: attention_lab/store/layout.py)

    checkpoints/step_00000500/      one complete checkpoint per directory:
        model.safetensors           the plain module's weights (never compile/DDP-wrapped names)
        model_config.json           GPTConfig as JSON (an LSTMConfig's says "arch": "lstm": model/registry.py)
        tokenizer.json              the tokenizer the model was trained with
        train_state.pt              optimizer, step, RNG and data-sampler state (torch.load weights_only=True)
        meta.json                   step, losses, what else the trainer records
    checkpoints/latest.json         {"dir": "step_00000500", "step": 500}
    checkpoints/best.json           the same for the lowest validation loss

A checkpoint is built in a temporary directory and renamed into place in one step, and the pointer files are
replaced atomically after it, so a killed process leaves either the old checkpoint or the new one, never half
of one. If a pointer is missing or names a directory that is gone, the newest complete step directory wins.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from attention_lab.exercises import learner
from attention_lab.store.layout import (
    STEP_PREFIX,
    CheckpointFiles,
    RunLayout,
    pointer_path,
    run_of_checkpoint,
    step_name,
)
from data.files import describe_disk, is_disk_full, make_temp_dir, publish_dir, write_json_atomic
from data.tokenizer import Tokenizer
from model import GPTConfig, LSTMConfig, build_model, config_from_dict

C = CheckpointFiles

# Test hook: with ATTENTION_LAB_CHECKPOINT_HOOK="<point>@<step>:<marker file>" in the environment, the save of
# checkpoint <step> stops at <point>, writes the marker file and waits (up to 120 s) until it is deleted, so a
# test can SIGKILL or Ctrl-C the trainer at a known moment instead of after a guessed sleep (tests/test_train.py).
# The points, in order: the temp folder half written; complete; renamed into place; latest.json replaced;
# best.json replaced (only reached when the checkpoint is the best).
HOOK_ENV = "ATTENTION_LAB_CHECKPOINT_HOOK"
HOOK_POINTS = ("writing", "before_publish", "after_publish", "after_latest", "after_best")


def _hook(point: str, step: int) -> None:
    spec = os.environ.get(HOOK_ENV)
    if not spec:
        return
    where, _, marker = spec.partition(":")
    if where.split("@")[0] not in HOOK_POINTS:
        raise ValueError(f"{HOOK_ENV}={spec!r}: the point must be one of {', '.join(HOOK_POINTS)}")
    if where != f"{point}@{step}":
        return
    Path(marker).write_text(f"{os.getpid()}\n")
    deadline = time.monotonic() + 120
    while os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)


class CheckpointError(Exception):
    """A checkpoint is missing, incomplete, corrupt or does not fit: the message says which and what to do."""


class DiskFullError(CheckpointError):
    """The disk filled up while a checkpoint was saved: the half-written one is gone, earlier ones are intact."""


SNAPSHOT = "snapshot"  # meta.json's key of a light checkpoint (train.snapshots)


def save_checkpoint(
    root: Path,
    step: int,
    model: nn.Module,
    tokenizer_json: str,
    meta: dict,
    train_state: dict | None = None,
    best: bool = False,
    keep_last: int = 2,
    snapshot: bool = False,
) -> Path:
    """Write checkpoint `step` under root (the run's checkpoints/ folder); point latest (and best) at it.

    `model` must be the plain module (unwrap torch.compile and DDP before calling).
    Keeps the newest `keep_last` step directories and the best one; removes older ones.
    snapshot: a light checkpoint between evaluations (train.snapshots): no pointer moves to it, so a resume never
    opens it, it is never pruned, and meta.json says `"snapshot": true`.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    meta = {**meta, **learner.provenance(model), **({SNAPSHOT: True} if snapshot else {})}
    name = step_name(step)
    final = root / name
    tmp = make_temp_dir(root, prefix=f".{name}.")  # the umask's folder mode, not mkdtemp's private 0700
    try:
        save_model(model, str(tmp / C.WEIGHTS), metadata={"format": "pt"})
        _hook("writing", step)
        (tmp / C.CONFIG).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
        (tmp / C.TOKENIZER).write_text(tokenizer_json, encoding="utf-8")
        if train_state is not None:
            torch.save(train_state, tmp / C.TRAIN_STATE)
        (tmp / C.META).write_text(json.dumps({"step": step, **meta}, indent=2, sort_keys=True) + "\n")
        if final.exists():  # re-saving the same step (e.g. Ctrl-C right after a periodic save)
            shutil.rmtree(final)
        _hook("before_publish", step)
        publish_dir(tmp, final)  # files synced, renamed, the rename synced: durable across a power loss
        _hook("after_publish", step)
    except BaseException as e:
        full = is_disk_full(e, tmp)  # asked before the partial files are removed and free their space
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise DiskFullError(disk_full_message(root, step)) from e
        raise
    if snapshot:
        return final
    pointer = {"dir": name, "step": step, **{k: v for k, v in meta.items() if k in ("val_loss", "val_bpb")}}
    try:
        write_json_atomic(pointer_path(root, "latest"), pointer)
        _hook("after_latest", step)
        if best:
            write_json_atomic(pointer_path(root, "best"), pointer)
            _hook("after_best", step)
    except OSError as e:
        if is_disk_full(e, root):
            raise DiskFullError(disk_full_message(root, step)) from e
        raise
    _prune(root, keep_last)
    return final


def disk_full_message(root: Path, step: int) -> str:
    """What a trainer prints when checkpoint `step` did not fit: which disk, which folder, where to resume."""
    try:
        last = find_checkpoint(root, "latest")
        resume = (f"The last complete checkpoint is {last}: free some space (old runs, or keep fewer checkpoints "
                  f"with train.keep_checkpoints) and resume from it with the same command plus "
                  f"hydra.run.dir={root.parent}.")
    except CheckpointError:
        resume = ("No checkpoint of this run is complete yet: free some space (old runs) and start it again.")
    return (f"the disk is full: checkpoint step {step} did not fit into {root} on {describe_disk(root)}. "
            f"Nothing half-written was kept. {resume}")


def _read_pointer(root: Path, which: str) -> str | None:
    try:
        return json.loads(pointer_path(root, which).read_text())["dir"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _step_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir())


def is_snapshot(step_dir: Path) -> bool:
    """A light checkpoint between evaluations (save_checkpoint(snapshot=True)): weights only."""
    try:
        return bool(json.loads((Path(step_dir) / C.META).read_text(encoding="utf-8")).get(SNAPSHOT))
    except (OSError, ValueError, AttributeError):
        return False


def _prune(root: Path, keep_last: int) -> None:
    full = [p for p in _step_dirs(root) if not is_snapshot(p)]  # snapshots are kept, and take no full one's place
    keep = {p.name for p in full[-keep_last:]}
    keep |= {d for d in (_read_pointer(root, "best"), _read_pointer(root, "latest")) if d}
    for p in full:
        if p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(f".{STEP_PREFIX}*.tmp"):  # left by a killed save
        shutil.rmtree(p, ignore_errors=True)


def find_checkpoint(path: Path, which: str = "best") -> Path:
    """A run directory, its checkpoints/ folder, or one checkpoint directory -> one checkpoint directory.

    which: "best" or "latest"; best falls back to latest (a run that never evaluated has no best).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no such run or checkpoint: {path}. Check the path, or list runs with `ls runs/`.")
    if (path / C.WEIGHTS).exists() or (path / C.CONFIG).exists():
        return path
    run = RunLayout(path)
    root = run.checkpoints if run.checkpoints.is_dir() else path
    for pointer in ((which, "latest") if which == "best" else (which,)):
        name = _read_pointer(root, pointer)
        if name and (root / name).is_dir():
            return root / name
    steps = _step_dirs(root)
    if not steps:
        raise CheckpointError(
            f"{path} holds no checkpoint (no {STEP_PREFIX}* folder under {root}). "
            "Train first (`python train.py`), or pass --checkpoint pointing at a checkpoint folder."
        )
    return ([p for p in steps if not is_snapshot(p)] or steps)[-1]  # without pointers: the newest full one


DEFAULT_PRESET = "default"  # config.yaml's name: what `python train.py` trains
NAMED_ONLY = ("debug", "claims")  # presets never opened unless named: a tiny model for trying things, claims' arms


@dataclass(frozen=True)
class RunChoice:
    """The run a command opens when given none: its folder, preset and why it was the one."""

    path: Path
    preset: str | None
    why: str


def choose_run(runs_root: Path = Path("runs"), preset: str | None = None) -> RunChoice:
    """The run to open when none is named, among the runs under runs_root that have a checkpoint (the most recently
    saved of those that qualify):

    preset named: the latest run of that preset (`--preset debug` opens debug runs);
    otherwise the latest run of the default preset (`python train.py`); if there is none, the latest run of
    another preset; never a debug or claims run, nor one trained with a learner's attention (an exercise): those
    only when named. CheckpointError, saying what to pass, when nothing qualifies.
    """
    runs_root = Path(runs_root)
    runs = [p.parent for p in runs_root.glob(f"**/{RunLayout(runs_root).checkpoints.name}") if p.is_dir() and _step_dirs(p)]
    if not runs:
        raise CheckpointError(
            f"no trained run found under {runs_root.resolve()}. Train one with `python train.py`, "
            "or pass --run / --checkpoint."
        )

    def last_saved(run: Path) -> float:
        pointer = RunLayout(run).latest_pointer
        return pointer.stat().st_mtime if pointer.exists() else run.stat().st_mtime

    def kind(run: Path) -> str | None:
        return RunLayout(run).preset()

    if preset is not None:
        named = [r for r in runs if kind(r) == preset]
        if not named:
            seen = sorted({str(kind(r)) for r in runs})
            raise CheckpointError(f"no run of preset {preset!r} under {runs_root}; the presets there: "
                                  f"{', '.join(seen)}")
        return RunChoice(max(named, key=last_saved), preset, f"the latest run of preset {preset!r}")
    ordinary = [r for r in runs if kind(r) not in NAMED_ONLY and not RunLayout(r).learner_attention()]
    default = [r for r in ordinary if kind(r) == DEFAULT_PRESET]
    if default:
        return RunChoice(max(default, key=last_saved), DEFAULT_PRESET, "the latest run of the default preset")
    if ordinary:
        run = max(ordinary, key=last_saved)
        return RunChoice(run, kind(run), "no run of the default preset yet: the latest other run")
    latest = max(runs, key=last_saved)
    raise CheckpointError(
        f"the only runs under {runs_root} are debug, claims or exercise runs (the latest: {latest}), opened only "
        f"when named: name that run, or pass --preset {kind(latest) or 'debug'} for the latest of its preset; "
        "`python train.py` trains the default run"
    )


def latest_run(runs_root: Path = Path("runs"), preset: str | None = None) -> Path:
    """choose_run's folder."""
    return choose_run(runs_root, preset).path


def run_summary(ckpt: Checkpoint, choice: RunChoice | None = None) -> str:
    """One line saying which run a command opened: its folder, preset, checkpoint step and bits/byte (and, when
    the run was chosen for the user, why this one)."""
    run = run_of_checkpoint(ckpt.path)
    preset = RunLayout(run).preset()
    bpb = ckpt.meta.get("val_bpb")
    score = f", {bpb:.3f} bits/byte" if isinstance(bpb, (int, float)) and math.isfinite(bpb) else ", not evaluated"
    chosen = f"; {choice.why}, pass --run to open another" if choice is not None else ""
    return (f"run: {run} (preset {preset or 'unknown'}; checkpoint {ckpt.path.name}, step {ckpt.step}{score}"
            f"{chosen})")


@dataclass
class Checkpoint:
    path: Path
    config: GPTConfig | LSTMConfig
    meta: dict
    tokenizer_json: str
    step: int = field(default=0)

    def build_model(self, device: str | torch.device = "cpu", config: GPTConfig | LSTMConfig | None = None,
                    attn_impl: str | None = None) -> nn.Module:
        """The GPT (or LSTM) with this checkpoint's weights, on `device`, in eval mode.

        config: build from this instead of the checkpoint's own (same shapes; e.g. another dropout).
        attn_impl: None runs the attention the checkpoint trained with (meta.json's attn_impl: a learner's file,
        which must still be there); "" the built-in one.
        """
        model = build_model(config or self.config)
        try:
            _, note = learner.reopen(model, self.meta if attn_impl is None else {"attn_impl": attn_impl})
        except ValueError as e:
            raise CheckpointError(f"{self.path}: {e}") from e
        if note:
            warnings.warn(note, stacklevel=2)
        try:
            missing, unexpected = load_model(model, str(self.path / C.WEIGHTS), strict=False)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise CheckpointError(
                f"{self.path / C.WEIGHTS} cannot be read ({e}). The file is corrupt or was written by "
                "another model; use another checkpoint of the run (checkpoints/step_*) or retrain."
            ) from e
        # tied weights are stored once, so lm_head.weight may be reported missing
        missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_embeddings)]
        if missing or unexpected:
            raise CheckpointError(
                f"{self.path} does not fit its model_config.json: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        return model.to(device).eval()

    def tokenizer(self) -> Tokenizer:
        """The tokenizer the model was trained with; CheckpointError if it cannot be read or does not fit."""
        try:
            tokenizer = Tokenizer.from_str(self.tokenizer_json)
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception for bad JSON
            raise CheckpointError(f"{self.path / CheckpointFiles.TOKENIZER} cannot be read as a tokenizer ({e})") from e
        if tokenizer.vocab_size > self.config.vocab_size:
            raise CheckpointError(
                f"{self.path}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                f"{self.config.vocab_size}; tokenizer.json belongs to another model"
            )
        return tokenizer

    def train_state(self, map_location="cpu") -> dict:
        f = self.path / C.TRAIN_STATE
        if not f.exists():
            raise CheckpointError(f"{self.path} has no train_state.pt, so training cannot resume from it")
        try:
            return torch.load(f, map_location=map_location, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means the same to the user
            raise CheckpointError(f"{f} cannot be loaded ({type(e).__name__}: {e}); it is corrupt") from e


def load_checkpoint(path: Path, which: str = "best") -> Checkpoint:
    """Read a checkpoint's config, meta and tokenizer (weights are read by Checkpoint.build_model)."""
    ckpt = find_checkpoint(path, which)
    missing = [f for f in C.REQUIRED if not (ckpt / f).exists()]
    if missing:
        raise CheckpointError(
            f"checkpoint {ckpt} is incomplete: missing {', '.join(missing)}. Use another checkpoint of the run."
        )
    try:
        cfg = config_from_dict(json.loads((ckpt / C.CONFIG).read_text()))
        meta = json.loads((ckpt / C.META).read_text())
    except ValueError as e:
        raise CheckpointError(f"checkpoint {ckpt} has an unreadable or invalid config/meta: {e}") from e
    return Checkpoint(ckpt, cfg, meta, (ckpt / C.TOKENIZER).read_text(encoding="utf-8"), int(meta.get("step", 0)))
