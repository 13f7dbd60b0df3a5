"""One claim, end to end: sweep each arm's rate on the choose plays, train the verdict seeds at the chosen rates and
at one common rate, score them on the test plays, pair the seeds, decide, write results.json and the report.

    1. the sweep      every arm with sweep=True at each of Claim.rates x the base rate, on the claim's sweep seeds
                      (3, none of them a verdict seed); arms with their own fixed rate train all their seeds in the
                      same multirun. A grid of one rate with no bracketing sweeps nothing: that rate is fixed in
                      advance (--quick does this)
    2. the choice     each swept arm's rate: the lowest mean over the sweep's seeds of `choose_by` (bits/byte) on
                      the choose plays, final checkpoint, among the rates at which no sweep run diverged
                      (trained.py DIVERGED_RULE); a winner at the grid's edge is bracketed first (one more rate
                      beyond it, the grid's own ratio, while the winner stays at the edge: at most BRACKET more), and
                      an arm whose every rate diverged tries one below the lowest
    3. the seeds      every arm at its chosen rate on the verdict seeds (1..5), and every swept arm at the common
                      rate (the base rate) on the same seeds: the common-rate verdict, a sensitivity check
    4. after-arms     arms that need another's time (the equal-time LSTM), once that arm's seeds have run
    5. the rate check a claim at a fixed rate: every arm's verdict seeds again at Claim.second_rate x its rate (an
                      arm's own rate scaled alike), after-arms on the budget of their arm at that rate
    6. the verdict    every seed's final checkpoint scored on the test plays; paired differences (stats.py); a seed
                      whose run diverged in either arm is left out of that comparison and named, never averaged in;
                      the comparisons and every trend test of the claim one Holm family (stats.decide_all); a seed
                      far from its arm (stats.outliers) kept, flagged, and the verdict decided once more without it
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import attention_lab.claims.report as report
import attention_lab.claims.stats as stats
from attention_lab.claims.catalog import BASE, BASE_LR, BRACKET, CHANCE_MARGIN, QUICK, Claim, along
from attention_lab.claims.measure import LENGTHS, Held, measure
from attention_lab.claims.runs import Runner, job, mean_minutes, minutes_or_seconds
from attention_lab.claims.trained import DIVERGED_RULE, HELD_OUT_RULE, metrics_of
from attention_lab.store.checkpoint import load_checkpoint
from attention_lab.training.evaluate import data_dir_of

SCORE_THREADS = 1
RULES = 43  # the issue whose rules a results.json was made under (none written: 35's); report.py names the changes
OUTLIER_RULE = (f"a seed is flagged when its number lies more than {stats.OUTLIER_K:g} scaled MADs (1.4826 x the median "
                "absolute deviation of its arm's seeds, at least "
                f"{stats.MAD_FLOOR:g}) from its arm's median; a flagged seed is kept in the verdict and shown, and "
                "the verdict is decided once more without it (the seed left out of every comparison of that arm)")


def select(claim: Claim, seeds: tuple[int, ...] | None = None, arms: tuple[str, ...] | None = None,
           rates: tuple[float, ...] | None = None, sweep_seeds: tuple[int, ...] | None = None) -> Claim:
    """The claim with only these seeds, arms (by name), rates (multiples of the base rate) and sweep seeds;
    ValueError naming what it has otherwise."""
    for what, value in (("--seeds", seeds), ("--sweep-seeds", sweep_seeds)):
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError(f"{what} must name distinct seeds, got {value}")
    if seeds is not None:
        claim = replace(claim, seeds=tuple(seeds))
    if sweep_seeds is not None:
        claim = replace(claim, sweep_seeds=tuple(sweep_seeds))
    if set(claim.seeds) & set(claim.sweep_seeds):
        raise ValueError(f"the verdict's seeds {claim.seeds} and the sweep's {claim.sweep_seeds} share "
                         f"{sorted(set(claim.seeds) & set(claim.sweep_seeds))}: a rate chosen on a seed selects that "
                         "seed too; choose other --seeds or --sweep-seeds")
    if rates is not None:
        if not rates or any(not r > 0 for r in rates):
            raise ValueError(f"--rates must be positive multiples of the base rate, got {rates}")
        claim = replace(claim, rates=tuple(sorted(set(rates))), fixed_rate=False)  # rates named: swept over them
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
              launcher: tuple[str, ...] = (), log=print, progress: bool = True, bracket: int | None = None,
              rate_check: bool | None = None) -> Path:
    """_run_claim with this process's scoring on SCORE_THREADS threads (restored after): its numbers then do not
    depend on the machine's cores, and it does not fight the runs' own threads (beside two runs, a 512-token LSTM
    was scored in 13.7 s on 2 threads and 0.5 s on 1). `rate_check`: train the second fixed rate (default: unless
    --quick, a smoke run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(SCORE_THREADS)
    try:
        return _run_claim(claim, out, quick, overrides, launcher, log, progress, bracket, rate_check)
    finally:
        torch.set_num_threads(before)


def _run_claim(claim: Claim, out: Path, quick: bool = False, overrides: tuple[str, ...] = (),
               launcher: tuple[str, ...] = (), log=print, progress: bool = True, bracket: int | None = None,
               rate_check: bool | None = None) -> Path:
    """Train (or reuse) the claim's runs into out/runs/, measure, decide; -> out/report.md. `bracket`: how many
    rates beyond the grid an edge winner may add (default BRACKET; none with --quick, a smoke run)."""
    bracket = (0 if quick else BRACKET) if bracket is None else bracket
    rate_check = (not quick) if rate_check is None else rate_check
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if not claim.arms:
        return report.write_bench(claim, out, quick)
    claim = along(claim)  # every arm and expectation at each value of the claim's variable
    common_overrides = (*BASE, *claim.overrides, *(QUICK if quick else ()), *overrides)
    runner = Runner(out, claim.name, common_overrides, launcher, log, progress,
                    timed=frozenset(a.after for a in claim.arms if a.after))
    sweeping = sweeps(claim, bracket)
    common = BASE_LR if sweeping else BASE_LR * claim.rates[0]  # the common rate: every swept arm at it
    factor = claim.second_rate if rate_check and not sweeping and claim.second_rate else None  # x each arm's rate
    n_runs = report.runs_needed(claim, sweeping, factor is not None)
    log(f"claim {claim.name}: {len(claim.arms)} arms, {n_runs} runs ("
        + (f"a sweep of {len(claim.rates)} rates on seeds {', '.join(map(str, claim.sweep_seeds))} per swept arm, "
           f"then seeds {', '.join(map(str, claim.seeds))} at the chosen rate and at the common rate {common:g}"
           if sweeping else f"no sweep: the rate {common:g} fixed in advance; seeds {', '.join(map(str, claim.seeds))}"
           + (f", and again at {factor:g} x each arm's rate" if factor else ""))
        + f"); about {minutes_or_seconds(n_runs * runner.estimate())} at {runner.estimate():.0f} s a run before "
        "any is reused")

    held: dict[tuple, Held] = {}

    def ran(run_dir: Path) -> dict:
        return metrics_of(run_dir, held_out=claim.noise_floor)

    def part(name: str, run_dir: Path) -> Held:
        """The run's own held-out part: one per data and context, since a claim's variable may change either (the
        recall claim's distance changes both)."""
        block = load_checkpoint(run_dir, "latest").config.block_size
        key = (name, data_dir_of(run_dir, run_dir).resolve(), block)
        if key not in held:
            held[key] = Held.of(run_dir, name, block, 8 if quick else (64 if name == "choose" else 256))
        return held[key]

    # 1-2. the sweep, and the arms that keep their own rate, in one multirun; each swept arm's rate chosen
    sweep_jobs = {(a.name, r, s): job(a, s, BASE_LR * r) for a in claim.arms if a.sweep and sweeping
                  for r in claim.rates for s in claim.sweep_seeds}
    fixed = [job(a, s, None) for a in claim.arms if not a.sweep and not a.rate_of and not a.after
             for s in claim.seeds]
    dirs = {}
    if sweep_jobs or fixed:
        log("the sweep" + (" and the arms at a fixed rate" if fixed else "") + ":")
        dirs = runner.train([*sweep_jobs.values(), *fixed])
    per_seed: dict[str, dict[str, dict[int, float | None]]] = {}  # arm -> rate -> seed -> choose_by (None: no number)
    sweep: dict[str, dict[str, float]] = {}  # arm -> rate -> the mean over the sweep's seeds: what picks
    diverged_sweep: dict[str, dict[str, dict[int, str]]] = {}  # arm -> rate -> seed -> why

    def score(jobs: dict) -> None:
        for (arm, r, s), j in jobs.items():
            m = ran(dirs[j])
            if m["diverged"]:
                diverged_sweep.setdefault(arm, {}).setdefault(_lr(r), {})[s] = m["diverged"]
            value = None if _stopped(m) else measure(replace(claim, measures=_choose_measures(claim)), dirs[j],
                                                     part("choose", dirs[j]), quick)[claim.choose_by]
            per_seed.setdefault(arm, {}).setdefault(_lr(r), {})[s] = value
        for arm, rates in per_seed.items():
            sweep[arm] = {lr: _mean([v for v in by.values() if v is not None]) for lr, by in rates.items()}

    def usable(arm: str) -> dict[str, float]:
        return pickable(sweep[arm], diverged_sweep.get(arm, {}))

    score(sweep_jobs)
    for _ in range(bracket):  # a winner at the edge of its grid may be beaten beyond it: one more rate out
        beyond = {(a.name, r, s): job(a, s, BASE_LR * r) for a in claim.arms if a.sweep and sweeping
                  if (r := _beyond(sorted({m for (n, m, _) in sweep_jobs if n == a.name}), usable(a.name))) is not None
                  for s in claim.sweep_seeds}
        if not beyond:
            break
        log("beyond the grid's edge: " + ", ".join(sorted({f"{arm} at lr {BASE_LR * r:.3g}" for arm, r, _ in beyond})))
        dirs |= runner.train(list(beyond.values()))
        score(beyond)
        sweep_jobs |= beyond
    best = {}
    for arm in sweep:
        ok = usable(arm)
        if all(math.isinf(v) for v in ok.values()):
            raise RuntimeError(f"claim {claim.name}: arm {arm!r} diverged at every rate tried ("
                               + "; ".join(f"lr {lr}: {', '.join(f'seed {s}' for s in by)}"
                                           for lr, by in diverged_sweep[arm].items())
                               + "); try lower --rates")
        best[arm] = float(min(ok, key=ok.get))
        log(f"  {arm}: " + ", ".join(f"lr {lr} -> " + ("diverged" if math.isinf(v) else f"{v:.4f}")
                                     for lr, v in ok.items()) + f"; chosen {best[arm]:g}")

    def rate(arm) -> float | None:
        if not (arm.sweep or arm.rate_of):
            return None
        return best.get(arm.rate_of or arm.name) if sweeping else common

    # 3. the seeds at the chosen rates, and at the common rate
    seed_jobs = {(a.name, s): job(a, s, rate(a)) for a in claim.arms if a.sweep or a.rate_of and not a.after
                 for s in claim.seeds}
    seed_jobs |= {(j.arm, j.seed): j for j in fixed}
    common_jobs = {(a.name, s): job(a, s, common) for a in claim.arms if a.sweep or a.rate_of and not a.after
                   for s in claim.seeds}
    log("the seeds at each arm's rate" + (f" and at the common rate {common:g}" if sweeping else "") + ":")
    dirs |= runner.train(list(dict.fromkeys([*seed_jobs.values(), *common_jobs.values()])))
    # 4. arms that need another arm's wall time
    for a in (a for a in claim.arms if a.after):
        minutes = mean_minutes([ran(dirs[seed_jobs[(a.after, s)]])["seconds"] for s in claim.seeds])
        log(f"{a.name}: {minutes:.2f} min a run, the mean of {a.after}'s")
        for s in claim.seeds:
            seed_jobs[(a.name, s)] = job(a, s, rate(a), minutes)
        dirs |= runner.train([seed_jobs[(a.name, s)] for s in claim.seeds])
    # 5. the rate check: every arm again at `factor` x its rate (an arm's own rate scaled alike), and at any
    # further factor the claim names
    def check_at(f: float) -> dict:
        nonlocal dirs
        jobs: dict = {}
        log(f"the rate check: every arm at {f:g} x its rate:")
        for a in (a for a in claim.arms if not a.after):
            arm, lr = at_rate(a, rate(a), f)
            jobs |= {(a.name, s): job(arm, s, lr) for s in claim.seeds}
        dirs |= runner.train(list(jobs.values()))
        for a in (a for a in claim.arms if a.after):
            minutes = mean_minutes([ran(dirs[jobs[(a.after, s)]])["seconds"] for s in claim.seeds])
            arm, lr = at_rate(a, rate(a), f)
            jobs |= {(a.name, s): job(arm, s, lr, minutes) for s in claim.seeds}
            dirs |= runner.train([jobs[(a.name, s)] for s in claim.seeds])
        return jobs

    second_jobs = check_at(factor) if factor else {}
    more_jobs = [(f, check_at(f)) for f in claim.more_rates] if factor else []

    # 6. every seed scored on the test plays
    rows: dict = {}  # job -> its row, so a run that is both an arm's chosen-rate and common-rate seed is read once

    def row(a, s, j) -> dict:
        if j not in rows:
            m = ran(dirs[j])
            r = {"seed": s, "lr": j.lr if j.lr is not None else m["lr"], "run": str(dirs[j].relative_to(out))}
            r |= {k: m[k] for k in ("seconds", "train_loss", "tokens_per_s", "val_curve", "max_train_loss_late",
                                    "launch", "diverged")}
            if not _stopped(m):
                r |= measure(claim, dirs[j], part("test", dirs[j]), quick)
                log(f"  {a.name} seed {s}: {r['bpb']:.4f} bits/byte on the test plays (lr {r['lr']:g}, step {r['step']})"
                    + (f"; diverged: {r['diverged']}" if r["diverged"] else ""))
            else:
                log(f"  {a.name} seed {s}: diverged, {r['diverged']}")
            rows[j] = r
        return rows[j]

    results = {a.name: [row(a, s, seed_jobs[(a.name, s)]) for s in claim.seeds] for a in claim.arms}
    results_common = {a.name: [row(a, s, common_jobs[(a.name, s)]) for s in claim.seeds]
                      for a in claim.arms if (a.name, claim.seeds[0]) in common_jobs}
    results_second = {a.name: [row(a, s, second_jobs[(a.name, s)]) for s in claim.seeds]
                      for a in claim.arms if (a.name, claim.seeds[0]) in second_jobs}
    results_more = [(f, {a.name: [row(a, s, jobs[(a.name, s)]) for s in claim.seeds] for a in claim.arms})
                    for f, jobs in more_jobs]
    comparisons_common = stats.decide([compare(e, results_common) for e in claim.expect
                                       if {e.better, e.worse} <= set(results_common)]) if sweeping else []
    doc = {"claim": claim.name, "quick": quick, "machine": report.machine(), "launcher": list(launcher),
           "launch": runner.launch, "seeds": list(claim.seeds), "rates": {a.name: rate(a) for a in claim.arms},
           "rate_rule": "swept" if sweeping else "fixed in advance", "common_rate": common,
           "diverged_rule": HELD_OUT_RULE if claim.noise_floor else DIVERGED_RULE, "sweep": sweep, "sweep_seeds": list(claim.sweep_seeds) if sweeping else [],
           "sweep_per_seed": {arm: {lr: {str(k): v for k, v in by.items()} for lr, by in rates.items()}
                              for arm, rates in per_seed.items()},
           "sweep_diverged": {arm: {lr: {str(k): v for k, v in by.items()} for lr, by in rates.items()}
                              for arm, rates in diverged_sweep.items()},
           "diverged": diverged_counts(claim, diverged_sweep, sweep_jobs, results, results_common if sweeping else {}),
           "grid": [_lr(r) for r in sorted(claim.rates)], "bracket": bracket, "choose_by": claim.choose_by,
           "split": {"choose": part("choose", first_dir(dirs)).part.documents,
                     "test": part("test", first_dir(dirs)).part.documents},
           "runs_trained": len(runner.seconds), "run_seconds": runner.seconds,
           "all_runs": {str(d.relative_to(out)): runner.seconds_of(d) for d in dict.fromkeys(dirs.values())},
           "minutes": (time.time() - t0) / 60, "results_common": results_common if sweeping else {},
           "comparisons_common": [c.as_dict() for c in comparisons_common], "noise_floor": claim.noise_floor}
    doc |= decided(claim, results, results_second, factor, results_more)
    return report.write(claim, doc, out)


def decided(claim: Claim, results: dict, results_second: dict | None = None, factor: float | None = None,
            more: list[tuple[float, dict]] = ()) -> dict:
    """The verdict part of a claim's results.json, from its arms' rows alone (claim: along its variable): the
    comparisons and trends as one Holm family, the measured axis, the rate check's verdicts (and those at the
    claim's further rates, `more`: [(factor, rows)]), the flagged seeds and the verdicts without them."""
    axis = axis_trends(claim, results)
    comparisons, trends, axis_judged = family(claim, results, axis=[stats.Trend(**t) for t in axis["trends"]]
                                              if axis else [])
    if axis:
        axis["trends"] = [t.as_dict() for t in axis_judged]
    comparisons_second, trends_second, _ = family(claim, results_second) if results_second else ([], [], [])
    flagged = flag_outliers(claim, results)
    robust, trends_robust, _ = family(claim, results, drop=flagged) if flagged else ([], [], [])
    return {"results": results, "comparisons": [c.as_dict() for c in comparisons],
            "variable": claim.variable.name if claim.variable else None,
            "at": [e.at for e in claim.expect], "of": [list(e.of) if e.of else None for e in claim.expect],
            "trends": [t.as_dict() for t in trends], "axis": axis, "rules": RULES,
            "second_rate": ({"factor": factor, "rates": {a.name: r[0]["lr"] for a in claim.arms
                                                         if (r := (results_second or {}).get(a.name))}}
                            if factor and results_second else None),
            "results_second": results_second or {}, "comparisons_second": [c.as_dict() for c in comparisons_second],
            "trends_second": [t.as_dict() for t in trends_second],
            "more_rates": [rate_check(claim, f, rows) for f, rows in more],
            "outlier_rule": OUTLIER_RULE, "outliers": flagged,
            "comparisons_robust": [c.as_dict() for c in robust], "trends_robust": [t.as_dict() for t in trends_robust]}


def rate_check(claim: Claim, factor: float, rows: dict) -> dict:
    """The verdicts at one further rate of the rate check: its factor, each arm's rate, its rows, comparisons and
    trends (one Holm family, as at the first rate)."""
    comparisons, trends, _ = family(claim, rows)
    return {"factor": factor, "rates": {a.name: r[0]["lr"] for a in claim.arms if (r := rows.get(a.name))},
            "results": rows, "comparisons": [c.as_dict() for c in comparisons],
            "trends": [t.as_dict() for t in trends]}


def pickable(means: dict[str, float], diverged: dict[str, dict]) -> dict[str, float]:
    """One arm's sweep means (rate -> mean over the sweep seeds) with every rate at which a sweep run diverged, or
    that has no number, made unpickable (inf): the lowest of what is left is the arm's rate."""
    return {lr: math.inf if lr in diverged or math.isnan(v) else v for lr, v in means.items()}


def sweeps(claim: Claim, bracket: int) -> bool:
    """Whether the claim sweeps rates: a grid of one rate with no bracketing, or a claim whose rate is fixed in
    advance, does not."""
    return not claim.fixed_rate and any(a.sweep for a in claim.arms) and (len(claim.rates) > 1 or bracket > 0)


AXES = {"length": "the scored length (x the trained context)", "position": "the position in the context"}
AXIS_VARIABLE = {"length": "length (x trained)", "position": "position"}  # the short name a trend sentence uses


def axis_values(axis: str, row: dict) -> dict[float, float]:
    """One run's numbers along a measured axis: bits/byte at each scored length, or the loss in each position
    bucket (measure.buckets); values a run cannot give (learned positions past their table) left out."""
    if axis == "length":
        return {float(f): row[k] for f in LENGTHS if (k := f"bpb_windows_{f}x") in row and row[k] is not None}
    return {float(k): v for k, v in row.get("position_buckets", {}).items()}


def axis_trends(claim: Claim, results: dict) -> dict | None:
    """Along the claim's measured axis, per bits/byte expectation: the paired difference at each value (its
    comparisons Holm-corrected across the values) and one trend test; seeds whose run diverged left out."""
    if claim.axis is None:
        return None
    out = {"name": claim.axis, "said": AXES[claim.axis], "trends": [], "per_value": []}
    for e in claim.expect:
        if e.metric != "bpb" or e.worse_metric:
            continue
        rows = {arm: {r["seed"]: axis_values(claim.axis, r) for r in results.get(arm, []) if not r.get("diverged")}
                for arm in (e.better, e.worse)}
        seeds = sorted(set(rows[e.better]) & set(rows[e.worse]))
        diffs = {s: {v: rows[e.worse][s][v] - rows[e.better][s][v] for v in rows[e.better][s]
                     if v in rows[e.worse][s]} for s in seeds}
        values = sorted({v for d in diffs.values() for v in d})
        per_value = []
        for v in values:
            by = [s for s in seeds if v in diffs[s]]
            if by:
                per_value.append(stats.paired({s: 0.0 for s in by}, {s: diffs[s][v] for s in by}, better_name=e.better,
                                              worse_name=e.worse, metric=f"{claim.axis} {v:g}", region=e.region))
        decided = stats.decide(per_value)
        out["per_value"].append([[v, c.as_dict()] for v, c in zip(values, decided)])
        out["trends"].append(stats.trend(diffs, better=e.better, worse=e.worse, metric="bpb" if claim.axis == "length"
                                         else "nats/token", variable=AXIS_VARIABLE[claim.axis], region=e.region).as_dict())
    return out


def family(claim: Claim, results: dict, drop: list[dict] = (), axis: list[stats.Trend] = ()):
    """One claim's verdicts from its results: every expectation compared, every trend along its variable (values
    at chance left out), and the trends along its measured axis, decided as one Holm family (stats.decide_all);
    `drop`: flagged seeds (flag_outliers) left out. -> (comparisons, trends, axis trends)."""
    raw = [compare(e, results, drop=drop) for e in claim.expect]
    trends = trends_of(claim, raw, results)
    comparisons, judged = stats.decide_all(raw, [*trends, *axis])
    return comparisons, judged[:len(trends)], judged[len(trends):]


def flag_outliers(claim: Claim, results: dict) -> list[dict]:
    """Every seed far from its arm (stats.outliers) in a number an expectation reads, diverged runs aside (they
    are left out already): arm, metric, seed, value, the arm's median and the distance in scaled MADs."""
    out = []
    for arm, metric in dict.fromkeys(pair for e in claim.expect
                                     for pair in ((e.better, e.metric), (e.worse, e.worse_metric or e.metric))):
        values = {r["seed"]: r[metric] for r in results.get(arm, []) if r.get(metric) is not None
                  and not r.get("diverged")}
        for seed, mads in stats.outliers(values).items():
            out.append({"arm": arm, "metric": metric, "seed": seed, "value": values[seed],
                        "median": float(np.median(list(values.values()))), "mads": mads})
    return out


def at_rate(arm, lr: float | None, factor: float):
    """The arm and the rate it trains at for the rate check: `factor` x its rate; an arm that names its own rate
    in its overrides (lr None) has that rate scaled and passed as the job's, so its runs are named apart."""
    if lr is not None:
        return arm, lr * factor
    own = [o for o in arm.overrides if o.startswith("optim.lr=")]
    if not own:
        raise ValueError(f"arm {arm.name!r} trains at no rate the rate check can scale")
    return replace(arm, overrides=tuple(o for o in arm.overrides if o not in own)), float(own[-1].split("=")[1]) * factor


def trends_of(claim: Claim, comparisons: list[stats.Comparison], results: dict | None = None) -> list[stats.Trend]:
    """Along the claim's variable: one trend test per expectation, from its paired differences at every value;
    a value where the worse arm's mean is at the expectation's chance level (Expect.chance, within CHANCE_MARGIN)
    is left out, since a curve flat at chance has no slope to find (`results`: the arms' rows, for their means)."""
    if claim.variable is None:
        return []
    groups: dict[tuple, dict[int, dict[float, float]]] = {}
    regions: dict[tuple, float] = {}
    for e, c in zip(claim.expect, comparisons):
        key = (*e.of, e.metric)
        regions[key] = e.region
        groups.setdefault(key, {})
        if e.chance is not None and results is not None:
            worse = [r[e.metric] for r in results.get(e.worse, []) if r.get(e.metric) is not None]
            if worse and float(np.mean(worse)) >= (1 - CHANCE_MARGIN) * e.chance:
                continue
        for s, d in zip(c.seeds, c.diffs):
            groups[key].setdefault(s, {})[e.at] = d
    return [stats.trend(diffs, better=b, worse=w, metric=m, variable=claim.variable.name, region=regions[(b, w, m)])
            for (b, w, m), diffs in groups.items()]


def first_dir(dirs: dict) -> Path:
    """A run whose checkpoint says the context length (every arm of a claim shares it): one that was not stopped."""
    return next(d for d in dirs.values() if (d / "checkpoints").exists())


def diverged_counts(claim: Claim, diverged_sweep: dict, sweep_jobs: dict, results: dict, common: dict) -> dict:
    """Per arm: how many of its sweep runs, verdict runs and common-rate runs diverged, and which."""
    out = {}
    for a in claim.arms:
        sweep_n = sum(1 for (arm, _, _) in sweep_jobs if arm == a.name)
        named = [f"lr {lr} seed {s}: {why}" for lr, by in diverged_sweep.get(a.name, {}).items() for s, why in by.items()]
        seeds = [f"seed {r['seed']}: {r['diverged']}" for r in results.get(a.name, []) if r.get("diverged")]
        at_common = [f"seed {r['seed']}: {r['diverged']}" for r in common.get(a.name, []) if r.get("diverged")]
        out[a.name] = {"sweep": [len(named), sweep_n], "seeds": [len(seeds), len(results.get(a.name, []))],
                       "common": [len(at_common), len(common.get(a.name, []))], "runs": named + seeds
                       + [f"common rate {r}" for r in at_common]}
    return out


def _stopped(m: dict) -> bool:
    """A run the trainer stopped on a non-finite loss: it has no final checkpoint to score."""
    return bool(m["diverged"]) and m["diverged"].startswith("non-finite")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _lr(multiple: float) -> str:
    """A rate as results.json and the logs key it: the base rate times `multiple`, 6 significant digits."""
    return f"{BASE_LR * multiple:.6g}"


def _beyond(multiples: list[float], scores: dict[str, float]) -> float | None:
    """The next multiple of the base rate to try when the best of `multiples` (sorted) is the largest or the
    smallest, a grid step further (the grid's ratio at that end; 3 for a grid of one); None when it is inside. A
    rate whose score is inf (a sweep run diverged there) never wins; when every one is, one below the lowest."""
    best = min(multiples, key=lambda r: scores[_lr(r)])
    ratio = multiples[1] / multiples[0] if len(multiples) > 1 else 3.0
    if math.isinf(scores[_lr(best)]):  # every rate tried diverged: one below the lowest
        return multiples[0] / ratio
    if best == multiples[-1]:
        return best * (multiples[-1] / multiples[-2] if len(multiples) > 1 else 3.0)
    if best == multiples[0]:
        return best / (multiples[1] / multiples[0])
    return None


def _choose_measures(claim: Claim) -> tuple[str, ...]:
    return ("honest",) if claim.choose_by == "honest_bpb" else ()


def compare(e, results: dict, drop: list[dict] = ()) -> stats.Comparison:
    """The paired comparison of one expectation: per seed, the worse arm's number minus the better arm's. A seed
    whose run diverged in either arm is left out (and named in `left_out`), never averaged in; so is a seed
    `drop` flags in either arm (flag_outliers), when the verdict is decided without them."""
    rows = {arm: {r["seed"]: r for r in results.get(arm, [])} for arm in (e.better, e.worse)}
    left_out = tuple(f"{arm} seed {s} ({r['diverged']})" for arm in dict.fromkeys((e.better, e.worse))
                     for s, r in rows[arm].items() if r.get("diverged"))
    gone = {s for arm in rows for s, r in rows[arm].items() if r.get("diverged")}
    far = [f for f in drop if f["arm"] in rows and f["seed"] not in gone]
    left_out += tuple(dict.fromkeys(f"{f['arm']} seed {f['seed']} (flagged: {f['mads']:.0f} MADs from its arm)"
                                    for f in far))
    gone |= {f["seed"] for f in far}

    def by_seed(arm: str, metric: str) -> dict[int, float]:
        return {s: r[metric] for s, r in rows[arm].items() if r.get(metric) is not None and s not in gone}

    better, worse = by_seed(e.better, e.metric), by_seed(e.worse, e.worse_metric or e.metric)
    if not set(better) & set(worse):
        nan = float("nan")
        return stats.Comparison(e.better, e.worse, e.metric, e.region, (), (), nan, nan, nan, nan, left_out=left_out)
    return stats.paired(better, worse, better_name=e.better, worse_name=e.worse, metric=e.metric, region=e.region,
                        left_out=left_out)
