"""The GPU path in one prepared call: every step that matters on an accelerator, one table, a non-zero exit on failure.

    python -m bench.gpu_check                  # the device it finds (cuda where there is one); at most ~8 min on one H100
    python -m bench.gpu_check --device cpu     # the same steps at tiny sizes (the test suite runs this)
    make gpu-check

A GPU is lent here for minutes at a time, so this is written to run once, top to bottom, without a person:
each step runs even when an earlier one failed (its error is kept, with the last lines of its traceback), the
table is printed at the end (and written as JSON with --json), and the exit status is 1 if any step failed.

The steps, in the order a first GPU user meets them:

  env        torch, the device, bf16 support, which fused SDPA kernels exist
  peak       the matmul peak in the run's dtype (bf16 on a GPU): the MFU denominator
  sdpa       the fused kernel against the explicit `math` path, float32 and bf16, forward and gradients
  cache      KV-cache decoding equal to the uncached forward, every step, for three variants
  capture    the attention weights a forward records: rows sum to 1, future keys exactly 0, in bf16 autocast
  generate   sampling with and without the cache gives the same greedy text
  train      experiment=baby_gpu (bf16, torch.compile, fused AdamW) for a few hundred steps: tokens/s and MFU
  resume     the checkpoint reloads and trains on from where it stopped
  sample     sample.py with attention maps (attention.npy and the page)
  export     the run exported for transformers and loaded back: logits equal
  lab        the live lab's analyze and generate on the device (in-process, no socket)
  exercise   a learner's attention checked, then trained with model.attn_impl on the device
  claim      a claim --quick with several runs side by side on one device

Tolerances are stated where they are used (TOL below): bf16 keeps 8 bits of mantissa, so a fused kernel and the
math path differ by a few 1e-3 relative in bf16 and by ~1e-6 in float32.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
LAB_TEXT = "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."

# maximum absolute difference allowed, per comparison and dtype (logits of a randomly initialised model are O(1))
TOL = {
    ("sdpa", torch.float32): 1e-4,
    ("sdpa", torch.bfloat16): 6e-2,
    ("cache", torch.float32): 1e-4,
    ("cache", torch.bfloat16): 1.5e-1,
    ("export", torch.float32): 1e-4,
}


@dataclass
class Sizes:
    """What each step runs at: real sizes on a GPU, seconds on a CPU."""

    n_layer: int
    n_head: int
    n_embd: int
    block: int
    batch: int
    train_steps: int
    train_preset: tuple[str, ...]
    claim_args: tuple[str, ...]
    sample_tokens: int
    lab_text: str

    @classmethod
    def for_device(cls, device: torch.device) -> Sizes:
        if device.type == "cuda":
            return cls(n_layer=4, n_head=8, n_embd=512, block=512, batch=8, train_steps=300,
                       train_preset=("experiment=baby_gpu", "train.eval_interval=100", "train.eval_batches=20",
                                     "train.log_interval=25"),
                       claim_args=("mask", "--quick", "--seeds", "1,2", "--launcher", "joblib", "--jobs", "3"),
                       sample_tokens=200, lab_text=LAB_TEXT)
        # the CPU: the same steps at tiny sizes, so the suite runs every line of this file in seconds
        return cls(n_layer=2, n_head=2, n_embd=32, block=32, batch=2, train_steps=12,
                   train_preset=("experiment=debug", "train.eval_interval=6", "train.eval_batches=2",
                                 "train.log_interval=3", "train.compile=false"),
                   claim_args=("mask", "--quick", "--seeds", "1", "--arms", "before_softmax,after_softmax",
                               "--rates", "1", "--launcher", "basic"),
                   sample_tokens=16, lab_text=LAB_TEXT[:24])


@dataclass
class Check:
    """What the steps share: the device, the sizes, a scratch folder, and what earlier steps left (the run)."""

    device: torch.device
    sizes: Sizes
    work: Path
    timeout: float
    found: dict = field(default_factory=dict)

    @property
    def bf16(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_bf16_supported()

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.bfloat16) if self.bf16 else (torch.float32,)

    def run(self, *args: str, cwd: Path | None = None) -> str:
        """A project command in a subprocess (the way a user runs it); its output, or an error with its tail."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   PYTHONUNBUFFERED="1")
        proc = subprocess.run([sys.executable, *args], cwd=cwd or REPO, env=env, capture_output=True, text=True,
                              timeout=self.timeout)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            tail = "\n".join(out.strip().splitlines()[-15:])
            raise RuntimeError(f"`{' '.join(args[:4])} ...` exited {proc.returncode}:\n{tail}")
        return out


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def within(what: str, err: float, tol: float) -> str:
    if not err <= tol:  # NaN fails too
        raise AssertionError(f"{what}: max |difference| {err:.3g} exceeds the tolerance {tol:g}")
    return f"{what} {err:.1e}"


