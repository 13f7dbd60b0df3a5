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
# This notebook shows that with a trained model's own numbers, then measures why the scores are divided by
# sqrt(d_k), then has you write `scores` and check it (`attention_lab.exercises`).
#
# Run it top to bottom (a few minutes on 2 CPU cores). The cell below is the parameter cell: the test suite runs
# this notebook with smaller settings.

# %% tags=["parameters"]
STEPS = 1000  # training steps of the small model whose numbers we read (the test suite runs 4)
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
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.config import compose
from model.hooks import run_with_cache

torch.manual_seed(0)
extra = [f"data.cache_dir={DATA_CACHE}"] if DATA_CACHE else []

# %% [markdown]
# ## A soft lookup by hand
# One query, four keys, four values. The weights say how much of each value the answer takes.

# %%
q = torch.tensor([1.0, 0.0])
keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.7, 0.7]])
values = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
weights = torch.softmax(keys @ q / math.sqrt(q.numel()), dim=0)
print("weights:", [round(w, 3) for w in weights.tolist()], " sum", round(weights.sum().item(), 3))
print("answer:", round((weights @ values).item(), 2), "(a hard lookup of key 0 would give 10)")

# %% [markdown]
# ## The same with a trained model's numbers
# A small model trained for STEPS steps on Shakespeare (characters). For one query (a position in a line), its
# layer-0 head-0 weights over the earlier characters: the keys it looks up.

# %%
run = Path("runs/notebook_01")
trainer.train(compose(["experiment=debug", f"train.max_steps={STEPS}", f"train.eval_interval={max(STEPS, 1)}",
                       "train.film=false", "train.tensorboard=false", "train.head_roles=false", *extra]), run)
ckpt = load_checkpoint(run, "latest")
model, tok = ckpt.build_model("cpu").eval(), ckpt.tokenizer()
text = "ROMEO:\nBut soft, what light"
ids = torch.tensor([tok.encode(text)])
_, cache = run_with_cache(model, ids)
qs, ks, w = cache["q", 0][0, 0], cache["k", 0][0, 0], cache["pattern", 0][0, 0]  # (T, hs), (T, hs), (T, T)
i = ids.size(1) - 1
by_hand = torch.softmax(qs[i] @ ks[: i + 1].T / math.sqrt(qs.size(-1)), dim=0)
print(f"query {i} ({tok.token_strings(ids[0].tolist())[i]!r}): its top keys")
for j in by_hand.argsort(descending=True)[:4].tolist():
    char = tok.token_strings(ids[0].tolist())[j]
    print(f"  key {j:2d} {char!r}: weight {by_hand[j]:.3f} (the model's: {w[i, j]:.3f})")
print("largest gap between softmax(q k / sqrt(d_k)) by hand and the model's weights:",
      f"{(by_hand - w[i, : i + 1]).abs().max().item():.1e}")

# %% [markdown]
# ## Why divide by sqrt(d_k)
# With q and k of unit-variance entries, q·k is a sum of d_k products: its variance grows like d_k. Divided by
# sqrt(d_k) it stays near 1 whatever the head size, and the softmax does not saturate (one weight near 1, the
# rest near 0, and gradients near 0).

# %%
for d_k in (4, 16, 64, 256):
    qq, kk = torch.randn(2000, d_k), torch.randn(2000, 16, d_k)
    dots = (kk @ qq[:, :, None]).squeeze(-1)  # (2000, 16): each query against 16 keys
    top_raw = torch.softmax(dots, -1).max(-1).values.mean().item()
    top_scaled = torch.softmax(dots / math.sqrt(d_k), -1).max(-1).values.mean().item()
    scaled_var = (dots / math.sqrt(d_k)).var().item()
    print(f"d_k {d_k:4d}: var(q.k) {dots.var().item():7.1f}, var(q.k / sqrt(d_k)) {scaled_var:.2f};"
          f" largest weight of 16: {top_raw:.2f} unscaled, {top_scaled:.2f} scaled")

# %% [markdown]
# ## Your turn: the scores
# Write `scores(q, k)` for every head at once, then check it against the model's own function. Try the classic
# slips (drop the sqrt, divide by d_k) and read what the check says.

# %%
def scores(q, k):
    """q (B, nh, T, hs), k (B, nh, S, hs) -> (B, nh, T, S)."""
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


result = check("scores", scores)

# %%
def scores_unscaled(q, k):
    return q @ k.transpose(-2, -1)


slip = check("scores", scores_unscaled)
assert slip.mistake == "no_scale"

# %% [markdown]
# And a softmax written by hand, exp(s) / sum(exp(s)), is right on small scores but overflows above exp's limit:
# the check's cases include rows whose scores reach 1e4.

# %%
def attention_exp(q, k, v):
    t = q.size(-2)
    s = scores(q, k).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    e = torch.exp(s)
    return e / e.sum(-1, keepdim=True) @ v


overflow = check("attention", attention_exp)
assert overflow.mistake == "unstable_softmax"
