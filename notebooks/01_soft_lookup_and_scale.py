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
# # 1. A query and its keys: attention as a soft lookup, and why sqrt(d_k)
#
# A dictionary lookup returns the value of the one key that equals the query. Attention returns a *weighted
# average* of every value, each weighted by how well its key matches the query: softmax(q·k / sqrt(d_k)).
# This notebook draws that on four keys, measures why the scores are divided by sqrt(d_k), has you write
# `scores` yourself, and then draws what a model you trained attends to, computed with *your* function.
#
# Run it top to bottom (a few minutes on 2 CPU cores). A "your turn" cell stops the run until you write it: fill it
# in, rerun that cell, and run on. The cell below is the parameter cell: the test suite runs this notebook with
# smaller settings, once as you get it and once with `SOLVED = True`.

# %% tags=["parameters"]
STEPS = 1000  # training steps of the small model whose numbers we read (the test suite runs 4)
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
import math
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import PowerNorm

import attention_lab
import train as trainer
from attention_lab.exercises import answer, check
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.config import compose
from model.hooks import run_with_cache

torch.manual_seed(0)
extra = [f"data.cache_dir={DATA_CACHE}"] if DATA_CACHE else []

# %% [markdown]
# ## A soft lookup by hand
# One query, four keys, four values. Each key's dot product with the query is its score; the softmax turns the
# scores into weights that sum to 1; the answer is the values averaged with those weights. (Two channels only, so
# no scale yet: that comes next.)

# %%
q = torch.tensor([1.0, 0.0])
keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.7, 0.7]])
values = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
weights = torch.softmax(keys @ q, dim=0)  # (4,): one weight per key
print("weights:", [round(w, 3) for w in weights.tolist()], " sum", round(weights.sum().item(), 3))
print("answer:", round((weights @ values).item(), 2), "(a hard lookup of key 0 would give 10)")

fig, ax = plt.subplots(1, 2, figsize=(8, 2.6))
ax[0].bar(range(4), (keys @ q).tolist(), color="tab:gray")
ax[0].set(title="scores q·k", xticks=range(4), xlabel="key")
ax[1].bar(range(4), weights.tolist(), color="tab:blue")
ax[1].set(title=f"weights (softmax): answer {(weights @ values).item():.1f}", xticks=range(4), xlabel="key",
          ylim=(0, 1))
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Why divide by sqrt(d_k)
# With q and k of unit-variance entries, q·k is a sum of d_k products: its variance grows like d_k. The softmax of
# large scores *saturates*: one weight near 1, the rest near 0, and gradients near 0, so the head stops learning.
# Divided by sqrt(d_k), the scores keep a variance near 1 whatever the head size. The figure: the largest of 16
# weights, averaged over 2000 random queries, as d_k grows.

# %%
sizes, top_raw, top_scaled = (2, 4, 8, 16, 32, 64, 128, 256, 512), [], []
for d_k in sizes:
    qq, kk = torch.randn(2000, d_k), torch.randn(2000, 16, d_k)
    dots = (kk @ qq[:, :, None]).squeeze(-1)  # (2000, 16): each query against 16 keys
    top_raw.append(torch.softmax(dots, -1).max(-1).values.mean().item())
    top_scaled.append(torch.softmax(dots / math.sqrt(d_k), -1).max(-1).values.mean().item())
    print(f"d_k {d_k:4d}: var(q.k) {dots.var().item():7.1f}, var(q.k / sqrt(d_k)) {(dots / math.sqrt(d_k)).var():.2f};"
          f" largest weight of 16: {top_raw[-1]:.2f} unscaled, {top_scaled[-1]:.2f} scaled")

fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(sizes, top_raw, "o-", label="softmax(q·k): saturates")
ax.plot(sizes, top_scaled, "o-", label="softmax(q·k / sqrt(d_k))")
ax.axhline(1 / 16, color="gray", ls=":", label="uniform (1/16)")
ax.set(xscale="log", xlabel="d_k (head size)", ylabel="largest weight of 16", ylim=(0, 1.05),
       title="softmax saturation against d_k")
ax.legend()
plt.show()

