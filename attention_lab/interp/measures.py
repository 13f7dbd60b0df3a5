"""Measurements that answer the tutorials' "why" claims, on any trained model and held-out windows. Pure: no files,
no printing. attention_lab/claims.py composes them into experiments; `python -m attention_lab.evaluate RUN
--by-position` prints the first one.

Shapes: B windows, T positions (at most block_size), L n_layer, C n_embd, V vocab. Losses are in nats.

    position_losses      (T,) mean loss at each position: position t predicts token t+1 from t+1 tokens of context,
                         so the curve says how much of the context the model uses (Khandelwal et al. 2018)
    prefix_shuffle       the loss on the last `last` targets of each window with the tokens before them in order,
                         and with those earlier tokens shuffled (the last `last` inputs stay): a model that uses
                         word order loses when its prefix is shuffled
    honest_position_losses  (T,) each position scored with every later token cut off (the model is run on the
                         window's first t+1 tokens and only its last prediction counts): what a model whose mask
                         leaks the future really predicts. Equal to position_losses for a causal model.
    attention_stats      per layer: the attention entropy normalised by log(visible keys), and the largest
                         pre-softmax score, from one forward pass (the model's own weights and scores)
    score_gradient       the root mean square of the loss's gradient at the softmax's input (the scaled scores),
                         per prediction, over the keys a query sees in rows with at least two of them: how much
                         signal reaches the scores (a saturated softmax passes almost none; Vaswani et al. 2017
                         §3.2.1's reason for the sqrt(d_k))
    contextual_similarity   per layer: the mean cosine similarity of the same token's residual vector in
                         different windows, minus that of random pairs of (any) tokens at the same layer, so that
                         a drift every vector shares does not count (Ethayarajh 2019's self-similarity,
                         anisotropy-adjusted); layer 0 is the embedding (tokens + positions)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attention_lab.interp.capture import residual_streams
from attention_lab.interp.roles import normalised_entropy
from attention_lab.runtime.device import eval_mode
from model.hooks import hook_points, hooked, point_name


def _losses(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, T) cross-entropy of every prediction in nats, float32."""
    logits = model(x).logits.float()
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)


@torch.no_grad()
def position_losses(model, x: torch.Tensor, y: torch.Tensor, batch_size: int = 16) -> np.ndarray:
    """(T,) the loss at every position, averaged over the windows x, y (B, T)."""
    with eval_mode(model):
        rows = [_losses(model, xb, yb) for xb, yb in zip(x.split(batch_size), y.split(batch_size))]
    return torch.cat(rows).mean(0).double().cpu().numpy()


@torch.no_grad()
def honest_position_losses(model, x: torch.Tensor, y: torch.Tensor, batch_size: int = 16) -> np.ndarray:
    """(T,) the loss at every position with every later token cut off: position t is predicted by a forward pass
    over tokens 0..t alone. T forward passes per window batch; for a causal model it equals position_losses."""
    t = x.size(1)
    out = torch.zeros(t, dtype=torch.float64)
    with eval_mode(model):
        for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
            for i in range(t):
                logits = model(xb[:, : i + 1]).logits[:, -1].float()  # (b, V): the prediction at position i only
                out[i] += F.cross_entropy(logits, yb[:, i], reduction="sum").item()
    return (out / x.size(0)).numpy()


@dataclass
class ShuffleResult:
    ordered: float  # mean loss on the last `last` targets, prefix in order
    shuffled: float  # the same with the prefix's tokens shuffled
    last: int

    @property
    def jump(self) -> float:
        return self.shuffled - self.ordered


