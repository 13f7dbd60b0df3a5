"""Bits per byte of a trained run on a whole split: every token of the held-out text scored once.

    python -m attention_lab.evaluate runs/default/2026-11-23_13-44-07
    python -m attention_lab.evaluate RUN --which latest --split train --json score.json
    python -m attention_lab.evaluate RUN --by-position     # also: the loss at each position of the context

The trainer's evaluation reads a fixed sample of windows (train.eval_batches batches of train.batch_size), which
is quick but depends on the batch size: two runs with different batch sizes are scored on different text. This
command scores the whole split the same way for every run, so it is what recipe comparisons should quote. The
split is cut into consecutive windows of the model's context; each window predicts all its tokens from the
tokens before them in the window, and the last window is moved back to end at the split's end, scoring only
the tokens no earlier window scored. So each of the split's n - 1 next tokens is predicted exactly once, with
between 0 and block_size - 1 tokens of context (as in training).

bits per byte = total nats / ln 2 / the split's UTF-8 bytes (whatever the tokenizer).

--by-position: the loss at positions 1 ... block_size (position p predicts its token from the p - 1 before it) over
the split's full windows, which says how much of its context a model uses (attention_lab/interp/measures.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from attention_lab.interp.measures import position_losses
from attention_lab.runtime import cli
from attention_lab.runtime.device import autocast, eval_mode, pick_device, pick_dtype
from attention_lab.store.checkpoint import CheckpointError, load_checkpoint
from attention_lab.store.layout import RunLayout
from data.batches import windows
from data.prepare import PreparedData, bits_per_byte
from model import GPT


def tiling_windows(n_tokens: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Window starts covering tokens[0:n] once, and per window the first target index it scores.

    Targets are positions 1..n-1 (position i is predicted from positions < i). Window s reads tokens[s : s+T+1]
    and predicts targets s+1 .. s+T; the last window ends at n-1, so it re-reads text an earlier window scored
    and skips those targets (first_scored > 0 for it only).
    """
    if n_tokens < block_size + 1:
        raise ValueError(f"{n_tokens} tokens is less than one window of block_size+1 = {block_size + 1}")
    starts = list(range(0, n_tokens - block_size, block_size))  # full windows, start + T + 1 <= n
    covered = starts[-1] + block_size  # targets 1..covered are scored
    first = [0] * len(starts)
    if covered < n_tokens - 1:
        last = n_tokens - block_size - 1
        starts.append(last)
        first.append(covered - last)  # targets last+1 .. covered were scored already
    return np.asarray(starts, dtype=np.int64), np.asarray(first, dtype=np.int64)


EVAL_TOKENS = 4096  # tokens a forward pass scores by default: a short context's windows are batched up to it


