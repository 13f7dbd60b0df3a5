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
# positions tell attention the order of the tokens, which it cannot see otherwise. Each idea has a "your turn": a
# stub that stops the run until you write it, checked against the model's own function (`attention_lab.exercises`),
# and then drawn. Stuck on one? `python -m attention_lab.exercises solution NAME --anyway` prints the answer.

# %% tags=["parameters"]
STEPS = 1000  # training steps of the two small models compared in the leak measurement (the test suite runs 4)
WINDOWS = 16  # validation windows scored honestly (each position predicted from the tokens up to it alone)
DATA_CACHE = None  # where the prepared corpus is cached (None: ./cache)
SOLVED = False  # True puts the project's answer in each "your turn" (it is never printed here; see the stub's message)

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
import math  # noqa: F401  (for your own code in the "your turn" cells)
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attention_lab
import train as trainer
from attention_lab.exercises import answer, check
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
# Your turn: write `mask(scores)`, the same scores with -inf wherever key j comes after query i (j > i). The check
# names the classic slips (0 instead of -inf, one off, transposed).

# %% tags=["your-turn"]
def mask(scores):
    """scores (B, nh, T, T) -> the same scores, -inf where the key comes after the query (j > i)."""
    raise NotImplementedError("write mask: scores with -inf wherever key j > query i, in this cell, then rerun it")


if SOLVED:
    mask = answer("mask")  # the test suite's switch: the project's function in place of yours
result = check("mask", mask, stop=True)

# %% [markdown]
# Your mask on six random scores, and the softmax of each row: the hidden keys (above the diagonal) get weight
# exactly 0, and each query's weights over the keys it sees still sum to 1. With 0 instead of -inf, exp(0) = 1
# would give every future key a weight.

# %%
s = torch.randn(1, 1, 6, 6)
masked = mask(s)[0, 0]
w = torch.softmax(masked, dim=-1)
fig, ax = plt.subplots(1, 2, figsize=(8, 3.4))
cmap = plt.get_cmap("coolwarm").copy()
cmap.set_bad("lightgray")  # -inf is not a number to colour: drawn gray
ax[0].imshow(masked.masked_fill(masked == float("-inf"), float("nan")).numpy(), cmap=cmap)
ax[0].set(title="your mask(scores): -inf in gray", xlabel="key j", ylabel="query i")
ax[1].imshow(w.numpy(), cmap="viridis", vmin=0, vmax=1)
ax[1].set(title="softmax per row: 0 above the diagonal", xlabel="key j", ylabel="query i")
for i in range(6):
    for j in range(6):
        ax[1].text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7, color="w" if w[i, j] < .5 else "k")
fig.tight_layout()
plt.show()
print("row sums:", [round(r, 3) for r in w.sum(-1).tolist()])

# %% [markdown]
# ## The leak, measured
# A mask applied *after* the softmax zeroes the future weights, but the future keys were in the softmax's
# denominator: the visible weights still depend on them. Train two small models, one with the mask after the
# softmax, and score each honestly: every position predicted again from the tokens up to it alone. The leaky
# model's loss rises once the future is really hidden; the causal one's does not move. (The mask is also why one
# pass trains every position at once: position t's prediction can use tokens 0..t only, so all T predictions of
# a window are honest in the same forward pass.)

# %%
common = ["experiment=debug", f"train.max_steps={STEPS}", f"train.eval_interval={max(STEPS, 1)}", "train.film=false",
          "train.tensorboard=false", "train.head_roles=false", "train.sample_tokens=0", "model.attn_backend=math",
          *extra]
cfg = compose(common)
val = prepare_data(cfg.data, log=lambda *a: None).tokens("val")
x, y = next(iter(eval_batches(val, cfg.model.block_size, WINDOWS, 1)))
leak = {}
for arm in ("before_softmax", "after_softmax"):
    run = Path(f"runs/notebook_02_{arm}")
    trainer.train(compose(common + [f"model.causal_mask={arm}"]), run)
    model = load_checkpoint(run, "latest").build_model("cpu").eval()
    leak[arm] = (position_losses(model, x, y).mean(), honest_position_losses(model, x, y).mean())
    print(f"mask {arm:15s}: loss {leak[arm][0]:.3f} nats/token with the future in view, {leak[arm][1]:.3f} without")

fig, ax = plt.subplots(figsize=(6, 3))
gaps = [honest - seen for seen, honest in leak.values()]
ax.bar(["mask before the softmax", "mask after the softmax"], gaps, color=["tab:blue", "tab:orange"])
ax.axhline(0, color="k", lw=0.8)
ax.set(ylabel="honest loss - loss as trained\n(nats/token)", title="the leak: what hiding the future costs each model")
plt.show()

# %% [markdown]
# ## Heads: split, attend, concatenate, project
# Your turn: `multi_head` projects x to q, k, v, splits the C channels into n_head heads of hs = C / n_head,
# attends in each, puts the heads side by side again and mixes them with the output projection. For the attention
# inside each head use `attend` below, the project's one-head causal attention, softmax(mask(q k^T / sqrt(hs))) v
# (you write your own in notebook 4). The check names the slips: heads split by position instead of channels, no
# transpose, the projection forgotten.

# %%
attend = answer("attention")  # (B, nh, T, hs) q, k, v -> (B, nh, T, hs): one head's causal attention, per head

