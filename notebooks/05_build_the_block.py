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
# # 5. Build the block up, one idea at a time, with a loss at each stage
#
# The tutorials build self-attention in steps, and so does Karpathy's lecture "Let's build GPT": an average of the
# tokens so far; the same average written as scores, -inf on the future and a softmax, so that the weights can be
# learned; scores that depend on the tokens (one head of queries and keys); several heads side by side; and the
# block, with a feed-forward layer and residual connections. Here each stage is a tiny character model written from
# scratch in plain torch below (not the project's model), trained for a few seconds on the Shakespeare characters
# the project prepares, and scored on held-out text. The number that moves is the validation loss.

# %% tags=["parameters"]
STEPS = 300  # training steps per stage (a few seconds each on 2 CPU cores; the test suite runs 4)
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
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.colors import PowerNorm
from torch import nn

from attention_lab.exercises import answer, check
from attention_lab.training.config import compose
from data.prepare import prepare_data

torch.set_num_threads(1)  # models this small train fastest on one core: more threads cost more than they share
extra = [f"data.cache_dir={DATA_CACHE}"] if DATA_CACHE else []
data = prepare_data(compose(["experiment=debug", *extra]).data, log=print)  # Shakespeare, one token per character
tok = data.tokenizer
train_ids = torch.from_numpy(np.asarray(data.tokens("train")).astype(np.int64))
val_ids = torch.from_numpy(np.asarray(data.tokens("val")).astype(np.int64))
V, T, C, HEADS, BATCH = tok.vocab_size, 32, 64, 4, 32  # vocabulary, context, width, heads, windows per step
print(f"{len(train_ids):,} training characters, {V} distinct; windows of {T}")


def batch(ids, gen):
    """BATCH random windows: x (BATCH, T) and y (BATCH, T), y the next character at every position."""
    starts = torch.randint(len(ids) - T - 1, (BATCH,), generator=gen)
    x = torch.stack([ids[s: s + T] for s in starts])
    return x, torch.stack([ids[s + 1: s + T + 1] for s in starts])


# %% [markdown]
# ## The model around each stage
# Every stage is the same small model, and only the part that mixes the positions changes: each character's vector
# (its embedding plus its position's), then the stage's `mix`, then a linear layer that scores every possible next
# character. `train_stage` trains it for STEPS steps with the same seed, data and optimizer, and scores it on 20
# held-out batches.

# %%
FUTURE = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, T): True where key j comes after query i


class TinyLM(nn.Module):
    def __init__(self, mix: nn.Module):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.mix = mix
        self.lm_head = nn.Linear(C, V)

    def forward(self, idx):  # idx (B, T) -> logits (B, T, V)
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))  # (B, T, C)
        return self.lm_head(self.mix(x))


losses: dict[str, float] = {}


def train_stage(number: int, name: str, make_mix) -> TinyLM:
    torch.manual_seed(0)
    model = TinyLM(make_mix())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen, t0 = torch.Generator().manual_seed(0), time.perf_counter()
    for _ in range(STEPS):
        x, y = batch(train_ids, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1)  # the same held-out windows for every stage
    with torch.no_grad():
        val = np.mean([F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                       for x, y in (batch(val_ids, gen) for _ in range(20))])
    losses[f"{number}. {name}"] = val
    print(f"stage {number}: {name}: validation loss {val:.3f} nats/token ({STEPS} steps, {seconds:.1f} s)")
    return model


# %% [markdown]
# ## Stage 0: no mixing at all
# Each character predicts the next from itself alone (a bigram model): the baseline every stage should beat.
# Guessing uniformly among the V characters would score ln(V).

# %%
print(f"uniform guess: ln({V}) = {math.log(V):.3f} nats/token")
train_stage(0, "each character alone", nn.Identity)

# %% [markdown]
# ## Stage 1: the uniform average over the past
# The simplest way for a character to hear the earlier ones: its vector becomes the average of its own and every
# earlier one. As a matrix product, one (T, T) weight matrix W whose row i holds 1/(i+1) on keys 0..i and 0 after:
# lower triangular (`tril`), each row summing to 1.

