"""Training-step throughput: forward, backward and AdamW step, ours vs transformers.GPT2LMHeadModel.

Both models have the same config and weights (bench/twins.py), dropout 0, and compute the same mean
cross-entropy on the same batch; each round times one step of ours, one of Hugging Face's and one large
matmul (the "probe"), so both MFU figures below are taken under the same load:

    MFU            model FLOP/s / the peak measured once at the start (bench/peak.py)
    MFU (paired)   per round, model FLOP/s / the probe's FLOP/s a moment later; median over rounds

Model FLOPs per token are model.gpt.flops_per_token (6N + 12 L C T, the PaLM count).

`python -m bench.train_step --profile baby` prints torch.profiler's op table of one step of each model.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention_lab.runtime.device import autocast
from attention_lab.runtime.flops import matmul_probe
from attention_lab.training.config import OptimConfig
from attention_lab.training.optim import configure_optimizer
from model import GPTConfig
from model.gpt import flops_per_token, num_params

from .common import Column, Context, Table, default_dtype, interleaved, log, median, paired_ratio, spread
from .twins import build_hf, build_ours, check_same_function, hf_attention

SPEEDUP_TARGET, SPEEDUP_GOAL = 1.3, 1.6  # ours / Hugging Face tokens/s, at every size
MFU_TARGET = 0.60  # of the measured matmul peak, at the baby size


@dataclass
class Case:
    name: str
    cfg: GPTConfig
    batch: int
    reps: int
    warmup: int = 2


def _cfg(vocab: int, block: int, n_layer: int, n_head: int, n_embd: int) -> GPTConfig:
    return GPTConfig(vocab_size=vocab, block_size=block, n_layer=n_layer, n_head=n_head, n_embd=n_embd, dropout=0.0)


CASES = [
    Case("small", _cfg(4096, 64, 4, 4, 128), batch=12, reps=15),
    Case("small, GPT-2 vocab", _cfg(50257, 64, 4, 4, 128), batch=12, reps=9),
    Case("medium", _cfg(4096, 128, 4, 4, 256), batch=12, reps=9),
    # nanoGPT's Shakespeare "baby GPT" shape, with this project's BPE vocabulary and a CPU-sized batch
    Case("baby", _cfg(4096, 256, 6, 6, 384), batch=8, reps=7, warmup=1),
]
QUICK_CASES = [Case("tiny", _cfg(256, 16, 2, 2, 32), batch=2, reps=2, warmup=1)]
PROBE_N = {"cpu": 1024, "cuda": 8192}


def make_steps(case: Case, device: torch.device, dtype: torch.dtype | None = None):
    """Two closures doing one AdamW training step each (ours, Hugging Face's), and the initial |loss diff|.

    Each side trains the way its users train it. Ours: attention_lab.training.optim.configure_optimizer (AdamW,
    decay on matrices, the fused kernel) and `model(x, y).loss`. Hugging Face: `torch.optim.AdamW(model.parameters())` and
    `model(input_ids=x, labels=x).loss`, which shifts the labels inside. Both process B x T tokens per step.
    """
    cfg, dtype = case.cfg, dtype or default_dtype(device)  # bf16 runs under autocast on both sides alike
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (case.batch, cfg.block_size), generator=gen).to(device)
    y = torch.randint(0, cfg.vocab_size, (case.batch, cfg.block_size), generator=gen).to(device)
    check_same_function(cfg, device)  # the twins compute one function (checked where an error would show)
    ours = build_ours(cfg, device).train()
    hf = build_hf(ours, device).train()

    def ours_loss():
        with autocast(device, dtype):
            return ours(x, y).loss

    def hf_loss():
        with autocast(device, dtype):
            # use_cache=False: a training step has no use for a KV cache (the default would build one)
            return hf(input_ids=x, labels=x, use_cache=False).loss

    with torch.no_grad():  # same weights, same function: the logits agree
        hf_logits = hf(input_ids=x, use_cache=False).logits
        loss_diff = abs(ours_loss().item() - F.cross_entropy(hf_logits.view(-1, hf_logits.size(-1)), y.view(-1)).item())

    def stepper(loss_fn, opt):
        def step() -> None:
            loss_fn().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    ours_opt = configure_optimizer(ours, OptimConfig(lr=1e-4, weight_decay=0.1), device)
    hf_opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.1)
    return stepper(ours_loss, ours_opt), stepper(hf_loss, hf_opt), loss_diff, hf_attention(hf), num_params(ours)


def run(ctx: Context) -> Table:
    peak = ctx.peak()
    probe_n = 256 if ctx.quick else PROBE_N[ctx.device.type]
    probe, probe_flops = matmul_probe(probe_n, ctx.device, ctx.dtype)
    rows, hf_attn = [], None
    for case in QUICK_CASES if ctx.quick else CASES:
        log(f"train step: {case.name} ...")
        ours_step, hf_step, loss_diff, hf_attn, n_params = make_steps(case, ctx.device, ctx.dtype)
        times = interleaved(
            {"ours": ours_step, "hf": hf_step, "probe": probe},
            ctx.device,
            reps=case.reps,
            warmup=case.warmup,
            min_sample_s=0.005 if ctx.quick else 0.05,
        )
        tokens = case.batch * case.cfg.block_size
        flops = flops_per_token(case.cfg, n_params) * tokens  # per step
        ours_tps, hf_tps = tokens / median(times["ours"]), tokens / median(times["hf"])
        paired_mfu = median(
            [(flops / t) / (probe_flops / p) for t, p in zip(times["ours"], times["probe"], strict=True)]
        )
        rows.append(
            {
                "config": case.name,
                "shape": f"L{case.cfg.n_layer} H{case.cfg.n_head} C{case.cfg.n_embd} T{case.cfg.block_size} "
                f"V{case.cfg.vocab_size} B{case.batch}",
                "params_m": n_params / 1e6,
                "ours_tok_s": ours_tps,
                "hf_tok_s": hf_tps,
                "speedup": paired_ratio(times["hf"], times["ours"]),
                "ours_mfu": flops / median(times["ours"]) / peak,
                "hf_mfu": flops / median(times["hf"]) / peak,
                "ours_mfu_paired": paired_mfu,
                "loss_diff": loss_diff,
                "spread": max(spread(times["ours"]), spread(times["hf"])),
                "reps": case.reps,
            }
        )
    baby = next((r for r in rows if r["config"] == "baby"), None)
    summary = {
        "peak_flops": peak,
        "speedup_min": min(r["speedup"] for r in rows),
        "speedup_target_met": all(r["speedup"] >= SPEEDUP_TARGET for r in rows),
        "speedup_goal_met": all(r["speedup"] >= SPEEDUP_GOAL for r in rows),
        "baby_mfu": baby and baby["ours_mfu"],
        "baby_mfu_paired": baby and baby["ours_mfu_paired"],
        "mfu_target_met": None if baby is None else baby["ours_mfu_paired"] >= MFU_TARGET,
        "hf_attn_implementation": hf_attn,
    }
    return Table(
        name="train",
        title="Training step (forward + backward + AdamW): ours vs transformers.GPT2LMHeadModel"
        + ("" if ctx.dtype == torch.float32 else f", {str(ctx.dtype).removeprefix('torch.')} autocast"),
        machine=ctx.machine,
        columns=[
            Column("config", "config"),
            Column("shape", "shape"),
            Column("params_m", "params (M)", "{:.2f}"),
            Column("ours_tok_s", "ours tok/s", "{:,.0f}"),
            Column("hf_tok_s", "HF tok/s", "{:,.0f}"),
            Column("speedup", "ours / HF", "{:.2f}x"),
            Column("ours_mfu", "ours MFU", "{:.0%}"),
            Column("hf_mfu", "HF MFU", "{:.0%}"),
            Column("ours_mfu_paired", "ours MFU (paired)", "{:.0%}"),
            Column("loss_diff", "|Δ loss| at init", "{:.1e}"),
            Column("spread", "spread", "{:.0%}"),
        ],
        rows=rows,
        notes=[
            "Same config and weights on both sides, dropout 0, lr 1e-4, weight decay 0.1; each side trained as its "
            "users train it: ours with train.configure_optimizer (fused AdamW, decay on matrices) and "
            f"model(x, y).loss; Hugging Face (attn_implementation={hf_attn!r}, its default) with "
            "torch.optim.AdamW and model(input_ids=x, labels=x, use_cache=False).loss.",
            "Each round: one step of ours, one of HF, one matmul probe; tok/s from the medians; "
            "ours / HF = median of per-round time ratios; spread = (max - min) / median of a side's samples.",
            f"MFU = flops_per_token (6N + 12LCT) x tok/s / peak {peak / 1e9:.1f} GFLOP/s; "
            f"MFU (paired) divides by the probe ({probe_n}² matmul) timed in the same round.",
            ("--quick: tiny model, the targets below mean nothing here. " if ctx.quick else "")
            + f"Targets: ours / HF >= {SPEEDUP_TARGET}x at every size (goal {SPEEDUP_GOAL}x): "
            f"{'met' if summary['speedup_target_met'] else 'MISSED'} (min {summary['speedup_min']:.2f}x); "
            f"baby MFU >= {MFU_TARGET:.0%}: "
            + ("n/a" if baby is None else f"{'met' if summary['mfu_target_met'] else 'MISSED'}"),
        ],
        summary=summary,
    )


def profile(case_name: str, steps: int = 3, row_limit: int = 25) -> None:
    """Print torch.profiler's table (self CPU time) of `steps` training steps of ours and of Hugging Face's."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    case = next(c for c in CASES + QUICK_CASES if c.name == case_name)
    device = torch.device("cpu")
    ours_step, hf_step, *_ = make_steps(case, device)
    for name, step in (("ours", ours_step), ("hf", hf_step)):
        step()  # warmup
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
        print(f"## {name}: {case.name}, {steps} steps")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=row_limit))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", metavar="CASE", required=True, help="one of: " + ", ".join(c.name for c in CASES))
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    profile(args.profile, args.steps)
