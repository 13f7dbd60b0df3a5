"""Optimizers and learning-rate schedules.

    adamw   AdamW everywhere; weight decay on matrices only (GPT-2 / nanoGPT)
    muon    Muon (Jordan et al. 2024; torch.optim.Muon) for the 2-D weights inside the blocks (attention and MLP
            projections), whose updates it orthogonalises with a Newton-Schulz iteration; AdamW for the rest:
            token embeddings and the head (their rows are per-token vectors, not a linear map to orthogonalise),
            position tables, LayerNorm gains and biases.

Schedules, as a multiplier of each group's base learning rate:

    cosine  linear warmup, then half a cosine down to min_lr / lr at decay_steps (default: max_steps)
    wsd     warmup-stable-decay: linear warmup, constant, then linear to min_lr / lr over the last decay_frac of
            the run (Hu et al. 2024, "MiniCPM")
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import OptimConfig


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """A 2-D weight inside a block (transformer.h.*): what Muon optimises."""
    return p.dim() == 2 and ".h." in f".{name}"


def decays(name: str, p: torch.Tensor) -> bool:
    """Weight decay on matrices only: biases, LayerNorm gains and position tables stay undecayed."""
    return p.dim() >= 2 and not name.endswith("wpe.weight")


class Optimizers:
    """One or two torch optimizers behind one interface: step, zero_grad, param_groups, state_dict.

    Every param group carries "base_lr"; `set_lr_multiplier` scales all of them at once, so the schedule is
    one number however many optimizers and learning rates there are.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def set_lr_multiplier(self, m: float) -> None:
        for group in self.param_groups:
            group["lr"] = group["base_lr"] * m

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        saved = state["optimizers"] if "optimizers" in state else [state]  # a bare AdamW state: older checkpoints
        if len(saved) != len(self.optimizers):
            raise ValueError(f"the checkpoint holds {len(saved)} optimizer states, this run has "
                             f"{len(self.optimizers)}: resume with the same optim.name")
        for opt, s in zip(self.optimizers, saved):
            opt.load_state_dict(s)


def configure_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> Optimizers:
    """AdamW (and Muon for the hidden matrices when cfg.name == "muon"), base learning rates set."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizers = []
    if cfg.name == "muon":
        hidden = [p for name, p in params if is_hidden_matrix(name, p)]
        muon = torch.optim.Muon(hidden, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay)
        for group in muon.param_groups:
            group["base_lr"] = cfg.muon_lr
        optimizers.append(muon)
        params = [(name, p) for name, p in params if not is_hidden_matrix(name, p)]
    groups = [{"params": [p for name, p in params if decays(name, p)], "weight_decay": cfg.weight_decay},
              {"params": [p for name, p in params if not decays(name, p)], "weight_decay": 0.0}]
    # the fused kernel (one pass over all parameters, CPU and CUDA) is about 5% of a small model's step faster
    adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                              eps=cfg.eps, fused=device.type in ("cpu", "cuda"))
    for group in adamw.param_groups:
        group["base_lr"] = cfg.lr
    optimizers.append(adamw)
    return Optimizers(optimizers)


def lr_multiplier(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """The schedule at `step` (0-based), as a fraction of the base learning rates."""
    floor = cfg.min_lr / cfg.lr
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    decay_steps = cfg.decay_steps or max_steps
    if step >= decay_steps:
        return floor
    if cfg.schedule == "wsd":
        decay_start = decay_steps - round(cfg.decay_frac * decay_steps)
        if step < max(decay_start, cfg.warmup_steps):
            return 1.0
        progress = (step - decay_start) / max(1, decay_steps - decay_start)
        return floor + (1.0 - progress) * (1.0 - floor)
    progress = (step - cfg.warmup_steps) / max(1, decay_steps - cfg.warmup_steps)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor)


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """The AdamW learning rate at `step` (Muon's is cfg.muon_lr times the same multiplier)."""
    return cfg.lr * lr_multiplier(step, cfg, max_steps)
