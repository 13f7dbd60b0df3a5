"""The tutorials' ideas measured on a trained model, each from the activations one forward pass recorded
(model/hooks.py): what a word looks for against what it offers, the 1/sqrt(d_k) scale and QK-norm, a word's
meaning across contexts, the mask on one query's row, the residual stream. `python -m attention_lab.ideas` is
the command over them (attention_lab/ideas/). Pure: no files, no printing.

Shapes: L n_layer, nh n_head, T tokens (at most block_size), hs head size (d_k), C n_embd, N contexts.

    S[l, h]       = q_i . k_j * scale         the scores of head h in block l, (T, T): query i, key j
    asymmetry     = S - S^T                   what i looks for in j minus what j looks for in i; 0 where k = q
    contribution  = resid_mid - resid_pre (attention), resid_post - resid_mid (MLP): what each sublayer adds
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attention_lab.interp.capture import plain_module, token_window
from attention_lab.interp.lens import LensTop, lens_of_stream
from attention_lab.runtime.device import eval_mode
from model.attention import expand_kv, split_qkv
from model.hooks import ActivationCache, residual_names, run_with_cache
from model.positions import RotaryPositions


@torch.no_grad()
def one_pass(model, idx, names=None, extra: dict | None = None) -> tuple[object, ActivationCache]:
    """idx (T,) or (B, T) token ids -> (the model's output, the cache of one forward pass), eval mode, float32.
    extra: name -> module whose output is recorded too, in the same pass (a plain forward hook), into the dict."""
    model = plain_module(model)
    idx = token_window(model, idx)[None] if torch.as_tensor(idx).dim() == 1 else torch.as_tensor(idx)
    idx = idx.to(next(model.parameters()).device)
    handles = []
    for name, module in (extra or {}).items():
        handles.append(module.register_forward_hook(
            lambda m, args, out, name=name: extra.__setitem__(name, out.detach().float())))
    try:
        with eval_mode(model), torch.autocast(device_type=idx.device.type, enabled=False):
            return run_with_cache(model, idx, names=names)
    finally:
        for h in handles:
            h.remove()


def scores_of(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """q (nh, T, hs), k (nh, T, hs) -> every score q_i . k_j * scale, (nh, T, T), the future included (no mask)."""
    return (q @ k.transpose(-2, -1)) * scale


def unrotated(model, x: Tensor) -> Tensor:
    """x (..., T, hs) queries or keys as the dot products see them (after RoPE) -> the same before RoPE (each
    position turned back by its own angle); unchanged when the model does not rotate (its positions, if any,
    are in the residual stream)."""
    pe = plain_module(model).transformer.wpe
    if not isinstance(pe, RotaryPositions):
        return x
    pos = torch.arange(x.size(-2), device=x.device)
    return pe.rotate(x, -pos)


@dataclass
class Lookup:
    """What token a looks for in token b against what b looks for in a, per head (a < b: b comes later)."""

    a: int
    b: int
    scale: float
    ab: np.ndarray  # (L, nh) q_a . k_b * scale (after positions): a's query against b's key
    ba: np.ndarray  # (L, nh) q_b . k_a * scale: b's query against a's key (the one the model computes: b sees a)
    ab_content: np.ndarray  # (L, nh) the same before RoPE (rotated back): what the words alone give
    ba_content: np.ndarray
    asymmetry: np.ndarray  # (L, nh, T, T) S - S^T after positions, the whole square (the mask ignored)
    asymmetry_content: np.ndarray  # (L, nh, T, T) before RoPE
    rope: bool  # False: the positions are in the residual stream, so before = after
    weight_ba: np.ndarray  # (L, nh) the weight query b gives key a (a real entry of the pattern)
    score_ab_masked: np.ndarray  # (L, nh) the model's own score for query a, key b: -inf (the future)
    pairs: int  # T (T - 1) / 2 distinct pairs of the text, each counted once per head below
    later_used: float  # share of the (head, pair) entries where q_later.k_earlier is the model's own score, weight > 0
    earlier_unused: float  # share where q_earlier.k_later is -inf in the model with weight exactly 0


def lookup(model, ids, a: int, b: int) -> Lookup:
    """The looks-for / offers table of tokens a < b of one text, every head, from one recorded pass."""
    model = plain_module(model)
    cfg = model.config
    idx = token_window(model, ids)
    t = idx.numel()
    if not 0 <= a < b < t:
        raise ValueError(f"the two tokens must be positions 0 <= a < b < {t}, got a={a}, b={b}")
    _, cache = one_pass(model, idx)
    q = cache.stack("q")[:, 0]  # (L, nh, T, hs)
    k = expand_kv(cache.stack("k")[:, 0], cfg.n_head)
    scale = cfg.score_scale
    s = scores_of(q, k, scale)  # (L, nh, T, T)
    qc, kc = unrotated(model, q), unrotated(model, k)
    sc = scores_of(qc, kc, scale)
    model_scores = cache.stack("scores")[:, 0]  # (L, nh, T, T): -inf on the future
    weights = cache.stack("pattern")[:, 0]
    later = torch.ones(t, t, dtype=torch.bool, device=s.device).tril(-1)  # query i later than key j: i > j
    match = torch.isclose(model_scores, s, atol=1e-4, rtol=1e-4) & (weights > 0)
    hidden = torch.isneginf(model_scores) & (weights == 0)
    later_used = float(match[..., later].float().mean())
    earlier_unused = float(hidden[..., later.T].float().mean())
    np_ = lambda x: x.cpu().numpy()  # noqa: E731
    return Lookup(a, b, scale, np_(s[..., a, b]), np_(s[..., b, a]), np_(sc[..., a, b]), np_(sc[..., b, a]),
                  np_(s - s.transpose(-1, -2)), np_(sc - sc.transpose(-1, -2)),
                  isinstance(model.transformer.wpe, RotaryPositions), np_(weights[..., b, a]),
                  np_(model_scores[..., a, b]), t * (t - 1) // 2, later_used, earlier_unused)


@dataclass
class ScaleStats:
    """The scores with and without 1/sqrt(d_k), over every (query, visible key) pair of one text, per layer."""

    d_k: int
    scale: float  # the factor the model applies (cfg.score_scale)
    qk_norm: bool
    std_scaled: np.ndarray  # (L,) spread of q.k * scale
    std_raw: np.ndarray  # (L,) spread of q.k
    max_weight_scaled: np.ndarray  # (L,) mean over queries (and heads) of the largest weight
    max_weight_raw: np.ndarray
    entropy_scaled: np.ndarray  # (L,) mean entropy of a query's weights, nats
    entropy_raw: np.ndarray
    max_abs_scaled: float  # the largest |q.k * scale| seen
    bound: float | None  # QK-norm's bound on |q.k * scale|: |q| = |k| = sqrt(d_k), so |q.k| <= d_k
    q_norm: np.ndarray  # (L,) mean |q| as the dot product sees it (sqrt(d_k) under QK-norm)
    q_norm_before: np.ndarray | None  # (L, 3) min, median, max of |q| straight out of c_attn (before QK-norm)
    pattern_error: float  # max |softmax(scaled, masked) - the model's own weights|: 0 up to rounding
    scaled_sample: np.ndarray  # every visible scaled score (for a histogram)
    raw_sample: np.ndarray


def masked_softmax_stats(s: Tensor, visible: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """s (..., T, T) scores, visible (T, T) -> (weights, the largest weight of each row, each row's entropy)."""
    w = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
    ent = -(w * torch.log(w.clamp_min(1e-30))).sum(-1)
    return w, w.max(-1).values, ent


def scale_stats(model, ids) -> ScaleStats:
    """What the 1/sqrt(d_k) scale and QK-norm do to one text's scores, from one recorded pass (module docstring).
    Row 0 (a query with one key: weight 1, entropy 0 whatever the scale) is left out of the means."""
    model = plain_module(model)
    cfg = model.config
    idx = token_window(model, ids)
    t = idx.numel()
    if t < 2:
        raise ValueError("the scale needs a text of 2 tokens or more")
    before: dict = {f"c_attn.{i}": blk.attn.c_attn for i, blk in enumerate(model.transformer.h)}
    _, cache = one_pass(model, idx, extra=before)
    q = cache.stack("q")[:, 0]  # (L, nh, T, hs)
    k = expand_kv(cache.stack("k")[:, 0], cfg.n_head)
    raw = q @ k.transpose(-2, -1)  # (L, nh, T, T)
    scaled = raw * cfg.score_scale
    visible = torch.ones(t, t, dtype=torch.bool, device=raw.device).tril()
    w_s, max_s, ent_s = masked_softmax_stats(scaled, visible)
    _, max_r, ent_r = masked_softmax_stats(raw, visible)
    pattern = cache.stack("pattern")[:, 0]
    vis = visible.expand_as(raw)
    per_layer = lambda x: x.flatten(1)  # noqa: E731
    std_s = torch.stack([scaled[i][vis[i]].std() for i in range(cfg.n_layer)])
    std_r = torch.stack([raw[i][vis[i]].std() for i in range(cfg.n_layer)])
    q_before = None
    if cfg.qk_norm:
        rows = []
        for i in range(cfg.n_layer):
            qb, _, _ = split_qkv(before[f"c_attn.{i}"], cfg.n_head, cfg.kv_heads, cfg.qk_tied)  # (1, nh, T, hs)
            norms = qb.norm(dim=-1).flatten()
            rows.append([norms.min(), norms.median(), norms.max()])
        q_before = torch.tensor(rows).numpy()
    return ScaleStats(
        d_k=cfg.head_size, scale=cfg.score_scale, qk_norm=cfg.qk_norm,
        std_scaled=std_s.numpy(), std_raw=std_r.numpy(),
        max_weight_scaled=per_layer(max_s[..., 1:]).mean(1).numpy(), max_weight_raw=per_layer(max_r[..., 1:]).mean(1).numpy(),
        entropy_scaled=per_layer(ent_s[..., 1:]).mean(1).numpy(), entropy_raw=per_layer(ent_r[..., 1:]).mean(1).numpy(),
        max_abs_scaled=float(scaled[vis].abs().max()),
        bound=cfg.head_size * cfg.score_scale if cfg.qk_norm else None,
        q_norm=q.norm(dim=-1).flatten(1).mean(1).numpy(), q_norm_before=q_before,
        pattern_error=float((w_s - pattern).abs().max()),
        scaled_sample=scaled[vis].numpy(), raw_sample=raw[vis].numpy(),
    )


@dataclass
class MaskRow:
    """One query's row of one head: its scores (-inf on the future) and its weights (exactly 0 there), beside the
    two ways of getting the mask wrong with a 0: the future's weights set to 0 after a softmax over every key
    (tutorial 4 warns against it), and the future's scores set to 0 before the softmax."""

    layer: int
    head: int
    query: int
    scores: np.ndarray  # (T,) softmax's input as the model computed it
    weights: np.ndarray  # (T,)
    scores_all: np.ndarray  # (T, T) the head's whole score matrix (for the picture)
    weights_zero: np.ndarray  # (T,) the weights had the future's scores been 0 instead of -inf
    scores_open: np.ndarray  # (T,) q . k_j * scale for every key, the future's too (the recorded q and k, no mask)
    weights_after: np.ndarray  # (T,) softmax over every key, then the future's weights set to 0 (after the softmax)
    after_sum: float  # what the row of weights_after sums to: the visible keys' share of e^s, below 1
    after_grad: np.ndarray  # (T,) d(after_sum) / d(score of key j): how the sum moves with each key's score,
    #                         negative on the future (a future key's e^s sits in the denominator)


def mask_row(model, ids, layer: int, head: int, query: int | None = None) -> MaskRow:
    """The row of `query` (default: the middle token) in head `head` of block `layer`, read from the recorded
    scores and weights (hook_scores, hook_pattern) and, for the future keys' own scores, the recorded queries
    and keys (hook_q, hook_k: what the dot products saw, after QK-norm and RoPE)."""
    model = plain_module(model)
    cfg = model.config
    idx = token_window(model, ids)
    t = idx.numel()
    query = t // 2 if query is None else query
    if not 0 <= layer < cfg.n_layer or not 0 <= head < cfg.n_head:
        raise ValueError(f"--layer must be in 0..{cfg.n_layer - 1} and --head in 0..{cfg.n_head - 1}, got "
                         f"{layer}, {head}")
    if not 0 <= query < t:
        raise ValueError(f"the query must be a position in 0..{t - 1}, got {query}")
    names = [f"h.{layer}.attn.hook_{kind}" for kind in ("scores", "pattern", "q", "k")]
    _, cache = one_pass(model, idx, names=names)
    s = cache["scores", layer][0, head]  # (T, T)
    w = cache["pattern", layer][0, head]
    q = cache["q", layer][0, head]  # (T, hs)
    k = expand_kv(cache["k", layer], cfg.n_head)[0, head]  # (T, hs)
    open_row = scores_of(q[None], k[None], cfg.score_scale)[0, query]  # (T,)
    after, grad = zero_after_softmax(open_row, query)
    return MaskRow(layer, head, query, s[query].numpy(), w[query].numpy(), s.numpy(),
                   zero_instead_of_inf(s[query], query).numpy(), open_row.numpy(), after.numpy(),
                   float(after.sum()), grad.numpy())


def zero_after_softmax(scores: Tensor, query: int) -> tuple[Tensor, Tensor]:
    """A row's scores for every key (T,), the future's included -> (the weights when the softmax runs over every
    key and the future's weights are then set to 0; d(their sum) / d(each score)).

    The sum is S = sum_{j <= query} e^(s_j) / sum_j e^(s_j): below 1, and every visible weight is the -inf mask's
    weight times S. The future keys are still in the denominator, so their scores move the row:
    dS/ds_j = -S w_j for a future key j (w_j its softmax weight before zeroing), -S (1 - S) over all of them."""
    with torch.enable_grad():  # a caller under no_grad still gets the derivative
        s = scores.detach().double().requires_grad_(True)
        w = torch.softmax(s, dim=-1)
        kept = torch.cat([w[: query + 1], torch.zeros_like(w[query + 1:])])
        (grad,) = torch.autograd.grad(kept.sum(), s)
    return kept.detach().float(), grad.float()


def zero_instead_of_inf(scores: Tensor, query: int) -> Tensor:
    """A row's scores (T,) as the model computed them (-inf after `query`) -> the weights softmax gives when the
    future keys' scores are set to 0 instead: e^0 = 1 each, so each future key takes 1 / sum_j e^(s_j) of the row."""
    zeroed = scores.clone()
    zeroed[query + 1:] = 0.0
    return torch.softmax(zeroed, dim=-1)


@dataclass
class Residual:
    """The residual stream of one text through the blocks, and what the logit lens reads off it."""

    stream_norm: np.ndarray  # (L + 1,) mean |stream| entering each block and leaving the last
    embed_norm: float  # mean |embedding|
    attn_norm: np.ndarray  # (L,) mean |what block l's attention adds|
    mlp_norm: np.ndarray  # (L,) mean |what block l's MLP adds|
    lens: LensTop  # (L + 1, T, k) top predictions after the embeddings and after each block
    final_error: float  # max |embedding + every contribution - the last stream|: 0 up to rounding


def residual(model, ids, k: int = 3) -> Residual:
    """Norms of each sublayer's contribution and the logit lens, from one recorded pass."""
    model = plain_module(model)
    n = model.config.n_layer
    names = residual_names(n) + [f"h.{i}.hook_resid_mid" for i in range(n)] + [f"h.{i}.hook_resid_post"
                                                                              for i in range(n)]
    _, cache = one_pass(model, token_window(model, ids), names=list(dict.fromkeys(names)))
    pre, mid, post = cache.stack("resid_pre")[:, 0], cache.stack("resid_mid")[:, 0], cache.stack("resid_post")[:, 0]
    stream = cache.residual_stream()[:, 0]  # (L + 1, T, C)
    attn, mlp = mid - pre, post - mid  # (L, T, C)
    total = pre[0] + attn.sum(0) + mlp.sum(0)
    mean_norm = lambda x: x.norm(dim=-1).mean(-1).numpy()  # noqa: E731
    return Residual(mean_norm(stream), float(pre[0].norm(dim=-1).mean()), mean_norm(attn), mean_norm(mlp),
                    lens_of_stream(model, stream, k), float((total - stream[-1]).abs().max()))


@dataclass
class ShuffleTest:
    """Block `layer`'s attention at the last token (the query) of one text, the earlier tokens shuffled, with
    the model's positions and with none: without positions attention reads its keys as a set."""

    layer: int
    encoding: str  # the model's positions (cfg.pos_encoding)
    orders: np.ndarray  # (P, T - 1) each shuffle of the earlier tokens (the query stays last)
    change_off: np.ndarray  # (P,) |y(shuffled) - y(text)| at the query (vector length), positions switched off
    change_on: np.ndarray  # (P,) the same with the model's positions
    size: float  # |y(text)| at the query, with positions (the scale of the changes)
    own_error: float  # max |this y - the model's own attention output (resid_mid - resid_pre)|, positions on


def shuffle_test(model, ids, shuffles: int = 5, seed: int = 0) -> ShuffleTest:
    """The trained block 0 attention run twice per shuffle of the tokens before the last: with the model's
    positions and with them switched off (no embedding, no rotation, no bias). The inputs are the token
    embeddings, so only the order of the earlier tokens changes; the causal mask lets the last query see every
    one of them, so without positions its output must not change (a weighted sum over a set)."""
    from model.positions import PositionalEncoding

    model = plain_module(model)
    cfg = model.config
    idx = token_window(model, ids)
    t = idx.numel()
    if t < 3:
        raise ValueError("a shuffle needs 3 tokens or more (two earlier tokens to swap, and the query)")
    block, pe, off = model.transformer.h[0], model.transformer.wpe, PositionalEncoding()
    pos = torch.arange(t, device=idx.device)

    @torch.no_grad()
    def query_output(order: Tensor, positions: bool) -> Tensor:
        enc = pe if positions else off
        x = model.transformer.wte(order[None])  # (1, T, C)
        emb = enc.embed(pos)
        if emb is not None:
            x = x + emb
        y, _, _ = block.attn(block.ln_1(x), enc, enc.rotation(pos), pos)
        return y[0, -1]  # (C,)

    rng = np.random.default_rng(seed)
    orders, off_, on_ = [], [], []
    with eval_mode(model), torch.autocast(device_type=idx.device.type, enabled=False):
        base_on, base_off = query_output(idx, True), query_output(idx, False)
        for _ in range(shuffles):
            perm = rng.permutation(t - 1)
            while t > 2 and (perm == np.arange(t - 1)).all():
                perm = rng.permutation(t - 1)
            order = torch.cat([idx[:-1][torch.as_tensor(perm, device=idx.device)], idx[-1:]])
            orders.append(perm)
            off_.append(float((query_output(order, False) - base_off).norm()))
            on_.append(float((query_output(order, True) - base_on).norm()))
        _, cache = one_pass(model, idx, names=["h.0.hook_resid_pre", "h.0.hook_resid_mid"])
    own = (cache["resid_mid", 0] - cache["resid_pre", 0])[0, -1]
    return ShuffleTest(0, cfg.pos_encoding, np.array(orders), np.array(off_), np.array(on_),
                       float(base_on.norm()), float((own - base_on).abs().max()))


def lstm_behind(transformer: np.ndarray, lstm: np.ndarray, margin: float = 0.5) -> tuple[bool, np.ndarray]:
    """Two losses by position (T,) -> (whether the LSTM is too undertrained to compare: its loss above the
    transformer's by more than `margin` nats in every bucket of position_buckets; the gap per bucket). A fair
    race (the rnn claim, equal steps) leaves gaps of 0.06 to 0.17 nats; a gap of half a nat at the first
    position, where neither model has context to use, means the LSTM has not learnt the tokens' frequencies yet."""
    _, gpt = position_buckets(transformer)
    _, rnn = position_buckets(lstm)
    gap = rnn - gpt
    return bool((gap > margin).all()), gap


# --- a word's meaning across contexts ---------------------------------------------------------------------------


def word_contexts(tokens: np.ndarray, word: int, width: int, n: int, stop: int | None = None,
                  continues: set[int] | frozenset = frozenset()) -> np.ndarray:
    """Positions p where tokens[p] == word, with `width` tokens ending at p (the word last) that hold no `stop`
    token (a document boundary) and where tokens[p + 1] is not in `continues` (the word goes on: " will" +
    "ing"); n of them, evenly spread over the text. -> (<= n,) int64 end positions."""
    tokens = np.asarray(tokens)
    at = np.flatnonzero(tokens == word)
    at = at[(at >= width - 1) & (at + 1 < len(tokens))]
    if continues:
        at = at[~np.isin(tokens[at + 1], list(continues))]
    if stop is not None and len(at):
        boundary = np.concatenate([[0], np.cumsum(tokens == stop)])  # boundaries before each index
        at = at[boundary[at + 1] - boundary[at + 1 - width] == 0]
    if len(at) > n:
        at = at[np.linspace(0, len(at) - 1, n).round().astype(np.int64)]
    return at


def windows_ending_at(tokens: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """(N, width) int64: the `width` tokens ending at each position of ends."""
    tokens = np.asarray(tokens)
    return np.stack([tokens[e - width + 1 : e + 1] for e in ends]).astype(np.int64)


def last_token_vectors(model, windows: np.ndarray) -> np.ndarray:
    """(N, W) token windows -> (L + 1, N, C): the residual stream at each window's last token after the
    embeddings and after every block, from one batched pass."""
    model = plain_module(model)
    x = torch.as_tensor(windows, dtype=torch.long, device=next(model.parameters()).device)
    _, cache = one_pass(model, x, names=residual_names(model.config.n_layer))
    return cache.residual_stream()[:, :, -1].cpu().numpy()


def cosine_matrix(v: np.ndarray) -> np.ndarray:
    """(N, C) -> (N, N) cosine similarity of every pair."""
    u = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
    return u @ u.T


def mean_pair_cosine(vectors: np.ndarray) -> np.ndarray:
    """(L + 1, N, C) -> (L + 1,) the mean cosine over the N (N - 1) / 2 distinct pairs, at each layer."""
    n = vectors.shape[1]
    if n < 2:
        raise ValueError("a mean over pairs needs two vectors or more")
    iu = np.triu_indices(n, k=1)
    return np.array([cosine_matrix(v)[iu].mean() for v in vectors])


def nearest_pairs(v: np.ndarray, k: int = 3) -> list[tuple[int, int, float]]:
    """(N, C) -> the k most alike distinct pairs (i, j, cosine), most alike first."""
    c = cosine_matrix(v)
    pairs = [(i, j, float(c[i, j])) for i, j in itertools.combinations(range(len(v)), 2)]
    return sorted(pairs, key=lambda p: -p[2])[:k]


# --- the schedule and speed ---------------------------------------------------------------------------------------


def tokens_per_second(model, x: Tensor, y: Tensor, repeats: int = 3) -> float:
    """Forward and backward of x, y (B, T) `repeats` times after one warm-up -> tokens a second (training
    mode, float32, gradients thrown away). A measurement on the spot: it depends on the machine and what else
    runs there."""
    import time

    model = plain_module(model)
    was = model.training
    model.train()
    try:
        for i in range(repeats + 1):
            if i == 1:
                start = time.perf_counter()
            model(x, y).loss.backward()
            model.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
    finally:
        model.train(was)
    return repeats * x.numel() / seconds



def position_buckets(curve: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A loss by position (T,) (position p + 1 at index p) -> (the last position of each bucket 1, 2, 3-4, 5-8,
    ..., up to T; each bucket's mean): one number per doubling, steadier than any single position."""
    curve = np.asarray(curve, dtype=np.float64)
    ends, means, start = [], [], 0
    end = 1
    while start < len(curve):
        end = min(end, len(curve))
        ends.append(end)
        means.append(curve[start:end].mean())
        start, end = end, 2 * end
    return np.array(ends), np.array(means)
