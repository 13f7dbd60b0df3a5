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
# # 3. What attention buys: meaning from context, reach over distance, and its quadratic cost
#
# Three claims of the tutorials, each measured on small models: a token's vector comes to depend on its context;
# attention reaches back over the whole window where a recurrent network's memory fades; and the price is a
# score for every (query, key) pair, so the cost of attention grows with the square of the context. Each is drawn;
# the "your turn" is the step that generation repeats: one new token attending over a cache of the keys before it.

# %% tags=["parameters"]
STEPS = 1000  # training steps of the transformer and the LSTM (the test suite runs 4)
WINDOWS = 32  # validation windows measured
SIZES = (64, 128, 256, 512)  # context lengths timed in the cost measurement
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
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import attention_lab
import train as trainer
from attention_lab.exercises import answer, check
from attention_lab.interp.measures import contextual_similarity, position_losses
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.config import compose
from data.batches import eval_batches
from data.prepare import prepare_data
from model.attention import math_attention, visible_keys

torch.manual_seed(0)
extra = [f"data.cache_dir={DATA_CACHE}"] if DATA_CACHE else []
common = ["experiment=debug", "model.block_size=128", f"train.max_steps={STEPS}",
          f"train.eval_interval={max(STEPS, 1)}", "train.film=false", "train.tensorboard=false", "train.head_roles=false", "train.sample_tokens=0", *extra]

# %% [markdown]
# Two small models on the same data, tokens and budget of steps: the transformer, and an LSTM with as many
# parameters.

# %%
models = {}
for arch in ("gpt", "lstm"):
    run = Path(f"runs/notebook_03_{arch}")
    trainer.train(compose(common + [f"model.arch={arch}"]), run)
    models[arch] = load_checkpoint(run, "latest").build_model("cpu").eval()
cfg = compose(common)
val = prepare_data(cfg.data, log=lambda *a: None).tokens("val")
x, y = next(iter(eval_batches(val, cfg.model.block_size, WINDOWS, 1)))

# %% [markdown]
# ## A token's meaning from its context
# The same character in different windows: how similar are its vectors, layer by layer, beyond what any two
# vectors share? At the embedding (layer 0) a token is one vector wherever it stands; attention mixes in its
# context, so the similarity falls as the layers go up.

# %%
sim = contextual_similarity(models["gpt"], x)
for layer, value in enumerate(sim.contextual):
    print(f"layer {layer}: same token in different windows, cosine above random pairs {value:+.3f}")

fig, ax = plt.subplots(figsize=(5.5, 3))
ax.plot(range(len(sim.contextual)), sim.contextual, "o-")
ax.set(xlabel="layer (0: the embedding, before any attention)", ylabel="cosine above random pairs",
       title="the same character in different windows", xticks=range(len(sim.contextual)))
plt.show()

# %% [markdown]
# ## Reach over distance
# The loss at each position of a 128-token window: position t predicts token t + 1 from t + 1 tokens of context.
# A model that uses the far context keeps improving as t grows.

# %%
curves = {arch: position_losses(model, x, y) for arch, model in models.items()}
t = x.size(1)
for arch, curve in curves.items():
    print(f"{arch:4s}: loss at positions 0-3 {curve[:4].mean():.3f}, at the last quarter "
          f"{curve[3 * t // 4:].mean():.3f} nats/token")

fig, ax = plt.subplots(figsize=(7, 3.4))
for arch, curve in curves.items():
    ax.plot(range(t), curve, label={"gpt": "transformer (attention)", "lstm": "LSTM"}[arch])
ax.set(xlabel="position t in the window (t + 1 tokens of context)", ylabel="loss (nats/token)",
       title=f"loss by position, {WINDOWS} validation windows")
ax.legend()
plt.show()

# %% [markdown]
# ## The quadratic cost
# Attention scores every (query, key) pair: T queries times T keys. Doubling the context quadruples the scores
# (and, at these sizes, about quadruples the time of the scores and the weighted sum).

# %%
times = []
for size in SIZES:
    q = k = v = torch.randn(1, 4, size, 64)
    visible = visible_keys(torch.arange(size), torch.arange(size))
    math_attention(q, k, v, visible)  # warm up
    t0 = time.perf_counter()
    for _ in range(3):
        math_attention(q, k, v, visible)
    times.append((time.perf_counter() - t0) / 3 * 1e3)
    print(f"T = {size:4d}: {size * size:9,d} scores per head, {times[-1]:7.2f} ms for 4 heads")

fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(SIZES, times, "o-", label="measured (this machine)")
ax.plot(SIZES, [times[0] * (n / SIZES[0]) ** 2 for n in SIZES], "k:", label="T² from the first point")
ax.set(xscale="log", yscale="log", xlabel="context T (tokens)", ylabel="ms for 4 heads",
       title="the cost of the scores and the weighted sum")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Your turn: one step of generation with a KV cache
# A model generating text adds one token at a time. The keys and values of the tokens before it do not change, so
# they are kept (the KV cache) and the new token computes only its own q, k, v: it appends its k and v to the
# caches, then attends over all of them (no mask: every cached key is in the past). Each new token costs as many
# scores as there are tokens so far, so T tokens cost 1 + 2 + ... + T, about T²/2. Write `decode`.

# %% tags=["your-turn"]
def decode(q, k, v, k_cache, v_cache):
    """q, k, v (B, nh, 1, hs) the new token's; caches (B, nh, S, hs) -> y (B, nh, 1, hs), caches (B, nh, S+1, hs)."""
    raise NotImplementedError("write decode: append k and v to the caches, then attend over them; then rerun "
                              "this cell")


if SOLVED:
    decode = answer("decode")
result = check("decode", decode, stop=True)

# %% [markdown]
# Your decode, one token at a time over a window, against attention over the whole window at once (the causal
# mask does what the cache does: query t sees keys 0..t). Then the transformer's page, inline.

# %%
q = k = v = torch.randn(1, 2, 16, 8)
k_cache = v_cache = torch.zeros(1, 2, 0, 8)
steps = []
for t in range(16):
    y, k_cache, v_cache = decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], k_cache, v_cache)
    steps.append(y)
whole, _ = math_attention(q, k, v, visible_keys(torch.arange(16), torch.arange(16)))  # (y, weights)
print(f"16 decode steps vs the whole window at once: largest gap {(torch.cat(steps, 2) - whole).abs().max():.1e}")

# %%
attention_lab.show(Path("runs/notebook_03_gpt"), "ROMEO:\nBut soft, what light", height=650)
