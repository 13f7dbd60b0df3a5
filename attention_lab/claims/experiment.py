"""One claim, end to end: sweep each arm's rate on the choose plays, train the seeds at the chosen rates, score
them on the test plays, pair the seeds, decide, write results.json and the report.

    1. the sweep      every arm with sweep=True at each of Claim.rates x the base rate, on the claim's first
                      SWEEP_SEEDS seeds;
                      arms with their own fixed rate train all their seeds in the same multirun
    2. the choice     each swept arm's rate: the lowest mean over the sweep's seeds of `choose_by` (bits/byte)
                      on the choose plays, final checkpoint; a winner at the grid's edge is bracketed first (one
                      more rate beyond it, the grid's own ratio, while the winner stays at the edge: at most
                      BRACKET more)
    3. the seeds      every arm at its chosen rate, seeds 1..5 (the sweep's seeds at the chosen rate are its runs)
    4. after-arms     arms that need another's time (the equal-time LSTM), once that arm's seeds have run
    5. the verdict    every seed's final checkpoint scored on the test plays; paired differences (stats.py)
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import attention_lab.claims.report as report
import attention_lab.claims.stats as stats
from attention_lab.claims.catalog import BASE, BASE_LR, BRACKET, QUICK, SWEEP_SEEDS, Claim
from attention_lab.claims.measure import Held, measure
from attention_lab.claims.runs import Runner, job, mean_minutes
from attention_lab.claims.trained import metrics_of
from attention_lab.store.checkpoint import load_checkpoint


def select(claim: Claim, seeds: tuple[int, ...] | None = None, arms: tuple[str, ...] | None = None,
           rates: tuple[float, ...] | None = None) -> Claim:
    """The claim with only these seeds, arms (by name) and rates (multiples of the base rate); ValueError naming
    what it has otherwise."""
    if seeds is not None:
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"--seeds must name distinct seeds, got {seeds}")
        claim = replace(claim, seeds=tuple(seeds))
    if rates is not None:
        if not rates or any(not r > 0 for r in rates):
            raise ValueError(f"--rates must be positive multiples of the base rate, got {rates}")
        claim = replace(claim, rates=tuple(sorted(set(rates))))
    if arms:
        unknown = set(arms) - {a.name for a in claim.arms}
        if unknown:
            raise ValueError(f"claim {claim.name} has no arm {sorted(unknown)}; its arms: "
                             f"{', '.join(a.name for a in claim.arms)}")
        keep = set(arms) | {a.after for a in claim.arms if a.name in arms and a.after}
        keep |= {a.rate_of for a in claim.arms if a.name in keep and a.rate_of}
        claim = replace(claim, arms=tuple(a for a in claim.arms if a.name in keep),
                        expect=tuple(e for e in claim.expect if {e.better, e.worse} <= keep))
    return claim


def run_claim(claim: Claim, out: Path, quick: bool = False, overrides: tuple[str, ...] = (),
              launcher: tuple[str, ...] = (), log=print, progress: bool = True, bracket: int | None = None) -> Path:
    """Train (or reuse) the claim's runs into out/runs/, measure, decide; -> out/report.md. `bracket`: how many
    rates beyond the grid an edge winner may add (default BRACKET; none with --quick, a smoke run)."""
    bracket = (0 if quick else BRACKET) if bracket is None else bracket
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if not claim.arms:
        return report.write_bench(claim, out, quick)
    runner = Runner(out, claim.name, (*BASE, *(QUICK if quick else ()), *overrides), launcher, log, progress,
                    timed=frozenset(a.after for a in claim.arms if a.after))
    by_name = {a.name: a for a in claim.arms}
    sweep_seeds = claim.seeds[:SWEEP_SEEDS]
    n_runs = report.runs_needed(claim)
    log(f"claim {claim.name}: {len(claim.arms)} arms, {n_runs} runs (a sweep of {len(claim.rates)} rates on seeds "
        f"{', '.join(map(str, sweep_seeds))} per swept arm, then seeds {', '.join(map(str, claim.seeds))}); about "
        f"{n_runs * runner.estimate() / 60:.0f} min at {runner.estimate():.0f} s a run before any is reused")

    # 1-2. the sweep, and the arms that keep their own rate, in one multirun; each swept arm's rate chosen
    sweep_jobs = {(a.name, r, s): job(a, s, BASE_LR * r) for a in claim.arms if a.sweep for r in claim.rates
                  for s in sweep_seeds}
    fixed = [job(a, s, None) for a in claim.arms if not a.sweep and not a.rate_of and not a.after
             for s in claim.seeds]
    log("the sweep" + (" and the arms at a fixed rate" if fixed else "") + ":")
    dirs = runner.train([*sweep_jobs.values(), *fixed])
    first = next(iter(dirs.values()))
    block = load_checkpoint(first, "latest").config.block_size
    choose = Held.of(first, "choose", block, 8 if quick else 64)
    per_seed: dict[str, dict[str, dict[int, float]]] = {}  # arm -> rate -> seed -> choose_by on the choose plays
    sweep: dict[str, dict[str, float]] = {}  # arm -> rate -> the mean over the sweep's seeds: what picks

    def score(jobs: dict) -> None:
        for (arm, r, s), j in jobs.items():
            m = measure(replace(claim, measures=_choose_measures(claim)), dirs[j], choose, quick)
            per_seed.setdefault(arm, {}).setdefault(_lr(r), {})[s] = m[claim.choose_by]
        for arm, rates in per_seed.items():
            sweep[arm] = {lr: sum(v.values()) / len(v) for lr, v in rates.items()}

    score(sweep_jobs)
    for _ in range(bracket):  # a winner at the edge of its grid may be beaten beyond it: one more rate out
        beyond = {(a.name, r, s): job(a, s, BASE_LR * r) for a in claim.arms if a.sweep
                  if (r := _beyond(sorted({m for (n, m, _) in sweep_jobs if n == a.name}), sweep[a.name])) is not None
                  for s in sweep_seeds}
        if not beyond:
            break
        log("beyond the grid's edge: " + ", ".join(sorted({f"{arm} at lr {BASE_LR * r:.3g}" for arm, r, _ in beyond})))
        dirs |= runner.train(list(beyond.values()))
        score(beyond)
        sweep_jobs |= beyond
    best = {arm: float(min(rates, key=rates.get)) for arm, rates in sweep.items()}
    for arm, rates in sweep.items():
        log(f"  {arm}: " + ", ".join(f"lr {lr} -> {v:.4f}" for lr, v in rates.items()) + f"; chosen {best[arm]:g}")

    def rate(arm) -> float | None:
        return best.get(arm.rate_of or arm.name)

    # 3. the seeds at the chosen rates
    seed_jobs = {(a.name, s): job(a, s, rate(a)) for a in claim.arms if a.sweep or a.rate_of and not a.after
                 for s in claim.seeds}
    seed_jobs |= {(j.arm, j.seed): j for j in fixed}
    log("the seeds at each arm's rate:")
    dirs |= runner.train(list(seed_jobs.values()))
    # 4. arms that need another arm's wall time
    for a in (a for a in claim.arms if a.after):
        minutes = mean_minutes([metrics_of(dirs[seed_jobs[(a.after, s)]])["seconds"] for s in claim.seeds])
        log(f"{a.name}: {minutes:.2f} min a run, the mean of {a.after}'s")
        for s in claim.seeds:
            seed_jobs[(a.name, s)] = job(a, s, rate(a), minutes)
        dirs |= runner.train([seed_jobs[(a.name, s)] for s in claim.seeds])

    # 5. every seed scored on the test plays
    test = Held.of(first, "test", block, 8 if quick else 256)
    results: dict[str, list[dict]] = {}
    for a in claim.arms:
        for s in claim.seeds:
            j = seed_jobs[(a.name, s)]
            m = metrics_of(dirs[j])
            r = {"seed": s, "lr": j.lr if j.lr is not None else m["lr"], "run": str(dirs[j].relative_to(out))}
            r |= {k: m[k] for k in ("seconds", "train_loss", "tokens_per_s", "val_curve", "max_train_loss_late")}
            r |= measure(claim, dirs[j], test, quick)
            log(f"  {a.name} seed {s}: {r['bpb']:.4f} bits/byte on the test plays (lr {r['lr']:g}, step {r['step']})")
            results.setdefault(a.name, []).append(r)
    comparisons = stats.decide([compare(e, results) for e in claim.expect])
    doc = {"claim": claim.name, "quick": quick, "machine": report.machine(), "launcher": list(launcher),
           "seeds": list(claim.seeds), "rates": {a.name: rate(a) for a in claim.arms},
           "sweep": sweep, "sweep_seeds": list(sweep_seeds),
           "sweep_per_seed": {arm: {lr: {str(k): v for k, v in by.items()} for lr, by in rates.items()}
                              for arm, rates in per_seed.items()},
           "grid": [_lr(r) for r in sorted(claim.rates)], "bracket": bracket, "choose_by": claim.choose_by,
           "split": {"choose": choose.part.documents, "test": test.part.documents},
           "runs_trained": len(runner.seconds), "run_seconds": runner.seconds,
           "all_runs": {str(d.relative_to(out)): runner.seconds_of(d) for d in dict.fromkeys(dirs.values())},
           "minutes": (time.time() - t0) / 60, "results": results,
           "comparisons": [c.as_dict() for c in comparisons]}
    return report.write(claim, doc, out)


def _lr(multiple: float) -> str:
    """A rate as results.json and the logs key it: the base rate times `multiple`, 6 significant digits."""
    return f"{BASE_LR * multiple:.6g}"


def _beyond(multiples: list[float], scores: dict[str, float]) -> float | None:
    """The next multiple of the base rate to try when the best of `multiples` (sorted) is the largest or the
    smallest, a grid step further (the grid's ratio at that end; 3 for a grid of one); None when it is inside."""
    best = min(multiples, key=lambda r: scores[_lr(r)])
    if best == multiples[-1]:
        return best * (multiples[-1] / multiples[-2] if len(multiples) > 1 else 3.0)
    if best == multiples[0]:
        return best / (multiples[1] / multiples[0])
    return None


def _choose_measures(claim: Claim) -> tuple[str, ...]:
    return ("honest",) if claim.choose_by == "honest_bpb" else ()


def compare(e, results: dict) -> stats.Comparison:
    """The paired comparison of one expectation: per seed, the worse arm's number minus the better arm's."""
    def by_seed(arm: str, metric: str) -> dict[int, float]:
        return {r["seed"]: r[metric] for r in results.get(arm, []) if r.get(metric) is not None}

    return stats.paired(by_seed(e.better, e.metric), by_seed(e.worse, e.worse_metric or e.metric),
                        better_name=e.better, worse_name=e.worse, metric=e.metric, region=e.region)
