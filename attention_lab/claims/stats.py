"""The verdict on one expectation of a claim, from paired seeds: a difference, its interval, a test, a region.

Arm A and arm B trained with seed s start from the same random stream, read the same batches in the same order and
are scored on the same text, so whatever noise they share drops out of d_s = metric(worse arm, s) - metric(better
arm, s) (common random numbers). How much they share is measured, not assumed: `correlation` is the correlation of
the two arms' seeds, and `paired_over_unpaired` the paired sd of the mean over the sd an unpaired comparison of the
same numbers would have (1: pairing bought nothing). Over n seeds:

    mean      the mean of d_s; > 0 is the direction the claim predicts
    p         the two-sided paired t-test's p-value (scipy.stats.ttest_rel); p_holm: Holm's step-down correction over
              the expectations of one claim (Holm 1979), so a claim with five comparisons is not five chances of a
              false "holds"
    interval  the paired t interval at the level Holm's step tested it at (`confidence`): the comparison with the
              k-th smallest p of m is tested at 0.05 / (m - k + 1), so its interval is the 1 - 0.05 / (m - k + 1)
              one; the comparisons from the first that fails on are all read at that failing step's level. So an
              interval excludes 0 exactly when the verdict is holds or reversed, whatever the words say beside it
    region    the region of practical equivalence: differences inside +-region are too small to matter (0.01
              bits/byte unless the expectation says otherwise); `smallest_region`: the narrowest region this
              interval lies inside, i.e. the smallest region these seeds could call equivalent

and the verdict word, significance first (so a difference on the wrong side is never hidden by the region):

    holds       p_holm < 0.05 and the mean in the claimed direction
    reversed    p_holm < 0.05 and the mean against it, wherever it lies relative to the region
    equivalent  not significant, and that same interval lies inside the region: interval inclusion, the two one-sided
                tests of Schuirmann 1987 (conservative here: the interval is the (1 - alpha)-level one, not 1 - 2 alpha)
    undecided   none of these: these seeds cannot tell. Where the observed mean lies outside the region, `seeds_needed`
                says how many paired seeds would detect a difference of this size (the observed mean and spread) at
                the level this comparison was tested at, with 80% power; a mean inside the region gets none (more
                seeds would be spent to show equivalence, and `smallest_region` says how far that is)

`within_region` says separately whether the interval lies inside the region, so "holds" or "reversed" with it
reads "by less than the region" (significant, but too small to matter). One seed gives no interval: always
undecided.

A claim's Holm family is every comparison and every trend test of the claim (`decide_all`): a trend is one more
test of the same seeds, so it is corrected with them, and its slope's interval is read at its Holm step's level.

A seed far from its arm (`outliers`): more than OUTLIER_K scaled MADs (1.4826 x the median absolute deviation of
the arm's seeds, floored at MAD_FLOOR) from the arm's median. A flagged seed is kept in the verdict and shown,
and the verdict is computed once more without it (claims/experiment.py): never averaged in silently, never
dropped silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
    low: float  # the t interval of the mean difference at `confidence` (nan with one seed)
    high: float
    p: float  # two-sided paired t-test (nan with one seed)
    p_holm: float = float("nan")
    verdict: str = "undecided"
    seeds_needed: int | None = None  # undecided, mean outside the region: paired seeds for 80% power at its level
    confidence: float = 1 - ALPHA  # the interval's level: 0.95 from paired(), Holm's step's level after decide()
    smallest_region: float = float("nan")  # the narrowest +-region the interval lies inside
    correlation: float = float("nan")  # between the two arms' seeds: what pairing can remove
    paired_over_unpaired: float = float("nan")  # sd of the paired mean / sd of an unpaired one (1: no gain)
    left_out: tuple[str, ...] = ()  # runs left out by the divergence rule, e.g. "tied seed 3 (diverged: ...)"
    within_region: bool = False  # the interval lies inside +-region (said beside the word, whatever the word)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def t_interval(diffs, confidence: float) -> tuple[float, float]:
    """The t interval of the mean of `diffs` at this confidence (the point itself when every diff is equal)."""
    d = np.asarray(diffs, dtype=np.float64)
    if len(d) < 2:
        return float("nan"), float("nan")
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    if sd == 0:
        return mean, mean
    half = float(stats.t.ppf(1 - (1 - confidence) / 2, len(d) - 1)) * sd / math.sqrt(len(d))
    return mean - half, mean + half


def paired(better: dict[int, float], worse: dict[int, float], *, better_name: str, worse_name: str, metric: str,
           region: float, left_out: tuple[str, ...] = ()) -> Comparison:
    """Pair two arms' values by seed (seeds one arm lacks are left out) and compute mean, 95% interval and p."""
    seeds = tuple(sorted(set(better) & set(worse)))
    if not seeds:
        raise ValueError(f"{better_name} and {worse_name} share no seed: nothing to pair")
    a = np.array([worse[s] for s in seeds], dtype=np.float64)
    b = np.array([better[s] for s in seeds], dtype=np.float64)
    d = a - b
    mean, p = float(d.mean()), float("nan")
    low, high = t_interval(d, 1 - ALPHA)
    corr = ratio = float("nan")
    if len(seeds) > 1:
        if np.all(d == d[0]):  # no spread at all: the interval is the point, and p is 0 or 1
            p = 1.0 if mean == 0 else 0.0
        else:
            p = float(stats.ttest_rel(a, b).pvalue)
        unpaired = math.sqrt(a.var(ddof=1) + b.var(ddof=1))
        if unpaired > 0:
            ratio = float(d.std(ddof=1) / unpaired)
        if a.std() > 0 and b.std() > 0:
            corr = float(np.corrcoef(a, b)[0, 1])
    return Comparison(better_name, worse_name, metric, region, seeds, tuple(float(x) for x in d), mean, low, high, p,
                      correlation=corr, paired_over_unpaired=ratio, left_out=tuple(left_out))


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


