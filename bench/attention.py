"""The quadratic wall, measured: one attention call as the context grows, and the variants that answer it.

Three tables:
  attention   one attention call (batch 1, the baby model's 6 heads of 64), T = 256 ... 16,384, forward and
              forward + backward, per method:
                explicit       model.attention.math_attention: the (nh, T, T) scores and weights in memory; it stops
                               where its predicted memory passes MEMORY_BUDGET (the prediction is printed: the wall)
                sdpa causal    torch's fused kernel, is_causal
                sdpa + window  sdpa with a dense sliding-window mask (W = 256): it still computes every block (and
                               on the CPU first turns the mask into a T x T float tensor): the honest no-saving row
                window blocks  model.attention.local_attention (W = 256): blocks of W queries against 2W keys
                linear         model.linear_attention.chunked: elu+1 features, chunks of 64
              time(2T) / time(T) is printed beside the FLOP prediction: 4 for the quadratic methods, 2 for the
              window and linear ones.
  kv_cache    bytes a decoding cache holds per token of context, against the context length, for multi-head,
              grouped-query (2 kv heads), multi-query, window (W = 256) and linear attention: computed from the
              shapes and measured from the cache's own tensors after a prefill.
  decode      milliseconds per decoded token against the cached length (256 ... 8,192), the baby shape (6 layers,
              6 heads, 384 wide, RoPE), for the same five.

Peak memory (CPU): torch.profiler(profile_memory=True) allocation events, the maximum of their running sum
(bench/common.py's peak_bytes); on a GPU torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import torch

from model import GPT, GPTConfig
from model.attention import local_attention, masked_sdpa, math_attention, visible_keys
from model.linear_attention import chunked
from model.positions import PositionalEncoding

from .common import Column, Context, Table, log, median, peak_bytes, time_calls

FULL = dict(ts=(256, 512, 1024, 2048, 4096, 8192, 16384), heads=6, hs=64, window=256, reps=3,
            cached=(256, 1024, 2048, 4096, 8192), decode_steps=24)
QUICK = dict(ts=(32, 64), heads=2, hs=8, window=16, reps=1, cached=(16, 32), decode_steps=2)
MEMORY_BUDGET = 4 * 2**30  # bytes the explicit path may use; beyond it, only its prediction is printed
MIB = 2**20
METHODS = ("explicit", "sdpa causal", "sdpa + window", "window blocks", "linear")
GROWTH = {"explicit": 4, "sdpa causal": 4, "sdpa + window": 4, "window blocks": 2, "linear": 2}


def explicit_bytes(t: int, heads: int) -> int:
    """What the explicit path holds at its peak in forward + backward: scores, weights, the boolean mask and
    the weights' gradient, each (nh, T, T), 4 bytes (the mask 1)."""
    return heads * t * t * (4 + 4 + 4 + 1)


def call(method: str, t: int, s: dict, device: torch.device, backward: bool):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, s["heads"], t, s["hs"], generator=gen).to(device).requires_grad_(backward)
               for _ in range(3))
    dy = torch.randn(1, s["heads"], t, s["hs"], generator=gen).to(device)
    pos = torch.arange(t, device=device)
    pe, w = PositionalEncoding(), s["window"]
    fns = {
        "explicit": lambda: math_attention(q, k, v, visible_keys(pos, pos))[0],
        "sdpa causal": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa + window": lambda: masked_sdpa(q, k, v, visible_keys(pos, pos, w)),
        "window blocks": lambda: local_attention(q, k, v, w, pe),
        "linear": lambda: chunked(q, k, v),
    }

    def step() -> None:
        with torch.set_grad_enabled(backward):
            y = fns[method]()
            if backward:
                y.backward(dy)
                q.grad = k.grad = v.grad = None

    return step


