"""What a finished run's own files say: its training curve, speed, wall time, rate, and whether it diverged (no
model is loaded).

A run is **diverged** (the rule every report states, DIVERGED_RULE) when its training loss became non-finite (the
trainer stops it; runs.py records the trainer's message in claims_done.json), when its final validation loss is
more than BLOWUP above the lowest it reached (a blow-up, even one the training batches recover from), when a training loss rose above GUESS times a uniform
guess's, ln(vocab) (a blow-up early in the run, before the first evaluation, that the later steps partly hide), or, on a
task without a noise floor, when its final training loss is above its first evaluation's validation loss (it
ended worse than it was a third of the way in). On a task with a noise floor (the recall claim: most tokens are
random, so a run that has learned everything it can sits at the floor, and its last training batch lies above or
below it by chance) that last rule would drop working runs: there the held-out rules alone judge
(HELD_OUT_RULE).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from attention_lab.claims.runs import DONE
from attention_lab.store.layout import RunLayout

BLOWUP = 0.10  # a final validation loss this fraction above the run's lowest is a blow-up
# a training loss this many times a uniform guess's, ln(vocab), is a blow-up however well the run recovers: a fresh
# model starts near ln(vocab), so only a run thrown far off by its updates goes half as high again (an LSTM
# started at its full rate without warmup reached 56-104 nats at step 10 on a 4,096-token vocabulary, whose
# uniform guess is 8.3, then crept back to 2.5-4.0 bits/byte, within the other runs' reach of the validation rules)
GUESS = 1.5
DIVERGED_RULE = ("a run is diverged when its training loss became non-finite or rose above 1.5 times a uniform "
                 f"guess's (1.5 ln vocab), when its final validation loss is more than {BLOWUP:.0%} above the lowest "
                 "it reached, or when its final training loss is above its first evaluation's validation loss")
HELD_OUT_RULE = ("a run is diverged when its training loss became non-finite or rose above 1.5 times a uniform "
                 f"guess's (1.5 ln vocab), or when its final validation loss is more than {BLOWUP:.0%} above the "
                 "lowest it reached; the last training batch is not read, since on "
                 "this task most tokens are random and a run that has learned all it can sits at that noise floor, "
                 "its last batch above or below it by chance")


def divergence(train_losses: list[float], val_curve: list[tuple[int, float]], stopped: str | None = None,
               held_out: bool = False, vocab: int | None = None) -> str | None:
    """Why a run counts as diverged under DIVERGED_RULE (HELD_OUT_RULE with `held_out`: a task with a noise
    floor), or None. `stopped`: the trainer's message when it stopped the run on a non-finite loss."""
    if stopped:
        return f"non-finite loss ({stopped.split(';')[0]})"
    bad = next((x for x in train_losses if not math.isfinite(x)), None)
    if bad is not None:
        return f"non-finite loss ({bad})"
    if vocab and train_losses and max(train_losses) > GUESS * math.log(vocab):
        at = max(range(len(train_losses)), key=train_losses.__getitem__)
        return (f"training loss {train_losses[at]:.1f} (logged loss {at + 1} of {len(train_losses)}) above "
                f"{GUESS:g} x a uniform guess's {math.log(vocab):.2f} (ln {vocab})")
    if val_curve:
        low = min(val_curve, key=lambda sv: sv[1])
        if val_curve[-1][1] > (1 + BLOWUP) * low[1]:
            return (f"final validation loss {val_curve[-1][1]:.4f} (step {val_curve[-1][0]}) more than "
                    f"{BLOWUP:.0%} above its lowest, {low[1]:.4f} (step {low[0]})")
    if held_out:
        return None
    if train_losses and val_curve and train_losses[-1] > val_curve[0][1]:
        return (f"final training loss {train_losses[-1]:.4f} above the first evaluation's {val_curve[0][1]:.4f} "
                f"(step {val_curve[0][0]})")
    return None


def metrics_of(run_dir: Path, held_out: bool = False) -> dict:
    """From metrics.jsonl, config.json and claims_done.json: the validation curve, the last training loss, the
    largest one after the first quarter, the median tokens/s, the rate, the run's wall seconds, how it was
    launched, and `diverged` (None, or why: see DIVERGED_RULE; HELD_OUT_RULE with `held_out`)."""
    layout = RunLayout(run_dir)
    text = layout.metrics.read_text() if layout.metrics.exists() else ""
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    train = [r for r in lines if "loss" in r and "heads" not in r]
    val = [(r["step"], r["val_loss"]) for r in lines if "val_loss" in r]
    done_path = Path(run_dir) / DONE
    done = json.loads(done_path.read_text()) if done_path.exists() else {}
    return {"steps": max((r["step"] for r in lines), default=0),
            "train_loss": train[-1]["loss"] if train else float("nan"),
            "max_train_loss_late": max((r["loss"] for r in train[len(train) // 4:]), default=float("nan")),
            "tokens_per_s": float(np.median([r["tokens_per_s"] for r in train])) if train else float("nan"),
            "val_curve": val,
            "lr": json.loads(layout.config.read_text())["optim"]["lr"],
            "seconds": done.get("seconds", float("nan")),
            "launch": done.get("launch"),
            "diverged": divergence([r["loss"] for r in train], val, done.get("stopped"), held_out,
                                   json.loads(layout.config.read_text()).get("model", {}).get("vocab_size"))}