# %% [markdown]
# ## Your turn: the scores
# Write `scores(q, k)`: every query's score for every key, in every head at once, divided by sqrt(d_k) (d_k is
# the head size, the last dimension). Replace the `raise` line with your code and rerun the cell. The check
# compares it with the model's own function and names the classic slips (no scale, dividing by d_k, the wrong
# transpose). Stuck? `python -m attention_lab.exercises solution scores --anyway` prints the project's answer.

# %% tags=["your-turn"]
def scores(q, k):
    """q (B, nh, T, hs), k (B, nh, S, hs) -> (B, nh, T, S): entry [b, h, i, j] is query i's score for key j."""
    raise NotImplementedError("write scores = (every q against every k) / sqrt(d_k) in this cell, then rerun it")


if SOLVED:
    scores = answer("scores")  # the test suite's switch: the project's function in place of yours
result = check("scores", scores, stop=True)

# %% [markdown]
# ## Your scores on a model you trained
# A small model trained for STEPS steps on Shakespeare (characters). Its first layer's q and k for one line go
# through *your* `scores`; each query's softmax over the keys up to itself (a query never sees later characters:
# notebook 2 is about that) is its attention. If your function is right, the maps are the model's own weights.

# %%
run = Path("runs/notebook_01")
trainer.train(compose(["experiment=debug", f"train.max_steps={STEPS}", f"train.eval_interval={max(STEPS, 1)}",
                       "train.film=false", "train.tensorboard=false", "train.head_roles=false", *extra]), run)
ckpt = load_checkpoint(run, "latest")
model, tok = ckpt.build_model("cpu").eval(), ckpt.tokenizer()
text = "ROMEO:\nBut soft, what light"
ids = torch.tensor([tok.encode(text)])
chars = tok.token_strings(ids[0].tolist())
_, cache = run_with_cache(model, ids)
s = scores(cache["q", 0], cache["k", 0])[0]  # (nh, T, T): your scores, layer 0
mine = torch.zeros_like(s)
for i in range(s.size(-1)):
    mine[:, i, : i + 1] = torch.softmax(s[:, i, : i + 1], dim=-1)  # query i over keys 0..i
theirs = cache["pattern", 0][0]  # (nh, T, T): the model's weights
gap = (mine - theirs).abs().max().item()
print(f"largest gap between your maps and the model's weights: {gap:.1e}")
assert gap < 1e-5, (f"your maps differ from the model's weights by {gap:.1e}: each query i takes its softmax over "
                    "keys 0..i only (itself and the earlier ones), never a later key")
i = len(chars) - 1
print(f"query {i} ({chars[i]!r}), head 0: its top keys",
      [(chars[j], round(mine[0, i, j].item(), 3)) for j in mine[0, i].argsort(descending=True)[:4].tolist()])

# %%
labels = [c.replace("\n", "\\n").replace(" ", "␣") for c in chars]
fig, axes = plt.subplots(1, mine.size(0), figsize=(5 * mine.size(0), 4.6))
for h, ax in enumerate(axes):
    im = ax.imshow(mine[h].numpy(), cmap="viridis", norm=PowerNorm(0.5, vmin=0, vmax=1))  # sqrt: small weights show
    ax.set(title=f"layer 0, head {h}: softmax of your scores", xlabel="key (what is looked at)", ylabel="query")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
fig.colorbar(im, ax=axes, label="weight (square-root colour scale)")
plt.show()

# %% [markdown]
# ## Two slips, and what the check says
# Leave the scale out, or write the softmax as exp(s) / sum(exp(s)): right on small scores, but exp overflows above
# about 88 in float32, and the check's cases include rows whose scores reach 1e4. Both are built from your
# `scores`, so they run once yours passes.

# %%
def scores_unscaled(q, k):
    return scores(q, k) * math.sqrt(q.size(-1))  # your scores with the scale undone


slip = check("scores", scores_unscaled)
assert slip.mistake == "no_scale"


def attention_exp(q, k, v):
    t = q.size(-2)
    s = scores(q, k).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    e = torch.exp(s)  # the slip: no max subtracted first
    return e / e.sum(-1, keepdim=True) @ v


overflow = check("attention", attention_exp)
assert overflow.mistake == "unstable_softmax"

# %% [markdown]
# ## The model's page
# The same run's attention page, inline: every head's map for this line, the step inside one query (its scores,
# weights and values), and what hiding a key does. (Leave it last in the cell to display it.)

# %%
attention_lab.show(run, text, height=700)