def wall(ctx: Context, s: dict) -> Table:
    rows, last = [], {}
    for t in s["ts"]:
        for method in METHODS:
            row = {"T": t, "method": method}
            if method == "explicit" and explicit_bytes(t, s["heads"]) > MEMORY_BUDGET:
                row["note"] = f"not run: would need {explicit_bytes(t, s['heads']) / 2**30:.1f} GiB"
                rows.append(row)
                log(f"attention: T={t} {method}: {row['note']}")
                continue
            log(f"attention: T={t} {method} ...")
            fwd, both = call(method, t, s, ctx.device, False), call(method, t, s, ctx.device, True)
            both()  # warmup
            fwd()
            row["fwd_ms"] = median([time_calls(fwd, 1, ctx.device) for _ in range(s["reps"])]) * 1e3
            row["both_ms"] = median([time_calls(both, 1, ctx.device) for _ in range(s["reps"])]) * 1e3
            mem = peak_bytes(both, ctx.device)
            row["peak_mib"] = None if mem is None else mem / MIB
            if method in last:
                row["growth"] = row["both_ms"] / last[method]
                row["predicted"] = GROWTH[method]
            last[method] = row["both_ms"]
            rows.append(row)
    summary = {}
    big = max(s["ts"])
    by = {(r["T"], r["method"]): r for r in rows}
    if by.get((big, "window blocks"), {}).get("both_ms") and by.get((big, "sdpa causal"), {}).get("both_ms"):
        summary["window_speedup_at_max_T"] = by[(big, "sdpa causal")]["both_ms"] / by[(big, "window blocks")]["both_ms"]
    blocks = [r["peak_mib"] for r in rows if r["method"] == "window blocks" and r.get("peak_mib")]
    if len(blocks) > 1:
        summary["window_peak_mib_per_1k_tokens"] = {r["T"]: r["peak_mib"] / r["T"] * 1024 for r in rows
                                                    if r["method"] == "window blocks" and r.get("peak_mib")}
    return Table(
        name="attention",
        title="The quadratic wall: one attention call, forward and forward + backward",
        machine=ctx.machine,
        columns=[Column("T", "T"), Column("method", "method"), Column("fwd_ms", "forward ms", "{:.1f}"),
                 Column("both_ms", "fwd + bwd ms", "{:.1f}"), Column("peak_mib", "peak MiB (fwd + bwd)", "{:.1f}"),
                 Column("growth", "time(T) / time(T/2)", "{:.2f}"), Column("predicted", "FLOP prediction", "{}"),
                 Column("note", "note")],
        rows=rows,
        notes=[f"batch 1, {s['heads']} heads of {s['hs']} (the baby model's), q, k, v given; window W = "
               f"{s['window']}; linear: elu+1 features, chunks of 64; median of {s['reps']} after a warmup.",
               f"The explicit path stops where its (nh, T, T) tensors would pass {MEMORY_BUDGET / 2**30:.0f} GiB.",
               "Peak memory: allocations during one forward + backward beyond those before it."],
        summary=summary,
    )


# ---------------------------------------------------------------------------------------------------------
# decoding: the cache and the cost per token


VARIANTS = {
    "multi-head": {},
    "grouped-query (2 kv heads)": {"n_kv_head": 2},
    "multi-query": {"n_kv_head": 1},
    "window (W = 256)": {"window": 256},
    "linear": {"attention": "linear", "pos_encoding": "none"},
}


def decode_model(variant: dict, block: int, quick: bool) -> GPT:
    shape = dict(n_layer=2, n_head=2, n_embd=16) if quick else dict(n_layer=6, n_head=6, n_embd=384)
    window = {"window": 16} if quick and "window" in variant else {}
    base = dict(vocab_size=4096, block_size=block, pos_encoding="rope", bias=False, **shape)
    torch.manual_seed(0)
    return GPT(GPTConfig(**(base | variant | window))).eval()


def cache_bytes(cache) -> int:
    total = 0
    for k, v, state in zip(cache.k, cache.v, cache.state):
        total += sum(x.numel() * x.element_size() for x in (k, v) if x is not None)
        if state is not None:
            total += sum(x.numel() * x.element_size() for x in state)
    return total


