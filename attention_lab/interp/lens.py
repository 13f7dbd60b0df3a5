"""The logit lens (nostalgebraist 2020): what the model would predict if it stopped after each block. Pure: no
files, no printing.

Legend: L n_layer, T tokens (at most block_size), C n_embd, V vocab_size, k predictions kept per position.

    resid[l]  = the residual stream after the embeddings (l = 0) and after block l (l = 1..L)        (L + 1, T, C)
    logits[l] = softcap(ln_f(resid[l]) W_U^T)    W_U = lm_head.weight (V, C); softcap only if the model has one
    probs[l]  = softmax(logits[l]) over the vocabulary; the lens keeps the k largest per position

The last row, l = L, is exactly the model's own prediction: the same stream through the same ln_f and lm_head.
Earlier rows read the stream with the final LayerNorm and unembedding, which were trained for the last row
only, so they say what the stream already points to, not what the model would do with fewer blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from attention_lab.interp.capture import plain_module
from attention_lab.interp.inside import residual_stream


class LensTop(NamedTuple):
    ids: np.ndarray  # (L + 1, T, k) int64 the k most probable next tokens, most probable first
    probs: np.ndarray  # (L + 1, T, k) float32 their probabilities


@torch.no_grad()
def logit_lens(model, ids, k: int = 5) -> LensTop:
    """The top-k next-token predictions read off the residual stream after the embeddings and after each block.

    ids: token ids, a list or 1-D tensor, cropped to the last block_size. Eval mode, float32 (no autocast).
    Returns LensTop(ids, probs), each (n_layer + 1, T, k).
    """
    model = plain_module(model)
    if not 1 <= k <= model.config.vocab_size:
        raise ValueError(f"k must be in 1..vocab_size ({model.config.vocab_size}), got {k}")
    return lens_of_stream(model, residual_stream(model, ids), k)


@torch.no_grad()
def lens_of_stream(model, resid: torch.Tensor, k: int = 5) -> LensTop:
    """The logit lens of a residual stream already recorded, (L + 1, T, C) (attention_lab/interp/analysis.py
    reads it from the activation cache): ln_f and lm_head applied to every row, the top k kept."""
    model = plain_module(model)
    with torch.autocast(device_type=resid.device.type, enabled=False):
        logits = model.lm_head(model.transformer.ln_f(resid))  # (L + 1, T, V)
        if model.softcap is not None:
            logits = model.softcap(logits)
    top = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)  # (L + 1, T, k)
    return LensTop(top.indices.cpu().numpy(), top.values.cpu().numpy())
