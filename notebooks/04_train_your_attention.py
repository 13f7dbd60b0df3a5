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
import json
from pathlib import Path

import attention_lab
import train as trainer
from attention_lab.exercises import check
from attention_lab.training.config import compose

extra = [f"data.cache_dir={DATA_CACHE}"] if DATA_CACHE else []
common = ["experiment=debug", f"train.max_steps={STEPS}", f"train.eval_interval={max(STEPS // 2, 1)}",
          "train.tensorboard=false", "train.head_roles=false", *extra]

# %% [markdown]
# ## Your attention, in a file
# The model loads your function from a file (so that its checkpoints can reopen it). Write it, check it.

# %%
mine = Path("my_attention")
mine.mkdir(exist_ok=True)
(mine / "attention.py").write_text('''import math

import torch


def attention(q, k, v):
    """q, k, v (B, nh, T, hs) -> (B, nh, T, hs): softmax(mask(q k^T / sqrt(hs))) v in each head."""
    t = q.size(-2)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(future, float("-inf")), dim=-1) @ v
''')
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

# %% [markdown]
# ## A leaky attention tells on itself
# The same with the mask after the softmax: the run scores the honest loss at every evaluation and says so.

# %%
(mine / "leaky.py").write_text((mine / "attention.py").read_text().replace(
    'return torch.softmax(s.masked_fill(future, float("-inf")), dim=-1) @ v',
    "return torch.softmax(s, dim=-1).masked_fill(future, 0.0) @ v"))
leaky = Path("runs/notebook_04_leaky")
trainer.train(compose(common + [f"model.attn_impl={(mine / 'leaky.py').resolve()}:attention"]), leaky)
told = [line for line in (leaky / "console.log").read_text().splitlines() if "reads the future" in line]
print(told[0] if told else "no leak said (too few steps for the leak to pass the noise floor)")

# %% [markdown]
# ## What your model attends to
# One text's page inline: every head's weights, the step inside one query, hiding a key. (Leave it last in the
# cell to display it.)

# %%
page = attention_lab.show(run, "ROMEO:\nBut soft, what light", height=700)
page
