"""The tutorials' claims about attention, each an experiment a learner runs on a CPU.

    python -m attention_lab.claims --list                 # the claims, their statements and arms
    python -m attention_lab.claims scale                  # train every arm, measure, write the report folder
    python -m attention_lab.claims scale --quick          # a tiny version in seconds (for tests and trying)
    python -m attention_lab.claims context --run RUN      # claims without arms read a trained run
    python -m attention_lab.claims compare RUN RUN ...    # a table and a plot of any runs

An experiment is data: a claim names its arms as config overrides on one base preset (configs/experiment/
claims.yaml), the seeds, and which numbers answer it. Every arm trains at equal steps with `train.py` (a
subprocess, so each arm is an ordinary run folder that the pages, TensorBoard, sample.py and evaluate open), then
the arms are measured from their folders (attention_lab/interp/measures.py) and scored on the whole held-out
split (attention_lab/training/evaluate.py). The report folder holds report.md (the table, the verdict, the
published result), results.json and one plot. The verdict is computed from the numbers: a difference counts
when it is larger than twice the seed spread (the largest difference between two seeds of one arm).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from attention_lab.interp.heads import ablation_effects, head_label
from attention_lab.interp.measures import (
    attention_stats,
    contextual_similarity,
    honest_position_losses,
    nearest_in_context,
    position_losses,
    prefix_shuffle,
)
from attention_lab.interp.roles import role_scores
from attention_lab.runtime import cli
from attention_lab.runtime.device import cpu_model
from attention_lab.store.checkpoint import CheckpointError, load_checkpoint
from attention_lab.training.config import compose
from attention_lab.training.evaluate import data_dir_of, score_run
from data.batches import windows
from data.files import atomic_write, write_json_atomic
from data.prepare import PreparedData, bits_per_byte

REPO = Path(__file__).resolve().parent.parent
BASE = ("experiment=claims",)
# --quick: the same arms on a model and a run small enough for seconds (character data, 1 layer, 24 steps)
QUICK = ("data=shakespeare_char", "model.block_size=32", "model.n_layer=1", "model.n_embd=32", "train.batch_size=4",
         "train.max_steps=24", "train.eval_interval=12", "train.eval_batches=2", "optim.warmup_steps=4",
         "train.head_roles=false", "train.film=false", "train.tensorboard=false", "train.dtype=float32")


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Expect:
    """The claim says `better` reaches a lower `metric` than `worse` (bits/byte unless named)."""

    better: str
    worse: str
    metric: str = "bpb"


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str  # the tutorials' claim, one line
    arms: tuple[Arm, ...]
    measures: tuple[str, ...]  # which numbers besides bits/byte (see MEASURES below)
    expect: tuple[Expect, ...]
    published: str
    seeds: tuple[int, ...] = (1, 2)
    plot: str = "curves"  # "curves": validation loss over steps; "position": loss by position; "bars:a,b": metrics


HEAD_COUNTS = (1, 2, 4, 8, 16)
CLAIMS = {c.name: c for c in (
    Claim("qk", "queries and keys are separate projections because what a word looks for differs from what it "
          "offers",
          (Arm("separate"), Arm("tied", ("model.qk_tied=true",))),
          ("diagonal", "previous_head"), (Expect("separate", "tied"),),
          "no published ablation; tied Q/K makes q_i.k_j symmetric, so a token attends to itself strongly "
          "(Kitaev et al. 2020 tie them in Reformer and forbid self-attention for that reason)"),
    Claim("scale", "scores are divided by sqrt(d_k) for numerical stability, so the softmax does not saturate",
          tuple(Arm(f"{s}{tag}", (f"model.attn_scale={s}",) + lr) for tag, lr in (("", ()), ("-3xlr", ("optim.lr=9e-3",)))
                for s in ("sqrt", "none", "inverse")),
          ("attention", "train_loss"),
          (Expect("sqrt", "none"), Expect("sqrt", "inverse"), Expect("sqrt-3xlr", "none-3xlr"),
           Expect("sqrt", "none", "max_score"), Expect("sqrt-3xlr", "none-3xlr", "max_score")),
          "Vaswani et al. 2017 §3.2.1: q.k has variance d_k (no ablation numbers); Wortsman et al. 2023: "
          "attention-logit growth makes small models unstable at high learning rates, QK-layernorm prevents it"),
    Claim("mask", "future keys get -inf before the softmax, not 0 after it, or the weights no longer sum to 1; "
          "without the mask the model sees the word it must predict",
          (Arm("before_softmax"), Arm("after_softmax", ("model.causal_mask=after_softmax",)),
           Arm("none", ("model.causal_mask=none",))),
          ("honest", "sample"),
          (Expect("before_softmax", "after_softmax", "honest_bpb"), Expect("before_softmax", "none", "honest_bpb")),
          "a standard result rather than a paper's table: a leaking mask trains to a low loss and predicts "
          "nothing once the future is hidden", plot="bars:leaky_bpb,honest_bpb"),
    Claim("heads", "several heads beat one",
          tuple(Arm(f"{n} head{'s' * (n > 1)}", (f"model.n_head={n}",)) for n in HEAD_COUNTS),
          ("roles", "ablation"), (Expect("4 heads", "1 head"), Expect("8 heads", "1 head")),
          "Vaswani et al. 2017 Table 3 (A), equal compute: 1 head 5.29 dev perplexity, 8 heads 4.92, 32 heads "
          "5.01; Michel et al. 2019: only 8 of 96 encoder heads change BLEU significantly when removed one at a "
          "time", plot="bars:bpb"),
    Claim("positions", "self-attention has no notion of order, so positions are added (though they may not be "
          "needed)",
          tuple(Arm(p, (f"model.pos_encoding={p}",)) for p in ("none", "learned", "sinusoidal", "rope", "alibi")),
          ("position", "shuffle", "long_context"),
          (Expect("rope", "none"), Expect("learned", "none")),
          "Haviv et al. 2022 (125M, the Pile): perplexity none 22.15, learned 22.04, sinusoidal 21.49, ALiBi "
          "19.94; a bidirectional model without positions fails (147 vs 4.06)", plot="position"),
    Claim("rnn", "attention replaced recurrent networks because it relates distant words directly and trains in "
          "parallel",
          (Arm("transformer"), Arm("lstm", ("model.arch=lstm",)),
           Arm("lstm equal time", ("model.arch=lstm", "train.max_steps=100000", "train.max_minutes={minutes}"))),
          ("position", "speed"), (Expect("transformer", "lstm"), Expect("transformer", "lstm equal time")),
          "Khandelwal et al. 2018: an LSTM LM uses about 200 tokens of context, word order only within the last "
          "~20-50; Kaplan et al. 2020: LSTM per-token loss plateaus after <100 tokens while transformers keep "
          "improving", plot="position"),
    Claim("context", "attention turns a word's context-free embedding into a context-dependent one",
          (), ("similarity",), (),
          "Ethayarajh 2019: under 5% of the variance of a GPT-2 word's contextual vectors is explained by a "
          "single static vector", seeds=()),
    Claim("quadratic", "the cost grows with the square of the context", (), ("bench",), (),
          "measured in docs/variants.md (bench/attention.py): time(2T)/time(T) near 4 for full attention, 2 for "
          "windows and linear attention", seeds=()),
)}


NO_ARMS = {"context": "none: it reads a trained run (--run)", "quadratic": "none: it runs the wall benchmark"}


# ------------------------------------------------------------------------------------------------------------
# running the arms


def arm_dir(out: Path, arm: Arm, seed: int) -> Path:
    return out / "runs" / f"{arm.name.replace(' ', '_')}-s{seed}"


def train_arm(run_dir: Path, overrides: list[str], python: str = sys.executable) -> float:
    """Train one arm with train.py into run_dir (skipped when it already finished); seconds it took."""
    done = run_dir / "claims_done.json"
    if done.exists():
        return json.loads(done.read_text())["seconds"]
    cmd = [python, str(REPO / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds = time.time() - t0
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"arm {run_dir.name} failed (train.py {' '.join(overrides)}):\n{tail}")
    write_json_atomic(done, {"seconds": seconds, "overrides": overrides})
    return seconds


def resolved(overrides: list[str]) -> dict:
    """The run config these overrides compose to, as its config.json holds it, without the run's name."""
    cfg = json.loads(json.dumps(dataclasses.asdict(compose(list(overrides)))))
    cfg.pop("name", None)
    return cfg


