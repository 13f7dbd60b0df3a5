"""What a finished run's own files say: its training curve, speed, wall time and rate (no model is loaded)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attention_lab.claims.runs import DONE
from attention_lab.store.layout import RunLayout


def metrics_of(run_dir: Path) -> dict:
    """From metrics.jsonl, config.json and claims_done.json: the validation curve, the last training loss, the
    largest one after the first quarter, the median tokens/s, the rate and the run's wall seconds."""
    layout = RunLayout(run_dir)
    lines = [json.loads(x) for x in layout.metrics.read_text().splitlines() if x.strip()]
    train = [r for r in lines if "loss" in r and "heads" not in r]
    val = [(r["step"], r["val_loss"]) for r in lines if "val_loss" in r]
    done = Path(run_dir) / DONE
    return {"steps": max((r["step"] for r in lines), default=0),
            "train_loss": train[-1]["loss"] if train else float("nan"),
            "max_train_loss_late": max((r["loss"] for r in train[len(train) // 4:]), default=float("nan")),
            "tokens_per_s": float(np.median([r["tokens_per_s"] for r in train])) if train else float("nan"),
            "val_curve": val,
            "lr": json.loads(layout.config.read_text())["optim"]["lr"],
            "seconds": json.loads(done.read_text())["seconds"] if done.exists() else float("nan")}
