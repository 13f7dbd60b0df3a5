"""Work that runs at every evaluation, plugged into the training loop as small objects.

The loop calls `on_evaluate(ctx)` on each callback after the validation loss is known, on the main process
only, with the model in eval mode. A callback may add numbers to `ctx.metrics` (they land in metrics.jsonl and
in TensorBoard under `val/`) and write what it likes through `ctx.log`. A new probe is a new class here, not a
new branch in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from model import GPT, generate

from .files import atomic_write, write_json_atomic
from .logger import RunLogger


@dataclass
class EvalContext:
    step: int
    model: GPT  # the plain module (never compiled or DDP-wrapped), in eval mode
    device: torch.device
    dtype: torch.dtype
    log: RunLogger
    run_dir: Path
    metrics: dict = field(default_factory=dict)  # val_loss, val_bpb, ...; callbacks may add to it


class Callback:
    def on_evaluate(self, ctx: EvalContext) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class TextSample(Callback):
    """Text generated from the probe prompt, seeded by the step so training's random stream is untouched."""

    def __init__(self, tokenizer, prompt_ids: list[int], n_tokens: int, seed: int):
        self.tokenizer, self.prompt_ids, self.n_tokens, self.seed = tokenizer, prompt_ids, n_tokens, seed

    def on_evaluate(self, ctx: EvalContext) -> None:
        if ctx.log.writer is None or self.n_tokens == 0:
            return
        idx = torch.tensor([self.prompt_ids], device=ctx.device)
        gen = torch.Generator(device=ctx.device).manual_seed(self.seed + ctx.step)
        out = generate(ctx.model, idx, self.n_tokens, temperature=0.8, top_k=200, generator=gen)
        ctx.log.text("sample", self.tokenizer.decode(out[0].tolist()), ctx.step)


class ProbeAttention(Callback):
    """The probe prompt's attention maps: heatmaps in TensorBoard and one float16 array per evaluation.

    Writes run_dir/attention/probe.json once and attention/step_XXXXXXXX.npy (L, nh, T, T) at every
    evaluation: the frames of the run's attention film (attention_lab/viewer.py).
    """

    def __init__(self, tokenizer, prompt_ids: list[int], description: str = "the probe prompt"):
        self.tokenizer, self.prompt_ids, self.description = tokenizer, prompt_ids, description

    def on_evaluate(self, ctx: EvalContext) -> None:
        from .attention_maps import capture_attention

        weights = capture_attention(ctx.model, torch.tensor([self.prompt_ids], device=ctx.device))
        labels = self.tokenizer.token_strings(self.prompt_ids)
        ctx.log.attention(weights, labels, ctx.step)
        folder = ctx.run_dir / "attention"
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "probe.json").exists():
            write_json_atomic(folder / "probe.json", {"tokens": labels, "ids": list(self.prompt_ids),
                                                      "description": self.description})
        with atomic_write(folder / f"step_{ctx.step:08d}.npy", "wb") as f:
            np.save(f, weights.astype(np.float16))
