"""Attention capture: every layer's and head's weights over one sequence, from the plain module, in float32.

Shapes: L n_layer, nh n_head, T tokens (at most block_size).
"""

from __future__ import annotations

import numpy as np
import torch

from attention_lab.runtime.device import eval_mode
from model.hooks import point_name, residual_names, run_with_cache


def plain_module(model: torch.nn.Module) -> torch.nn.Module:
    """Unwrap torch.compile (`_orig_mod`) and DDP (`module`): capture runs the plain module, eagerly."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def token_window(model: torch.nn.Module, ids) -> torch.Tensor:
    """ids: a list of ints, an array or a 1-D tensor -> (T,) int64 on the model's device, its last block_size
    tokens; ValueError for anything but one non-empty sequence."""
    device = next(model.parameters()).device
    idx = torch.as_tensor(ids, dtype=torch.long, device=device)
    if idx.dim() != 1 or idx.numel() == 0:
        raise ValueError(f"token ids must be one non-empty sequence (T,), got shape {tuple(idx.shape)}")
    return idx[-model.config.block_size :]


@torch.no_grad()
def capture_attention(model: torch.nn.Module, idx) -> np.ndarray:
    """Every layer's attention weights over one sequence: float32 (L, nh, T, T).

    idx: token ids (T,) or (B, T) tensor, or a list of ints; only the first row and its last block_size
    tokens are used. The model runs in eval mode (no dropout) and in float32 (any surrounding autocast is
    switched off); its training mode is restored afterwards.
    """
    model = plain_module(model)
    device = next(model.parameters()).device
    idx = torch.as_tensor(idx, dtype=torch.long, device=device)
    if idx.dim() == 1:
        idx = idx[None]  # (1, T)
    if idx.dim() != 2 or idx.size(1) == 0:
        raise ValueError(f"capture_attention needs token ids of shape (T,) or (B, T), T >= 1; got {tuple(idx.shape)}")
    idx = idx[:1, -model.config.block_size :]  # (1, T)
    names = [point_name("pattern", layer) for layer in range(model.config.n_layer)]
    with eval_mode(model), torch.autocast(device_type=device.type, enabled=False):
        _, cache = run_with_cache(model, idx, names=names)
    return cache.stack("pattern")[:, 0].cpu().numpy()  # (L, 1, nh, T, T) -> (L, nh, T, T)


@torch.no_grad()
def residual_streams(model, x: torch.Tensor, edits=None) -> torch.Tensor:
    """The residual stream of a batch from one forward pass: float32 (B, L + 1, T, C), on x's device. Row l < L
    enters block l (row 0: the embeddings); row L leaves the last block (ln_f's input). Recorded at the model's
    hook points (model/hooks.py), eval mode, float32; `edits` (interp/interventions.py) apply during the pass."""
    model = plain_module(model)
    with eval_mode(model), torch.autocast(device_type=x.device.type, enabled=False):
        _, cache = run_with_cache(model, x, edits=edits, names=residual_names(model.config.n_layer))
    return cache.residual_stream().transpose(0, 1)
