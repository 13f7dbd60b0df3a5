"""Everything a run writes besides checkpoints: console lines, metrics.jsonl, TensorBoard, provenance.

Created on the main process only; other ranks get a RunLogger(enabled=False) whose methods do nothing.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from attention_lab.store.layout import RunLayout
from data.files import write_json_atomic

PACKAGES = ("torch", "numpy", "datasets", "tokenizers", "hydra-core", "omegaconf", "tensorboard", "safetensors",
            "transformers")


def git_commit(cwd: Path) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class RunLogger:
    """Files are opened on first use, so a run that fails its checks at start leaves no empty logs behind."""

    def __init__(self, run_dir: Path, enabled: bool = True, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.layout = RunLayout(self.run_dir)
        self.enabled = enabled
        self.use_tensorboard = tensorboard
        self._writer = None
        self._series: dict = {}  # TensorBoard runs beside the main one (tb/<name>/): one per head, one colour each
        self._metrics = None
        self._console = None

    @property
    def writer(self):
        """The TensorBoard SummaryWriter (None when disabled)."""
        if self._writer is None and self.enabled and self.use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.layout.tb))
        return self._writer

    def series_scalar(self, series: str, tag: str, value: float, step: int) -> None:
        """A scalar in TensorBoard run tb/<series>/: a chart whose tag several series write draws one line per series,
        each in its own colour and named by the series in the run list and the tooltip (lines of one run share
        one colour, so 16 heads' lines in one run cannot be told apart)."""
        if self.writer is None:
            return
        if series not in self._series:
            from torch.utils.tensorboard import SummaryWriter

            self._series[series] = SummaryWriter(log_dir=str(self.layout.tb / series))
        self._series[series].add_scalar(tag, value, step)

    def print(self, *args) -> None:
        """A line on the console, also appended to the run's console.log."""
        if not self.enabled:
            return
        line = " ".join(str(a) for a in args)
        print(line, flush=True)
        if self._console is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._console = open(self.layout.console, "a", encoding="utf-8")
        self._console.write(line.lstrip("\n") + "\n")
        self._console.flush()

    def provenance(self, config, overrides: list[str], extra: dict | None = None) -> None:
        if not self.enabled:
            return
        repo = Path(__file__).resolve().parents[2]  # attention_lab/store/logger.py -> the repo
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # config: the typed Config, or the dict to record (attention_lab/training/learner.py recorded_config)
        write_json_atomic(self.layout.config, config if isinstance(config, dict) else dataclasses.asdict(config))
        write_json_atomic(self.layout.provenance, {
            "argv": sys.argv,
            "overrides": overrides,
            "git": git_commit(repo),
            "packages": package_versions(),
            "platform": platform.platform(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **(extra or {}),
        })

    def metrics(self, step: int, values: dict, tb_prefix: str | None = None) -> None:
        """One line of metrics.jsonl; with tb_prefix, also TensorBoard scalars named prefix/key."""
        if not self.enabled:
            return
        if self._metrics is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._metrics = open(self.layout.metrics, "a", encoding="utf-8")
        self._metrics.write(json.dumps({"step": step, **values}) + "\n")
        self._metrics.flush()
        if self.writer is not None and tb_prefix is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{tb_prefix}/{key}", value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.writer is not None:
            # TensorBoard renders text as markdown: indent four spaces so line breaks and spacing survive
            self.writer.add_text(tag, "    " + text.replace("\n", "\n    "), step)

    def hparams(self, hparams: dict, final_metrics: dict) -> None:
        if self.writer is not None:
            clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
            self.writer.add_hparams(clean, {f"hparam/{k}": v for k, v in final_metrics.items()}, run_name="hparams")

    def flush(self) -> None:
        for writer in (self._writer, *self._series.values()):
            if writer is not None:
                writer.flush()

    def close(self) -> None:
        for writer in (self._writer, *self._series.values()):
            if writer is not None:
                writer.close()
        for f in (self._metrics, self._console):
            if f is not None:
                f.close()