@torch.no_grad()
def prefix_shuffle(model, x: torch.Tensor, y: torch.Tensor, last: int, seed: int = 0,
                   batch_size: int = 16) -> ShuffleResult:
    """Loss on each window's last `last` targets, with the tokens before those `last` inputs in order and
    shuffled (a different random permutation per window, fixed by `seed`). The targets and the last `last`
    inputs are the same in both: only the order of the earlier context changes."""
    b, t = x.shape
    if not 0 < last < t:
        raise ValueError(f"prefix_shuffle: last must be in [1, T-1] = [1, {t - 1}], got {last}")
    cut = t - last  # inputs [0, cut) are shuffled, [cut, T) kept
    gen = torch.Generator().manual_seed(seed)
    order = torch.stack([torch.randperm(cut, generator=gen) for _ in range(b)]).to(x.device)  # (B, cut)
    shuffled = x.clone()
    shuffled[:, :cut] = torch.gather(x[:, :cut], 1, order)
    with eval_mode(model):
        def tail(inp: torch.Tensor) -> float:
            rows = [_losses(model, xb, yb)[:, cut:] for xb, yb in zip(inp.split(batch_size), y.split(batch_size))]
            return torch.cat(rows).mean().item()
        return ShuffleResult(tail(x), tail(shuffled), last)


@dataclass
class AttentionStats:
    entropy: np.ndarray  # (L,) mean over heads and query rows i >= 1 of H(row) / log(i + 1): 1 = uniform
    max_score: np.ndarray  # (L,) the largest pre-softmax score any head gives any visible key (nan: no softmax)


@torch.no_grad()
def attention_stats(model, x: torch.Tensor) -> AttentionStats:
    """Per-layer attention entropy and largest pre-softmax score over the windows x (B, T), from one forward
    pass that records each layer's hook_pattern and hook_scores (scaled, biased, -inf where masked; model/hooks.py).
    Eval mode, float32."""
    points = hook_points(model)
    n_layer = model.config.n_layer
    names = [point_name(kind, i) for i in range(n_layer) for kind in ("pattern", "scores")
             if point_name(kind, i) in points]  # linear attention has no softmax scores
    with eval_mode(model), torch.autocast(device_type=x.device.type, enabled=False), hooked(model, record=names) as seen:
        model(x)
    entropy = np.array([normalised_entropy(seen[point_name("pattern", i)].double().cpu().numpy()).mean()
                        for i in range(n_layer)])
    max_score = []
    for i in range(n_layer):
        scores = seen.get(point_name("scores", i))
        finite = scores[torch.isfinite(scores)] if scores is not None else None
        max_score.append(finite.max().item() if finite is not None and finite.numel() else float("nan"))
    return AttentionStats(entropy, np.array(max_score))


def score_gradient(model, x: torch.Tensor, y: torch.Tensor) -> float:
    """The RMS of d(loss)/d(scores) per prediction over the windows x, y (B, T): one forward and backward pass in
    eval mode and float32, the gradient read where the model hands its scores to the softmax (hook_scores). Each
    prediction's share of the mean loss is 1/(B T), so the gradient is multiplied back by B T; hidden keys (which
    get no gradient) and row 0 (one key: its weight is 1 whatever its score) are left out. The model's own
    gradients are left as they were found (none)."""
    n_layer = model.config.n_layer
    grads: list[torch.Tensor] = []

    def keep(scores: torch.Tensor) -> torch.Tensor:
        scores.register_hook(lambda g: grads.append(g.detach().float()))
        return scores

    names = {point_name("scores", i): keep for i in range(n_layer)}
    with eval_mode(model), torch.enable_grad(), torch.autocast(device_type=x.device.type, enabled=False), \
            hooked(model, edits=names):
        loss = model(x, y).loss
        loss.backward()
    model.zero_grad(set_to_none=True)
    t = x.size(1)
    seen = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
    seen[0] = False  # query 0 sees one key: nothing to share out
    g = torch.stack(grads)[..., seen] * x.numel()  # (L, B, nh, visible entries), per prediction
    return float(g.pow(2).mean().sqrt())


