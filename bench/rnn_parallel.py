"""Does attention train in parallel where an LSTM cannot? Training tokens/s of the rnn claim's two models at equal
threads: the claim's part that its own runs (one thread a run under joblib) cannot show.

    python -m bench.rnn_parallel                 1 and 2 threads on the CPU (and the GPU when there is one)
    python -m bench.rnn_parallel --threads 1,2,4 --reps 7
    python -m bench.rnn_parallel --quick         tiny models, seconds: checks that it runs

The models are the rnn claim's arms as configured (the claims' base preset, configs/experiment/claims.yaml, with the
claim's context: 512 tokens, 4 sequences a step, vocabulary 512; CONTEXT repeats attention_lab/claims/catalog.py's
LONG, which a bench may not import, and a test holds the two equal): the transformer and the LSTM of matched
parameters. One training
step is a forward pass, a backward pass and an AdamW step on one batch, float32 on the CPU (bf16 autocast on a
GPU). An LSTM must run its 512 positions one after another (each step of its state needs the last), while a
transformer's positions are one batched matrix product per layer, so what more threads (or a GPU) buy each is
the point: the table gives each model's tokens/s per thread count and the ratio transformer / LSTM, and the
speedup from 1 thread to the most. Samples are taken round-robin (bench.common.interleaved), the median reported.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from bench.common import describe_machine, interleaved, log, machine_line, median

CLAIMS_PRESET = ("experiment=claims",)  # attention_lab/claims/catalog.py BASE
CONTEXT = ("model.block_size=512", "train.batch_size=4")  # the rnn claim's own (catalog.py LONG)


def build(arch: str, quick: bool, vocab_size: int = 512):
    """The rnn claim's arm `arch` ("gpt" or "lstm") as a model and its batch shape (B, T)."""
    from attention_lab.training.config import compose
    from model import build_model

    overrides = [*CLAIMS_PRESET, *CONTEXT, f"model.arch={arch}"]
    if quick:
        overrides += ["model.block_size=32", "model.n_embd=32", "model.n_layer=1", "train.batch_size=2"]
    cfg = compose(overrides)
    return build_model(cfg.model.network(vocab_size=vocab_size)), (cfg.train.batch_size, cfg.model.block_size)


def step_fn(model, shape, device: torch.device):
    """One training step of `model` on a fixed random batch: forward, backward, AdamW."""
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size
    x = torch.randint(0, vocab, shape, device=device)
    y = torch.randint(0, vocab, shape, device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(x, targets=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def measure(threads: list[int], reps: int, quick: bool, cuda: bool) -> list[dict]:
    rows = []
    settings = [("cpu", t) for t in threads] + ([("cuda", None)] if cuda else [])
    for device_name, t in settings:
        device = torch.device(device_name)
        if t is not None:
            torch.set_num_threads(t)
        fns, tokens = {}, {}
        for arch in ("gpt", "lstm"):
            model, shape = build(arch, quick)
            fns[arch] = step_fn(model, shape, device)
            tokens[arch] = shape[0] * shape[1]
        log(f"{device_name} {t or ''} threads: {reps} rounds")
        times = interleaved(fns, device, reps, warmup=2)
        per = {arch: tokens[arch] / median(times[arch]) for arch in fns}
        rows.append({"device": device_name, "threads": t, "transformer_tokens_per_s": per["gpt"],
                     "lstm_tokens_per_s": per["lstm"], "transformer_over_lstm": per["gpt"] / per["lstm"]})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| device | threads | transformer tokens/s | LSTM tokens/s | transformer / LSTM |", "|---|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['device']} | {r['threads'] or '-'} | {r['transformer_tokens_per_s']:,.0f} | "
                     f"{r['lstm_tokens_per_s']:,.0f} | {r['transformer_over_lstm']:.2f} |")
    cpu = [r for r in rows if r["device"] == "cpu"]
    if len(cpu) > 1:
        lo, hi = cpu[0], cpu[-1]
        lines += ["", f"From {lo['threads']} to {hi['threads']} threads the transformer trains "
                  f"{hi['transformer_tokens_per_s'] / lo['transformer_tokens_per_s']:.2f}x as many tokens a second, "
                  f"the LSTM {hi['lstm_tokens_per_s'] / lo['lstm_tokens_per_s']:.2f}x."]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rnn_parallel", description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2", help="CPU thread counts, comma-separated (default 1,2)")
    p.add_argument("--reps", type=int, default=5, help="rounds per setting (default 5)")
    p.add_argument("--quick", action="store_true", help="tiny models: checks that it runs, measures nothing")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    try:
        threads = [int(t) for t in args.threads.split(",")]
        if not threads or min(threads) < 1 or args.reps < 1:
            raise ValueError
    except ValueError:
        print(f"error: --threads takes positive counts like 1,2 and --reps a positive number, got {args.threads!r} "
              f"and {args.reps}", file=sys.stderr)
        return 2
    rows = measure(threads, args.reps, args.quick, torch.cuda.is_available())
    print(f"# Training tokens/s of the rnn claim's models{' (--quick: tiny models, not a measurement)' * args.quick}")
    print()
    print(machine_line(describe_machine(torch.device("cpu"))))
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": describe_machine(torch.device("cpu")), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
