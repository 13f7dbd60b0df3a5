"""A claim's results in plain words: the paragraph "What we found" that opens its report, and the one line the
README gives it. Every number and every word comes from results.json; the catalog gives only the words for the
arms (Arm.said), the claim's tutorial sentence and its conditional caveats (Caveat: added only when an
expectation reads a given word).

The rules the sentences follow:

    holds       "A predicted the test text better than B by 0.101 bits/byte, 8 times the spread between seeds"
    reversed    said as a reversal: "the reverse of the claim: B ... better than A by ..."
    equivalent  "A and B are equivalent here: their difference lies within the region ±0.05 bits/byte"
    undecided   never a finding: "these seeds cannot tell A from B"
    within the region (significant, but smaller than the region): "..., by less than the ±0.01 that counts"
    along a variable: the verdict at each value leads, the trend along it comes second
    a rate check that reads another word: "... at the second rate ...: this depends on the rate"
    a flagged seed (stats.outliers): named, and the verdict without it given where its word differs
"""

from __future__ import annotations

import math

import numpy as np

from attention_lab.claims.catalog import Claim, at_value
from attention_lab.claims.stats import OUTLIER_K

# per metric: what the arm with the lower number did better, and the size in words (lower is the claim's side)
VERBS = {"bpb": "predicted the test text better than",
         "honest_bpb": "predicted the test text better, with every later token hidden, than",
         "saturated_rows": "left fewer softmax rows saturated (one key taking over 99% of a row) than",
         "max_weight": "spread its attention more evenly than",
         "log10_score_grad_init": "passed less gradient to its scores at the start of training than",
         "log10_score_grad": "passed less gradient to its scores after training than",
         "copy_bits": "copied the letters better than",
         "recall_bits": "recalled the item better than",
         "context_left": "kept less of each word's context-free identity than",
         "nats/token": "predicted the tokens at these positions better than"}


def size(metric: str, value: float) -> str:
    """A difference in words, in its unit."""
    v = abs(value)
    if metric in ("bpb", "honest_bpb"):
        return f"{v:.3f} bits/byte"
    if metric == "saturated_rows":
        return f"{100 * v:.1f} percentage points of the rows"
    if metric.startswith("log10"):
        return f"{v:.2f} powers of ten (a factor of {10 ** v:.2g})"
    if metric in ("copy_bits", "recall_bits"):
        return f"{v:.2f} bits per {'copied letter' if metric == 'copy_bits' else 'recalled item'} (4: chance)"
    if metric == "nats/token":
        return f"{v:.3f} nats/token"
    if metric == "context_left":
        return f"{v:.3f} in cosine similarity"
    return f"{v:.3g} in {metric}"


def said(claim: Claim, name: str) -> str:
    """An arm's plain words (Arm.said), else its name. A claim along a variable (catalog.along) names its arms at
    each value ("transformer, distance=8"), and a results doc names the expectation's base arm ("transformer"):
    the words are the same at every value."""
    at_values = [at_value(name, claim.variable, v) for v in claim.variable.values] if claim.variable else []
    arm = next((a for a in claim.arms if a.name == name), None) or next(
        (a for a in claim.arms if a.name in at_values), None)
    return (arm.said if arm and arm.said else name)


def said_at(claim: Claim, name: str) -> str:
    """An arm at one value of the claim's variable in words: "the transformer at distance = 512"."""
    for v in claim.variable.values if claim.variable else ():
        suffix = at_value("", claim.variable, v)  # ", distance=512"
        if name.endswith(suffix):
            return f"{said(claim, name[:-len(suffix)])} at {claim.variable.name} = {v:g}"
    return said(claim, name)


