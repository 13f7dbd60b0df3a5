"""Where the default training step goes on this CPU, in bf16 autocast and in float32, and what each setting buys.

    python -m bench.step_profile                the default run's step (model=small, optim=muon, batch 4 x 512)
    python -m bench.step_profile --quick        the debug shape, seconds: checks that it runs

1. torch.profiler over 3 steps of attention_lab.training.loop.train_step (the loop's own step: forward,
   backward, clipping, Muon + AdamW) after 2 warm-up steps, per dtype: the ops' share of self CPU time, grouped.
2. Settings timed against the default, interleaved (default, setting, default, setting, ...) in one process so a
   neighbour's load falls on both; the ratio is the median over rounds of default time / setting time (> 1: the
   setting is faster). Each setting runs on its own copy of the model and optimizer, from the same weights.
Weights are random and the batches are random tokens: a step's cost does not depend on them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from collections import defaultdict

from attention_lab.runtime.omp import bound_spinning

bound_spinning()  # before torch loads OpenMP, as train.py and sample.py do

import numpy as np  # noqa: E402
import torch  # noqa: E402

from attention_lab.runtime.device import cpu_has_native_bf16, cpu_model  # noqa: E402
from attention_lab.training.compiling import compiled_for_training  # noqa: E402
from attention_lab.training.config import compose  # noqa: E402
from attention_lab.training.loop import train_step  # noqa: E402
from attention_lab.training.optim import configure_optimizer  # noqa: E402
from data.batches import BatchSampler  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

# op name -> the group the table shows (the rows); anything else is "other"
GROUPS = {
    "aten::mm": "matmuls (mm, addmm, bmm)", "aten::addmm": "matmuls (mm, addmm, bmm)",
    "aten::bmm": "matmuls (mm, addmm, bmm)", "aten::linear": "matmuls (mm, addmm, bmm)",
    "aten::baddbmm": "Muon's Newton-Schulz (baddbmm)",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention forward (sdpa flash)",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention backward (sdpa flash)",
    "aten::copy_": "casts and copies (copy_, _to_copy)", "aten::_to_copy": "casts and copies (copy_, _to_copy)",
    "aten::_log_softmax": "log-softmax + NLL (the loss)", "aten::_log_softmax_backward_data": "log-softmax + NLL (the loss)",
    "aten::nll_loss_forward": "log-softmax + NLL (the loss)", "aten::nll_loss_backward": "log-softmax + NLL (the loss)",
    "aten::gelu": "GELU", "aten::gelu_backward": "GELU",
    "aten::native_layer_norm": "LayerNorm", "aten::native_layer_norm_backward": "LayerNorm",
    "aten::_fused_rms_norm": "RMS norm (QK-norm)", "aten::_fused_rms_norm_backward": "RMS norm (QK-norm)",
    "aten::_fused_adamw_": "AdamW (fused)",
}


OTHER_ROWS = 6  # the largest ops outside GROUPS, each a row
COMPILED_GRAPH = "## Call CompiledFxGraph"  # how torch.profiler names a compiled graph's call (--compiled)


def machine() -> str:
    caps = torch.cpu.get_capabilities()
    return (f"CPU {caps.get('cpu_name') or cpu_model()} (avx512_bf16: {bool(caps.get('avx512_bf16'))}, "
            f"amx_bf16: {bool(caps.get('amx_bf16'))}), {torch.get_num_threads()} torch threads, torch "
            f"{torch.__version__}; shared cores (other work ran beside it)")


def setup(quick: bool, overrides: list[str]):
    """The default run's model config, optimizer config and batch size (configs/), vocab 4096."""
    cfg = compose((["experiment=debug"] if quick else []) + overrides)
    m = cfg.model
    gcfg = GPTConfig(vocab_size=4096 if not quick else 65, block_size=m.block_size, n_layer=m.n_layer,
                     n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout, bias=m.bias, pos_encoding=m.pos_encoding,
                     qk_norm=m.qk_norm, attn_backend=m.gpt().attn_backend)  # auto: sdpa, the rows' reference
    return gcfg, cfg.optim, cfg.train.batch_size


class Step:
    """One trainer (model, optimizer, sampler) whose call is one train_step."""

    def __init__(self, model: GPT, optim_cfg, batch: int, dtype: torch.dtype, loss_chunk: int = 0):
        self.model, self.dtype, self.loss_chunk = model.train(), dtype, loss_chunk
        self.opt = configure_optimizer(model, optim_cfg, torch.device("cpu"))
        tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, 200_000).astype(np.uint16)
        self.sampler = BatchSampler(tokens, model.config.block_size, batch, seed=0)

    def __call__(self) -> float:
        return train_step(self.model, self.opt, self.sampler, 1, torch.device("cpu"), self.dtype, 1.0,
                          loss_chunk=self.loss_chunk)[0]


