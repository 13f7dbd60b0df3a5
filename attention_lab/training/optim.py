"""Optimizers and learning-rate schedules.

    adamw   AdamW everywhere; weight decay on matrices only (GPT-2 / nanoGPT)
    muon    Muon (Jordan et al. 2024) for the 2-D weights inside the blocks (attention and MLP projections),
            whose updates it orthogonalises with a Newton-Schulz iteration; AdamW for the rest: token
            embeddings and the head (their rows are per-token vectors, not a linear map to orthogonalise),
            position tables, LayerNorm gains and biases. `Muon` below computes torch.optim.Muon's update, with
            the iteration in a dtype the hardware is fast at (torch's always uses bfloat16: 70x slower than
            float32 on a CPU without native bf16) and same-shaped matrices iterated together.

Schedules, as a multiplier of each group's base learning rate:

    cosine  linear warmup, then half a cosine down to min_lr / lr at decay_steps (default: max_steps)
    wsd     warmup-stable-decay: linear warmup, constant, then linear to min_lr / lr over the last decay_frac of
            the run (Hu et al. 2024, "MiniCPM")
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn as nn

from attention_lab.runtime.device import cpu_has_native_bf16
from attention_lab.training.config import OptimConfig

# Keller Jordan's quintic Newton-Schulz coefficients (as in torch.optim.Muon): the largest slope at zero, so five
# steps push every singular value of the normalised update into about [0.7, 1.2]
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def orthogonalise(g: torch.Tensor, steps: int = NS_STEPS, dtype: torch.dtype = torch.bfloat16,
                  eps: float = 1e-7) -> torch.Tensor:
    """Newton-Schulz: a matrix (m, n) or a batch (B, m, n) -> roughly U V^T of each one's SVD U S V^T, in `dtype`.

    Each matrix is scaled to Frobenius norm 1 (so its spectral norm is at most 1), then X <- a X + (b A + c A^2) X
    with A = X X^T, iterated on the wide orientation (the Gram matrix is the smaller side)."""
    a, b, c = NS_COEFFICIENTS
    batched = g.dim() == 3
    x = g.to(dtype) if batched else g.to(dtype)[None]
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x.mT if tall else x
    return x if batched else x[0]


def ns_dtype_for(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on a CUDA GPU or a CPU with native bf16 matmuls, float32 elsewhere (Apple's MPS too)."""
    if name == "auto":
        fast = device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
        return torch.bfloat16 if fast else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


class Muon(torch.optim.Optimizer):
    """Muon for 2-D weights: momentum, then the update orthogonalised (`orthogonalise`), applied with the learning
    rate scaled by sqrt(max(1, rows / cols)) and decoupled weight decay.

    The same update as torch.optim.Muon (nesterov momentum 0.95, 5 steps, "original" lr adjustment) and the same
    state ("momentum_buffer"), so checkpoints move between the two. Differences: the iteration runs in
    `ns_dtype` (a property of the machine, not saved in the state), and the matrices of one shape go through it
    as one batch, a tall matrix transposed (the default model's 16 matrices have 3 wide shapes: 3 calls per step
    instead of 16), with the momentum and the updates applied to all matrices in one for-each call each.
    """

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, weight_decay: float = 0.1,
                 nesterov: bool = True, ns_steps: int = NS_STEPS, ns_dtype: torch.dtype = torch.bfloat16):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "nesterov": nesterov, "ns_steps": ns_steps})
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon takes 2-D weights only; got one of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, mom = group["lr"], group["weight_decay"], group["momentum"]
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
            grads = [p.grad for p in params]
            buffers = [self.state[p]["momentum_buffer"] for p in params]
            torch._foreach_lerp_(buffers, grads, 1 - mom)  # one call for every matrix, not one each
            updates = torch._foreach_lerp(grads, buffers, mom) if group.get("nesterov", True) else buffers
            ortho = self._orthogonalised(updates, group.get("ns_steps", NS_STEPS))
            torch._foreach_mul_(params, 1 - lr * wd)
            by_lr: dict[float, list[int]] = defaultdict(list)  # the lr scale depends on the shape: one add per scale
            for i, p in enumerate(params):
                by_lr[lr * math.sqrt(max(1.0, p.size(0) / p.size(1)))].append(i)
            for scaled_lr, idx in by_lr.items():
                torch._foreach_add_([params[i] for i in idx], [ortho[i].to(params[i].dtype) for i in idx],
                                    alpha=-scaled_lr)
        return loss

    def _orthogonalised(self, updates: list[torch.Tensor], steps: int) -> list[torch.Tensor]:
        """orthogonalise(u) for each update, the matrices of one wide shape in one batch: a tall matrix goes through
        transposed (orthogonalise iterates on the wide orientation anyway), so the MLP's (4C, C) and (C, 4C) share
        one batch; the default model's 16 matrices take 3 calls."""
        tall = [u.size(0) > u.size(1) for u in updates]
        by_shape: dict[torch.Size, list[int]] = defaultdict(list)
        for i, u in enumerate(updates):
            by_shape[(u.mT if tall[i] else u).shape].append(i)
        out: list[torch.Tensor] = [None] * len(updates)  # type: ignore[list-item]
        for idx in by_shape.values():
            batch = orthogonalise(torch.stack([updates[i].mT if tall[i] else updates[i] for i in idx]), steps,
                                  self.ns_dtype)
            for j, i in enumerate(idx):
                out[i] = batch[j].mT if tall[i] else batch[j]
        return out


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
        muon = Muon(hidden, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay,
                    ns_steps=cfg.muon_ns_steps, ns_dtype=ns_dtype_for(cfg.muon_ns_dtype, device))
        for group in muon.param_groups:
            group["base_lr"] = cfg.muon_lr
        optimizers.append(muon)
        params = [(name, p) for name, p in params if not is_hidden_matrix(name, p)]
    groups = [{"params": [p for name, p in params if decays(name, p)], "weight_decay": cfg.weight_decay},
              {"params": [p for name, p in params if not decays(name, p)], "weight_decay": 0.0}]
    # the fused kernel (one pass over all parameters, CPU and CUDA) is about 5% of a small model's step faster;
    # on Apple's MPS the for-each path, the one torch has supported there longest (nothing was run on a Mac here)
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