# %% tags=["your-turn"]
def multi_head(x, w_qkv, b_qkv, w_proj, b_proj, n_head):
    """x (B, T, C); w_qkv (3C, C), b_qkv (3C,); w_proj (C, C), b_proj (C,) -> (B, T, C)."""
    raise NotImplementedError("write multi_head: project, split into heads, attend(q, k, v), concatenate, project; "
                              "then rerun this cell")


if SOLVED:
    multi_head = answer("multi_head")
result = check("multi_head", multi_head, stop=True)

# %% [markdown]
# Your multi_head inside the model: an attention layer of the model (4 heads, 32 channels, no positions here)
# gives its own output when its weights go through your function. Then what each head of a trained model attends
# to on one line of Shakespeare: the page of the causal run above, inline.

# %%
layer = CausalSelfAttention(GPTConfig(n_embd=32, n_head=4, bias=True, pos_encoding="none", attn_backend="math")).eval()
xs = torch.randn(1, 12, 32)
with torch.no_grad():
    yours = multi_head(xs, layer.c_attn.weight, layer.c_attn.bias, layer.c_proj.weight, layer.c_proj.bias, 4)
    theirs = layer(xs, PositionalEncoding(), None, torch.arange(12))[0]
print(f"your multi_head vs the model's attention layer: largest gap {(yours - theirs).abs().max():.1e}")

# %%
attention_lab.show(Path("runs/notebook_02_before_softmax"), "ROMEO:\nBut soft, what light", height=650)

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
# ## The sinusoid table
# One way to give positions: add to each token's vector a row of a fixed table, PE[p, 2i] = sin(p / 10000^(2i/dim))
# and PE[p, 2i+1] = cos(the same angle). Each channel pair turns at its own speed: the first pairs fast, the last
# ones so slowly they barely move over a window. Your turn: write the table.

# %% tags=["your-turn"]
def sinusoidal(n_positions, dim):
    """-> (n_positions, dim) float32: PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(the same angle)."""
    raise NotImplementedError("write sinusoidal: the (n_positions, dim) table of sines and cosines, then rerun "
                              "this cell")


if SOLVED:
    sinusoidal = answer("sinusoidal")
result = check("sinusoidal", sinusoidal, stop=True)

# %%
table = sinusoidal(128, 64)
fig, ax = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [2, 1]})
im = ax[0].imshow(table.T.numpy(), cmap="RdBu", aspect="auto", vmin=-1, vmax=1)
ax[0].set(title="your sinusoid table (128 positions, 64 channels)", xlabel="position p", ylabel="channel")
fig.colorbar(im, ax=ax[0])
for c in (0, 6, 14, 30):
    ax[1].plot(table[:, c].numpy(), label=f"channel {c}")
ax[1].set(title="a few channels along the positions", xlabel="position p")
ax[1].legend(fontsize=7)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Rotary positions (RoPE)
# The other way, this model's default: leave the embeddings alone and turn q and k instead, each channel pair
# (i, i + hs/2) by the angle pos * base^(-2i/hs). Your turn: write `rope(x, pos)`.

# %% tags=["your-turn"]
def rope(x, pos, base=10000.0):
    """x (B, nh, T, hs), pos (T,) -> x with channel pair (i, i + hs/2) turned by pos * base^(-2i/hs)."""
    raise NotImplementedError("write rope: turn each channel pair (i, i + hs/2) by pos * base^(-2i/hs), then rerun "
                              "this cell")


if SOLVED:
    rope = answer("rope")
result = check("rope", rope, stop=True)

# %% [markdown]
# RoPE makes a score depend on the distance between query and key only: shift both positions by the same amount
# and the score does not change. Left: one channel pair of a vector turned by your `rope` at positions 0..7 (the
# first pair turns fast, a later pair slowly). Right: q at position p + 3 against k at p, for many p: one
# score; against k held at 0, the score moves as the distance grows.

# %%
unit = torch.zeros(1, 1, 1, 16)
unit[..., 0] = unit[..., 4] = 1.0  # pair 0 is channels (0, 8); pair 4 is (4, 12)
fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
for pair, colour in ((0, "tab:red"), (4, "tab:blue")):
    for p in range(8):
        turned = rope(unit, torch.tensor([p]))[0, 0, 0]
        ax[0].arrow(0, 0, turned[pair].item(), turned[pair + 8].item(), color=colour, alpha=0.3 + 0.09 * p,
                    head_width=0.04, length_includes_head=True, label=f"pair {pair}" if p == 0 else None)
ax[0].set(xlim=(-1.1, 1.1), ylim=(-1.1, 1.1), aspect="equal", title="one channel pair turned at positions 0..7")
ax[0].legend(fontsize=8)
qv, kv = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
starts = list(range(0, 200, 5))
same_gap = [(rope(qv, torch.tensor([p + 3])) * rope(kv, torch.tensor([p]))).sum().item() for p in starts]
growing = [(rope(qv, torch.tensor([p + 3])) * rope(kv, torch.tensor([0]))).sum().item() for p in starts]
ax[1].plot(starts, same_gap, "o-", ms=3, label="q at p + 3, k at p: distance 3 always")
ax[1].plot(starts, growing, "o-", ms=3, alpha=0.6, label="q at p + 3, k at 0: distance grows")
ax[1].set(title="a score under RoPE depends on the distance", xlabel="p", ylabel="score")
ax[1].legend(fontsize=7)
fig.tight_layout()
plt.show()
print(f"scores over p: from {min(same_gap):.5f} to {max(same_gap):.5f}")