def predicted_bytes(cfg: GPTConfig, length: int) -> int:
    """What the cache must hold (float32): per layer, keys and values of min(length, W) tokens x nkv heads x hs,
    or linear attention's hs x hs sums and hs normaliser per head (its size does not grow with length)."""
    hs = cfg.head_size
    if cfg.attention == "linear":
        return cfg.n_layer * cfg.n_head * (hs * hs + hs) * 4
    kept = sum(min(length, cfg.layer_window(i) or length) for i in range(cfg.n_layer))
    return 2 * kept * cfg.kv_heads * hs * 4


def decode(ctx: Context, s: dict) -> list[Table]:
    lengths = s["cached"]
    block = max(lengths) + s["decode_steps"] + 8
    cache_rows, time_rows = [], []
    for name, variant in VARIANTS.items():
        model = decode_model(variant, block, ctx.quick).to(ctx.device)
        for length in lengths:
            log(f"decode: {name}, {length} cached ...")
            ids = torch.randint(0, 4096, (1, length + s["decode_steps"]), generator=torch.Generator().manual_seed(1))
            ids = ids.to(ctx.device)
            with torch.inference_mode():
                cache = model.new_kv_cache()
                model(ids[:, :length], kv_cache=cache, last_only=True)
                measured = cache_bytes(cache)
                held = predicted_bytes(model.config, length)
                cache_rows.append({"variant": name, "length": length, "computed": held, "measured": measured,
                                   "per_token": held / length})
                steps = iter(range(length, length + s["decode_steps"]))
                torch.set_num_threads(1)  # a fixed count, so lengths and variants compare alike
                try:
                    n = s["decode_steps"]
                    seconds = time_calls(lambda: model(ids[:, [next(steps)]], kv_cache=cache, last_only=True), n,
                                         ctx.device)
                finally:
                    torch.set_num_threads(ctx.machine.get("torch_threads") or torch.get_num_threads())
            time_rows.append({"variant": name, "length": length, "ms": seconds * 1e3})
    base = {r["length"]: r["ms"] for r in time_rows if r["variant"] == "multi-head"}
    for r in time_rows:
        r["vs_mha"] = base[r["length"]] / r["ms"]
    longest = max(lengths)
    summary = {r["variant"]: r["vs_mha"] for r in time_rows if r["length"] == longest}
    linear = [r["ms"] for r in time_rows if r["variant"] == "linear"]
    summary["linear_ms_longest_over_shortest"] = linear[-1] / linear[0]
    shape = "2 layers, 2 heads, 16 wide" if ctx.quick else "6 layers, 6 heads of 64, 384 wide (baby)"
    cache_table = Table(
        name="kv_cache", title="Decoding cache: bytes per token of context", machine=ctx.machine,
        columns=[Column("variant", "variant"), Column("length", "cached tokens"),
                 Column("computed", "bytes held (computed)", "{:,}"),
                 Column("measured", "bytes allocated (measured)", "{:,}"),
                 Column("per_token", "bytes held / token", "{:,.0f}")],
        rows=cache_rows,
        notes=[f"{shape}, float32, RoPE (linear: no positions).",
               "Held: keys and values of the tokens a layer still sees (min(length, W) per windowed layer), or "
               "linear attention's hs x hs sums and hs normaliser per head. Allocated: the cache's own tensors, "
               "measured after a prefill: a full layer preallocates block_size positions (here the longest "
               "length plus the decoded tokens), a windowed layer W, a linear layer its state."],
    )
    time_table = Table(
        name="decode", title="Cached decoding: milliseconds per token against the cached length",
        machine=ctx.machine,
        columns=[Column("variant", "variant"), Column("length", "cached tokens"), Column("ms", "ms / token", "{:.2f}"),
                 Column("vs_mha", "multi-head / this", "{:.2f}x")],
        rows=time_rows,
        notes=[f"{shape}, batch 1, one thread (fixed: sample.py measures one against all), {s['decode_steps']} "
               "tokens after a prefill of the cached length, mean per token."],
        summary=summary,
    )
    return [cache_table, time_table]


def run(ctx: Context) -> list[Table]:
    s = QUICK if ctx.quick else FULL
    return [wall(ctx, s), *decode(ctx, s)]

