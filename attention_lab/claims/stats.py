"""The verdict on one expectation of a claim, from paired seeds: a difference, its interval, a test, a region.

Arm A and arm B trained with seed s read the same batches in the same order and are scored on the same text, so
the noise they share cancels in the difference d_s = metric(worse arm, s) - metric(better arm, s) (common random
numbers). Over n seeds:

    mean      the mean of d_s; > 0 is the direction the claim predicts
    interval  its 95% t interval (scipy.stats.ttest_rel)
    p         the two-sided paired t-test's p-value; p_holm: Holm's step-down correction over the expectations of
              one claim (Holm 1979), so a claim with five comparisons is not five chances of a false "holds"
    region    the region of practical equivalence (Benavoli et al. 2017): differences inside +-region are too small
              to matter (0.01 bits/byte unless the expectation says otherwise)

and the verdict word:

    equivalent  the whole interval lies inside the region: no difference that matters, a finding in itself
    holds       p_holm < 0.05 and the mean in the claimed direction
    reversed    p_holm < 0.05 and the mean against it
    undecided   neither: these seeds cannot tell; `seeds_needed` says how many paired seeds would detect a
                difference of this size (the observed mean and spread) with 80% power

One seed gives no interval: always undecided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 0.05
POWER = 0.8
WORDS = ("holds", "reversed", "equivalent", "undecided")


@dataclass(frozen=True)
class Comparison:
    better: str  # the arm the claim says is lower in `metric`
    worse: str
    metric: str
    region: float  # the region of practical equivalence: +-region in the metric's unit
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]  # worse - better, one per paired seed
    mean: float
    low: float  # the 95% t interval of the mean difference (nan with one seed)
    high: float
    p: float  # two-sided paired t-test (nan with one seed)
    p_holm: float = float("nan")
    verdict: str = "undecided"
    seeds_needed: int | None = None  # undecided only: paired seeds for 80% power at the observed effect

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def paired(better: dict[int, float], worse: dict[int, float], *, better_name: str, worse_name: str, metric: str,
           region: float) -> Comparison:
    """Pair two arms' values by seed (seeds one arm lacks are left out) and compute mean, interval and p."""
    seeds = tuple(sorted(set(better) & set(worse)))
    if not seeds:
        raise ValueError(f"{better_name} and {worse_name} share no seed: nothing to pair")
    a = np.array([worse[s] for s in seeds], dtype=np.float64)
    b = np.array([better[s] for s in seeds], dtype=np.float64)
    d = a - b
    mean, low, high, p = float(d.mean()), float("nan"), float("nan"), float("nan")
    if len(seeds) > 1:
        if np.all(d == d[0]):  # no spread at all: the interval is the point, and p is 0 or 1
            low = high = mean
            p = 1.0 if mean == 0 else 0.0
        else:
            test = stats.ttest_rel(a, b)
            ci = test.confidence_interval(1 - ALPHA)
            low, high, p = float(ci.low), float(ci.high), float(test.pvalue)
    return Comparison(better_name, worse_name, metric, region, seeds, tuple(float(x) for x in d), mean, low, high, p)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values: sorted ascending, p_(i) * (m - i), made monotone, capped at 1.
    Missing values (nan) are neither counted nor adjusted."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    m = len(idx)
    out = [float("nan")] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def seeds_needed(diffs: tuple[float, ...], power: float = POWER, alpha: float = ALPHA, limit: int = 1000) -> int | None:
    """The number of paired seeds a two-sided paired t-test needs to find a mean difference of the observed size
    (mean / sd of the differences) with this power; None when the observed mean is 0 or above `limit` seeds."""
    d = np.asarray(diffs, dtype=np.float64)
    if len(d) < 2 or d.std(ddof=1) == 0 or d.mean() == 0:
        return None
    effect = abs(d.mean()) / d.std(ddof=1)
    n = np.arange(2, limit + 1)
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = effect * np.sqrt(n)
    reached = stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc) >= power
    return int(n[np.argmax(reached)]) if reached.any() else None


def decide(comparisons: list[Comparison]) -> list[Comparison]:
    """Holm-correct the p-values of one claim's comparisons and attach each verdict word."""
    adjusted = holm([c.p for c in comparisons])
    out = []
    for c, ph in zip(comparisons, adjusted):
        if len(c.seeds) > 1 and -c.region <= c.low and c.high <= c.region:
            word = "equivalent"
        elif not math.isnan(ph) and ph < ALPHA:
            word = "holds" if c.mean > 0 else "reversed"
        else:
            word = "undecided"
        needed = seeds_needed(c.diffs) if word == "undecided" else None
        out.append(Comparison(**(c.as_dict() | {"p_holm": ph, "verdict": word, "seeds_needed": needed})))
    return out
