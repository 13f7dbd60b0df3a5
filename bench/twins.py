"""Our GPT and a Hugging Face GPT2LMHeadModel with the same config and the same weights, built locally.

Nothing is downloaded: the Hugging Face model is built from `GPT2Config(**hf_config_from(cfg))`, randomly
initialised, then given our weights through attention_lab/interop/convert.py, so both compute the same function and any
difference in speed is the implementation's.
"""

from __future__ import annotations

import torch

from attention_lab.interop.convert import hf_config_from, state_dict_to_hf
from model import GPT, GPTConfig


def build_ours(cfg: GPTConfig, device: torch.device, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg).to(device)


def build_hf(ours: GPT, device: torch.device):
    """transformers.GPT2LMHeadModel with `ours`' weights (dropout 0, transformers' default attention)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = ours.config
    # GPT-2's token ids 50256 fall outside small vocabularies; no bos/eos keeps transformers from warning
    hf_cfg = GPT2Config(**hf_config_from(cfg), bos_token_id=None, eos_token_id=None)
    hf = GPT2LMHeadModel(hf_cfg)
    missing, unexpected = hf.load_state_dict(state_dict_to_hf(ours.state_dict(), cfg), strict=False)
    # lm_head.weight is tied to wte in both; nothing else may be left out
    leftover = [k for k in missing if k != "lm_head.weight"] + list(unexpected)
    if leftover:
        raise RuntimeError(f"weights did not map onto GPT2LMHeadModel: {leftover}")
    hf.tie_weights()
    return hf.to(device)


def hf_attention(hf) -> str:
    return hf.config._attn_implementation


@torch.no_grad()
def check_same_function(cfg: GPTConfig, device: torch.device, seed: int = 0, tol: float = 1e-4) -> float:
    """Build a twin pair at *random* weights (std 1/sqrt(fan-in), not GPT-2's 0.02) and check their logits agree.

    At GPT-2's initialisation the logits are so flat that a mapping error (say q and k swapped) moves them by
    less than 1e-4; at these weights such an error moves them by far more than `tol`. Returns the max |diff|;
    raises RuntimeError when it exceeds tol * (1 + max |logit|).
    """
    ours = build_ours(cfg, device, seed)
    gen = torch.Generator().manual_seed(seed)
    for p in ours.parameters():
        fan_in = p.shape[-1] if p.dim() == 2 else 1
        p.copy_(torch.randn(p.shape, generator=gen).to(p.device) / fan_in ** 0.5)
    hf = build_hf(ours.eval(), device).eval()
    x = torch.randint(0, cfg.vocab_size, (2, min(cfg.block_size, 16)), generator=gen).to(device)
    a, b = ours(x).logits.float(), hf(input_ids=x, use_cache=False).logits.float()
    diff = (a - b).abs().max().item()
    if diff > tol * (1 + a.abs().max().item()):
        raise RuntimeError(f"our GPT and its GPT2LMHeadModel twin disagree at random weights (max |logit diff| "
                           f"{diff:.2e}): the weight mapping in attention_lab/interop/convert.py is wrong, so the benchmark would "
                           "compare different functions")
    return diff