def finished_twin(out: Path, overrides: list[str]) -> Path | None:
    """A finished arm of another claim beside `out` (out/../*/runs/*) whose run config equals these overrides'
    (the name aside): the base arm is the same run in six claims, trained once."""
    want = resolved(overrides)
    for done in sorted(out.resolve().parent.glob("*/runs/*/claims_done.json")):
        run = done.parent
        if run.parent.parent == out.resolve() or not (run / "config.json").exists():
            continue
        cfg = json.loads((run / "config.json").read_text())
        cfg.pop("name", None)
        if cfg == want:
            return run
    return None


def metrics_of(run_dir: Path) -> dict:
    """From metrics.jsonl: the validation curve, the last training loss, the largest one after warmup, the median
    tokens/s."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in lines if "loss" in r and "heads" not in r]
    val = [(r["step"], r["val_loss"]) for r in lines if "val_loss" in r]
    return {"steps": max((r["step"] for r in lines), default=0),
            "train_loss": train[-1]["loss"] if train else float("nan"),
            "max_train_loss_late": max((r["loss"] for r in train[len(train) // 4:]), default=float("nan")),
            "tokens_per_s": float(np.median([r["tokens_per_s"] for r in train])) if train else float("nan"),
            "val_curve": val}


# ------------------------------------------------------------------------------------------------------------
# measuring a trained arm


@dataclass
class Held:
    """Held-out windows of one prepared data set, shared by every arm of a claim (same text for each)."""

    data: PreparedData
    x: torch.Tensor
    y: torch.Tensor

    @classmethod
    def of(cls, run_dir: Path, block_size: int, n: int) -> "Held":
        data = PreparedData.open(data_dir_of(run_dir, run_dir))
        tokens = data.tokens("val")
        starts = np.linspace(0, len(tokens) - 2 * block_size - 2, n).astype(np.int64)
        x, y = windows(tokens, starts, 2 * block_size)  # twice the context, for the long-context measure
        return cls(data, x, y)

    def bpb(self, nats: float) -> float:
        return bits_per_byte(nats, self.data.meta, "val")


def measure(claim: Claim, run_dir: Path, held: Held, quick: bool) -> dict:
    ckpt = load_checkpoint(run_dir, "best")
    model = ckpt.build_model("cpu")
    t = model.config.block_size
    x, y = held.x[:, :t], held.y[:, :t]
    out: dict = {"params": sum(p.numel() for p in model.parameters())}
    # the loss at each position of the held-out windows, once: the position curve, the 1x number of the
    # long-context pair and --quick's bits/byte read it
    curve = position_losses(model, x, y)
    # the whole held-out split; --quick: the held-out windows only (seconds, not a measurement)
    out["bpb"] = held.bpb(float(curve.mean())) if quick else score_run(run_dir, batch_size=8).bits_per_byte
    attention = hasattr(model.config, "n_head")
    if "position" in claim.measures:
        out["position_loss"] = curve.round(4).tolist()
        out["loss_first_8"] = float(curve[:8].mean())
        out["loss_last_half"] = float(curve[t // 2:].mean())
    if "shuffle" in claim.measures:
        r = prefix_shuffle(model, x, y, last=max(1, t // 4))
        out["shuffle_jump"] = r.jump
    if "long_context" in claim.measures:  # both on the same held-out windows: their first T, then all 2T tokens
        out["bpb_windows_1x"] = held.bpb(float(curve.mean()))
        out["bpb_windows_2x"] = _long_context_bpb(ckpt, model, held)
    if "honest" in claim.measures:
        n = 4 if quick else 16
        honest = honest_position_losses(model, x[:n], y[:n])
        leaky = position_losses(model, x[:n], y[:n])
        out["leaky_bpb"] = held.bpb(float(leaky.mean()))
        out["honest_bpb"] = held.bpb(float(honest.mean()))
    if "sample" in claim.measures:
        out["sample"] = _sample(model, ckpt, held, 48 if quick else 160)
    if attention and ("diagonal" in claim.measures or "previous_head" in claim.measures or "roles" in claim.measures):
        n = 4 if quick else 16
        with torch.no_grad():
            attn = torch.stack(model(x[:n], return_attention=True).attentions, dim=1).float().numpy()
        scores = role_scores(attn, x[:n].numpy())
        out["self_mass"] = float(scores["self"].mean())
        out["max_previous_token"] = float(scores["previous_token"].max())
        labels = [head_label(scores, layer, h) for layer in range(attn.shape[1]) for h in range(attn.shape[2])]
        out["roles_named"] = sorted({lab for lab in labels if lab != "mixed"})
        out["heads_with_a_role"] = sum(lab != "mixed" for lab in labels)
    if "ablation" in claim.measures and attention:
        n = 4 if quick else 16
        effects = ablation_effects(model, x[:n], y[:n])
        out["heads_that_matter"] = int((effects > 0.01).sum())
        out["heads"] = int(effects.size)
    if "attention" in claim.measures and attention:
        stats = attention_stats(model, x[: 4 if quick else 16])
        out["entropy_by_layer"] = stats.entropy.round(4).tolist()
        out["max_score"] = float(stats.max_score.max())
    return out


def _long_context_bpb(ckpt, model, held: Held) -> float | None:
    """Bits/byte on windows of twice the trained context, for encodings that have no table of positions."""
    cfg = model.config
    if getattr(cfg, "pos_encoding", "learned") == "learned":
        return None
    try:
        longer = ckpt.build_model("cpu", replace(cfg, block_size=2 * cfg.block_size))
    except (CheckpointError, RuntimeError):
        return None
    return held.bpb(float(position_losses(longer, held.x, held.y).mean()))


def _sample(model, ckpt, held: Held, n_tokens: int) -> str:
    from model import generate

    tok = ckpt.tokenizer()
    prompt = held.x[:1, :16]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        out = generate(model, prompt, n_tokens, temperature=0.8, top_k=50, generator=gen)
    return tok.decode(out[0].tolist())


# ------------------------------------------------------------------------------------------------------------
# the verdict


def seed_spread(results: dict, metric: str = "bpb", arms: tuple[str, ...] | None = None) -> float | None:
    """The largest difference between two seeds of one arm, over `arms` (default: every arm); None with one seed."""
    chosen = [r for name, r in results.items() if arms is None or name in arms]
    spreads = [max(v) - min(v) for v in (_values(r, metric) for r in chosen) if len(v) > 1]
    return max(spreads) if spreads else None


def _values(arm_results: list[dict], metric: str) -> list[float]:
    return [r[metric] for r in arm_results if r.get(metric) is not None]


def mean_of(results: dict, arm: str, metric: str) -> float | None:
    v = _values(results.get(arm, []), metric)
    return float(np.mean(v)) if v else None


def verdict(expect: Expect, results: dict) -> str:
    better, worse = mean_of(results, expect.better, expect.metric), mean_of(results, expect.worse, expect.metric)
    if better is None or worse is None:
        return f"{expect.better} vs {expect.worse}: not measured"
    diff = worse - better
    spread = seed_spread(results, expect.metric, (expect.better, expect.worse))  # the two arms compared
    unit = "bits/byte" if expect.metric.endswith("bpb") else f"in {expect.metric} (lower is better)"
    what = f"{expect.worse} is {'worse' if diff > 0 else 'better'} than {expect.better} by {abs(diff):.3f} {unit}"
    if spread is None:
        return f"{what} (one seed: no spread measured, so no verdict beyond the sign)"
    ratio = abs(diff) / spread if spread > 0 else math.inf
    times = f"{ratio:.1f}x the seed spread ({spread:.3f})"
    if abs(diff) <= 2 * spread:
        return f"{what}, {times}: no difference beyond the seed spread"
    return f"{what}, {times}: " + ("the claim holds at this scale" if diff > 0 else "the claim fails at this scale")


# ------------------------------------------------------------------------------------------------------------
# the report


def arm_table(claim: Claim, results: dict) -> str:
    keys = sorted({k for rs in results.values() for r in rs for k, v in r.items()
                   if isinstance(v, (int, float)) and k not in ("bpb", "seed", "seconds")})
    head = ["arm", "bits/byte (mean)", "seeds", "spread"] + keys + ["seconds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in claim.arms:
        rs = results.get(arm.name, [])
        if not rs:
            continue
        bpbs = _values(rs, "bpb")
        cells = [arm.name, f"{np.mean(bpbs):.4f}", ", ".join(f"{b:.4f}" for b in bpbs),
                 f"{max(bpbs) - min(bpbs):.4f}" if len(bpbs) > 1 else "-"]
        for k in keys:
            v = _values(rs, k)
            cells.append(_fmt(float(np.mean(v))) if v else "-")
        cells.append(f"{np.mean([r['seconds'] for r in rs]):.0f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _fmt(v: float) -> str:
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4f}" if abs(v) < 10 else f"{v:.2f}"


def log_bins(curve: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The loss by position averaged over positions 1, 2, 3-4, 5-8, ... (a log axis gets equal-width bins)."""
    edges = [1, 2, 3] + [2 ** k + 1 for k in range(2, 20) if 2 ** k < len(curve)] + [len(curve) + 1]
    centres = [np.sqrt(a * (b - 1)) for a, b in zip(edges, edges[1:])]
    return np.asarray(centres), np.asarray([curve[a - 1:b - 1].mean() for a, b in zip(edges, edges[1:])])


