"""python -m attention_lab.claims: run a claim, list them, assemble the docs, or compare any runs."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from attention_lab.claims import report
from attention_lab.claims.catalog import CLAIMS, Arm, Claim
from attention_lab.claims.experiment import run_claim, select
from attention_lab.claims.trained import metrics_of
from attention_lab.runtime import cli
from attention_lab.store.checkpoint import CheckpointError, load_checkpoint
from attention_lab.training.evaluate import score_run

LAUNCHERS = ("auto", "basic", "joblib", "submitit_local", "submitit_slurm")


def auto_launcher(cores: int | None = None) -> tuple[str, int | None]:
    """--launcher auto: joblib with one run per core (one thread each) where the plugin is installed and there is
    more than one core, the basic launcher (one run at a time, every core) otherwise."""
    import importlib.util

    cores = cores or os.cpu_count() or 1
    if cores > 1 and importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None:
        return "joblib", cores
    return "basic", None


def launcher_overrides(name: str, jobs: int | None, extra: list[str]) -> tuple[str, ...]:
    """Hydra overrides that choose and size a launcher (joblib: n_jobs runs at a time)."""
    out = [] if name == "basic" else [f"hydra/launcher={name}"]
    if jobs is not None:
        if name != "joblib":
            raise ValueError("--jobs sizes the joblib launcher; other launchers take their own settings after --")
        out.append(f"hydra.launcher.n_jobs={jobs}")
        out.append(f"train.num_threads={max(1, (os.cpu_count() or 1) // jobs)}")  # the cores shared, not oversubscribed
    return tuple(out + extra)


def compare(runs: list[Path], out: Path) -> Path:
    """A table and a plot of any runs: whole-validation-split bits/byte of the final checkpoint, steps, params."""
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for run in runs:
        m = metrics_of(run)
        ckpt = load_checkpoint(run, "latest")
        results[str(run)] = [{"bpb": score_run(run, which="latest").bits_per_byte, "step": ckpt.step, "lr": m["lr"],
                              "seed": 0, "params": sum(p.numel() for p in ckpt.build_model("cpu").parameters()),
                              "tokens_per_s": m["tokens_per_s"], "val_curve": m["val_curve"],
                              "seconds": m["seconds"]}]
    claim = Claim("compare", "runs side by side", tuple(Arm(str(r)) for r in runs), (), (), "", seeds=(0,))
    doc = {"results": results}
    report.write_text(out / "report.md", "\n".join(["# Runs compared", "", f"Machine: {report.machine()}.", "",
                                                    report.arm_table(claim, doc), "",
                                                    "bits/byte: the whole validation split, final checkpoint."]))
    report.plot(claim, results, out / "plot.png")
    return out / "report.md"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m attention_lab.claims", description=__doc__.split("\n")[0],
                                epilog="claims: " + ", ".join(CLAIMS) + "; or: docs, compare RUN [RUN ...]. "
                                "Hydra overrides for the launcher go after --.")
    p.add_argument("name", nargs="?", help="a claim (see --list), `docs` or `compare`")
    p.add_argument("runs", nargs="*", type=Path, help="compare: the run folders")
    p.add_argument("--list", action="store_true", help="name the claims, their statements and arms")
    p.add_argument("--quick", action="store_true", help="a tiny version in seconds (a smoke run, not a measurement)")
    p.add_argument("--seeds", type=lambda s: tuple(int(x) for x in s.split(",")),
                   help="the verdict's seeds, e.g. 1,2,3 (default 1-5)")
    p.add_argument("--sweep-seeds", type=lambda s: tuple(int(x) for x in s.split(",")),
                   help="the seeds that choose the rates, none of them a verdict seed (default 101,102,103)")
    p.add_argument("--arms", type=lambda s: tuple(a.strip() for a in s.split(",")),
                   help="only these arms, by name, comma-separated (see --list)")
    p.add_argument("--rates", type=lambda s: tuple(float(x) for x in s.split(",")),
                   help="the sweep, as multiples of the base rate 3e-3 (default 0.333,1,3)")
    p.add_argument("--no-rate-check", action="store_true",
                   help="skip the second fixed rate (a third of each arm's): half the runs, and no verdict can say it "
                        "depends on the rate (--quick skips it too)")
    p.add_argument("--out", type=Path, help="the report folder (default: claims/<name>, or claims/<name>-quick)")
    p.add_argument("--launcher", choices=LAUNCHERS, default="auto",
                   help="Hydra's launcher for the runs (auto, the default: joblib with one run per core where it is "
                        "installed, else basic; joblib: pip install hydra-joblib-launcher; submitit_*: pip install "
                        "hydra-submitit-launcher)")
    p.add_argument("--jobs", type=int, help="joblib: how many runs at a time")
    p.add_argument("--root", type=Path, default=Path("claims"), help="docs: where the claims' folders are")
    args = p.parse_args(argv)
    if args.list or not args.name:
        for c in CLAIMS.values():
            arms = ", ".join(a.name for a in c.arms) or "none: it runs the wall benchmark"
            print(f"{c.name:<14} {c.statement}\n{'':<14} arms: {arms}")
            if c.variable:
                print(f"{'':<14} along {c.variable.name}: {', '.join(f'{v:g}' for v in c.variable.values)}")
        return 0
    if args.name == "docs":
        return cli.run(lambda: print(report.write_docs(args.root)))
    if args.name == "compare":
        if not args.runs:
            p.error("compare needs at least one run folder")
        return cli.run(lambda: print(compare(args.runs, args.out or Path("claims/compare"))), CheckpointError)
    if args.name not in CLAIMS:
        p.error(f"unknown claim {args.name!r}; choose from {', '.join(CLAIMS)} (or docs, compare)")
    out = args.out or args.root / (args.name + ("-quick" if args.quick else ""))

    def go() -> None:
        t0 = time.time()
        claim = select(CLAIMS[args.name], args.seeds, args.arms, args.rates, args.sweep_seeds)
        name, jobs = (auto_launcher() if args.launcher == "auto" else (args.launcher, None))
        launcher = launcher_overrides(name, args.jobs if args.jobs is not None else jobs, extra)
        rep = run_claim(claim, out, args.quick, launcher=launcher, rate_check=False if args.no_rate_check else None)
        print(f"report: {rep} ({(time.time() - t0) / 60:.1f} min)")
    return cli.run(go, CheckpointError, RuntimeError, ValueError)