# %%
class UniformAverage(nn.Module):
    def forward(self, x):  # (B, T, C) -> (B, T, C)
        t = x.size(1)
        w = torch.tril(torch.ones(t, t))  # (T, T): 1 on keys 0..i
        w = w / w.sum(dim=-1, keepdim=True)  # each row: 1/(i+1) on keys 0..i
        return w @ x  # (T, T) @ (B, T, C) -> (B, T, C)


uniform = train_stage(1, "uniform average over the past", UniformAverage)

# %% [markdown]
# Worse than stage 0: averaging every earlier character with equal weight blurs away the one that matters most
# here, the last. The weights must be able to differ.
#
# ## Stage 2: scores, -inf on the future, softmax
# The same average written another way: scores of 0 for every (query, key) pair, -inf where the key is in the
# future, a softmax per row. exp(-inf) = 0 hides the future; the visible keys share the weight equally, so this
# is exactly stage 1's W. The point of writing it so: now the scores can be *learned*. Here they are a free
# (T, T) table of parameters, one score per (query position, key position), the same for every text.

# %%
scores0 = torch.zeros(T, T).masked_fill(FUTURE, float("-inf"))
w = torch.softmax(scores0, dim=-1)
same = torch.allclose(w, torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None])
print("softmax of zeros with -inf on the future equals the uniform average:", same)
assert same, ("each query i should share its weight equally over keys 0..i: FUTURE must be True exactly where the "
              "key comes after the query (j > i), hiding the future and nothing else")


class LearnedPositionScores(nn.Module):
    def __init__(self):
        super().__init__()
        self.scores = nn.Parameter(torch.zeros(T, T))  # starts as stage 1's uniform average

    def weights(self, t):
        return torch.softmax(self.scores[:t, :t].masked_fill(FUTURE[:t, :t], float("-inf")), dim=-1)

    def forward(self, x):
        return self.weights(x.size(1)) @ x


by_position = train_stage(2, "learned scores by position, -inf, softmax", LearnedPositionScores)

# %% [markdown]
# ## Stage 3: one head, scores from the tokens
# Now the scores depend on the characters themselves: each position emits a query (what it looks for) and a key
# (what it offers), the score of query i for key j is their dot product over sqrt(d_k), and what gets averaged is
# a value vector, not the raw embedding.

# %%
class OneHead(nn.Module):
    def __init__(self, head_size=C):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(C, head_size, bias=False) for _ in range(3))

    def weights(self, x):  # (B, T, C) -> (B, T, T)
        q, k = self.query(x), self.key(x)  # (B, T, hs) each
        s = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))  # (B, T, T): query i's score for key j
        t = x.size(1)
        return torch.softmax(s.masked_fill(FUTURE[:t, :t], float("-inf")), dim=-1)

    def forward(self, x):
        return self.weights(x) @ self.value(x)  # (B, T, T) @ (B, T, hs)


one_head = train_stage(3, "one head (q, k, v)", OneHead)

# %% [markdown]
# ## Stage 4: several heads
# Several smaller heads side by side, each free to look for something else: split the C channels into HEADS heads
# of C / HEADS, attend in each, concatenate, and mix the heads with an output projection. Your turn: write
# `multi_head`, as in notebook 2 (paste yours). The model below passes its own layers' weights to your function.
# For the attention inside each head, use `attend`, one head's causal attention (notebook 4 has you write it).

# %%
attend = answer("attention")  # (B, nh, T, hs) q, k, v -> (B, nh, T, hs): softmax(mask(q k^T / sqrt(hs))) v per head

# %% tags=["your-turn"]
def multi_head(x, w_qkv, b_qkv, w_proj, b_proj, n_head):
    """x (B, T, C); w_qkv (3C, C), b_qkv (3C,); w_proj (C, C), b_proj (C,) -> (B, T, C)."""
    raise NotImplementedError("write multi_head: project, split into heads, attend(q, k, v), concatenate, project; "
                              "then rerun this cell")