LEGEND = {"leaky_bpb": "as trained: the whole window in view", "honest_bpb": "honest: every later token cut off",
          "bpb": "whole-split bits/byte"}


def plot(claim: Claim, results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if claim.plot.startswith("bars:"):
        metrics = claim.plot[5:].split(",")
        arms = [a.name for a in claim.arms if results.get(a.name)]
        width = 0.8 / len(metrics)
        for m, metric in enumerate(metrics):
            values = [_values(results[a], metric) for a in arms]
            mean = [float(np.mean(v)) if v else np.nan for v in values]
            err = [[mu - min(v) for mu, v in zip(mean, values)], [max(v) - mu for mu, v in zip(mean, values)]]
            ax.bar(np.arange(len(arms)) + m * width, mean, width, yerr=err, capsize=3, label=LEGEND.get(metric, metric))
        ax.set_xticks(np.arange(len(arms)) + 0.4 - width / 2, arms, fontsize=8)
        ax.set_ylabel("bits/byte (bars: seeds' min and max)")
    for arm in claim.arms if not claim.plot.startswith("bars:") else ():
        for r in results.get(arm.name, [])[:1]:  # the first seed of each arm
            if claim.plot == "position" and "position_loss" in r:
                centres, means = log_bins(np.asarray(r["position_loss"]))
                ax.plot(centres, means, marker="o", label=arm.name)
                ax.set_xlabel("position in the context (tokens seen; means over 1, 2, 3-4, 5-8, ... )")
                ax.set_ylabel("validation loss (nats/token)")
                ax.set_xscale("log")
            elif r.get("val_curve"):
                steps, losses = zip(*r["val_curve"])
                ax.plot(steps, losses, marker="o", label=arm.name)
                ax.set_xlabel("step")
                ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"claim '{claim.name}': {claim.statement[:70]}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_text(path: Path, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text if text.endswith("\n") else text + "\n")


def machine() -> str:
    cpu = cpu_model()
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    bf16 = "AMX-BF16" if caps.get("amx_bf16") else "AVX512-BF16" if caps.get("avx512_bf16") else "no native bf16"
    return f"{cpu} ({bf16}), {os.cpu_count()} cores, torch {torch.__version__}"


def write_report(claim: Claim, results: dict, out: Path, quick: bool, extra: str = "") -> Path:
    verdicts = [verdict(e, results) for e in claim.expect]
    lines = [f"# Claim `{claim.name}`{' (--quick: a smoke run, not a measurement)' if quick else ''}", "",
             f"> {claim.statement}", "",
             f"Machine: {machine()}." + (f" Base preset: configs/experiment/claims.yaml"
                                         f"{' with the --quick overrides' if quick else ''}; seeds "
                                         f"{', '.join(map(str, claim.seeds))}." if claim.arms else ""),
             ""]
    if claim.arms:
        scored = "64 held-out windows" if quick else "the whole held-out split, float32 (`python -m attention_lab.evaluate`)"
        lines += [arm_table(claim, results), "", f"bits/byte: {scored}; spread: the largest difference between "
                  "two seeds of one arm; seconds: one arm's training, wall clock.", ""]
    if verdicts:
        lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts] + [""]
    if extra:
        lines += [extra, ""]
    lines += ["## Published", "", claim.published, ""]
    if claim.arms:
        lines += ["![plot](plot.png)", ""]
    report = out / "report.md"
    write_text(report, "\n".join(lines))
    write_json_atomic(out / "results.json", {"claim": claim.name, "quick": quick, "machine": machine(),
                                              "results": results, "verdicts": verdicts})
    return report