def joined(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _values(values) -> str:
    return joined([f"{v:g}" for v in values])


def _sizes(metric: str, means: list[float]) -> str:
    if len(means) == 1:
        return size(metric, means[0])
    if len(means) > 3:
        lo, hi = min(abs(m) for m in means), max(abs(m) for m in means)
        return f"{size(metric, lo).split(' ', 1)[0]} to {size(metric, hi)}"
    return (", ".join(size(metric, m).split(" ", 1)[0] for m in means[:-1]) + " and "
            + size(metric, means[-1]).split(" (")[0])


def spread(doc: dict, c: dict) -> float:
    """The spread between seeds beside one comparison: the pooled sd over seeds of the two arms' numbers (one arm's,
    for a control read on the same runs), diverged runs aside; nan when the arms' rows are not in the doc."""
    results = doc.get("results", {})
    worse_metric = c.get("worse_metric") or c["metric"]
    sds = []
    for arm, metric in ((c["better"], c["metric"]), (c["worse"], worse_metric)):
        xs = [r[metric] for r in results.get(arm, []) if r.get(metric) is not None and not r.get("diverged")]
        if len(xs) > 1:
            sds.append(float(np.std(xs, ddof=1)))
    return float(np.sqrt(np.mean(np.square(sds)))) if sds else float("nan")


def beside_spread(doc: dict, c: dict) -> str:
    """What a difference's size means beside the spread between seeds."""
    sd = spread(doc, c)
    if not sd > 0 or c["metric"] not in VERBS:
        return ""
    ratio = abs(c["mean"]) / sd
    at = size(c["metric"], sd).split(" (")[0]
    if ratio >= 2:
        return f", {ratio:.0f} times the spread between seeds (sd {at})"
    if ratio >= 0.5:
        return f", about the spread between seeds (sd {at})"
    return f", less than the spread between seeds (sd {at})"


def word_of(c: dict) -> str:
    """The verdict as the sentences read it: "holds", "holds within", "reversed", "reversed within", ..."""
    return c["verdict"] + (" within" if c.get("within_region") and c["verdict"] in ("holds", "reversed", "grows",
                                                                                   "shrinks") else "")


def clause(claim: Claim, doc: dict, of: tuple[str, str], metric: str, items: list[tuple[float | None, dict]],
           var: str | None, spread_said: bool = True) -> str:
    """One verdict word at one or more values of the variable, as a clause a learner reads."""
    better, worse = said(claim, of[0]), said(claim, of[1])
    c0 = items[0][1]
    if of[0] == of[1]:  # one arm's number against the same runs read with the pasted control
        better, worse = f"{better} with its trained attention", "the same runs with attention pasted uniform"
    verb = VERBS.get(metric, f"was lower in {metric} than")
    where = f" at {var} = {_values([at for at, _ in items])}" if var else ""
    means = [c["mean"] for _, c in items]
    by = _sizes(metric, means)
    if spread_said and len(items) == 1:
        by += beside_spread(doc, c0)
    elif spread_said and spread(doc, c0) > 0 and metric in VERBS:
        by += f" (the seeds of one arm spread by about {size(metric, spread(doc, c0)).split(' (')[0]})"
    region = f"±{c0['region']:g}"
    bare = _sizes(metric, means).split(" (")[0]  # inside parentheses: no "(4: chance)" within them
    word = word_of(c0)
    if word == "holds":
        straddles = (len(items) == 1 and abs(c0["mean"]) < c0["region"] and "high" in c0
                     and max(abs(c0["low"]), abs(c0["high"])) > c0["region"])
        past = (f"; that is less than the region {region} that we count as too small to matter, but its interval "
                f"({_sizes(metric, [c0['low']]).split(' ')[0]} to {size(metric, c0['high']).split(' (')[0]}) reaches "
                "past it, so these seeds cannot call the gap too small" if straddles else "")
        return f"{better} {verb} {worse}{where}, by {by}{past}"
    if word == "holds within":
        return (f"{better} {verb} {worse}{where}, but only by {by}, inside the region {region} that we count as too "
                "small to matter")
    if word == "reversed":
        return f"the reverse of the claim{where}: {worse} {verb} {better}, by {by}"
    if word == "reversed within":
        return (f"the reverse of the claim{where}: {worse} {verb} {better}, though only by {by}, inside the region "
                f"{region} that we count as too small to matter")
    if word == "equivalent":
        return (f"{better} and {worse} are equivalent{where}: their difference ({bare}) lies within "
                f"the region {region}, too small to matter")
    return (f"these seeds cannot tell {better} from {worse}{where} (a difference of {bare}, within "
            "what the seeds' spread allows)")


def trend_clause(t: dict, var: str, n_values: int) -> str:
    """The trend along the variable, second to the verdicts at each value."""
    diff = f"{t['worse']} minus {t['better']}"
    word = word_of(t)
    if math.isnan(t.get("slope", float("nan"))):
        return ""
    fitted = ("" if len(t["values"]) == n_values else
              f" (fitted at {var} = {_values(t['values'])} only: elsewhere the worse arm is at chance)")
    per = f"{'+' if t['slope'] >= 0 else '-'}{size(t['metric'], t['slope']).split(' (')[0]} per doubling of {var}"
    if word in ("grows", "shrinks"):
        return f"the difference ({diff}) {'rises' if word == 'grows' else 'falls'} along {var}, {per}{fitted}"
    if word in ("grows within", "shrinks within"):
        return (f"the difference ({diff}) {'rises' if word.startswith('grows') else 'falls'} along {var}, but by "
                f"less than the region (±{t['region']:g} per doubling): {per}{fitted}")
    if word == "flat":
        return f"the difference stays level along {var} (within ±{t['region']:g} per doubling){fitted}"
    two = " with only two values" if len(t["values"]) == 2 else ""
    return f"whether the difference changes along {var} these seeds cannot tell{two} ({per}){fitted}"


def groups(doc: dict, key: str = "comparisons") -> list[tuple[tuple[str, str], str, list[tuple[float | None, dict]]]]:
    """A doc's comparisons grouped by expectation: ((better, worse) before the variable's value was added, metric,
    [(value or None, comparison)]), in the doc's order."""
    out: dict[tuple, list] = {}
    cs = doc.get(key, [])
    ats = doc.get("at") or [None] * len(cs)
    ofs = doc.get("of") or [None] * len(cs)
    for c, at, of in zip(cs, ats, ofs):
        of = tuple(of) if of else (c["better"], c["worse"])
        out.setdefault((of, c["metric"]), []).append((at, c))
    return [(of, metric, sorted(items, key=lambda x: -math.inf if x[0] is None else x[0]))
            for (of, metric), items in out.items()]


def _by_word(items):
    words: dict[str, list] = {}
    for at, c in items:
        words.setdefault(word_of(c), []).append((at, c))
    return list(words.values())


def group_sentence(claim: Claim, doc: dict, of, metric: str, items, var: str | None, trend: dict | None,
                   spread_said: bool = True) -> str:
    """One expectation in words: the verdicts at each value (grouped by word) first, the trend second."""
    parts = [clause(claim, doc, of, metric, same, var, spread_said) for same in _by_word(items)]
    text = "; ".join(parts)
    if trend is not None and var:
        tc = trend_clause(trend, var, len(items))
        if tc:
            text += "; " + tc
    return text[0].upper() + text[1:] + "."


def _trend_for(doc: dict, of, metric: str, key: str = "trends") -> dict | None:
    return next((t for t in doc.get(key, []) if (t["better"], t["worse"]) == tuple(of) and t["metric"] == metric),
                None)


def caveats(claim: Claim, of, items) -> list[str]:
    words = {word_of(c) for _, c in items}  # "holds within" is not "holds": a caveat names which it is for
    return [cv.text for cv in claim.caveats if (cv.better, cv.worse) == tuple(of) and words & set(cv.when)]


def _key(c: dict) -> tuple:
    return c["better"], c["worse"], c["metric"]


def rate_checks(doc: dict) -> list[tuple[float, dict]]:
    """The rate check's verdicts in a doc: [(factor, {"comparisons", "at", "of", "results"})], the second rate
    first, then any further rates the claim names."""
    out = []
    if doc.get("comparisons_second"):
        out.append(((doc.get("second_rate") or {}).get("factor", float("nan")),
                    {"comparisons": doc["comparisons_second"], "results": doc.get("results_second", {})}))
    out += [(m["factor"], {"comparisons": m["comparisons"], "results": m.get("results", {})})
            for m in doc.get("more_rates") or [] if m.get("comparisons")]
    return [(f, d | {"at": doc.get("at"), "of": doc.get("of")}) for f, d in out]


RATE_WORDS = {1 / 3: "a third of", 1 / 9: "a ninth of", 3.0: "three times", 9.0: "nine times"}


def rate_said(factor: float, own: bool, common: float) -> str:
    """A rate of the check in words: "a third of each arm's own rate", or the rate itself."""
    if not own:
        return f"{common * factor:g}"
    words = next((w for f, w in RATE_WORDS.items() if math.isclose(f, factor, rel_tol=1e-6)), f"{factor:.2g} x")
    return f"{words} each arm's own rate"


def _changed(first: dict, items) -> list:
    """The (value, comparison) items whose word differs from the same comparison's at the first rate."""
    return [(at, c) for at, c in items if _key(c) in first and first[_key(c)]["verdict"] != c["verdict"]]


def rate_sentences(claim: Claim, doc: dict) -> list[str]:
    """The verdicts at the check's other fixed rates beside the first, one sentence per rate: a word that differs
    reads "depends on the rate"."""
    checks = rate_checks(doc)
    if not checks:
        skipped = "second_rate" in doc and not doc.get("second_rate") and not doc.get("quick") and claim.second_rate
        return (["These runs were not checked at a second rate (--no-rate-check): whether a verdict depends on the "
                 "rate is not known."] if skipped else [])
    first = {_key(c): c for c in doc["comparisons"]}
    own = any(v is None for v in doc.get("rates", {}).values())
    common = doc.get("common_rate", float("nan"))
    var = doc.get("variable")
    out, same = [], []
    for factor, check in checks:
        r2 = rate_said(factor, own, common) + ("" if own else f" instead of {common:g}")
        flips = []
        for of, metric, items in groups(check):
            changed = _changed(first, items)
            if changed:
                was = "/".join(sorted({first[_key(c)]["verdict"] for _, c in changed}))
                flips.append(f"{said(claim, of[0])} against {said(claim, of[1])} reads otherwise ({was} at the first "
                             "rate): " + "; ".join(clause(claim, check, of, metric, same_, var, spread_said=False)
                                                   for same_ in _by_word(changed)))
        kept = []  # a reversal is the finding a reader doubts first: say that it survives the other rate
        for of, metric, items in groups(check):
            still = [(at, c) for at, c in items if _key(c) in first and first[_key(c)]["verdict"] == "reversed"
                     and c["verdict"] == "reversed"]
            kept += [clause(claim, check, of, metric, same_, var, spread_said=False) for same_ in _by_word(still)]
        if flips:
            these = "this finding depends" if len(flips) == 1 else "these findings depend"
            out.append(f"At {r2}, " + "; and ".join(flips) + f": {these} on the rate.")
        else:
            same.append(r2)
        if kept:
            out.append(f"At {r2} the reversal{'s' * (len(kept) > 1)} above read{'s' * (len(kept) == 1)} the same: "
                       + "; ".join(kept) + ".")
    if same:
        out.insert(0, f"At {joined(same)} every verdict reads the same{' as well' if out else ''}.")
    return out


def flipped(doc: dict) -> set[tuple[tuple[str, str], str]]:
    """The expectations ((better, worse), metric) whose word differs at any checked rate from the first."""
    first = {_key(c): c for c in doc.get("comparisons", [])}
    return {(tuple(of), metric) for _, check in rate_checks(doc) for of, metric, items in groups(check)
            if _changed(first, items)}


SHORT = {"holds": "{a} was better", "holds within": "{a} was better, by less than the region",
         "reversed": "{b} was better", "reversed within": "{b} was better, by less than the region",
         "equivalent": "{a} and {b} are equivalent", "undecided": "these seeds cannot tell {a} from {b}"}


def flips_said(claim: Claim, doc: dict, pairs) -> str:
    """How the words of `pairs` ((better, worse), metric) read at the rates where they differ, in short: "at a
    third and a ninth of each arm's own rate, an LSTM given the transformer's wall time was better"."""
    first = {_key(c): c for c in doc.get("comparisons", [])}
    own = any(v is None for v in doc.get("rates", {}).values())
    common = doc.get("common_rate", float("nan"))
    said_at_rates: dict[str, list[str]] = {}
    for factor, check in rate_checks(doc):
        for of, metric, items in groups(check):
            if (tuple(of), metric) not in pairs:
                continue
            changed = _changed(first, items)
            for same in _by_word(changed):
                w = word_of(same[0][1])
                text = SHORT.get(w, w).format(a=said(claim, of[0]), b=said(claim, of[1]))
                if doc.get("variable") and same[0][0] is not None:
                    text += f" at {doc['variable']} = {_values([at for at, _ in same])}"
                said_at_rates.setdefault(text, []).append(rate_said(factor, own, common))
    parts = []
    for text, rates in said_at_rates.items():
        if own and len(rates) > 1:  # "a third and a ninth of each arm's own rate"
            rates = [r.replace(" of each arm's own rate", "") for r in rates[:-1]] + rates[-1:]
        parts.append(f"at {joined(rates)}, {text}")
    return "; ".join(parts)




def outlier_sentences(claim: Claim, doc: dict) -> list[str]:
    """The seeds flagged far from their arm, and the verdicts without them where a word differs."""
    flagged = doc.get("outliers") or []
    if not flagged:
        return []
    named = "; ".join(f"{said_at(claim, f['arm'])}, seed {f['seed']} ({size(f['metric'], f['value']).split(' (')[0]} "
                      f"against its arm's median {size(f['metric'], f['median']).split(' ')[0]}, {f['mads']:.0f} MADs "
                      "away)" for f in flagged)
    many = f"{len(flagged)} seeds lie" if len(flagged) > 1 else "One seed lies"
    text = [f"{many} far from the other seeds of {'their arms' if len(flagged) > 1 else 'its arm'} (more than "
            f"{OUTLIER_K:g} scaled MADs from the arm's median; kept in the verdicts above): {named}."]
    robust = {_key(c): c for c in doc.get("comparisons_robust") or []}
    var = doc.get("variable")
    changed = []
    for of, metric, items in groups(doc):
        moved = [(at, robust[_key(c)]) for at, c in items if _key(c) in robust
                 and robust[_key(c)]["verdict"] != c["verdict"]]
        changed += [clause(claim, doc, of, metric, same, var, spread_said=False) for same in _by_word(moved)]
    text.append("Without the flagged seeds: " + "; ".join(changed) + "." if changed else
                "Without them every verdict reads the same.")
    return text


def lower_first(text: str) -> str:
    """A sentence's first word lowered to run on after a semicolon, unless it is a name (RoPE, LSTM)."""
    first = text.split(" ", 1)[0]
    return text[0].lower() + text[1:] if first[1:].islower() or len(first) == 1 else text


def axis_sentences(claim: Claim, doc: dict) -> list[str]:
    """Along a measured axis (the scored length, the position in the context): per expectation the words at
    each value, then the trend (none for an arm scored at one value only: its verdict is said above)."""
    axis = doc.get("axis") or {}
    out = []
    for t, pv in zip(axis.get("trends", []), axis.get("per_value", [])):
        if len(pv) < 2:
            continue
        items = [(v, c | {"metric": t["metric"]}) for v, c in pv]
        var = {"length": "the scored length (x the trained context)",
               "position": "the position in the context"}.get(axis.get("name"), t["variable"])
        out.append(f"Along {var}: " + lower_first(group_sentence(claim, {"results": {}}, (t["better"], t["worse"]), t["metric"],
                                                                   items, t["variable"], t)))
    return out


def found(claim: Claim, doc: dict) -> str:
    """The paragraph "What we found": the tutorial's sentence, what the models trained here show (direction, size
    and what it means beside the spread between seeds), and the caveats that matter."""
    if not claim.arms:
        if not doc.get("slopes"):
            return f"The tutorials say: *{claim.statement}*. What the wall benchmark measured: {doc.get('summary', '')}."
        return (f"The tutorials say: *{claim.statement}*. What the wall benchmark measured on this CPU: "
                f"{wall_words(doc['slopes'])}.")
    var = doc.get("variable")
    unit = (" (sizes in bits/byte: the bits a model needs per byte of unseen text, lower is better)"
            if any(metric in ("bpb", "honest_bpb") for _, metric, _ in groups(doc)) else "")
    lines = [f"The tutorials say: *{claim.statement}*. What the models trained here show{unit}:", ""]
    notes = []
    for of, metric, items in groups(doc):
        text = group_sentence(claim, doc, of, metric, items, var, _trend_for(doc, of, metric))
        lines.append(f"- {text}")
        notes += [cv for cv in caveats(claim, of, items) if cv not in notes]
    lines += [f"- {s}" for s in axis_sentences(claim, doc)]
    for paragraph in ([f"{n[0].upper() + n[1:]}." for n in notes], rate_sentences(claim, doc),
                      outlier_sentences(claim, doc)):
        if paragraph:
            lines += ["", " ".join(paragraph)]
    return "\n".join(lines)


def wall_words(slopes: list[dict]) -> str:
    """The wall benchmark in words: each method's time factor per doubling of the context, and which it is nearer,
    quadratic (x4, a log-log slope of 2) or linear (x2, slope 1), read from the slope's interval against 1.5."""
    def kind(s: dict) -> str:
        if not math.isnan(s["low"]) and s["low"] > 1.5:
            return "nearer quadratic"
        if not math.isnan(s["high"]) and s["high"] < 1.5:
            return "nearer linear"
        return "between the two: its interval spans 1.5"

    first = slopes[0]
    parts = [f"{2 ** s['slope']:.2f} for {s['method']} (log-log slope {s['slope']:.2f}, {kind(s)})" for s in slopes]
    return ("each doubling of the context multiplied the time of one attention call (forward and backward) by "
            + joined(parts) + f", over T = {first['from']:,} to {first['to']:,} tokens (4 per doubling is quadratic, "
            "2 linear)")


def headline(claim: Claim, doc: dict) -> str:
    """The README's line for one claim: its headline expectations in words, and the caveats that change how the
    line reads (a reversal is in the clause; "depends on the rate"; "we do not know why")."""
    if not claim.arms:
        return wall_words(doc["slopes"]) if doc.get("slopes") else doc.get("summary", "")
    gs = groups(doc)
    picked = []
    for i in claim.headline:
        if i < len(claim.expect):
            e = claim.expect[i]
            picked += [g for g in gs if g[0] == (e.better, e.worse) and g[1] == e.metric]
    picked = picked or gs[:1]
    var = doc.get("variable")
    said_ = [group_sentence(claim, doc, of, metric, items, var, None, spread_said=False).rstrip(".")
             for of, metric, items in picked]
    text = "; ".join([said_[0]] + [lower_first(x) for x in said_[1:]])
    flags = []
    moved = flipped(doc)
    shown = moved & {(of, metric) for of, metric, _ in picked}
    if shown:
        flags.append(f"depends on the rate: {flips_said(claim, doc, shown)}")
    elif moved:  # a flip in a comparison this line does not give: said, but not on the findings it gives
        flags.append("another of its comparisons depends on the rate")
    if any("we do not know why" in cv for of, _, items in gs for cv in caveats(claim, of, items)):
        flags.append("we do not know why")
    if doc.get("outliers"):
        n = len(doc["outliers"])
        flags.append("a seed flagged far from its arm" if n == 1 else f"{n} seeds flagged far from their arms")
    return text + (f" — {'; '.join(flags)}" if flags else "") + "."

