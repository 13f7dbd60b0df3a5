"""Inside one head: the attention of one head for one query position, recomputed step by step from the model's
own weights, the way the tutorials write it out, and the residual stream it reads. Pure: no files, no printing.

Legend
    T  tokens in the (cropped) sequence, at most block_size;  i the query position, 0 <= i < T;  n = i + 1 keys
    C  n_embd;  nh n_head;  nkv key/value heads;  hs = C // nh the head size;  L n_layer;  V vocab_size
    c_attn.weight ((nh + 2 nkv) hs, C): rows [q: nh heads | k: nkv heads | v: nkv heads], hs rows a head;
               query head h reads key/value head h // (nh / nkv) (grouped-query; nkv = nh: its own)
               qk_tied: rows [q: nh heads | v: nh heads], and W_K, b_K are W_Q, b_Q (k = q)
    c_proj.weight (C, C):  head h owns its input channels, the columns h*hs..(h+1)*hs (W_O, (C, hs))

The steps, for head h of block l and query i, every vector a row (y = x W^T + b, as nn.Linear):

    x          the residual stream entering block l at positions 0..i                           (n, C)
    x_ln     = ln_1(x) = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta                       (n, C)
    q_j      = x_ln[j] W_Q^T + b_Q,  k_j = x_ln[j] W_K^T + b_K,  v_j = x_ln[j] W_V^T + b_V      (hs,) each
    uniform attention: q_j = 0 (the model zeroes it), so every dot is 0 and the weights are 1 / (keys seen)
    qk_norm:   q <- q / sqrt(mean(q^2) + eps), k likewise (parameter-free RMS norm over hs)
    rope:      q_i <- R(i) q_i,  k_j <- R(j) k_j      (R(p) turns channel pair (c, c + hs/2) by p * theta_c)
    value_residual, block l > 0:  v_j <- lambda v_j + (1 - lambda) v_first_j    (v_first: block 0's v_j)
    dots_j   = q_i . k_j;   scaled_j = dots_j / sqrt(hs);   alibi: + m_h (j - i)                     (n,)
               attn_scale: dots_j * 1 ("none") or dots_j / hs ("inverse") instead (GPTConfig.score_scale)
    masked   = that row over all T keys, -inf where the query may not look (j > i; window W: j <= i - W) (T,)
               attend_self=False: -inf at j = i too, unless i is the only key the query sees
    weights  = softmax(masked) = exp(masked - max) / sum(exp(masked - max))   (exactly 0 where -inf) (T,)
               sinks: exp(masked - m) / (exp(s_h - m) + sum exp(masked - m)), m = max(row, s_h)
    linear attention: dots_j = phi(q_i) . phi(k_j) with phi = elu + 1, no scaling; weights the implied
               normalised dots_j / sum_j' dots_j'; head_out = weights @ v (without the denominator: dots @ v),
               RMS-normalised with linear_out_norm
    head_out = sum_j weights_j v_j                                                                 (hs,)
    share_h  = head_out W_O^T = head_out c_proj.weight[:, h*hs:(h+1)*hs]^T                          (C,)
    attn_out = sum_h share_h + c_proj.bias     = what the block's attention adds at position i      (C,)

x, q, k and v are the model's own, recorded by one forward pass at its hook points (model/hooks.py); q_proj, x_ln
and the other intermediate steps before them come from the block's own ln_1, c_attn and qk_norm applied to the
recorded x: nothing of the model is written twice. What follows q, k and v for one query (dots, scale, bias,
mask, softmax, weighted sum, the head's share) is the arithmetic the page shows, in float64 numpy, so any
difference from the model is the model's float32 rounding (~1e-7). A model whose positions see later keys
(causal_mask "after_softmax" or "none") is refused: its rows need every key of the sequence, not keys 0..i
(`steppable` says why; the page leaves its panel out). The page's panel also leaves out a model that hides each
query's own key (attend_self=False), which its script does not know; step_inside shows that one. What varies with the attention kind
(which key/value head a query head reads, which keys a query sees, what joins the softmax) lives in one
section below, "the attention kind".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attention_lab.interp.capture import plain_module, residual_streams, token_window
from attention_lab.runtime.device import eval_mode
from model.attention import expand_kv, qk_norm, split_qkv
from model.hooks import ActivationCache, point_name, run_with_cache


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


# ------------------------------------------------------------------------------------------------------------
# the attention kind: the one place that knows how heads share keys and values, which keys a query sees, and
# what the softmax normalises over. Grouped-query attention, sliding windows and sink logits change these.


@dataclass(frozen=True)
class HeadWeights:
    """One head's slices of its block's attention weights, float32 tensors on the model's device.

    Each map is a row map y = x W^T + b, as nn.Linear; biases are zeros when the model has none.
    """

    W_Q: Tensor  # (hs, C)
    b_Q: Tensor  # (hs,)
    W_K: Tensor  # (hs, C) of the key/value head this query head reads
    b_K: Tensor  # (hs,)
    W_V: Tensor  # (hs, C)
    b_V: Tensor  # (hs,)
    W_O: Tensor  # (C, hs): c_proj's input channels that carry this head's output


def _not_causal(cfg) -> str | None:
    """Why step_inside cannot show this model (None: it can). The steps see keys 0..i only, so a model whose
    positions see later keys (causal_mask after_softmax or none) is left out rather than shown wrong."""
    if cfg.causal_mask != "before_softmax":
        return (f"step inside shows causal attention (keys 0..i); this model has causal_mask={cfg.causal_mask!r}, "
                "whose rows reach later keys: read its weights from capture_attention instead")
    return None


def steppable(cfg) -> str | None:
    """Why the page's step-inside panel cannot show this model (None: it can): step_inside's reason, or a query
    that never sees its own key (attend_self=False), which the panel's script (viewer/assets/inside.js) does not
    hide. Uniform attention needs nothing: its recorded q is 0, so the panel's dot products are 0 as the model's."""
    if _not_causal(cfg) is not None:
        return _not_causal(cfg)
    if not getattr(cfg, "attend_self", True):
        return ("the page's step inside shows every key 0..i; this model hides each query's own key "
                "(attend_self=false): call attention_lab.interp.inside.step_inside, or read its weights from "
                "capture_attention")
    return None


def _check_head(cfg, layer: int, head: int) -> None:
    if not 0 <= layer < cfg.n_layer:
        raise ValueError(f"layer must be in 0..{cfg.n_layer - 1}, got {layer}")
    if not 0 <= head < cfg.n_head:
        raise ValueError(f"head must be in 0..{cfg.n_head - 1}, got {head}")


def head_weights(model, layer: int, head: int) -> HeadWeights:
    """Query head `head` of block `layer`: its rows of c_attn (q; k and v of the key/value head it reads) and its
    columns of c_proj. Multi-head attention: key/value head = query head."""
    model = plain_module(model)
    cfg = model.config
    _check_head(cfg, layer, head)
    attn = model.transformer.h[layer].attn
    hs, nh, nkv = cfg.head_size, cfg.n_head, cfg.kv_heads
    w = attn.c_attn.weight.detach()  # ((nh + 2 nkv) hs, C); ((nh + nkv) hs, C) with qk_tied
    b = attn.c_attn.bias.detach() if attn.c_attn.bias is not None else w.new_zeros(w.size(0))
    # where the q, k and v rows begin; qk_tied: rows [q | v], and the keys are the queries
    starts = dict(q=0, k=0, v=nh * hs) if cfg.qk_tied else dict(q=0, k=nh * hs, v=(nh + nkv) * hs)

    def rows(part: str, h: int) -> slice:
        return slice(starts[part] + h * hs, starts[part] + (h + 1) * hs)

    kv = head // (nh // nkv)  # grouped-query attention: contiguous groups of query heads share a kv head
    return HeadWeights(
        W_Q=w[rows("q", head)], b_Q=b[rows("q", head)],
        W_K=w[rows("k", kv)], b_K=b[rows("k", kv)],
        W_V=w[rows("v", kv)], b_V=b[rows("v", kv)],
        W_O=attn.c_proj.weight.detach()[:, head * hs : (head + 1) * hs],
    )


def _scores_row(scaled: np.ndarray, bias: np.ndarray, query: int, t: int, window: int | None,
                attend_self: bool = True) -> np.ndarray:
    """The pre-softmax row of query i over all T keys: scaled + bias (n,) where the query may look, -inf elsewhere.

    Causal: keys j <= i; a sliding window of W keys also hides j <= i - W; attend_self=False hides j = i unless
    it is the only key left (i = 0, or W = 1: Reformer's "except when no other targets are available").
    """
    row = np.full(t, -np.inf)
    row[: query + 1] = scaled + bias
    if window is not None:
        row[: max(0, query - window + 1)] = -np.inf
    if not attend_self and np.isfinite(np.delete(row, query)).any():
        row[query] = -np.inf
    return row


def _weights(masked: np.ndarray, sink: float | None) -> np.ndarray:
    """softmax over the row (T,): exp(s_j - m) / sum_j' exp(s_j' - m); exp(-inf) = 0 for hidden keys. A sink
    logit s joins the denominator only: exp(s - m) is added to it (so the weights may sum to less than 1).

    Subtracting m = the max (of the row and the sink) changes nothing mathematically and keeps exp from overflowing.
    """
    m = masked.max() if sink is None else max(masked.max(), sink)
    e = np.exp(masked - m)
    return e / (e.sum() + (0.0 if sink is None else math.exp(sink - m)))


# ------------------------------------------------------------------------------------------------------------
# the activations: what one recorded forward pass holds (model/hooks.py)


@torch.no_grad()
def residual_stream(model, ids) -> Tensor:
    """The residual stream of one sequence: float32 (L + 1, T, C) on the model's device.

    Row l < L enters block l (row 0: token + position embeddings); row L leaves the last block, ln_f's input.
    Recorded at the model's hook points during one ordinary forward pass, so it is the model's own stream whatever
    its blocks do. ids: a list or 1-D tensor, cropped to the last block_size tokens. Eval mode, float32.
    """
    model = plain_module(model)
    return residual_streams(model, token_window(model, ids)[None])[0]


@torch.no_grad()
def _recorded(model, idx: Tensor, names: list[str]) -> ActivationCache:
    """One forward pass of idx (T,) recording `names`: eval mode, float32."""
    with eval_mode(model), torch.autocast(device_type=idx.device.type, enabled=False):
        return run_with_cache(model, idx[None], names=names)[1]


# ------------------------------------------------------------------------------------------------------------
# one head, step by step


@dataclass
class Inside:
    """Every intermediate of head `head` in block `layer` at query position i = `query` (float64 numpy).

    n = i + 1 keys (positions 0..i), T tokens, C n_embd, hs head size, nh n_head. Where an option is off, the
    array after its step equals the one before (q_normed is q_proj without qk_norm; q is q_normed without rope).
    """

    layer: int
    head: int
    query: int  # i, in 0..T-1 of the cropped sequence
    ids: np.ndarray  # (T,) int64 the token ids, cropped to the last block_size
    x: np.ndarray  # (n, C) the residual stream entering the block, positions 0..i
    x_ln: np.ndarray  # (n, C) ln_1(x)
    q_proj: np.ndarray  # (hs,) q_i straight from c_attn
    k_proj: np.ndarray  # (n, hs) k_j straight from c_attn
    q_normed: np.ndarray  # (hs,) after QK-norm
    k_normed: np.ndarray  # (n, hs)
    q: np.ndarray  # (hs,) after RoPE: the query the dot products see
    k: np.ndarray  # (n, hs) the keys the dot products see
    v_own: np.ndarray  # (n, hs) this block's values, straight from c_attn
    v_first: np.ndarray | None  # (n, hs) block 0's values (value_residual in a block > 0), else None
    value_lambda: float | None  # the block's learned mix (value_residual in a block > 0), else None
    v: np.ndarray  # (n, hs) the values the weights average: lambda v_own + (1 - lambda) v_first, or v_own
    dots: np.ndarray  # (n,) q_i . k_j
    scaled: np.ndarray  # (n,) dots * GPTConfig.score_scale (1/sqrt(hs) by default)
    bias: np.ndarray  # (n,) the ALiBi bias m_h (j - i); zeros for the other encodings
    masked: np.ndarray  # (T,) the pre-softmax row over all T keys: scaled + bias, -inf for j > i
    weights: np.ndarray  # (T,) softmax(masked); 0 for j > i
    head_out: np.ndarray  # (hs,) sum_j weights_j v_j
    share: np.ndarray  # (C,) head_out W_O^T: this head's part of the attention output
    shares: np.ndarray  # (nh, C) every head's share at this query (row `head` is `share`)
    proj_bias: np.ndarray  # (C,) c_proj's bias (zeros without biases)
    attn_out: np.ndarray  # (C,) shares.sum(0) + proj_bias: the attention block's output at position i


def rms_norm(x: np.ndarray) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the head channels (linear_out_norm on a head's output). eps is F.rms_norm's
    default, the machine epsilon of the model's float32."""
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + np.finfo(np.float32).eps)


