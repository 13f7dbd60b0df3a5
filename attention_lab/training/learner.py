"""A learner's attention in a run (model.attn_impl): what config.json records about it, and the evaluation that
tells on it when it reads the future.

    recorded_config(cfg, model)   config.json's dict: the learner's file (absolute) and its sha256 in place of the
                                  built-in switches their function replaces (causal_mask, attn_scale, attn_backend)
    FutureLeak                    the callback: at every evaluation the loss as trained and the honest loss (each
                                  position predicted from the tokens up to it alone, interp/measures.py, the mask
                                  claim's measure); once they differ by more than noise the run says so, once
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from attention_lab.exercises.learner import learner_of, parse_spec
from attention_lab.interp.measures import honest_position_losses, position_losses
from data.batches import eval_batches

# the built-in switches a learner's attention(q, k, v) does itself: config.json records their file instead
REPLACED = ("causal_mask", "attn_scale", "attn_backend")
WINDOWS, POSITIONS = 16, 64  # validation windows and positions scored both ways: T + 1 forward passes of <= 64
# nats: the two losses are paired (the same windows, the same weights), so their only noise is float32 rounding,
# under 1e-5 for a causal function (tests/test_exercises_training.py); the mask after the softmax leaks 0.015-0.02
# after 20-40 debug steps
NOISE_FLOOR = 1e-3


def recorded_config(cfg, model) -> dict:
    """The run's config as config.json records it: for a learner's attention, model.attn_impl is the absolute
    file:function, model.attn_impl_sha256 its hash, and the switches their function replaces are left out (a
    built-in causal_mask "before_softmax" beside their file would claim a mask their code may not have)."""
    out = dataclasses.asdict(cfg)
    fn = learner_of(model)
    if fn is not None:
        section = out["model"]
        for name in REPLACED:
            section.pop(name, None)
        section["attn_impl"], section["attn_impl_sha256"] = fn.spec, fn.sha256
    return out


class FutureLeak:
    """The learner's attention scored twice on fixed validation windows: as trained (the whole window in view)
    and honestly (position t predicted by a pass over tokens 0..t alone). metrics.jsonl and TensorBoard get
    val/leaky_loss and val/honest_loss at every evaluation; the first evaluation where the honest loss is higher
    by more than noise (NOISE_FLOOR: the pair differs by float rounding only) prints one line and
    writes it as TensorBoard text `future_leak`. A causal function's two losses agree to float rounding.
    A callback of training/callbacks.py (on_evaluate, after_evaluate, resume), which imports this module."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, spec: str):
        self.x, self.y, self.spec = x, y, spec
        self.told = False

    def on_evaluate(self, ctx) -> None:
        """ctx: training/callbacks.py EvalContext (the model in eval mode, the metrics, the logger)."""
        x, y = self.x.to(ctx.device), self.y.to(ctx.device)
        leaky, honest = position_losses(ctx.model, x, y), honest_position_losses(ctx.model, x, y)
        ctx.metrics["leaky_loss"], ctx.metrics["honest_loss"] = float(leaky.mean()), float(honest.mean())
        if self.told:
            return
        message = leak_sentence(leaky, honest, x.size(0), self.spec)
        if message is not None:
            self.told = True
            ctx.log.print(message)
            ctx.log.text("future_leak", message, ctx.step)

    def after_evaluate(self, ctx) -> None:
        pass

    def resume(self, run_dir, step: int) -> None:
        pass  # a resumed run measures again; it says so again once if the leak is still there


def leak_sentence(leaky: np.ndarray, honest: np.ndarray, windows: int, spec: str) -> str | None:
    """The sentence when the honest loss is above the loss as trained by more than noise, else None."""
    gap = honest - leaky  # (T,)
    if not float(gap.mean()) > NOISE_FLOOR:
        return None
    path = Path(parse_spec(spec)[0]).resolve()
    return (f"your attention reads the future: loss {leaky.mean():.4g} with it, {honest.mean():.4g} without "
            f"(nats/token on {windows} validation windows of {gap.size} tokens, each position predicted again from "
            f"the tokens up to it alone, as `python -m attention_lab.claims mask` measures; a causal attention "
            f"scores the same both ways). Check it: python -m attention_lab.exercises check attention {path}")


def future_leak_callback(cfg, data, model_cfg) -> FutureLeak:
    """FutureLeak on the first WINDOWS validation windows, their first POSITIONS tokens."""
    x, y = next(iter(eval_batches(data.tokens("val"), model_cfg.block_size, WINDOWS, 1)))
    t = min(POSITIONS, x.size(1))
    return FutureLeak(x[:, :t], y[:, :t], cfg.model.attn_impl)