def tiny_model(ck: Check, **options):
    from model import GPT, GPTConfig

    s = ck.sizes
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, block_size=s.block, n_layer=s.n_layer, n_head=s.n_head, n_embd=s.n_embd,
                    **options)
    return GPT(cfg).to(ck.device).eval()


# ----------------------------------------------------------------------------------------------------------
# the steps: each returns one line for the table, or raises


def step_env(ck: Check) -> str:
    from attention_lab.runtime.device import cpu_model

    parts = [f"torch {torch.__version__}"]
    if ck.device.type == "cuda":
        p = torch.cuda.get_device_properties(ck.device)
        parts += [p.name, f"sm_{p.major}{p.minor}", f"{p.total_memory / 2**30:.0f} GiB",
                  f"bf16 {'yes' if ck.bf16 else 'no'}",
                  "flash " + ("yes" if torch.backends.cuda.is_flash_attention_available() else "no"),
                  f"CUDA {torch.version.cuda}"]
        ck.found["gpu"] = p.name
    parts.append(f"CPU {cpu_model()}")
    return ", ".join(parts)


def step_peak(ck: Check) -> str:
    from attention_lab.runtime.flops import measure_peak_flops

    dtype = torch.bfloat16 if ck.bf16 else torch.float32
    peak = measure_peak_flops(ck.device, dtype, quick=ck.device.type == "cpu")
    ck.found["peak_flops"] = peak
    return f"{peak / 1e12:.1f} TFLOP/s {str(dtype).removeprefix('torch.')} (best square matmul)"


def step_sdpa(ck: Check) -> str:
    """The fused kernel (sdpa) against the explicit math path: logits, and the gradients of a loss, per dtype."""
    from attention_lab.runtime.device import autocast

    s = ck.sizes
    idx = torch.randint(0, 256, (s.batch, s.block), device=ck.device)
    lines = []
    for dtype in ck.dtypes:
        outs = {}
        for backend in ("math", "sdpa"):
            m = tiny_model(ck, attn_backend=backend, pos_encoding="rope")
            with autocast(ck.device, dtype):
                out = m(idx, targets=idx)
            out.loss.backward()
            outs[backend] = (out.logits.detach(), m.transformer.h[0].attn.c_attn.weight.grad)
        tol = TOL[("sdpa", dtype)]
        name = str(dtype).removeprefix("torch.")
        lines.append(within(f"{name} logits", max_diff(*[o[0] for o in outs.values()]), tol))
        grad_scale = outs["math"][1].abs().max().item() or 1.0
        lines.append(within(f"{name} grad (rel)", max_diff(*[o[1] for o in outs.values()]) / grad_scale, tol))
    return "; ".join(lines)


def step_cache(ck: Check) -> str:
    """Decoding one token at a time with the KV cache gives the logits of the full forward at every position."""
    from attention_lab.runtime.device import autocast

    s = ck.sizes
    t = min(s.block, 64)
    idx = torch.randint(0, 256, (2, t), device=ck.device)
    lines = []
    variants = {"rope": dict(pos_encoding="rope"), "gqa+window": dict(n_kv_head=1, window=8),
                "alibi": dict(pos_encoding="alibi")}
    for dtype in ck.dtypes:
        worst = 0.0
        for options in variants.values():
            m = tiny_model(ck, **options)
            with torch.no_grad(), autocast(ck.device, dtype):
                full = m(idx).logits
                cache = m.new_kv_cache()
                steps = [m(idx[:, i:i + 1], kv_cache=cache).logits for i in range(t)]
            worst = max(worst, max_diff(torch.cat(steps, dim=1), full))
        lines.append(within(f"{str(dtype).removeprefix('torch.')} {len(variants)} variants x {t} steps", worst,
                            TOL[("cache", dtype)]))
    return "; ".join(lines)


