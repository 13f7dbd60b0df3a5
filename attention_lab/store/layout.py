"""Every path of a run folder, named once: the trainer, sample.py, the pages and the commands that read a run
all ask this module, so a writer and its readers cannot drift apart.

    <run>/                              RunLayout(run)
      config.json, provenance.json      the resolved config; argv, overrides, git commit, packages, data folder
      metrics.jsonl, console.log        one JSON line per log/evaluation; what the console showed
      .train.lock, .train.lock.json     one trainer per run folder, and who holds it
      checkpoints/                      latest.json, best.json ({"dir", "step", "val_loss", ...}), step_XXXXXXXX/
        step_XXXXXXXX/                  CheckpointFiles: model.safetensors, model_config.json, tokenizer.json,
                                        train_state.pt, meta.json
      attention/                        the training film's frames: probe.json, step_XXXXXXXX.npy (float16
                                        L x nh x T x T), heads.jsonl (one record per evaluation), phase_changes.json
      attention.html                    the film (rewritten at every evaluation)
      tb/                               TensorBoard events; tb/samples/<name>/ for sample.py's
      samples/<name>/                   SampleLayout: one sample.py call (sample_00/, ... when several)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

STEP_PREFIX = "step_"


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def pointer_path(checkpoints: Path, which: str) -> Path:
    """latest.json or best.json inside a checkpoints folder ({"dir": "step_XXXXXXXX", "step", "val_loss", ...})."""
    return Path(checkpoints) / f"{which}.json"


class CheckpointFiles:
    """The files of one checkpoint folder (checkpoints/step_XXXXXXXX/)."""

    WEIGHTS = "model.safetensors"
    CONFIG = "model_config.json"
    TOKENIZER = "tokenizer.json"
    TRAIN_STATE = "train_state.pt"
    META = "meta.json"
    REQUIRED = (WEIGHTS, CONFIG, TOKENIZER, META)  # train_state.pt only matters for resuming


@dataclass(frozen=True)
class RunLayout:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    # what the logger writes
    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def provenance(self) -> Path:
        return self.root / "provenance.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def console(self) -> Path:
        return self.root / "console.log"

    @property
    def tb(self) -> Path:
        return self.root / "tb"

    @property
    def lock(self) -> Path:
        return self.root / ".train.lock"

    @property
    def lock_owner(self) -> Path:
        return self.root / ".train.lock.json"

    # checkpoints
    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def pointer(self, which: str) -> Path:
        """checkpoints/latest.json or checkpoints/best.json."""
        return pointer_path(self.checkpoints, which)

    @property
    def latest_pointer(self) -> Path:
        return self.pointer("latest")

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

    # the training film
    @property
    def attention(self) -> Path:
        return self.root / "attention"

    @property
    def probe(self) -> Path:
        return self.attention / "probe.json"

    def frame(self, step: int) -> Path:
        return self.attention / f"{step_name(step)}.npy"

    def frames(self) -> dict[int, Path]:
        """step -> attention/step_XXXXXXXX.npy, for every frame on disk."""
        out = {}
        for p in self.attention.glob(f"{STEP_PREFIX}*.npy"):
            try:
                out[int(p.stem.removeprefix(STEP_PREFIX))] = p
            except ValueError:
                continue
        return dict(sorted(out.items()))

    @property
    def heads(self) -> Path:
        return self.attention / "heads.jsonl"

    @property
    def phase_changes(self) -> Path:
        return self.attention / "phase_changes.json"

    @property
    def film(self) -> Path:
        return self.root / "attention.html"

    # `python -m attention_lab.ideas NAME`'s figures: ideas/NAME.png
    @property
    def ideas(self) -> Path:
        return self.root / "ideas"

    # sample.py's outputs
    @property
    def samples(self) -> Path:
        return self.root / "samples"

    @property
    def tb_samples(self) -> Path:
        return self.tb / "samples"

    def new_sample_name(self, stamp: str) -> str:
        """stamp, or stamp-2, stamp-3, ...: the first name free in both samples/ and tb/samples/ (two calls of
        sample.py within one second)."""
        name, n = stamp, 1
        while (self.samples / name).exists() or (self.tb_samples / name).exists():
            n += 1
            name = f"{stamp}-{n}"
        return name

    def is_run(self) -> bool:
        """Does this folder hold what a training film is built from (attention/ or metrics.jsonl)?"""
        return self.attention.exists() or self.metrics.exists()

    def model_arch(self) -> str:
        """The run's model.arch as its config.json records it: "gpt" (also for a run without one, or from before
        the LSTM baseline) or "lstm"."""
        try:
            return json.loads(self.config.read_text(encoding="utf-8")).get("model", {}).get("arch", "gpt")
        except (OSError, ValueError, AttributeError):
            return "gpt"

    def preset(self) -> str | None:
        """The run's preset as its config.json records it (`name`: "default" for `python train.py`, the
        experiment's name for `experiment=...`), or None for a folder without one."""
        try:
            name = json.loads(self.config.read_text(encoding="utf-8")).get("name")
            return str(name) if name else None
        except (OSError, ValueError, AttributeError):
            return None

    def learner_attention(self) -> str:
        """The learner's attention the run trained with (config.json's model.attn_impl: an exercise), or ""."""
        try:
            return str(json.loads(self.config.read_text(encoding="utf-8")).get("model", {}).get("attn_impl") or "")
        except (OSError, ValueError, AttributeError):
            return ""


@dataclass(frozen=True)
class SampleLayout:
    """One sample's folder: what sample.py writes and what `python -m attention_lab.viewer FOLDER` reads."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def weights(self) -> Path:
        return self.root / "attention.npy"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def summary_text(self) -> Path:
        return self.root / "summary.txt"

    @property
    def page(self) -> Path:
        return self.root / "attention.html"

    @property
    def page_data(self) -> Path:
        """What the page shows beyond attention.npy (step inside, logit lens, circuits, scores, title), so that
        `python -m attention_lab.viewer FOLDER` rebuilds the same page."""
        return self.root / "page.json"

    def layer_png(self, layer: int) -> Path:
        return self.root / f"layer_{layer:02d}.png"

    def is_sample(self) -> bool:
        return self.weights.exists() and self.tokens.exists()


def run_of_checkpoint(checkpoint_dir: Path) -> Path:
    """runs/<run>/checkpoints/step_X -> runs/<run>; a loose checkpoint folder is its own 'run'."""
    checkpoint_dir = Path(checkpoint_dir)
    if checkpoint_dir.parent.name == RunLayout(checkpoint_dir.parent.parent).checkpoints.name:
        return checkpoint_dir.parent.parent
    return checkpoint_dir