def profile_table(step: Step, steps: int = 3) -> tuple[dict[str, float], float]:
    """Each group's share of self CPU time over `steps` steps, and the milliseconds a step took; the largest
    ops outside the named groups are their own rows ("other: aten::...")."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ms = (time.perf_counter() - start) / steps * 1e3
    by_group: dict[str, float] = defaultdict(float)
    others = []
    for e in prof.key_averages():
        if e.key in GROUPS:
            by_group[GROUPS[e.key]] += e.self_cpu_time_total
        elif e.key.startswith(COMPILED_GRAPH):  # one row for inductor's generated kernels, whatever their hash
            by_group["inductor's generated kernels (compiled graphs)"] += e.self_cpu_time_total
        else:
            others.append((e.self_cpu_time_total, e.key))
    total = sum(by_group.values()) + sum(t for t, _ in others)
    others.sort(reverse=True)
    for t, key in others[:OTHER_ROWS]:
        by_group[f"other: {key}"] = t
    by_group["other (the rest)"] = sum(t for t, _ in others[OTHER_ROWS:])
    return {g: t / total for g, t in by_group.items()}, ms


def compare(base: Step, other: Step, rounds: int) -> tuple[float, float, float]:
    """Interleaved: median ms of each and the median per-round ratio base / other (> 1: other is faster)."""
    for _ in range(2):
        base(), other()
    tb, to = [], []
    for _ in range(rounds):
        for fn, times in ((base, tb), (other, to)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return (statistics.median(tb) * 1e3, statistics.median(to) * 1e3,
            statistics.median(a / b for a, b in zip(tb, to, strict=True)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument("--settings", default="bf16,math,ns,ns3,loss",
                   help="which rows to time, comma-separated: bf16, bf16weights, math, ns, ns3, loss, compile "
                        "(default: all but compile, which compiles for minutes)")
    p.add_argument("--backend", choices=("sdpa", "math"), default="sdpa",
                   help="the default step's attention backend (what model.attn_backend=auto picked on this CPU "
                        "and dtype: train.py's console says)")
    p.add_argument("--dtypes", default=None,
                   help="the dtypes profiled and of the per-dtype rows, comma-separated: bfloat16, float32 (default: "
                        "both on a CPU with native bf16; float32 alone elsewhere, where bf16 is emulated: 28-120x "
                        "slower matmuls, minutes a profile, and no run trains in it)")
    p.add_argument("--loss-chunk", type=int, default=0,
                   help="the default step's train.loss_chunk (the profile's and the comparisons' base)")
    p.add_argument("--compiled", action="store_true",
                   help="the default step's model compiled by inductor, as train.compile=auto picks on an AMX CPU "
                        "(the profile after; the compile itself is paid before the profile's warm-up)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the default run's config, e.g. model.n_embd=512 "
                   "train.batch_size=8 (another shape's step)")
    args = p.parse_args(argv)
    try:
        dtypes = profiled_dtypes(args.dtypes, cpu_has_native_bf16())
    except ValueError as e:
        p.error(str(e))  # "error: ..." and exit 2, before anything is measured
    rounds = 2 if args.quick else args.rounds
    gcfg, ocfg, batch = setup(args.quick, args.overrides)
    gcfg = dataclasses.replace(gcfg, attn_backend=args.backend)
    torch.manual_seed(0)
    base_model = GPT(gcfg)
    print(f"## The default training step, profiled and compared\n\n{machine()}\n")
    print(f"- model {gcfg.n_layer} layers x {gcfg.n_head} heads x {gcfg.n_embd} wide, context {gcfg.block_size}, "
          f"vocab {gcfg.vocab_size}, batch {batch}; optimizer {ocfg.name} (Newton-Schulz dtype {ocfg.muon_ns_dtype}); "
          f"attention {gcfg.attn_backend}; loss {f'{args.loss_chunk} rows at a time' if args.loss_chunk else 'all at once'}"
          + ("; compiled (inductor)" if args.compiled else "") + "\n")
    if args.dtypes is None and dtypes == (torch.float32,):
        print("- float32 only: this CPU has no native bf16 (bf16 would be emulated; --dtypes bfloat16,float32 "
              "measures it anyway)\n")
    bf16, f32 = torch.bfloat16, torch.float32
    if not args.skip_profile:
        shares, ms = {}, {}
        for dtype in dtypes:
            step = Step(copy.deepcopy(base_model), ocfg, batch, dtype, args.loss_chunk)
            shares[dtype], ms[dtype] = profile_table(compiled(step) if args.compiled else step)
        first = dtypes[0]
        groups = sorted(set().union(*map(set, shares.values())), key=lambda g: -shares[first].get(g, 0.0))
        print("### Profile: share of self CPU time over 3 steps (torch.profiler)\n")
        print("| op group | " + " | ".join(DTYPE_TITLES[d] for d in dtypes) + " |\n|---|"
              + "--:|" * len(dtypes))
        def cell(dtype, g):
            return f"{shares[dtype][g]:.1%}" if g in shares[dtype] else "(in the rest)"

        for g in groups:
            print(f"| {g} | " + " | ".join(cell(d, g) for d in dtypes) + " |")
        print("| ms a step (under the profiler) | " + " | ".join(f"{ms[d]:.0f}" for d in dtypes) + " |")
        print("| tokens/s (under the profiler) | " + " | ".join(f"{batch * gcfg.block_size / ms[d] * 1e3:,.0f}"
                                                             for d in dtypes) + " |\n")

    print(f"### Settings against the default step ({rounds} interleaved rounds; ratio = default / setting, "
          "> 1 is faster)\n")
    print("| setting | dtype | default ms | setting ms | ratio |\n|---|---|--:|--:|--:|")
    def fresh(dtype, model_change=lambda m: m, optim=ocfg, loss_chunk=args.loss_chunk) -> Step:
        step = Step(model_change(copy.deepcopy(base_model)), optim, batch, dtype, loss_chunk)
        return compiled(step) if args.compiled else step

    ns_f32 = dataclasses.replace(ocfg, muon_ns_dtype="float32")
    ns3 = dataclasses.replace(ocfg, muon_ns_steps=3)
    # (setting, the default's dtype, the default step, the setting's step)
    wanted = set(args.settings.split(","))
    rows = []
    if bf16 in dtypes:  # the bf16 rows need bf16 asked for; the second: what casting costs (timing only, no master
        # weights: the whole model in bf16, no autocast)
        rows += [("bf16", "bf16 autocast (vs float32)", "float32 -> bf16", lambda: fresh(f32), lambda: fresh(bf16)),
                 ("bf16weights", "bf16 weights, no autocast (vs bf16 autocast; an upper bound on the casts' cost)",
                  "bf16", lambda: fresh(bf16), lambda: fresh(f32, lambda m: m.to(bf16)))]
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        rows.append(("math", "attention: the math path (vs sdpa's flash kernel)", name, lambda d=dtype: fresh(d),
                     lambda d=dtype: fresh(d, lambda m: set_backend(m, "math"))))
        rows.append(("ns", "Newton-Schulz in float32 (vs the default's " + ocfg.muon_ns_dtype + ")", name,
                     lambda d=dtype: fresh(d), lambda d=dtype: fresh(d, optim=ns_f32)))
        rows.append(("ns3", f"Newton-Schulz steps 3 (vs {ocfg.muon_ns_steps})", name,
                     lambda d=dtype: fresh(d), lambda d=dtype: fresh(d, optim=ns3)))
        rows.append(("loss", "the loss 256 rows at a time (train.loss_chunk=256)", name,
                     lambda d=dtype: fresh(d), lambda d=dtype: fresh(d, loss_chunk=256)))
        rows.append(("compile", "torch.compile of the model (inductor; the step's optimizer stays eager)", name,
                     lambda d=dtype: fresh(d), lambda d=dtype: compiled(fresh(d))))
    for key, name, label, make_base, make_other in rows:
        if key not in wanted or (key == "compile" and args.compiled):  # compiled against compiled: no row
            continue
        other = make_other()
        b, o, r = compare(make_base(), other, rounds)
        extra = f" (compiling took {other.compile_s:.0f} s, paid once a run)" if hasattr(other, "compile_s") else ""
        print(f"| {name}{extra} | {label} | {b:.0f} | {o:.0f} | {r:.2f}x |", flush=True)
    return 0


DTYPE_TITLES = {torch.bfloat16: "bf16 autocast", torch.float32: "float32"}


def profiled_dtypes(asked: str | None, native_bf16: bool) -> tuple[torch.dtype, ...]:
    """The dtypes the profile and the per-dtype rows run in, bf16 first: those asked (--dtypes), else both where
    the CPU has native bf16 and float32 alone where it has not (emulated bf16 profiles for minutes, and
    train.dtype=auto never trains in it there). ValueError on a name that is not bfloat16 or float32."""
    if asked is None:
        return (torch.bfloat16, torch.float32) if native_bf16 else (torch.float32,)
    names = [n.strip() for n in asked.split(",") if n.strip()]
    unknown = [n for n in names if n not in ("bfloat16", "float32")]
    if unknown or not names:
        raise ValueError(f"--dtypes {asked!r}: use bfloat16, float32 or both, comma-separated")
    return tuple(d for d in DTYPE_TITLES if str(d).removeprefix("torch.") in names)


def compiled(step: Step) -> Step:
    """The step with its model compiled by inductor as train.compile=true compiles it (compiled_for_training: with
    the deterministic algorithms a compiled CPU run trains under); the first step (the compile) is timed here, so
    the table can say what a run pays for it before its first useful step."""
    step.model = compiled_for_training(step.model)
    start = time.perf_counter()
    step()
    step.compile_s = time.perf_counter() - start
    return step


def set_backend(model: GPT, backend: str) -> GPT:
    for block in model.transformer.h:
        block.attn.backend = backend
    return model


if __name__ == "__main__":
    raise SystemExit(main())
