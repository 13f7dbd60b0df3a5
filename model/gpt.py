"""The decoder-only GPT: MLP -> Block -> GPT, with GPT-2's names so its weights map by key.

Shapes: B batch, T tokens in this call, S = tokens cached before + T, C n_embd, V vocab_size, nh n_head.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import CausalSelfAttention, KVCache, dropout
from .config import GPTConfig
from .hooks import HookPoint
from .linear_attention import LinearAttention
from .positions import LearnedPositions, build_positional_encoding


def gelu(x: Tensor) -> Tensor:
    """GPT-2's activation: GELU with the tanh approximation."""
    return F.gelu(x, approximate="tanh")


def relu2(x: Tensor) -> Tensor:
    """relu(x)^2 (So et al. 2021, "Primer"): sparse like ReLU, smooth at 0, cheaper than GELU."""
    return F.relu(x).square()


# functions, not modules: nothing to learn, and a decoding token calls each layer's once (a module call costs a few
# microseconds of Python; see dropout in attention.py)
MLP_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"gelu": gelu, "relu2": relu2}


class MLP(nn.Module):
    """Position-wise feed-forward: C -> mlp_ratio*C -> C, the activation (cfg.mlp_act) in between."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=cfg.bias)
        self.act = MLP_ACTIVATIONS[cfg.mlp_act]
        self.c_proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout_p = cfg.dropout

    def forward(self, x: Tensor) -> Tensor:
        return dropout(self.c_proj(self.act(self.c_fc(x))), self.dropout_p, self.training)


# uniform attention is softmax attention with q zeroed (CausalSelfAttention reads cfg.attention): every path it
# has (backends, windows, the KV cache, hooks, return_weights) then computes the uniform weights
ATTENTIONS: dict[str, type[nn.Module]] = {"softmax": CausalSelfAttention, "linear": LinearAttention,
                                          "uniform": CausalSelfAttention}


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    hooked = False  # True inside model.hooks.hooked(): the residual-stream points are called

    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        # the residual stream entering, between the two adds, and leaving (model/hooks.py)
        self.hook_resid_pre, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.attn = ATTENTIONS[cfg.attention](cfg, layer)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, pe, rotation, pos, kv_cache=None, layer=0, return_weights=False, v_first=None):
        """-> x (B, T, C), attention weights or None, this block's values (B, nkv, T, hs) (see attention.py)."""
        if self.hooked:
            x = self.hook_resid_pre(x)
        a, weights, v = self.attn(self.ln_1(x), pe, rotation, pos, kv_cache, layer, return_weights, v_first)
        x = x + a
        if self.hooked:
            x = self.hook_resid_mid(x)
        x = x + self.mlp(self.ln_2(x))
        if self.hooked:
            x = self.hook_resid_post(x)
        return x, weights, v


class LogitSoftcap(nn.Module):
    """logits -> c * tanh(logits / c): smooth, about the identity for |logits| << c, bounded in (-c, c).

    Keeps the output logits from growing without limit (Gemma 2; modded-nanogpt). Computed in float32, so the
    loss sees the capped logits at full precision under bf16 autocast too.
    """

    def __init__(self, cap: float):
        super().__init__()
        self.cap = cap

    def forward(self, logits: Tensor) -> Tensor:
        return self.cap * torch.tanh(logits.float() / self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap}"


@dataclass
class GPTOutput:
    logits: Tensor  # (B, T, V)
    loss: Tensor | None = None  # mean next-token cross-entropy in nats, when targets were given
    attentions: tuple[Tensor, ...] | None = None  # n_layer x (B, nh, T, S), when return_attention


def next_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy in nats of logits (B, T, V) against targets (B, T), -1 ignored, computed in float32
    whatever the autocast dtype. The GPT and the LSTM baseline share it, so both are scored the same way."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


def chunked_next_token_loss(logits: Tensor, targets: Tensor, rows: int = 256) -> Tensor:
    """next_token_loss, `rows` positions at a time: the same number, without the float32 copy of every logit.

    The plain loss casts all B*T x V logits to float32, keeps their log-softmax for the backward pass and writes a
    float32 gradient of the same size (three arrays of 32 MB at batch 4 x 512, vocab 4096). Here each block of
    rows is cast, reduced to its log-sum-exp and dropped; the backward pass recomputes its softmax from the
    logits and the saved log-sum-exps. loss_i = logsumexp(z_i) - z_i[y_i]; d loss / d z_i = softmax(z_i) - onehot(y_i).
    """
    return _ChunkedNextTokenLoss.apply(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), rows)


