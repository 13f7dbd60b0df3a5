"""Run the benchmarks, print their markdown tables, write them to JSON.

    python -m bench.run                     everything (2-5 minutes on 2 CPU cores, longer when they are busy)
    python -m bench.run --quick             tiny settings, seconds: checks that every benchmark still runs
    python -m bench.run --only train,peak   a subset (names: peak, train, generate, attention, data, figures)
    python -m bench.run --out r.json --md last_run.md
    python -m bench.run --only peak,train --dtype auto    the bf16 step and its MFU where the CPU has native bf16

Progress goes to stderr; stdout carries only the tables.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

from attention_lab.runtime.omp import DECODING_SPINCOUNT, SPINCOUNT, bound_spinning

DECODING = {"generate"}  # the benchmarks that time decoding as sample.py decodes


def only_decoding(argv: list[str]) -> bool:
    """Whether `--only` names decoding benchmarks alone (read before argparse: OpenMP's wait is set at import)."""
    for i, arg in enumerate(argv):
        value = arg.removeprefix("--only=") if arg.startswith("--only=") else (
            argv[i + 1] if arg == "--only" and i + 1 < len(argv) else None)
        if value is not None:
            return {n.strip() for n in value.split(",") if n.strip()} <= DECODING
    return False


# Before torch loads OpenMP, the setting the entry points use (attention_lab/runtime/omp.py), so the tables measure
# what a user gets: train.py's bounded spin, or sample.py's longer one when only decoding is benchmarked. Export
# OMP_WAIT_POLICY or GOMP_SPINCOUNT to measure another (the machine line of every table shows the settings in
# force). No effect if torch is loaded already (as under pytest).
bound_spinning(DECODING_SPINCOUNT if only_decoding(sys.argv[1:]) else SPINCOUNT)

import torch  # noqa: E402

from attention_lab.runtime.device import pick_device, pick_dtype  # noqa: E402

from .common import Context, describe_machine, log  # noqa: E402

# name -> module with run(ctx) -> Table; in this order, so the training table reuses the measured peak
BENCHMARKS = {
    "peak": "bench.peak",
    "train": "bench.train_step",
    "generate": "bench.generation",
    "attention": "bench.attention",
    "data": "bench.data_prep",
    "figures": "bench.figures",
}


def parse_only(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown benchmark {unknown}; choose from {', '.join(BENCHMARKS)}")
    return names


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny settings (smoke test), seconds per benchmark")
    parser.add_argument("--only", type=parse_only, default=list(BENCHMARKS), metavar="NAME[,NAME]",
                        help=f"run only these: {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", default=os.path.join("bench", "results.json"), help="JSON file to write")
    parser.add_argument("--md", default=None, help="also write the markdown tables to this file")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--dtype", choices=("default", "auto", "float32", "bfloat16"), default="default",
                        help="what the peak and the training step compute in: default float32 on a CPU (comparable "
                             "across CPU kinds) and bf16 on a GPU; auto what train.dtype=auto trains in (bf16 "
                             "autocast on a CPU with native bf16); bfloat16 under autocast, ours and HF's alike")
    args = parser.parse_args(argv)

    device = pick_device(args.device, "--device")
    dtype = None if args.dtype == "default" else pick_dtype(args.dtype, device)
    ctx = Context(device=device, quick=args.quick, machine=describe_machine(device, dtype), asked_dtype=dtype)
    results = {"machine": ctx.machine, "quick": args.quick, "tables": {}}
    sections = []
    start = time.perf_counter()
    for name in BENCHMARKS:
        if name not in args.only:
            continue
        t0 = time.perf_counter()
        tables = importlib.import_module(BENCHMARKS[name]).run(ctx)  # one table, or several
        log(f"{name}: {time.perf_counter() - t0:.1f} s")
        for table in tables if isinstance(tables, list) else [tables]:
            results["tables"][table.name] = table.to_json()
            results["tables"][table.name]["seconds"] = time.perf_counter() - t0
            sections.append(table.markdown())
            print(sections[-1], flush=True)
    results["seconds"] = time.perf_counter() - start

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    if args.md:
        command = "python -m bench.run " + " ".join(argv if argv is not None else sys.argv[1:])
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime())
        with open(args.md, "w") as f:
            f.write(f"<!-- `{command.strip()}`, {stamp}, {results['seconds']:.0f} s -->\n\n" + "\n".join(sections))
    log(f"wrote {args.out}" + (f" and {args.md}" if args.md else "") + f" in {results['seconds']:.0f} s")
    return results


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1:])
