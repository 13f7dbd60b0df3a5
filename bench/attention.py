"""One attention layer, `math` vs `sdpa` backend: forward + backward time and peak memory as T grows.

The math backend materialises the (B, nh, T, T) scores and weights, so its memory grows as T²; the fused
kernel (flash attention on CPU and GPU) works in tiles and keeps O(T) memory. Time tends to T² for both
as the T² attention products outgrow the T·C² projections (T > 2C).

Peak memory is what torch allocates during one forward + backward on top of what existed before (weights,
input, output gradient):
  GPU  torch.cuda.max_memory_allocated after reset_peak_memory_stats
  CPU  torch.profiler(profile_memory=True): the running sum of its allocation events (+size, -size on free),
       taken in time order; its maximum is the peak.
"""

from __future__ import annotations

import math

import torch

from model import GPTConfig
from model.attention import CausalSelfAttention
from model.positions import build_positional_encoding

from .common import Column, Context, Table, interleaved, log, median, paired_ratio, synchronize

FULL = dict(ts=(128, 256, 512, 1024, 2048), batch=1, n_embd=384, n_head=6, reps=5)
QUICK = dict(ts=(16, 32), batch=1, n_embd=32, n_head=2, reps=2)
MIB = 2**20


def peak_bytes(fn, device: torch.device) -> int | None:
    """Bytes allocated by fn at its peak, beyond what was allocated before it ran (None if unmeasurable)."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        from torch._C._profiler import _EventType

        tree = prof.profiler.kineto_results.experimental_event_tree()
    except (AttributeError, ImportError):  # the event tree is an experimental API; report n/a without it
        return None
    events, stack = [], list(tree)
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    running = peak = 0
    for _, size in sorted(events):
        running += size
        peak = max(peak, running)
    return peak


def layer_step(backend: str, t: int, setting: dict, device: torch.device, state: dict | None):
    """A closure running forward + backward of one CausalSelfAttention at sequence length t."""
    cfg = GPTConfig(
        block_size=t, n_layer=1, n_head=setting["n_head"], n_embd=setting["n_embd"], dropout=0.0, attn_backend=backend
    )
    torch.manual_seed(0)
    layer = CausalSelfAttention(cfg).to(device).train()
    if state is not None:
        layer.load_state_dict(state)  # the same weights for both backends
    pe = build_positional_encoding(cfg).to(device)
    rotation = pe.rotation(torch.arange(t, device=device))  # cos/sin tables for RoPE, None otherwise
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(setting["batch"], t, cfg.n_embd, generator=gen).to(device).requires_grad_()
    dy = torch.randn(setting["batch"], t, cfg.n_embd, generator=gen).to(device)

    def step() -> None:
        y = layer(x, pe, rotation)[0]  # (y, weights, values): only y is timed
        y.backward(dy)
        # freed here, not at the next call's start: a peak measurement then starts with no stale gradients
        x.grad = None
        layer.zero_grad(set_to_none=True)

    return step, layer


def growth_exponent(ts: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(T): value ~ T^slope."""
    xs, ys = [math.log(t) for t in ts], [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def run(ctx: Context) -> Table:
    setting = QUICK if ctx.quick else FULL
    device = ctx.device
    rows = []
    for t in setting["ts"]:
        log(f"attention: T={t} ...")
        math_step, layer = layer_step("math", t, setting, device, None)
        sdpa_step, _ = layer_step("sdpa", t, setting, device, layer.state_dict())
        times = interleaved({"math": math_step, "sdpa": sdpa_step}, device, reps=setting["reps"], warmup=2,
                            min_sample_s=0.005 if ctx.quick else 0.05)
        mem_math, mem_sdpa = peak_bytes(math_step, device), peak_bytes(sdpa_step, device)
        score_bytes = setting["batch"] * setting["n_head"] * t * t * 4  # one fp32 (B, nh, T, T) tensor
        rows.append(
            {
                "T": t,
                "math_ms": median(times["math"]) * 1e3,
                "sdpa_ms": median(times["sdpa"]) * 1e3,
                "speedup": paired_ratio(times["math"], times["sdpa"]),
                "math_mib": None if mem_math is None else mem_math / MIB,
                "sdpa_mib": None if mem_sdpa is None else mem_sdpa / MIB,
                "memory_ratio": None if not (mem_math and mem_sdpa) else mem_math / mem_sdpa,
                "scores_mib": score_bytes / MIB,
            }
        )
    # exponents over the longer sequences, where the T² terms dominate (all of them in quick mode)
    tail = [r for r in rows if r["T"] >= 512] if not ctx.quick else rows
    ts = [r["T"] for r in tail]
    summary = {f"{k}_exponent": growth_exponent(ts, [r[k] for r in tail]) for k in ("math_ms", "sdpa_ms")}
    if all(r["math_mib"] and r["sdpa_mib"] for r in tail):
        summary.update({f"{k}_exponent": growth_exponent(ts, [r[k] for r in tail]) for k in ("math_mib", "sdpa_mib")})
    method = "torch.cuda.max_memory_allocated" if device.type == "cuda" else (
        "torch.profiler(profile_memory=True) allocation events, peak of their running sum"
    )
    labels = {"math_ms": "math time", "sdpa_ms": "sdpa time", "math_mib": "math memory", "sdpa_mib": "sdpa memory"}
    growth = ", ".join(f"{labels[k.removesuffix('_exponent')]} ~ T^{v:.2f}" for k, v in summary.items())
    return Table(
        name="attention",
        title="Attention backends, one layer forward + backward: math vs sdpa",
        machine=ctx.machine,
        columns=[
            Column("T", "T"),
            Column("math_ms", "math ms", "{:.2f}"),
            Column("sdpa_ms", "sdpa ms", "{:.2f}"),
            Column("speedup", "math / sdpa time", "{:.2f}x"),
            Column("math_mib", "math peak MiB", "{:.2f}"),
            Column("sdpa_mib", "sdpa peak MiB", "{:.2f}"),
            Column("memory_ratio", "math / sdpa memory", "{:.1f}x"),
            Column("scores_mib", "one B·nh·T² fp32 tensor MiB", "{:.2f}"),
        ],
        rows=rows,
        notes=[
            f"CausalSelfAttention (c_attn, attention, c_proj), batch {setting['batch']}, C {setting['n_embd']}, "
            f"{setting['n_head']} heads, learned positions (no rotation), dropout 0; same weights for both backends.",
            f"Time: the two interleaved, {setting['reps']} rounds after 2 warmups, medians; "
            "math / sdpa = median of per-round time ratios.",
            f"Peak memory: bytes allocated during one forward + backward beyond those before it; method: {method}.",
            f"Growth over T >= {ts[0]}: {growth}.",
        ],
        summary=summary,
    )
