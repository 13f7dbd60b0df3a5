"""One text, one forward pass, one cache: everything the sample report and the live lab show about a text is read
from the activations that a single pass recorded (model/hooks.py), plus one batched pass for the ablations.
Pure: no files.

Shapes: L n_layer, nh n_head, T tokens (at most block_size), hs head size, C n_embd, k kept predictions.

    weights  = cache pattern                                (L, nh, T, T)  -> role scores (interp/roles.py)
    qkv      = cache q, k, v (k, v of a grouped-query kv head repeated for each query head it serves)
                                                            (3, L, nh, T, hs) -> the page's "step inside"
    shares   = z_h W_O,h^T, each head's part of its block's attention output   (L, nh, T, C)
    lens     = ln_f + lm_head on the residual stream entering each block and leaving the last (interp/lens.py)
    loss     = cross-entropy of token t + 1 given tokens 0..t   (T - 1,); top: the k most likely next tokens
    ablation = mean loss with one head's z zeroed minus the loss as it is: (L, nh), every head in one batch of
               L * nh copies of the text (row l * nh + h zeroes head h of block l), on the edited model when
               interventions are given

Eval mode, float32 (any surrounding autocast is off), the plain module (no compile or DDP wrapper).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attention_lab.interp.capture import plain_module, token_window
from attention_lab.interp.interventions import Intervention, intervention_edits
from attention_lab.interp.lens import LensTop, lens_of_stream
from attention_lab.interp.roles import role_scores
from attention_lab.runtime.device import eval_mode
from model.attention import expand_kv
from model.hooks import hooked, point_name, run_with_cache

ABLATION_ROWS = 32  # copies of the text per batched ablation pass: bounds its memory on long texts and big models


@dataclass
class TextAnalysis:
    ids: np.ndarray  # (T,) int64, the last block_size tokens
    weights: np.ndarray  # (L, nh, T, T) float32
    scores: dict[str, np.ndarray]  # role -> (L, nh), measured on this text
    ablation: np.ndarray | None  # (L, nh) nats/token, None for a one-token text or when not asked for
    loss: np.ndarray  # (T - 1,) float32 nats of token t + 1 given 0..t
    loss_mean: float  # nan for a one-token text
    top_ids: np.ndarray  # (T, k) int64 the most likely next tokens after each position
    top_probs: np.ndarray  # (T, k) float32
    lens: LensTop | None  # (L + 1, T, lens_k); None with analyze(lens=False): `stream` holds what it reads
    qkv: np.ndarray  # (3, L, nh, T, hs) float32
    shares: np.ndarray  # (L, nh, T, C) float32
    interventions: tuple[Intervention, ...] = ()
    stream: np.ndarray | None = None  # (L + 1, T, C) float32, the residual stream, kept only with lens=False

    def lens_of(self, model, lens_k: int = 5) -> LensTop:
        """The logit lens: the one computed, or (lens=False) the one read now from the stream kept."""
        if self.lens is not None:
            return self.lens
        device = next(plain_module(model).parameters()).device
        return lens_of_stream(model, torch.from_numpy(self.stream).to(device), lens_k)


def _losses_and_top(logits: Tensor, idx: Tensor, top_k: int) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """logits (1, T, V), idx (1, T) -> per-token loss (T - 1,), its mean, top ids and probs (T, k)."""
    logits = logits[0].float()
    loss = F.cross_entropy(logits[:-1], idx[0, 1:], reduction="none") if idx.size(1) > 1 else logits.new_zeros(0)
    top = torch.softmax(logits, dim=-1).topk(min(top_k, logits.size(-1)), dim=-1)
    mean = float(loss.mean()) if loss.numel() else float("nan")
    return loss.cpu().numpy(), mean, top.indices.cpu().numpy(), top.values.cpu().numpy()


@torch.no_grad()
def text_losses(model, ids, *, interventions: Sequence[Intervention] = (), top_k: int = 10):
    """One forward pass, no cache: (loss (T - 1,), loss_mean, top_ids (T, k), top_probs (T, k)) of the model with
    the interventions applied."""
    model = plain_module(model)
    idx = token_window(model, ids)[None]  # (1, T)
    edits = intervention_edits(model.config, interventions)
    with eval_mode(model), torch.autocast(device_type=idx.device.type, enabled=False), hooked(model, edits):
        logits = model(idx).logits
    return _losses_and_top(logits, idx, top_k)


@torch.no_grad()
def batched_ablation(model, idx: Tensor, interventions: Sequence[Intervention] = ()) -> np.ndarray:
    """(L, nh) the mean next-token loss on idx (1, T) with each head's z zeroed, minus the loss without: every
    head in batches of copies of the text, each copy zeroing one head (equal to heads.ablation_effects)."""
    cfg = model.config
    n_layer, n_head = cfg.n_layer, cfg.n_head
    x, y = idx[:, :-1], idx[:, 1:]
    base = intervention_edits(cfg, interventions)
    rows_of = [(layer, head) for layer in range(n_layer) for head in range(n_head)]
    out = np.zeros((n_layer, n_head))
    with eval_mode(model), torch.autocast(device_type=idx.device.type, enabled=False):
        with hooked(model, base):
            clean = F.cross_entropy(model(x).logits[0].float(), y[0]).item()
        for start in range(0, len(rows_of), ABLATION_ROWS):
            chunk = rows_of[start : start + ABLATION_ROWS]
            edits = dict(base)
            for layer in {layer for layer, _ in chunk}:
                rows = [(r, head) for r, (lay, head) in enumerate(chunk) if lay == layer]
                edits[point_name("z", layer)] = _zero_rows(rows, edits.get(point_name("z", layer)))
            with hooked(model, edits):
                logits = model(x.expand(len(chunk), -1)).logits.float()  # (R, T - 1, V)
            losses = F.cross_entropy(logits.transpose(1, 2), y.expand(len(chunk), -1), reduction="none").mean(1)
            for r, (layer, head) in enumerate(chunk):
                out[layer, head] = losses[r].item() - clean
    return out


def _zero_rows(rows: list[tuple[int, int]], before=None):
    """An edit of hook_z (R, nh, T, hs) zeroing head h in batch row r for each (r, h), after `before`."""
    def edit(z: Tensor) -> Tensor:
        z = before(z) if before is not None else z.clone()
        for r, head in rows:
            z[r, head] = 0.0
        return z
    return edit


@torch.no_grad()
def analyze(model, ids, *, interventions: Sequence[Intervention] = (), ablation: bool = True, top_k: int = 10,
            lens_k: int = 5, lens: bool = True) -> TextAnalysis:
    """Everything the pages show about one text, from one recorded forward pass (module docstring). lens=False
    keeps the residual stream instead of reading the lens off it (TextAnalysis.lens_of reads it when asked: the
    live lab draws the maps first)."""
    model = plain_module(model)
    cfg = model.config
    idx = token_window(model, ids)[None]  # (1, T)
    edits = intervention_edits(cfg, interventions)
    with eval_mode(model), torch.autocast(device_type=idx.device.type, enabled=False):
        out, cache = run_with_cache(model, idx, edits=edits)
    loss, loss_mean, top_ids, top_probs = _losses_and_top(out.logits, idx, top_k)
    weights = cache.stack("pattern")[:, 0].cpu().numpy()  # (L, nh, T, T)
    ids_np = idx[0].cpu().numpy()
    resid = cache.residual_stream()[:, 0]  # (L + 1, T, C)
    q = cache.stack("q")[:, 0]  # (L, nh, T, hs)
    k = expand_kv(cache.stack("k")[:, 0], cfg.n_head)  # (L, nkv, T, hs) -> (L, nh, T, hs): dim 1 is the heads
    v = expand_kv(cache.stack("v")[:, 0], cfg.n_head)
    z = cache.stack("z")[:, 0]  # (L, nh, T, hs)
    w_o = torch.stack([b.attn.c_proj.weight.float() for b in model.transformer.h])  # (L, C, nh * hs)
    w_o = w_o.view(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.head_size)
    shares = torch.einsum("lhtd,lchd->lhtc", z, w_o)  # (L, nh, T, C): z_h W_O,h^T
    with warnings.catch_warnings():  # a one-token text has no rows to average: its scores are nan, said once
        warnings.simplefilter("ignore", RuntimeWarning)
        scores = role_scores(weights, ids_np)
    return TextAnalysis(
        ids=ids_np, weights=weights, scores=scores,
        ablation=batched_ablation(model, idx, interventions) if ablation and idx.size(1) > 1 else None,
        loss=loss, loss_mean=loss_mean, top_ids=top_ids, top_probs=top_probs,
        lens=lens_of_stream(model, resid, lens_k) if lens else None,
        qkv=torch.stack([q, k, v]).cpu().numpy(), shares=shares.cpu().numpy(),
        interventions=tuple(interventions), stream=None if lens else resid.float().cpu().numpy(),
    )
