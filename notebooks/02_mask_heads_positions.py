# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. The mask, the heads, the positions
#
# A language model predicts each next token from the tokens before it, so no query may see a later key: the
# causal mask puts -inf on those scores *before* the softmax. Then several heads attend side by side, and
# positions tell attention the order of the tokens, which it cannot see otherwise. Each idea ends with your own
# code checked against the model's (`attention_lab.exercises`).

# %% tags=["parameters"]
STEPS = 1000  # training steps of the two small models compared in the leak measurement (the test suite runs 4)
WINDOWS = 16  # validation windows scored honestly (each position predicted from the tokens up to it alone)
DATA_CACHE = None  # where the prepared corpus is cached (None: ./cache)

# %% In Colab: install attention-lab first (clone your copy, then an editable install); elsewhere this does nothing
import os
import subprocess
import sys

if "google.colab" in sys.modules:
    REPO = os.environ.get("ATTENTION_LAB_REPO", "")  # the git URL of your copy of attention-lab
    if not os.path.isdir("attention-lab"):
        if not REPO:
            raise SystemExit("set ATTENTION_LAB_REPO to the git URL of attention-lab, then rerun this cell")
        subprocess.run(["git", "clone", "--depth", "1", REPO, "attention-lab"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "attention-lab"], check=True)
    os.chdir("attention-lab")

# %%
import math
from pathlib import Path

import torch

import train as trainer
from attention_lab.exercises import check
from attention_lab.interp.measures import honest_position_losses, position_losses
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.config import compose
from data.batches import eval_batches
from data.prepare import prepare_data
from model.attention import CausalSelfAttention
from model.config import GPTConfig
from model.positions import PositionalEncoding

torch.manual_seed(0)
extra = [f"data.cache_dir={DATA_CACHE}"] if DATA_CACHE else []

# %% [markdown]
# ## The mask: -inf before the softmax
# Write `mask(scores)`; the check names the classic slips (0 instead of -inf, one off, transposed).

# %%
def mask(scores):
    t = scores.size(-1)
    future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(diagonal=1)  # key j > query i
    return scores.masked_fill(future, float("-inf"))


assert check("mask", mask)

# %% [markdown]
# ## The leak, measured
# A mask applied *after* the softmax zeroes the future weights, but the future keys were in the softmax's
# denominator: the visible weights still depend on them. Train two small models, one with the mask after the
# softmax, and score each honestly: every position predicted again from the tokens up to it alone. The leaky
# model's loss rises once the future is really hidden; the causal one's does not move.

# %%
common = ["experiment=debug", f"train.max_steps={STEPS}", f"train.eval_interval={max(STEPS, 1)}", "train.film=false",
          "train.tensorboard=false", "train.head_roles=false", "train.sample_tokens=0", "model.attn_backend=math",
          *extra]
cfg = compose(common)
val = prepare_data(cfg.data, log=lambda *a: None).tokens("val")
x, y = next(iter(eval_batches(val, cfg.model.block_size, WINDOWS, 1)))
for arm in ("before_softmax", "after_softmax"):
    run = Path(f"runs/notebook_02_{arm}")
    trainer.train(compose(common + [f"model.causal_mask={arm}"]), run)
    model = load_checkpoint(run, "latest").build_model("cpu").eval()
    as_trained, honest = position_losses(model, x, y).mean(), honest_position_losses(model, x, y).mean()
    print(f"mask {arm:15s}: loss {as_trained:.3f} nats/token with the future in view, {honest:.3f} without")

# %% [markdown]
# ## Heads: split, attend, concatenate, project
# `multi_head` splits the C channels into n_head heads of hs = C / n_head, attends in each, puts the heads side by
# side again and mixes them with the output projection. Paste your attention in (here: sdpa, the fused one).

# %%
def multi_head(x, w_qkv, b_qkv, w_proj, b_proj, n_head):
    b, t, c = x.shape
    hs = c // n_head
    q, k, v = (x @ w_qkv.T + b_qkv).split(c, dim=-1)
    q, k, v = (z.view(b, t, n_head, hs).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hs)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2).reshape(b, t, c) @ w_proj.T + b_proj


assert check("multi_head", multi_head)

# %% [markdown]
# ## Without positions, attention cannot see order
# Without any position encoding (and without the mask), attention is permutation-equivariant: shuffle the
# tokens and every output is shuffled the same way, nothing else changes. The causal mask alone breaks this (a
# token sees a different set of earlier tokens); positions give the order itself.

# %%
layer = CausalSelfAttention(GPTConfig(n_embd=32, n_head=4, pos_encoding="none", causal_mask="none",
                                      attn_backend="math")).eval()
tokens = torch.randn(1, 10, 32)
perm = torch.randperm(10)
with torch.no_grad():
    out = layer(tokens, PositionalEncoding(), None, torch.arange(10))[0]
    out_perm = layer(tokens[:, perm], PositionalEncoding(), None, torch.arange(10))[0]
print("no positions, no mask: shuffled output == output shuffled, largest gap",
      f"{(out_perm - out[:, perm]).abs().max().item():.1e}")

# %% [markdown]
# The two ways this model gives positions: a sinusoidal table added to the embeddings, or rotary positions
# (RoPE) that turn q and k by an angle per position. Write both and check them.

# %%
def sinusoidal(n_positions, dim):
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    angle = pos / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle[:, : dim // 2])
    return table.float()


def rope(x, pos, base=10000.0):
    hs = x.size(-1)
    inv_freq = 1.0 / base ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs)
    angle = pos.float()[:, None] * inv_freq[None, :]
    angle = torch.cat((angle, angle), dim=-1)  # channel i and i + hs/2 turn together
    x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
    return x * angle.cos().to(x.dtype) + torch.cat((-x2, x1), dim=-1) * angle.sin().to(x.dtype)


assert check("sinusoidal", sinusoidal)
assert check("rope", rope)

# %% [markdown]
# RoPE makes a score depend on the distance between query and key only: shift both positions by the same amount
# and the score does not change.

# %%
qv, kv = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
for shift in (0, 7, 100):
    s = (rope(qv, torch.tensor([5 + shift])) * rope(kv, torch.tensor([2 + shift]))).sum().item()
    print(f"query at {5 + shift:3d}, key at {2 + shift:3d}: score {s:.5f}")