def holm_levels(pvalues: list[float], alpha: float = ALPHA) -> list[float]:
    """The level each comparison was tested at in Holm's step-down: alpha / (m - k) for the k-th smallest p (k from
    0) while the steps reject, and the first failing step's level for it and every comparison after it (alpha
    for a missing p)."""
    idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
    m = len(idx)
    out = [alpha] * len(pvalues)
    stopped = None
    for rank, i in enumerate(idx):
        level = alpha / (m - rank) if stopped is None else stopped
        if stopped is None and not pvalues[i] < level:
            stopped = level
        out[i] = level
    return out


def seeds_needed(diffs: tuple[float, ...], power: float = POWER, alpha: float = ALPHA, limit: int = 1000) -> int | None:
    """The number of paired seeds a two-sided paired t-test at level `alpha` needs to find a mean difference of the
    observed size (mean / sd of the differences) with this power; None when the observed mean is 0 or above
    `limit` seeds."""
    d = np.asarray(diffs, dtype=np.float64)
    if len(d) < 2 or d.std(ddof=1) == 0 or d.mean() == 0:
        return None
    effect = abs(d.mean()) / d.std(ddof=1)
    n = np.arange(2, limit + 1)
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = effect * np.sqrt(n)
    reached = stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc) >= power
    return int(n[np.argmax(reached)]) if reached.any() else None


def _inside(low: float, high: float, region: float) -> bool:
    return not math.isnan(low) and -region <= low and high <= region


def _word(p_holm: float, mean: float, low: float, high: float, region: float, n: int,
          words=("holds", "reversed", "equivalent", "undecided")) -> str:
    """Significance first: a significant difference reads holds or reversed wherever it lies relative to the
    region; only a non-significant one can read equivalent (its interval inside the region)."""
    if not math.isnan(p_holm) and p_holm < ALPHA:
        return words[0] if mean > 0 else words[1]
    if n > 1 and _inside(low, high, region):
        return words[2]
    return words[3]


