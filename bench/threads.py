"""How OpenMP's waiting threads should wait: training and decoding tokens/s per setting, idle and contended.

    python -m bench.threads                     3 rounds, about 6 minutes on 2 cores
    python -m bench.threads --rounds 1 --quick  tiny model, seconds: checks that it runs

torch's CPU ops run on an OpenMP pool (GNU libgomp in the pip wheels). When a thread finishes its share of an
op it waits for the others, spinning for GOMP_SPINCOUNT iterations before it sleeps; OMP_WAIT_POLICY=PASSIVE
sleeps at once (every op then pays a futex wake-up), ACTIVE spins practically forever, and the default (unset)
spins 300,000 iterations. Spinning is fastest alone, but beside another busy process a spinning thread burns the
time slice the thread it waits for needs. libgomp reads these variables once, when it loads, so every sample
runs in a fresh subprocess with its own environment.

Each round measures every setting once per workload and load, interleaved; "contended" samples run beside one
CPU-bound process (a Python busy loop, as another job on the machine would be). Ratios are per round against
PASSIVE under the same load, medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# settings: the environment (and thread count) each sample runs with
SETTINGS: dict[str, dict] = {
    "PASSIVE": dict(env={"OMP_WAIT_POLICY": "PASSIVE"}),
    "unset (spin 300k)": dict(env={}),
    "ACTIVE": dict(env={"OMP_WAIT_POLICY": "ACTIVE"}),
    "spin 1k": dict(env={"GOMP_SPINCOUNT": "1000"}),
    "spin 10k": dict(env={"GOMP_SPINCOUNT": "10000"}),
    "1 thread": dict(env={}, threads=1),
}
BASELINE = "PASSIVE"
WORKLOADS = ("train", "decode")
CLEARED = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "KMP_BLOCKTIME")


# ----------------------------------------------------------------------------------------------------------
# worker: one sample, in its own process


def default_shape(quick: bool):
    from model import GPTConfig

    if quick:
        return GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False, pos_encoding="rope")
    # the default run's model (configs/model/small.yaml with the BPE-4096 vocabulary)
    return GPTConfig(vocab_size=4096, block_size=512, n_layer=4, n_head=4, n_embd=256, bias=False,
                     pos_encoding="rope", qk_norm=True)


def worker(workload: str, seconds: float, quick: bool, dtype: str) -> dict:
    """tokens/s of one workload for about `seconds` (after warmup) in this process's thread setting."""
    import torch

    from attention_lab.runtime.device import autocast
    from model import GPT
    from model.generate import generate_stream

    cfg = default_shape(quick)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = GPT(cfg)
    gen = torch.Generator().manual_seed(0)
    if workload == "train":
        batch = 2 if quick else 4  # the default run's batch
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=gen)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step() -> int:
            with autocast(cpu, dt):
                loss = model(x, x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return x.numel()

        warmup = 3
    else:  # sample.py's case: batch 1, a short prompt, 500 new tokens (within the 512-token context)
        model.eval()
        prompt = torch.randint(0, cfg.vocab_size, (1, 10), generator=gen)
        new = 40 if quick else 500

        def step() -> int:
            n = 0
            with autocast(cpu, dt):
                for _ in generate_stream(model, prompt, new, temperature=0.8, top_k=200, generator=gen):
                    n += 1
            return n

        warmup = 1
    for _ in range(warmup):
        step()
    done, t0 = 0, time.perf_counter()
    while True:
        done += step()
        if time.perf_counter() - t0 >= seconds:
            break
    return {"tok_s": done / (time.perf_counter() - t0), "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------------------------------------
# driver


def sample(setting: str, workload: str, seconds: float, quick: bool, dtype: str) -> float:
    spec = SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(spec["env"])
    if "threads" in spec:
        env["OMP_NUM_THREADS"] = str(spec["threads"])
    cmd = [sys.executable, "-m", "bench.threads", "--worker", workload, "--seconds", str(seconds), "--dtype", dtype]
    out = subprocess.run(cmd + (["--quick"] if quick else []), env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["tok_s"]


def busy_loop() -> subprocess.Popen:
    """One CPU-bound process, as another user's job would be."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run(rounds: int, seconds: float, quick: bool, dtype: str, settings: list[str], workloads: list[str]) -> dict:
    from .common import median, spread

    times: dict[tuple, list[float]] = {}
    load = []
    for r in range(rounds):
        for condition in ("idle", "contended"):
            competitor = busy_loop() if condition == "contended" else None
            try:
                for workload in workloads:
                    for setting in settings:
                        load.append(os.getloadavg()[0])
                        tps = sample(setting, workload, seconds, quick, dtype)
                        times.setdefault((workload, condition, setting), []).append(tps)
                        print(f"round {r + 1}/{rounds} {condition:9s} {workload:6s} {setting:18s} {tps:8.0f} tok/s",
                              file=sys.stderr, flush=True)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()
    rows = []
    for workload in workloads:
        for setting in settings:
            row = {"workload": workload, "setting": setting}
            for condition in ("idle", "contended"):
                tps = times[(workload, condition, setting)]
                base = times[(workload, condition, BASELINE)]
                row[f"{condition}_tok_s"] = median(tps)
                row[f"{condition}_vs_passive"] = median([a / b for a, b in zip(tps, base, strict=True)])
                row[f"{condition}_spread"] = spread(tps)
            rows.append(row)
    return {"rows": rows, "load": load}


def table(result: dict, rounds: int, seconds: float, quick: bool, dtype: str):
    import torch

    from .common import Column, Table, describe_machine

    load = result["load"]
    return Table(
        name="threads",
        title=f"OpenMP wait policy and threads: training step and batch-1 decoding ({dtype})",
        machine=describe_machine(torch.device("cpu")),
        columns=[
            Column("workload", "workload"),
            Column("setting", "setting"),
            Column("idle_tok_s", "idle tok/s", "{:,.0f}"),
            Column("idle_vs_passive", "idle / PASSIVE", "{:.2f}x"),
            Column("contended_tok_s", "contended tok/s", "{:,.0f}"),
            Column("contended_vs_passive", "contended / PASSIVE", "{:.2f}x"),
            Column("idle_spread", "idle spread", "{:.0%}"),
            Column("contended_spread", "contended spread", "{:.0%}"),
        ],
        rows=result["rows"],
        notes=[
            ("--quick: tiny model, the numbers mean nothing. " if quick else "")
            + "train: the default run's model (4x4x256, T512, V4096, RoPE + QK-norm), batch 4, fused AdamW; "
            "decode: the same model, batch 1, 10-token prompt, 500 new tokens (top-k 200, T 0.8).",
            f"Each sample a fresh process ({seconds:g} s after warmup); {rounds} rounds, every setting once per round "
            "and load, interleaved; contended = beside one Python busy loop. Ratios: per-round against PASSIVE "
            "under the same load, median over rounds. spread = (max - min) / median over rounds.",
            f"1-minute load average while sampling: {min(load):.2f} to {max(load):.2f} (other jobs on the machine "
            "add to it; the busy loop adds 1).",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per sample (after warmup)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated subset of: " + ", ".join(SETTINGS))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="also write the table as JSON here")
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.seconds, args.quick, args.dtype)))
        return
    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        p.error(f"unknown settings {unknown}; choose from {', '.join(SETTINGS)}")
    if BASELINE not in settings:
        settings.insert(0, BASELINE)
    result = run(args.rounds, args.seconds, args.quick, args.dtype, settings, args.workloads.split(","))
    t = table(result, args.rounds, args.seconds, args.quick, args.dtype)
    print(t.markdown())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(t.to_json(), f, indent=2)


if __name__ == "__main__":
    main()