class _ChunkedNextTokenLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, y: Tensor, rows: int) -> Tensor:
        keep = y != -1
        n = keep.sum()
        lse = torch.empty(z.size(0), dtype=torch.float32, device=z.device)
        total = torch.zeros((), dtype=torch.float32, device=z.device)
        for s in range(0, z.size(0), rows):
            block, yb, kb = z[s:s + rows].float(), y[s:s + rows], keep[s:s + rows]
            lse[s:s + rows] = torch.logsumexp(block, dim=-1)
            picked = block.gather(1, yb.clamp_min(0).unsqueeze(1)).squeeze(1)
            total += torch.where(kb, lse[s:s + rows] - picked, 0.0).sum()
        ctx.save_for_backward(z, y, lse, n)
        ctx.rows = rows
        return total / n  # nan when every target is ignored, as F.cross_entropy gives

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, y, lse, n = ctx.saved_tensors
        rows, scale = ctx.rows, grad.float() / n
        dz = torch.empty_like(z)
        for s in range(0, z.size(0), rows):
            yb, kb = y[s:s + rows], (y[s:s + rows] != -1)
            p = torch.exp(z[s:s + rows].float() - lse[s:s + rows, None])  # softmax, recomputed
            p.scatter_add_(1, yb.clamp_min(0).unsqueeze(1), -kb.float().unsqueeze(1))  # minus the one-hot
            dz[s:s + rows] = (p * (kb.float() * scale).unsqueeze(1)).to(z.dtype)
        return dz, None, None


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=build_positional_encoding(cfg),
                h=nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.softcap = LogitSoftcap(cfg.logit_softcap) if cfg.logit_softcap > 0 else None
        if cfg.tie_embeddings:
            # one matrix reads tokens in and scores them out (Press & Wolf 2017); saves V*C parameters
            self.lm_head.weight = self.transformer.wte.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2 * n_layer).

        Each block adds two residual branches (attention and MLP); scaling their output projections keeps the
        residual stream's variance from growing with depth. With zero_init_proj they start at exactly zero
        instead: every block begins as the identity, and the branches grow from there (modded-nanogpt).

        qk_init="unit": c_attn's q and k rows (the q rows alone with qk_tied) are drawn N(0, 1/n_embd) instead, so
        on the LayerNorm's unit-variance output each q and k channel starts with variance n_embd * (1/n_embd) = 1,
        the premise of the 1/sqrt(d_k) scale (q.k then has variance d_k; Vaswani et al. 2017, footnote 4). With
        0.02 the variance is 0.0004 * n_embd (0.05 at n_embd 128), and q.k is small at any d_k.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
            elif isinstance(module, LearnedPositions):
                module.reset_parameters()
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                if self.config.zero_init_proj:
                    nn.init.zeros_(p)
                else:
                    nn.init.normal_(p, mean=0.0, std=residual_std)
            elif name.endswith("value_lambda"):
                nn.init.constant_(p, 0.5)  # an even mix of the block's own and the first block's values
        if self.config.qk_init == "unit":
            cfg = self.config
            qk_rows = (cfg.n_head + (0 if cfg.qk_tied else cfg.kv_heads)) * cfg.head_size  # [q | k] lead c_attn
            for block in self.transformer.h:
                with torch.no_grad():
                    block.attn.c_attn.weight[:qk_rows].normal_(0.0, 1.0 / math.sqrt(cfg.n_embd))

    def new_kv_cache(self) -> KVCache:
        cfg = self.config
        return KVCache(cfg.n_layer, cfg.block_size, [cfg.layer_window(i) for i in range(cfg.n_layer)])

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        return_attention: bool = False,
        last_only: bool = False,
    ) -> GPTOutput:
        """Next-token logits at every position.

        idx:      (B, T) token ids; with a kv_cache, the T tokens that follow the cached ones.
        targets:  (B, T) the token that follows each position (-1 = ignore); gives `loss`.
        kv_cache: keys/values of earlier tokens, updated in place (see generate.py).
        return_attention: also return every layer's attention weights (runs the explicit `math` path).
        last_only: logits of the last position only, (B, 1, V): all that decoding needs.
        """
        b, t = idx.shape
        past = kv_cache.length if kv_cache is not None else 0
        if past + t > self.config.block_size and not (kv_cache is not None and self.config.bounded_cache):
            raise ValueError(
                f"sequence of {past + t} tokens is longer than block_size={self.config.block_size}; "
                "crop the input to the last block_size tokens"
            )
        # (T,) absolute positions; a cache hands out views of one table (one token's step makes no new tensor)
        pos = (kv_cache.positions(past, past + t, idx.device) if kv_cache is not None
               else torch.arange(t, device=idx.device))
        pe = self.transformer.wpe

        x = self.transformer.wte(idx)  # (B, T, C)
        pos_emb = pe.embed(pos)
        if pos_emb is not None:
            x = x + pos_emb  # (T, C) broadcast over the batch
        x = dropout(x, self.config.dropout, self.training)
        # RoPE's cos/sin tables, once for every layer (None for the other encodings); pos is past..past+t-1
        rotation = pe.rotation(pos, (past, past + t))

        attentions = []
        v_first = None  # the first block's values, for value_residual
        for i, block in enumerate(self.transformer.h):
            x, weights, v = block(x, pe, rotation, pos, kv_cache, i, return_attention, v_first)
            attentions.append(weights)
            if i == 0:
                v_first = v
        if kv_cache is not None:
            kv_cache.advance(t)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C): a view (a list index [-1] would copy)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, V)
        if self.softcap is not None:
            logits = self.softcap(logits)

        loss = next_token_loss(logits, targets) if targets is not None else None
        return GPTOutput(logits, loss, tuple(attentions) if return_attention else None)


def num_params(model: GPT, non_embedding: bool = True) -> int:
    """Parameters, each tied matrix once. non_embedding drops the position table (wte counts: it is the lm_head)."""
    n = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    if non_embedding and isinstance(model.transformer.wpe, LearnedPositions):
        n -= model.transformer.wpe.weight.numel()
    return n


def flops_per_token(cfg: GPTConfig, n_params: int, seq_len: int | None = None, training: bool = True) -> float:
    """Matmul FLOPs to process one token, the PaLM (Chowdhery et al. 2022, app. B) count.

    Each parameter takes a multiply and an add per token in the forward pass (2N); attention adds
    QK^T and AV, 2 * seq_len * C each per layer (4 L C T, counting the masked half as the convention does).
    The backward pass costs twice the forward, so training is 3x: 6N + 12 L C T.
    """
    t = cfg.block_size if seq_len is None else seq_len
    forward = 2 * n_params + 4 * cfg.n_layer * cfg.n_embd * t
    return 3 * forward if training else forward