def windows_per_pass(block_size: int) -> int:
    """The default batch: windows making about EVAL_TOKENS tokens, 8 at least (16 for the 256-token default model;
    128 for a context of 32, whose 8 windows a pass spent 4 s of Python on 460,000 tokens)."""
    return max(8, EVAL_TOKENS // block_size)


@torch.no_grad()
def split_nats(model: GPT, tokens: np.ndarray, batch_size: int | None = None, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> tuple[float, int]:
    """(summed next-token cross-entropy in nats, tokens scored) over the whole token array, each scored once;
    batch_size windows a forward pass (default: windows_per_pass)."""
    device = torch.device(device)
    block_size = model.config.block_size
    if batch_size is None:
        batch_size = windows_per_pass(block_size)
    starts, first = tiling_windows(len(tokens), block_size)
    total, count = 0.0, 0
    with eval_mode(model):
        for i in range(0, len(starts), batch_size):
            x, y = windows(tokens, starts[i:i + batch_size], block_size)
            skip = torch.arange(block_size)[None, :] < torch.from_numpy(first[i:i + batch_size])[:, None]
            y = y.masked_fill(skip, -1)
            with autocast(device, dtype):
                logits = model(x.to(device)).logits
            y = y.to(device)
            total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-1,
                                     reduction="sum").item()
            count += int((y >= 0).sum())
    return total, count


@dataclass
class Score:
    split: str
    tokens: int
    bytes: int
    nats_per_token: float
    bits_per_byte: float
    checkpoint: str
    step: int


def score_run(run: Path, which: str = "best", split: str = "val", data_dir: Path | None = None,
              batch_size: int | None = None, device: str = "auto", dtype: str = "float32") -> Score:
    ckpt = load_checkpoint(run, which)
    data_dir = data_dir or data_dir_of(Path(run), ckpt.path)
    data = PreparedData.open(data_dir)
    if data.meta["vocab_size"] > ckpt.config.vocab_size:
        raise ValueError(f"{data_dir} has a vocabulary of {data.meta['vocab_size']} tokens but the model "
                         f"{ckpt.config.vocab_size}: it is another run's data; pass --data")
    dev = pick_device(device)
    model = ckpt.build_model(dev)
    total, count = split_nats(model, data.tokens(split), batch_size, dev, pick_dtype(dtype, dev))
    nats = total / count  # per token; the split's first token has no prediction, so count = tokens - 1
    return Score(split, count, int(data.meta[split]["text_bytes"]), nats, bits_per_byte(nats, data.meta, split),
                 str(ckpt.path), ckpt.step)


def position_curve(run: Path, which: str = "best", split: str = "val", data_dir: Path | None = None,
                   max_windows: int = 256, device: str = "auto") -> np.ndarray:
    """(block_size,) mean loss in nats at each position over up to max_windows of the split's full windows,
    evenly spread, float32."""
    ckpt = load_checkpoint(run, which)
    data = PreparedData.open(data_dir or data_dir_of(Path(run), ckpt.path))
    model = ckpt.build_model(pick_device(device))
    t = ckpt.config.block_size
    starts, first = tiling_windows(len(data.tokens(split)), t)
    starts = starts[first == 0]  # full windows only: every position scored
    starts = starts[np.linspace(0, len(starts) - 1, min(max_windows, len(starts))).astype(np.int64)]
    x, y = windows(data.tokens(split), starts, t)
    device_ = next(model.parameters()).device
    return position_losses(model, x.to(device_), y.to(device_))


def format_position_curve(curve: np.ndarray) -> str:
    """Positions 1, 2, 4, 8, ... and the last, with their loss."""
    marks = sorted({1, *[2 ** k for k in range(1, 20) if 2 ** k <= len(curve)], len(curve)})
    return "loss by position: " + ", ".join(f"{p}: {curve[p - 1]:.3f}" for p in marks) + " (nats/token)"


def data_dir_of(run: Path, ckpt_path: Path) -> Path:
    """The prepared data folder the run's provenance.json names (relative to where training ran: tried from
    here and from the folders above the run)."""
    for folder in (run, ckpt_path.parent.parent):
        prov = RunLayout(folder).provenance
        if prov.exists():
            data_dir = json.loads(prov.read_text()).get("data_dir")
            if data_dir:
                candidates = [Path(data_dir)] + [p / data_dir for p in folder.resolve().parents]
                found = next((c for c in candidates if (c / "meta.json").exists()), None)
                if found is None:
                    raise ValueError(f"the prepared data {run} trained on ({data_dir}, named in {prov}) is not "
                                     "here; prepare it again (`python train.py` with the run's data settings "
                                     "prepares it before training) or pass --data DIR")
                return found
    raise ValueError(f"cannot tell which prepared data {run} was trained on (no provenance.json with data_dir); "
                     "pass --data DIR (a prepared data folder holding meta.json, train.bin and val.bin: "
                     "by default cache/data/<name>-<hash> under the folder training ran in)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a run folder (runs/<name>/<time>) or one checkpoint folder")
    p.add_argument("--which", choices=("best", "latest"), default="best")
    p.add_argument("--split", choices=("val", "train"), default="val")
    p.add_argument("--data", type=Path, help="the prepared data folder (default: the one the run trained on)")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"windows a forward pass (default: about {EVAL_TOKENS} tokens of them, 8 at least); the score "
                        "is the same, up to float32 summation")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "auto"), default="float32",
                   help="autocast dtype; float32 (default) scores every run the same way on any machine")
    p.add_argument("--json", type=Path, help="also write the score to this JSON file")
    p.add_argument("--by-position", action="store_true",
                   help="also the loss at each position of the context (how much of it the model uses)")
    args = p.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        p.error(f"--batch-size {args.batch_size} must be >= 1")
    return cli.run(lambda: report(args), CheckpointError)


def report(args: argparse.Namespace) -> None:
    score = score_run(args.run, args.which, args.split, args.data, args.batch_size, args.device, args.dtype)
    print(f"{score.split}: {score.bits_per_byte:.4f} bits/byte ({score.nats_per_token:.4f} nats/token over "
          f"{score.tokens:,} tokens, {score.bytes:,} bytes), checkpoint {score.checkpoint} (step {score.step})")
    record = dict(score.__dict__)
    if args.by_position:
        curve = position_curve(args.run, args.which, args.split, args.data, device=args.device)
        print(format_position_curve(curve))
        record["position_loss"] = curve.round(4).tolist()
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