def samples_section(results: dict) -> str:
    parts = ["## Samples (temperature 0.8, the same held-out prompt)", ""]
    for arm, rs in results.items():
        if rs and rs[0].get("sample"):
            text = rs[0]["sample"].replace("\n", " / ")
            parts += [f"- **{arm}**: {text[:400]}"]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------------------
# the claims without arms


def run_context(run: Path, out: Path, quick: bool) -> str:
    ckpt = load_checkpoint(run, "best")
    model = ckpt.build_model("cpu")
    t = model.config.block_size
    held = Held.of(run, t // 2 if 2 * t > 4096 else t, 8 if quick else 64)
    x = held.x[:, :t]
    sim = contextual_similarity(model, x, n_tokens=10 if quick else 30)
    tok = ckpt.tokenizer()
    rows = ["| after | same token, different contexts | random pairs | difference |", "|---|--:|--:|--:|"]
    for layer, (s, b) in enumerate(zip(sim.self_similarity, sim.baseline)):
        name = "embedding" if layer == 0 else f"block {layer}"
        rows.append(f"| {name} | {s:.3f} | {b:.3f} | {s - b:.3f} |")
    # one frequent word (not a bare function token if one has 4+ letters) in two contexts: what is nearest to it
    # after the last block, each neighbour with the tokens before it
    words = [t for t in sim.tokens if sum(c.isalpha() for c in tok.decode([t])) >= 4]
    token = (words or sim.tokens)[0]
    where = [(int(b), int(p)) for b, p in zip(*np.nonzero(x.numpy() == token)) if p >= 8]

    def snippet(w: int, p: int, before: int = 6) -> str:
        return tok.decode(x[w, max(0, p - before): p + 1].tolist()).replace("\n", " / ")

    near = []
    for w in (where[0], where[-1]) if len(where) > 1 else where[:1]:
        found = [f"\"...{snippet(nw, np_)}\" ({c:.2f})" for nw, np_, _, c in nearest_in_context(model, x, w, k=3)]
        near.append(f"- `{tok.decode([token])}` in \"...{snippet(*w, before=12)}\": nearest after the last block: "
                    + "; ".join(found))
    results = {"run": str(run), "self_similarity": sim.self_similarity.round(4).tolist(),
               "baseline": sim.baseline.round(4).tolist(), "tokens": sim.tokens, "pairs": sim.pairs}
    write_json_atomic(out / "similarity.json", results)
    verdict_line = (f"From the embedding to the last block the same token's similarity above random pairs goes "
                    f"{sim.contextual[0]:.3f} -> {sim.contextual[-1]:.3f}: "
                    + ("the context moves a token's vector away from its other occurrences, the claim holds"
                       if sim.contextual[-1] < sim.contextual[0] else "no contextualisation measured"))
    return "\n".join([f"Run: `{run}` ({len(x)} held-out windows of {t} tokens, {len(sim.tokens)} frequent tokens, "
                      f"{sim.pairs} same-token pairs per layer).", "", *rows, "", "## Verdict", "", f"- {verdict_line}",
                      "", "## One token in two contexts", "", *near])


def run_quadratic(out: Path, quick: bool) -> str:
    cmd = [sys.executable, "-m", "bench.run", "--only", "attention", "--out", str(out / "bench.json"),
           "--md", str(out / "bench.md")] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench/attention.py failed:\n{proc.stderr[-1500:]}")
    table = (out / "bench.md").read_text() if (out / "bench.md").exists() else proc.stdout
    rows = json.loads((out / "bench.json").read_text())["tables"]["attention"]["rows"]
    lines = ["## Verdict", ""]
    for method in ("sdpa causal", "window blocks", "linear"):
        ts = sorted(r["T"] for r in rows if r["method"] == method and r.get("growth"))
        big = [r["growth"] for r in rows if r["method"] == method and r.get("growth") and r["T"] >= ts[len(ts) // 2]]
        if big:
            lines.append(f"- {method}: doubling the context multiplies the forward + backward time by "
                         f"{np.median(big):.2f} (median over T >= {ts[len(ts) // 2]:,}; quadratic would be 4, linear 2)")
    return "\n".join(lines) + "\n\nThe wall, measured now by `python -m bench.run --only attention` " \
        "(docs/variants.md has the full tables and the plot):\n\n" + table


# ------------------------------------------------------------------------------------------------------------
# the command


def run_claim(claim: Claim, out: Path, quick: bool = False, seeds: tuple[int, ...] | None = None,
              run: Path | None = None, arms: tuple[str, ...] | None = None, overrides: tuple[str, ...] = (),
              train=train_arm, log=print) -> Path:
    """Train (or reuse) every arm x seed into out/runs/, measure each, write out/report.md, results.json and
    plot.png. arms: only these (by name); overrides: appended to every arm's (e.g. data.cache_dir=...);
    train(run_dir, overrides) -> seconds trains one arm (default: a train.py subprocess)."""
    out.mkdir(parents=True, exist_ok=True)
    claim = replace(claim, seeds=seeds) if seeds is not None and claim.arms else claim
    if arms:
        unknown = set(arms) - {a.name for a in claim.arms}
        if unknown:
            raise ValueError(f"claim {claim.name} has no arm {sorted(unknown)}; its arms: "
                             f"{', '.join(a.name for a in claim.arms)}")
        claim = replace(claim, arms=tuple(a for a in claim.arms if a.name in arms))
    if claim.name == "context":
        return write_report(claim, {}, out, quick, run_context(run or _default_run(), out, quick))
    if claim.name == "quadratic":
        return write_report(claim, {}, out, quick, run_quadratic(out, quick))
    results: dict[str, list[dict]] = {}
    held = None
    minutes = None
    for arm in claim.arms:
        for seed in claim.seeds:
            run_dir = arm_dir(out, arm, seed)
            arm_overrides = [*BASE, *(QUICK if quick else ()), f"name=claims-{claim.name}", f"train.seed={seed}"]
            arm_overrides += [o.replace("{minutes}", f"{minutes:.3f}") if minutes else o for o in arm.overrides]
            arm_overrides += list(overrides)
            log(f"claim {claim.name}: arm '{arm.name}' seed {seed} ({' '.join(arm.overrides) or 'the base'}) ...")
            twin = None if (run_dir / "claims_done.json").exists() else finished_twin(out, arm_overrides)
            if twin is not None:  # the same run, trained for another claim: copied, so this claim's folder is whole
                log(f"  the same run as {twin}: copied")
                shutil.copytree(twin, run_dir, dirs_exist_ok=True)
            seconds = train(run_dir, arm_overrides)
            if minutes is None:  # the first arm's wall time (start-up included): an equal-time arm's budget
                minutes = max(seconds / 60.0, 0.05)
            m = metrics_of(run_dir)
            if held is None:
                ckpt = load_checkpoint(run_dir, "best")
                held = Held.of(run_dir, ckpt.config.block_size, 8 if quick else 256)
            r = {"seed": seed, "seconds": seconds, "steps": m["steps"], "train_loss": m["train_loss"],
                 "tokens_per_s": m["tokens_per_s"], "val_curve": m["val_curve"]}
            if "train_loss" in claim.measures:
                r["max_train_loss_late"] = m["max_train_loss_late"]
            r |= measure(claim, run_dir, held, quick)
            log(f"  {arm.name} seed {seed}: {r['bpb']:.4f} bits/byte in {seconds:.0f} s")
            results.setdefault(arm.name, []).append(r)
    report = write_report(claim, results, out, quick, samples_section(results) if "sample" in claim.measures else "")
    plot(claim, results, out / "plot.png")
    return report


def _default_run() -> Path:
    from attention_lab.store.checkpoint import latest_run

    return latest_run(Path("runs"))


def compare(runs: list[Path], out: Path) -> Path:
    """A table and a plot of any runs: whole-split bits/byte, steps, parameters, tokens/s, validation curves."""
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for run in runs:
        m = metrics_of(run)
        ckpt = load_checkpoint(run, "best")
        results[str(run)] = [{"bpb": score_run(run).bits_per_byte, "steps": m["steps"],
                              "params": sum(p.numel() for p in ckpt.build_model("cpu").parameters()),
                              "tokens_per_s": m["tokens_per_s"], "val_curve": m["val_curve"], "seconds": 0.0}]
    claim = Claim("compare", "runs side by side", tuple(Arm(str(r)) for r in runs), (), (), "", seeds=(0,))
    lines = ["# Runs compared", "", f"Machine: {machine()}.", "", arm_table(claim, results), ""]
    write_text(out / "report.md", "\n".join(lines))
    write_json_atomic(out / "results.json", results)
    plot(claim, results, out / "plot.png")
    return out / "report.md"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="claims: " + ", ".join(CLAIMS) + "; or: compare RUN [RUN ...]")
    p.add_argument("name", nargs="?", help="a claim (see --list), or `compare`")
    p.add_argument("runs", nargs="*", type=Path, help="compare: the run folders")
    p.add_argument("--list", action="store_true", help="name the claims, their statements and arms")
    p.add_argument("--quick", action="store_true", help="a tiny version in seconds (a smoke run, not a measurement)")
    p.add_argument("--seeds", type=lambda s: tuple(int(x) for x in s.split(",")), help="e.g. 1,2 (default: the claim's)")
    p.add_argument("--out", type=Path, help="the report folder (default: claims/<name>, or claims/<name>-quick)")
    p.add_argument("--run", type=Path, help="context: the trained run to read (default: the newest under runs/)")
    p.add_argument("--arms", type=lambda s: tuple(a.strip() for a in s.split(",")),
                   help="only these arms, by name, comma-separated (see --list)")
    args = p.parse_args(argv)
    if args.list or not args.name:
        for c in CLAIMS.values():
            arms = ", ".join(a.name for a in c.arms) or NO_ARMS[c.name]
            print(f"{c.name:<10} {c.statement}\n{'':<10} arms: {arms}")
        return 0
    if args.name == "compare":
        if len(args.runs) < 1:
            p.error("compare needs at least one run folder")
        return cli.run(lambda: print(compare(args.runs, args.out or Path("claims/compare"))), CheckpointError)
    if args.name not in CLAIMS:
        p.error(f"unknown claim {args.name!r}; choose from {', '.join(CLAIMS)} (or compare)")
    out = args.out or Path("claims") / (args.name + ("-quick" if args.quick else ""))

    def go() -> None:
        t0 = time.time()
        report = run_claim(CLAIMS[args.name], out, args.quick, args.seeds, args.run, args.arms)
        print(f"report: {report} ({(time.time() - t0) / 60:.1f} min)")
    return cli.run(go, CheckpointError, RuntimeError)


if __name__ == "__main__":
    sys.exit(main())