def step_capture(ck: Check) -> str:
    from attention_lab.runtime.device import autocast

    s = ck.sizes
    m = tiny_model(ck, attn_backend="sdpa")
    idx = torch.randint(0, 256, (1, s.block), device=ck.device)
    dtype = torch.bfloat16 if ck.bf16 else torch.float32
    with torch.no_grad(), autocast(ck.device, dtype):
        out = m(idx, return_attention=True)
    w = torch.stack([a.float() for a in out.attentions])  # (L, B, nh, T, T)
    rows = within("rows sum to 1", max_diff(w.sum(-1), torch.ones_like(w.sum(-1))), 1e-2)
    future = torch.ones(s.block, s.block, dtype=torch.bool, device=ck.device).triu(1)
    leaked = w[..., future].abs().max().item()
    if leaked != 0.0:
        raise AssertionError(f"a future key got weight {leaked:.3g}; it must be exactly 0")
    return f"{rows}; future keys exactly 0 ({str(w.dtype).removeprefix('torch.')} captured under "\
           f"{str(dtype).removeprefix('torch.')} autocast)"


def step_generate(ck: Check) -> str:
    from model.generate import generate

    m = tiny_model(ck)
    idx = torch.randint(0, 256, (1, 4), device=ck.device)
    n = ck.sizes.block - 4
    with torch.no_grad():
        a = generate(m, idx, n, greedy=True, use_cache=True)
        b = generate(m, idx, n, greedy=True, use_cache=False)
    if not torch.equal(a, b):
        first = (a != b).nonzero()[0, 1].item()
        raise AssertionError(f"greedy text with the cache differs from without it from token {first}")
    return f"{n} greedy tokens, cached == uncached"


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def step_train(ck: Check) -> str:
    run = ck.work / "run"
    dev = "cuda" if ck.device.type == "cuda" else "cpu"
    t0 = time.perf_counter()
    ck.run("train.py", *ck.sizes.train_preset, f"train.max_steps={ck.sizes.train_steps}", f"train.device={dev}",
           "train.max_minutes=null", f"hydra.run.dir={run}")
    wall = time.perf_counter() - t0
    rows = _metrics(run)
    steps = [r for r in rows if "tokens_per_s" in r]
    evals = [r for r in rows if "val_loss" in r]
    if not steps or not all(math.isfinite(r["loss"]) for r in steps):
        raise AssertionError(f"training logged no finite loss: {steps[-3:]}")
    if evals and not evals[-1]["val_loss"] < steps[0]["loss"]:
        raise AssertionError(f"val loss {evals[-1]['val_loss']:.3f} is not below the first step's {steps[0]['loss']:.3f}")
    steady = steps[len(steps) // 2:] or steps  # past the compile and warm-up
    tps = sorted(r["tokens_per_s"] for r in steady)[len(steady) // 2]
    mfu = sorted(r["mfu"] for r in steady)[len(steady) // 2]
    cfg = json.loads((run / "config.json").read_text())
    compiled = cfg.get("train", cfg).get("compile")
    prov = json.loads((run / "provenance.json").read_text())  # the dtype the run computed in, and its MFU peak
    ck.found.update(run=run, tokens_per_s=tps, mfu=mfu)
    val = f", val {evals[-1]['val_loss']:.3f} nats/token" if evals else ""
    return (f"{ck.sizes.train_steps} steps in {wall:.0f} s (compile {compiled}, {prov.get('peak_dtype')}): "
            f"loss {steps[0]['loss']:.2f} -> {steps[-1]['loss']:.2f}{val}; {tps:,.0f} tokens/s, "
            f"MFU {100 * mfu:.1f}% of the run's measured {prov.get('peak_flops', 0) / 1e12:.3g} TFLOP/s "
            "(median of the second half)")


def _need_run(ck: Check) -> Path:
    if "run" not in ck.found:
        raise RuntimeError("needs the run that the `train` step makes: it failed or did not run (or pass --run DIR)")
    return ck.found["run"]


def step_resume(ck: Check) -> str:
    run = _need_run(ck)
    more = ck.sizes.train_steps + max(2, ck.sizes.train_steps // 10)
    dev = "cuda" if ck.device.type == "cuda" else "cpu"
    ck.run("train.py", *ck.sizes.train_preset, f"train.max_steps={more}", f"train.device={dev}",
           "train.max_minutes=null", f"hydra.run.dir={run}")
    last = max(r["step"] for r in _metrics(run))
    if last != more:
        raise AssertionError(f"the resumed run stopped at step {last}, not {more}")
    return f"resumed at {ck.sizes.train_steps}, trained on to {more}"


def step_sample(ck: Check) -> str:
    run = _need_run(ck)
    out = ck.work / "sample"
    ck.run("sample.py", "--run", str(run), "--prompt", "ROMEO:", "--max-new-tokens", str(ck.sizes.sample_tokens),
           "--seed", "1", "--device", ck.device.type, "--out", str(out))
    maps = list(out.rglob("attention.npy"))
    pages = list(out.rglob("*.html"))
    if not maps or not pages:
        raise AssertionError(f"sample.py wrote no attention.npy or page under {out}: {sorted(out.rglob('*'))[:10]}")
    import numpy as np

    a = np.load(maps[0])
    return f"{ck.sizes.sample_tokens} tokens; attention.npy {tuple(a.shape)}, page {pages[0].stat().st_size // 1024} KiB"


def step_export(ck: Check) -> str:
    run = _need_run(ck)
    out = ck.work / "export"
    ck.run("-m", "attention_lab.export", str(run), str(out))
    from transformers import AutoModelForCausalLM

    from attention_lab.store.checkpoint import load_checkpoint

    ckpt = load_checkpoint(run)
    ours = ckpt.build_model(ck.device).eval()
    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).to(ck.device).eval()
    idx = torch.randint(0, ours.config.vocab_size, (1, min(32, ours.config.block_size)), device=ck.device)
    with torch.no_grad():
        err = max_diff(hf(idx).logits, ours(idx).logits)
    return within(f"{type(hf).__name__} reloaded, float32 logits", err, TOL[("export", torch.float32)])


def step_lab(ck: Check) -> str:
    run = _need_run(ck)
    from starlette.testclient import TestClient

    from attention_lab.lab.app import create_app
    from attention_lab.lab.models import Registry

    text = ck.sizes.lab_text
    with TestClient(create_app(Registry.open([run], device=ck.device)), base_url="http://127.0.0.1:8008") as c:
        t0 = time.perf_counter()
        r = c.post("/api/analyze", json={"text": text})
        analyze_ms = 1000 * (time.perf_counter() - t0)
        if r.status_code != 200:
            raise AssertionError(f"/api/analyze answered {r.status_code}: {r.text[:300]}")
        t0 = time.perf_counter()
        with c.stream("POST", "/api/generate", json={"text": "ROMEO:", "max_new_tokens": 20, "seed": 1}) as g:
            if g.status_code != 200:
                raise AssertionError(f"/api/generate answered {g.status_code}: {g.read()[:300]!r}")
            lines = [json.loads(x) for x in g.iter_lines() if x]
        generate_ms = 1000 * (time.perf_counter() - t0)
    return f"analyze {len(text)} chars {analyze_ms:.0f} ms (first call); generate 20 tokens {generate_ms:.0f} ms, " \
           f"{len(lines)} lines streamed"


def step_exercise(ck: Check) -> str:
    folder = ck.work / "exercise"
    folder.mkdir(exist_ok=True)
    answer = ck.run("-m", "attention_lab.exercises", "solution", "attention", "--anyway")
    body = "\n".join(line for line in answer.splitlines() if not line.startswith("#"))
    (folder / "attention.py").write_text("import math\n\nimport torch\n\n\n" + body.strip() + "\n")
    ck.run("-m", "attention_lab.exercises", "check", "attention", str(folder / "attention.py"))
    dev = "cuda" if ck.device.type == "cuda" else "cpu"
    run = ck.work / "learner_run"
    ck.run("train.py", "experiment=debug", "train.max_steps=6", "train.eval_interval=3", f"train.device={dev}",
           f"model.attn_impl={folder / 'attention.py'}:attention", f"hydra.run.dir={run}")
    last = [r for r in _metrics(run) if "val_loss" in r][-1]
    return f"check passed; trained 6 steps with it on {dev}: val {last['val_loss']:.3f} nats/token"


def step_claim(ck: Check) -> str:
    out = ck.work / "claim"
    t0 = time.perf_counter()
    ck.run("-m", "attention_lab.claims", *ck.sizes.claim_args, "--out", str(out))
    wall = time.perf_counter() - t0
    results = json.loads((out / "results.json").read_text())
    runs = results.get("all_runs") or results.get("runs") or []
    n = len(runs) if isinstance(runs, (list, dict)) else runs
    return f"{ck.sizes.claim_args[0]} --quick: report written, {n} runs in {wall:.0f} s"


STEPS: dict[str, Callable[[Check], str]] = {
    "env": step_env, "peak": step_peak, "sdpa": step_sdpa, "cache": step_cache, "capture": step_capture,
    "generate": step_generate, "train": step_train, "resume": step_resume, "sample": step_sample,
    "export": step_export, "lab": step_lab, "exercise": step_exercise, "claim": step_claim,
}


# ----------------------------------------------------------------------------------------------------------
# the story


def run_steps(ck: Check, names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            result, ok = STEPS[name](ck), True
        except Exception as e:  # one step's failure is a row of the table, never the end of the check
            tb = traceback.format_exception(e)
            result, ok = f"{type(e).__name__}: {e}".strip(), False
            print("".join(tb[-6:]), file=sys.stderr, flush=True)
        rows.append({"step": name, "ok": ok, "seconds": round(time.perf_counter() - t0, 1), "result": result})
        print(f"gpu_check: {name} {'ok' if ok else 'FAILED'} ({rows[-1]['seconds']} s)", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], ck: Check) -> str:
    where = ck.found.get("gpu", str(ck.device))
    lines = [f"GPU check on {where} ({ck.device}), torch {torch.__version__}", "",
             "| step | status | s | result |", "| --- | --- | --- | --- |"]
    for r in rows:
        result = r["result"].replace("|", "/").replace("\n", " ")
        lines.append(f"| {r['step']} | {'ok' if r['ok'] else '**FAILED**'} | {r['seconds']} | {result[:400]} |")
    failed = [r["step"] for r in rows if not r["ok"]]
    total = sum(r["seconds"] for r in rows)
    lines += ["", f"{len(rows) - len(failed)} of {len(rows)} steps passed in {total:.0f} s"
              + (f"; failed: {', '.join(failed)}" if failed else "")]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", help="auto (cuda where there is one), cuda, cuda:N or cpu")
    p.add_argument("--only", help=f"comma-separated steps (default: all): {', '.join(STEPS)}")
    p.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--run", type=Path, help="a run folder for the steps after train (default: the one train makes)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for any one subprocess (default 300)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from attention_lab.runtime.device import pick_device

    try:
        device = pick_device(args.device, "--device")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = args.only.split(",") if args.only else list(STEPS)
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        print(f"error: unknown step {', '.join(unknown)}; the steps are {', '.join(STEPS)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ck = Check(device, Sizes.for_device(device), work, args.timeout)
        if args.run:
            ck.found["run"] = args.run.resolve()
        rows = run_steps(ck, names)
    print(table(rows, ck), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": str(device), "gpu": ck.found.get("gpu"), "torch": torch.__version__,
                                         "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