@dataclass
class Similarity:
    self_similarity: np.ndarray  # (L + 1,) mean cosine of the same token's vectors in different windows
    baseline: np.ndarray  # (L + 1,) mean cosine of random pairs of vectors at the same layer
    tokens: list[int]  # the frequent tokens measured
    pairs: int  # same-token pairs per layer

    @property
    def contextual(self) -> np.ndarray:
        """self_similarity - baseline: 1 - this is how much the context moves a token's vector."""
        return self.self_similarity - self.baseline


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp_min(1e-12)


@torch.no_grad()
def contextual_similarity(model, x: torch.Tensor, n_tokens: int = 20, pairs_per_token: int = 50,
                          seed: int = 0, edits=None) -> Similarity:
    """Self-similarity by layer for the `n_tokens` most frequent tokens of x (B, T) that occur in at least two
    windows: for each, `pairs_per_token` random pairs of its occurrences in different windows; the baseline is as
    many random pairs of any two positions (in different windows). Cosines of the residual vectors. `edits`: an
    intervention applied during the pass (the same pairs are drawn, so a control differs in the edit only)."""
    stream = residual_streams(model, x, edits)  # (B, L + 1, T, C)
    b, n_points, t, _ = stream.shape
    flat = _unit(stream.permute(1, 0, 2, 3).reshape(n_points, b * t, -1))  # (L + 1, B*T, C)
    ids = x.reshape(-1).cpu()
    window = torch.arange(b).repeat_interleave(t)
    gen = torch.Generator().manual_seed(seed)
    counts = torch.bincount(ids)
    chosen, left, right = [], [], []
    for tok in torch.argsort(counts, descending=True).tolist():
        where = torch.nonzero(ids == tok).flatten()
        if len(where) < 2 or len(set(window[where].tolist())) < 2:
            continue
        i = where[torch.randint(len(where), (4 * pairs_per_token,), generator=gen)]
        j = where[torch.randint(len(where), (4 * pairs_per_token,), generator=gen)]
        apart = window[i] != window[j]  # the same token in two different windows: two different contexts
        i, j = i[apart][:pairs_per_token], j[apart][:pairs_per_token]
        if len(i) == 0:
            continue
        chosen.append(tok)
        left.append(i)
        right.append(j)
        if len(chosen) == n_tokens:
            break
    if not chosen:
        raise ValueError("contextual_similarity: no token occurs in two different windows; give more windows")
    i, j = torch.cat(left), torch.cat(right)
    ri = torch.randint(b * t, (4 * len(i),), generator=gen)
    rj = torch.randint(b * t, (4 * len(i),), generator=gen)
    apart = window[ri] != window[rj]
    ri, rj = ri[apart][: len(i)], rj[apart][: len(i)]
    same = (flat[:, i] * flat[:, j]).sum(-1).mean(-1)  # (L + 1,)
    rand = (flat[:, ri] * flat[:, rj]).sum(-1).mean(-1)
    return Similarity(same.double().cpu().numpy(), rand.double().cpu().numpy(), chosen, len(i))


@torch.no_grad()
def nearest_in_context(model, x: torch.Tensor, where: tuple[int, int], k: int = 5, layer: int = -1) -> list[tuple]:
    """The k positions of x (B, T) whose residual vectors at `layer` (default: the last block's output) are
    nearest (cosine) to the vector at `where` = (window, position), excluding that position itself:
    [(window, position, token id, cosine)]. Shows what a token in one context has become."""
    stream = residual_streams(model, x)[:, layer]  # (B, T, C)
    b, t, _ = stream.shape
    flat = _unit(stream.reshape(b * t, -1))
    q = flat[where[0] * t + where[1]]
    cos = flat @ q
    cos[where[0] * t + where[1]] = -2.0
    top = torch.topk(cos, k)
    ids = x.reshape(-1)
    return [(int(n) // t, int(n) % t, int(ids[n]), float(c)) for c, n in zip(top.values, top.indices)]