if SOLVED:
    multi_head = answer("multi_head")
result = check("multi_head", multi_head, stop=True)

# %%
class SeveralHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)  # [q | k | v] of every head; the mixing

    def forward(self, x):
        return multi_head(x, self.c_attn.weight, self.c_attn.bias, self.c_proj.weight, self.c_proj.bias, HEADS)


train_stage(4, f"{HEADS} heads (your multi_head)", SeveralHeads)

# %% [markdown]
# ## Stage 5: the block
# Attention lets positions talk; a feed-forward layer then works on each position alone (the tutorials: blocks
# stack attention and feed-forward). Each is added to its input (a residual connection: x + f(x), so the token's
# own vector is never lost and gradients have a direct path), after a layer norm.

# %%
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), SeveralHeads(), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))  # positions talk
        return x + self.mlp(self.ln_2(x))  # each position thinks alone


train_stage(5, "the block: heads + feed-forward, residuals, layer norm",
            lambda: nn.Sequential(Block(), nn.LayerNorm(C)))

# %% [markdown]
# ## The losses, stage by stage

# %%
fig, ax = plt.subplots(figsize=(8, 3.6))
names = list(losses)
ax.barh(names[::-1], [losses[n] for n in names[::-1]], color="tab:blue")
ax.axvline(math.log(V), color="gray", ls=":", label=f"uniform guess ln({V})")
for i, n in enumerate(names[::-1]):
    ax.text(losses[n], i, f" {losses[n]:.3f}", va="center", fontsize=8)
ax.set(xlabel="validation loss (nats/token), lower is better", title=f"each stage trained {STEPS} steps",
       xlim=(0, math.log(V) * 1.15))
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# What to look for (a run of 300 steps a stage on 2 CPU cores went 2.58, 3.18, 2.82, 2.60, 2.49, 2.30 from stage 0
# to 5; yours will differ a little): the fixed average is worse than no mixing at all; learning the weights wins
# most of that back; scores from the tokens do better again, several heads better than one; and the block gains
# the most, because its residual connection keeps each character's own vector beside what attention brings in
# (stages 1 to 4 replace it with the average).
#
# Why one head (stage 3, 2.60) still trails no mixing at all (stage 0, 2.58): stage 0 hands each position its
# own character, which is most of what a bigram model needs. Stages 1 to 4 hand it only the mix, so one head must
# learn to put nearly all its weight on the character itself just to get back what stage 0 had for free, and a
# softmax never puts all of it there. What one head shows is that scores from the tokens beat fixed ones (stage 2);
# beating stage 0 takes several heads, or the residual connection of stage 5.
#
# ## What each stage's weights look like
# One line of Shakespeare through stages 1, 2 and 3: the uniform average (fixed), the scores learned by position
# (the same for every text), and one head's weights, which depend on the characters.

# %%
text = "ROMEO:\nBut soft, what light through"[:T]
ids = torch.tensor([tok.encode(text)])
labels = [c.replace("\n", "\\n").replace(" ", "␣") for c in tok.token_strings(ids[0].tolist())]
n = len(labels)
with torch.no_grad():
    maps = {"1. uniform average": torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None],
            "2. learned by position": by_position.mix.weights(n),
            "3. one head": one_head.mix.weights(one_head.wte(ids) + one_head.wpe(torch.arange(n)))[0]}
fig, axes = plt.subplots(1, 3, figsize=(15, 5))
for ax, (title, m) in zip(axes, maps.items()):
    im = ax.imshow(m.numpy(), cmap="viridis", norm=PowerNorm(0.5, vmin=0, vmax=1))  # sqrt: small weights show
    ax.set(title=title, xlabel="key", ylabel="query")
    ax.set_xticks(range(n), labels, fontsize=6)
    ax.set_yticks(range(n), labels, fontsize=6)
fig.colorbar(im, ax=axes, label="weight (square-root colour scale)")
plt.show()