def _alibi_row(pe, head: int, query: int, device: torch.device) -> np.ndarray:
    """(n,) the score bias of query i over keys 0..i (ALiBi: m_h (j - i)); zeros for the other encodings."""
    keys = torch.arange(query + 1, device=device)
    bias = pe.score_bias(keys[query:], keys) if pe.has_score_bias else None  # (nh, 1, n)
    return np.zeros(query + 1) if bias is None else _np(bias[head, 0])


def _projections(model, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """ln_1(x) (n, C) and q, k, v straight from c_attn for the stream x (n, C) entering block `layer`: the block's
    own ln_1, c_attn and head split, (nh, n, hs), (nkv, n, hs), (nkv, n, hs). What the cache's q, k, v were before
    QK-norm, RoPE and the value mix."""
    cfg, attn = model.config, model.transformer.h[layer].attn
    x_ln = model.transformer.h[layer].ln_1(x)
    q, k, v = split_qkv(attn.c_attn(x_ln)[None], cfg.n_head, cfg.kv_heads, cfg.qk_tied)
    if cfg.attention == "uniform":  # the model zeroes q: every score 0 (model/attention.py)
        q = torch.zeros_like(q)
    return x_ln, q[0], k[0], v[0]


def _head_steps(model, layer: int, head: int, vec: dict, query: int, t: int) -> dict:
    """Every step of one head at query i from its q, k, v (float64, positions 0..i), as a dict of Inside's
    fields from q_proj on: the per-query arithmetic, nothing the model computed already."""
    cfg, device = model.config, next(model.parameters()).device
    attn = model.transformer.h[layer].attn
    kv = head // (cfg.n_head // cfg.kv_heads)  # grouped-query attention: the key/value head this head reads
    w = head_weights(model, layer, head)
    v_first = vec["v_first"][kv] if vec["v_first"] is not None else None
    fields = dict(q_proj=vec["q_proj"][head, query], k_proj=vec["k_proj"][kv], q_normed=vec["q_normed"][head, query],
                  k_normed=vec["k_normed"][kv], q=vec["q"][head, query], k=vec["k"][kv], v_own=vec["v_own"][kv],
                  v_first=v_first, value_lambda=vec["lam"], v=vec["v"][kv])
    q, k, v = fields["q"], fields["k"], fields["v"]
    if cfg.attention == "linear":
        return fields | _linear_steps(cfg, q, k, v, query, t, w)
    dots = k @ q  # (n,)
    scaled = dots * cfg.score_scale  # dots / sqrt(hs), unless attn_scale says otherwise
    bias = _alibi_row(model.transformer.wpe, head, query, device)
    masked = _scores_row(scaled, bias, query, t, cfg.layer_window(layer), cfg.attend_self)  # (T,)
    sink = float(attn.sink[head]) if getattr(attn, "sink", None) is not None else None
    weights = _weights(masked, sink)  # (T,)
    head_out = weights[: query + 1] @ v  # (hs,); the hidden keys' weights are 0
    return fields | dict(dots=dots, scaled=scaled, bias=bias, masked=masked, weights=weights, head_out=head_out,
                         share=head_out @ _np(w.W_O).T)


def _phi(x: np.ndarray) -> np.ndarray:
    """Linear attention's feature map, elu(x) + 1 (> 0)."""
    return np.where(x > 0, x + 1.0, np.exp(x))


def _linear_steps(cfg, q: np.ndarray, k: np.ndarray, v: np.ndarray, query: int, t: int, w: HeadWeights) -> dict:
    """Linear attention's steps (model/linear_attention.py): feature dot products instead of softmax scores."""
    dots = _phi(k) @ _phi(q)  # (n,) phi(q_i) . phi(k_j) > 0
    masked = np.full(t, -np.inf)
    masked[: query + 1] = dots
    weights = np.zeros(t)
    weights[: query + 1] = dots / max(dots.sum(), 1e-6)  # the implied normalised weights the maps show
    head_out = weights[: query + 1] @ v if cfg.linear_denominator else dots @ v
    if cfg.linear_out_norm:
        head_out = rms_norm(head_out)
    return dict(dots=dots, scaled=dots, bias=np.zeros(query + 1), masked=masked, weights=weights,
                head_out=head_out, share=head_out @ _np(w.W_O).T)


@torch.no_grad()
def head_vectors(model, ids) -> np.ndarray:
    """q, k, v of every head at every position, as its dot products and weighted sum see them (after QK-norm,
    RoPE and the value mix; a grouped-query kv head repeated for each query head it serves): float64
    (3, L, nh, T, hs), read from one recorded forward pass. What the page's "step inside" panel computes with."""
    model = plain_module(model)
    cfg = model.config
    idx = token_window(model, ids)
    cache = _recorded(model, idx, [point_name(kind, layer) for layer in range(cfg.n_layer) for kind in "qkv"])
    q, k, v = (cache.stack(kind)[:, 0] for kind in "qkv")  # (L, nh | nkv, T, hs)
    return _np(torch.stack([q, expand_kv(k, cfg.n_head), expand_kv(v, cfg.n_head)]))


def head_shares(model, weights: np.ndarray, qkv: np.ndarray) -> np.ndarray:
    """What every head adds to the residual stream at every position: head_out W_O^T, float64 (L, nh, T, C), from
    the attention weights (L, nh, T, T) and head_vectors' q, k, v (3, L, nh, T, hs).

    head_out_i = sum_j w_ij v_j, as in step_inside; linear attention as _linear_steps: without its denominator
    the raw phi(q_i) . phi(k_j) weigh the values (the normalised weights the maps show would divide the output by
    their sum), and linear_out_norm RMS-normalises head_out.
    """
    model = plain_module(model)
    cfg = model.config
    q, k, v = qkv
    raw = cfg.attention == "linear" and not cfg.linear_denominator
    out = np.zeros((cfg.n_layer, cfg.n_head, v.shape[2], cfg.n_embd))
    for layer in range(cfg.n_layer):
        for head in range(cfg.n_head):
            w_o = _np(head_weights(model, layer, head).W_O)  # (C, hs)
            w = (np.tril(_phi(q[layer, head]) @ _phi(k[layer, head]).T) if raw
                 else np.asarray(weights[layer, head], dtype=np.float64))  # (T, T)
            head_out = w @ v[layer, head]  # (T, hs)
            if cfg.attention == "linear" and cfg.linear_out_norm:
                head_out = rms_norm(head_out)
            out[layer, head] = head_out @ w_o.T
    return out


@torch.no_grad()
def step_inside(model, ids, layer: int, head: int, query: int) -> Inside:
    """The attention computation of head `head` in block `layer` for query position `query`, step by step.

    ids: token ids, a list or 1-D tensor, cropped to the last block_size; query indexes the cropped sequence
    (negative counts from the end). The stream, q, k and v come from one recorded forward pass of the model
    (eval mode, float32, no autocast); what the tutorials write out for one query (the dot products, scaling,
    mask, softmax, weighted sum and the head's share) is computed here (module docstring).
    """
    model = plain_module(model)
    cfg = model.config
    if _not_causal(cfg) is not None:
        raise ValueError(_not_causal(cfg))
    _check_head(cfg, layer, head)
    idx = token_window(model, ids)
    t = idx.numel()
    if not -t <= query < t:
        raise ValueError(f"query must index the {t} tokens given (0..{t - 1}, or negative from the end), got {query}")
    i = query % t
    blocks = model.transformer.h
    cache = _recorded(model, idx, [point_name(kind, layer) for kind in ("resid_pre", "q", "k", "v")]
                      + [point_name("resid_pre", 0)])
    x = cache["resid_pre", layer][0, : i + 1]  # (n, C)
    x_ln, q_proj, k_proj, v_own = _projections(model, layer, x)  # causal: positions 0..i need nothing after i
    q_normed, k_normed = (qk_norm(q_proj), qk_norm(k_proj)) if cfg.qk_norm else (q_proj, k_proj)
    attn = blocks[layer].attn
    v_first = _projections(model, 0, cache["resid_pre", 0][0, : i + 1])[3] if attn.value_lambda is not None else None
    vec = dict(q_proj=_np(q_proj), k_proj=_np(k_proj), q_normed=_np(q_normed), k_normed=_np(k_normed),
               q=_np(cache["q", layer][0, :, : i + 1]), k=_np(cache["k", layer][0, :, : i + 1]),
               v=_np(cache["v", layer][0, :, : i + 1]), v_own=_np(v_own),
               v_first=_np(v_first) if v_first is not None else None,
               lam=float(attn.value_lambda) if attn.value_lambda is not None else None)
    steps = [_head_steps(model, layer, h, vec, i, t) for h in range(cfg.n_head)]
    shares = np.stack([s["share"] for s in steps])  # (nh, C)
    proj = attn.c_proj
    proj_bias = _np(proj.bias) if proj.bias is not None else np.zeros(cfg.n_embd)
    return Inside(layer=layer, head=head, query=i, ids=idx.cpu().numpy(), x=_np(x),
                  x_ln=_np(x_ln), **steps[head], shares=shares, proj_bias=proj_bias,
                  attn_out=shares.sum(0) + proj_bias)