def decide(comparisons: list[Comparison]) -> list[Comparison]:
    """Holm-correct the p-values of one claim's comparisons (no trends: decide_all for both); each interval at the
    level its Holm step used; the word, `seeds_needed` and `smallest_region` on that same interval."""
    return decide_all(comparisons, [])[0]


def decide_all(comparisons: list[Comparison], trends: list["Trend"]) -> tuple[list[Comparison], list["Trend"]]:
    """One claim's Holm family: its comparisons and its trend tests corrected together; each interval (a
    difference's, a slope's) at the level its Holm step used; each word from them, significance first."""
    ps = [c.p for c in comparisons] + [t.p for t in trends]
    adjusted = holm(ps)
    levels = holm_levels(ps)
    out = []
    for c, ph, level in zip(comparisons, adjusted, levels):
        low, high = t_interval(c.diffs, 1 - level)
        word = _word(ph, c.mean, low, high, c.region, len(c.seeds))
        needed = seeds_needed(c.diffs, alpha=level) if word == "undecided" and abs(c.mean) > c.region else None
        smallest = max(abs(low), abs(high)) if len(c.seeds) > 1 else float("nan")
        out.append(Comparison(**(c.as_dict() | {"p_holm": ph, "verdict": word, "seeds_needed": needed, "low": low,
                                                "high": high, "confidence": 1 - level, "smallest_region": smallest,
                                                "within_region": len(c.seeds) > 1 and _inside(low, high, c.region)})))
    judged = []
    for t, ph, level in zip(trends, adjusted[len(comparisons):], levels[len(comparisons):]):
        if not t.slopes:
            judged.append(replace(t, p_holm=ph))
            continue
        low, high = t_interval(t.slopes, 1 - level)
        word = _word(ph, t.slope, low, high, t.region, len(t.seeds), TREND_WORDS)
        judged.append(replace(t, p_holm=ph, low=low, high=high, confidence=1 - level, verdict=word,
                              within_region=len(t.seeds) > 1 and _inside(low, high, t.region)))
    return out, judged


OUTLIER_K = 10.0  # a seed more than this many scaled MADs from its arm's median is flagged: with 5 seeds the MAD
# is itself noisy, so that 5 normal seeds have one beyond 5 MADs in 11% of arms, beyond 10 in 3% (simulated)
MAD_SCALE = 1.4826  # the MAD times this estimates the sd of a normal sample
MAD_FLOOR = 1e-3  # in the metric's unit: seeds that agree to the last digits do not make every other seed "far"


def outliers(values: dict[int, float], k: float = OUTLIER_K, floor: float = MAD_FLOOR) -> dict[int, float]:
    """The seeds of one arm that lie far from the others: seed -> its distance from the arm's median in scaled
    MADs, for every seed beyond `k` of them (max(MAD_SCALE x MAD, floor) is the unit). Fewer than 3 seeds: none
    (with two, each is as far from the median as the other)."""
    seeds = [s for s, v in values.items() if v is not None and math.isfinite(v)]
    if len(seeds) < 3:
        return {}
    x = np.array([values[s] for s in seeds], dtype=np.float64)
    median = float(np.median(x))
    unit = max(MAD_SCALE * float(np.median(np.abs(x - median))), floor)
    return {s: float(abs(values[s] - median) / unit) for s in seeds if abs(values[s] - median) / unit > k}


TREND_WORDS = ("grows", "shrinks", "flat", "no trend detected")  # in _word's order: up, down, inside, neither


