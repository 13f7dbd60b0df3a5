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
# # 4. Train the model with your own attention, and watch it
#
# Your `attention(q, k, v)` goes into every layer of the real model (`model.attn_impl=FILE:attention`), trains,
# and the run says if it reads the future. Then `attention_lab.show` draws what your model attends to, inline.

# %% tags=["parameters"]
STEPS = 1000  # training steps (the test suite runs 4)
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
import inspect
import json
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt

import attention_lab
import train as trainer
from attention_lab.exercises import answer, check
from attention_lab.training.config import compose

extra = [f"data.cache_dir={DATA_CACHE}"] if DATA_CACHE else []
common = ["experiment=debug", f"train.max_steps={STEPS}", f"train.eval_interval={max(STEPS // 10, 1)}",
          "train.tensorboard=false", "train.head_roles=false", *extra]

# %% [markdown]
# ## Your turn: one head's causal attention
# softmax(mask(q k^T / sqrt(d_k))) v in every head: the scores (notebook 1), -inf on the future keys (notebook 2),
# a softmax over the keys, the weighted average of the values. Use only `math` and `torch` inside it: the next cell
# writes your function into a file that the model loads.

# %% tags=["your-turn"]
def attention(q, k, v):
    """q, k, v (B, nh, T, hs) -> (B, nh, T, hs): softmax(mask(q k^T / sqrt(hs))) v in each head."""
    raise NotImplementedError("write attention: scores, -inf on the future, softmax, weighted sum of v; then rerun "
                              "this cell")


if SOLVED:
    attention = answer("attention")
result = check("attention", attention, stop=True)

# %% [markdown]
# ## Your attention, in a file
# The model loads your function from a file, so that its checkpoints can reopen it. This writes yours there and
# checks the file.

# %%
mine = Path("my_attention")
mine.mkdir(exist_ok=True)
(mine / "attention.py").write_text("import math\n\nimport torch\n\n\n" + textwrap.dedent(inspect.getsource(attention)))
result = check("attention", mine / "attention.py")

# %% [markdown]
# ## Train with it
# The run prints that the attention is yours; config.json records your file and its hash.

# %%
run = Path("runs/notebook_04_mine")
final = trainer.train(compose(common + [f"model.attn_impl={(mine / 'attention.py').resolve()}:attention"]), run)
recorded = json.loads((run / "config.json").read_text())["model"]
print("config.json:", recorded["attn_impl"], recorded["attn_impl_sha256"][:12], "...")
print(f"validation loss {final['val_loss']:.3f} nats/token")


def curves(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return ([(r["step"], r["loss"]) for r in rows if "loss" in r], [(r["step"], r["val_loss"]) for r in rows
                                                                     if "val_loss" in r])


train_curve, val_curve = curves(run)
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(*zip(*train_curve), label="training batches")
ax.plot(*zip(*val_curve), "o-", label="validation")
ax.set(xlabel="step", ylabel="loss (nats/token)", title="the model trained with your attention")
ax.legend()
plt.show()

# %% [markdown]
# ## A leaky attention tells on itself
# An attention with a classic slip, the mask applied after the softmax: the future keys' weights are zeroed, but
# they were in the softmax's denominator, so every visible weight still depends on the future. The run scores
# the honest loss (each position predicted from the tokens up to it alone) at every evaluation and says so.

# %%
(mine / "leaky.py").write_text('''import math

import torch


def attention(q, k, v):
    """The slip: a softmax over every key, the future's weights zeroed afterwards."""
    t = q.size(-2)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)  # the future in the denominator
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return weights.masked_fill(future, 0.0) @ v
''')
leaky = Path("runs/notebook_04_leaky")
trainer.train(compose(common + [f"model.attn_impl={(mine / 'leaky.py').resolve()}:attention"]), leaky)
told = [line for line in (leaky / "console.log").read_text().splitlines() if "reads the future" in line]
print(told[0] if told else "no leak said (too few steps for the leak to pass the noise floor)")

rows = [json.loads(line) for line in (leaky / "metrics.jsonl").read_text().splitlines() if "honest_loss" in line]
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot([r["step"] for r in rows], [r["leaky_loss"] for r in rows], "o-", label="as trained (the future in view)")
ax.plot([r["step"] for r in rows], [r["honest_loss"] for r in rows], "o-", label="honest (the future cut off)")
ax.set(xlabel="step", ylabel="validation loss (nats/token)", title="the leaky attention: two losses part")
ax.legend()
plt.show()

# %% [markdown]
# ## What your model attends to
# One text's page inline: every head's weights, the step inside one query, hiding a key. (Leave it last in the
# cell to display it.)

# %%
page = attention_lab.show(run, "ROMEO:\nBut soft, what light", height=700)
page