@dataclass(frozen=True)
class Trend:
    """How one expectation's paired difference moves along the claim's variable: each seed's least-squares slope
    of its difference on log2(value) (per doubling of the variable), the slopes' mean, its t interval over seeds
    (95% alone; at its Holm step's level once decide_all has read it with the claim's comparisons), and a word,
    significance first: grows or shrinks when p_holm < 0.05 (`within_region`: and by less than the region, said
    so), else flat when the interval lies inside +-region per doubling, else no trend detected."""

    better: str
    worse: str
    metric: str
    variable: str
    values: tuple[float, ...]
    seeds: tuple[int, ...]
    slope: float
    low: float
    high: float
    p: float
    region: float
    verdict: str
    means: tuple[float, ...]  # the mean difference at each value
    slopes: tuple[float, ...] = ()  # each seed's slope, in `seeds` order
    p_holm: float = float("nan")
    confidence: float = 1 - ALPHA
    within_region: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def trend(diffs: dict[int, dict[float, float]], *, better: str, worse: str, metric: str, variable: str,
          region: float) -> Trend:
    """The trend test of one expectation along the variable. `diffs`: seed -> value -> the paired difference (worse
    - better) at that value. Only seeds with a difference at every value count (a seed left out at one value, by
    the divergence rule, is left out of the trend). Each seed's slope on log2(value) is one number, so the test is
    a one-sample t-test over seeds (the seeds are independent; the values of one seed are not): grows (p < 0.05,
    slope > 0), shrinks (p < 0.05, slope < 0), flat (not significant, the interval inside +-region per doubling),
    or no trend detected. Alone, at 95%; decide_all puts it in the claim's Holm family."""
    values = tuple(sorted({v for by in diffs.values() for v in by}))
    seeds = tuple(s for s in sorted(diffs) if set(diffs[s]) == set(values))
    nan = float("nan")
    means = tuple(float(np.mean([diffs[s][v] for s in seeds])) if seeds else nan for v in values)
    if len(values) < 2 or not seeds:
        return Trend(better, worse, metric, variable, values, seeds, nan, nan, nan, nan, region, "no trend detected",
                     means)
    x = np.log2(np.asarray(values, dtype=np.float64))
    slopes = np.array([np.polyfit(x, [diffs[s][v] for v in values], 1)[0] for s in seeds])
    slope = float(slopes.mean())
    low, high = t_interval(slopes, 1 - ALPHA)
    if len(seeds) < 2:
        p = nan
    elif np.all(slopes == slopes[0]):  # no spread: the slope is exact (0 up to rounding: no trend)
        p = 1.0 if math.isclose(slope, 0.0, abs_tol=1e-12) else 0.0
    else:
        p = float(stats.ttest_1samp(slopes, 0.0).pvalue)
    word = _word(p, slope, low, high, region, len(seeds), TREND_WORDS)
    return Trend(better, worse, metric, variable, values, seeds, slope, low, high, p, region, word, means,
                 slopes=tuple(float(x) for x in slopes), p_holm=p,
                 within_region=len(seeds) > 1 and _inside(low, high, region))


@dataclass(frozen=True)
class Slope:
    """A log-log fit: log2(y) = a + slope * log2(x), the slope's 95% t interval (n - 2 degrees of freedom)."""

    slope: float
    low: float
    high: float
    n: int


def loglog_slope(x, y) -> Slope:
    """The least-squares slope of log2(y) on log2(x) and its 95% interval (nan with fewer than 3 points): for a
    cost y over a length x, 2 is quadratic, 1 linear; 2 ** slope is the factor per doubling."""
    lx, ly = np.log2(np.asarray(x, dtype=np.float64)), np.log2(np.asarray(y, dtype=np.float64))
    n = len(lx)
    if n < 2:
        return Slope(float("nan"), float("nan"), float("nan"), n)
    fit = stats.linregress(lx, ly)
    if n < 3:
        return Slope(float(fit.slope), float("nan"), float("nan"), n)
    half = float(stats.t.ppf(1 - ALPHA / 2, n - 2)) * float(fit.stderr)
    return Slope(float(fit.slope), float(fit.slope) - half, float(fit.slope) + half, n)
