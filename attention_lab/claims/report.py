"""A claim's report, every number and every verdict word read from its results.json (written here too), and
docs/claims.md and the README's claims list assembled from the results by one command.

    report.md    the statement; "What we found" (claims/plain.py: the finding in words); the key figure; then
                 "The fine print": machine, seeds, split, rates; one sentence per expectation (difference,
                 interval, p, Holm, region, verdict); trends; flagged seeds; the rate check; the arm table; the
                 sweep table; the published result
    docs         docs/claims.md (every claim's report, its figure redrawn from its results) and the README's one
                 line per claim; each real (not --quick) results.json read is kept as docs/claims/results_<name>.json,
                 so a later session regenerates the docs from them without re-running anything
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch
from scipy import stats

import attention_lab.claims.plain as plain
from attention_lab.claims.catalog import BRACKET, CLAIMS, Claim, along
from attention_lab.claims.runs import REPO
from attention_lab.claims.stats import OUTLIER_K
from attention_lab.runtime.device import cpu_model
from data.files import atomic_write, write_json_atomic

UNITS = {"bpb": "bits/byte", "honest_bpb": "bits/byte (honest: every later token cut off)",
         "max_score": "in the largest pre-softmax score", "context_left": "in identity left after the last block",
         "max_weight": "in the mean largest attention weight of a row", "saturated_rows": "in the share of rows whose "
         "largest weight is above 0.99", "log10_score_grad": "powers of ten in the gradient reaching the softmax's "
         "input (RMS per prediction; trained)", "log10_score_grad_init": "powers of ten in the gradient reaching the "
         "softmax's input (RMS per prediction; untrained, the run's seed)",
         "copy_bits": "bits per copied symbol (the copy half of held-out examples)"}
LEGEND = {"leaky_bpb": "as trained: the whole window in view", "honest_bpb": "honest: every later token cut off",
          "bpb": "bits/byte on the test plays", "context_left": "identity left, as trained",
          "context_left_uniform": "identity left, attention pasted uniform (the same runs)"}


def machine() -> str:
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    bf16 = "AMX-BF16" if caps.get("amx_bf16") else "AVX512-BF16" if caps.get("avx512_bf16") else "no native bf16"
    return f"{cpu_model()} ({bf16}), {os.cpu_count()} cores, torch {torch.__version__}"


def write_text(path: Path, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text if text.endswith("\n") else text + "\n")


def _f(v: float, digits: int = 4) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _docs(names: list[str]) -> str:
    """A held-out part's documents by name when they are few (the plays), by count when many (the recall task's
    examples, one document each)."""
    return ", ".join(names) if len(names) <= 6 else f"{len(names)} held-out documents"


def _p(p: float) -> str:
    if p is None or math.isnan(p):
        return "-"
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


# what an arm table's columns mean, where the name alone does not say (the mask claim gives three bits/byte)
COLUMNS = {"bpb": "bpb: bits/byte on the whole test plays, as trained (a mask that leaks sees the future here too)",
           "leaky_bpb": "leaky_bpb: bits/byte on a few test windows, as trained: the whole window in view",
           "honest_bpb": "honest_bpb: bits/byte on the same windows with every later token cut off, what the model "
                         "predicts without the future; equal to leaky_bpb when the mask leaks nothing"}


def column_lines(claim: Claim, keys) -> list[str]:
    """One line per bits/byte column of the arm table when there are several: what it measures, and which one the
    verdict reads and why."""
    shown = [k for k in COLUMNS if k == "bpb" or k in keys]
    if len(shown) < 2:
        return []
    read = {e.metric for e in claim.expect}
    why = ("the verdict reads this one: a leaking mask wins on the numbers that let it see the future, so only "
           "this one compares what each arm predicts" if "honest_bpb" in read else "the verdict reads this one")
    return [f"- {COLUMNS[k]}" + (f"; **{why}**" if k in read else "") for k in shown]


LOSSES = ("bpb", "honest_bpb")  # metrics where lower is better: only these get "(worse)" / "(better)"


def _level(c: dict) -> str:
    """The interval's level as the sentence names it: 95% alone, Holm's step's level among several."""
    conf = c.get("confidence", 0.95)
    return f"{100 * conf:.3g}%"


def sentence(c: dict, n_compared: int) -> str:
    """One expectation in words, every number from the comparison; the interval printed is the one the verdict
    word was read from (the level Holm's step used)."""
    unit = UNITS.get(c["metric"], f"in {c['metric']}")
    if c["better"] == c["worse"]:  # one arm's number against the same runs read with the pasted control
        worse = f"{c['worse']} read with the pasted control (uniform attention in the same trained runs)"
        better = "with its trained attention"
    else:
        worse, better = c["worse"], c["better"]
    up = c["mean"] > 0
    if c["metric"] in LOSSES:
        direction = "higher (worse)" if up else "lower (better)"
    else:
        direction = "higher, as the claim predicts," if up else "lower, against the claim's prediction,"
    n = len(c["seeds"])
    text = (f"**{c['verdict']}**: {worse} is {direction} than {better} by {abs(c['mean']):.4f} {unit} (mean of {n} "
            f"paired seed{'s' * (n > 1)}")
    if n > 1:
        step = (f"the level Holm's step tested it at among {n_compared}" if n_compared > 1 else "one comparison")
        text += (f"; {_level(c)} interval {c['low']:+.4f} to {c['high']:+.4f} ({step}); p = {_p(c['p'])}, "
                 f"{_p(c['p_holm'])} after Holm's correction for {n_compared}; region of practical equivalence "
                 f"±{c['region']:g}; the smallest region these seeds could call equivalent ±{c['smallest_region']:.4f}")
        if not math.isnan(c.get("correlation", float("nan"))):
            text += (f"; the arms' seeds correlate {c['correlation']:+.2f}, paired sd / unpaired sd "
                     f"{c['paired_over_unpaired']:.2f})")
        else:
            text += ")"
    else:
        text += "; one seed: no interval)"
    if c.get("left_out"):
        text += "; left out by the divergence rule: " + ", ".join(c["left_out"])
    if c["verdict"] == "undecided":
        if abs(c["mean"]) <= c["region"]:
            text += ("; this many seeds cannot tell, and the difference seen lies inside the region: more seeds "
                     "would be spent to show equivalence, not a difference")
        else:
            text += ("; this many seeds cannot tell" + (f": about {c['seeds_needed']} paired seeds would find a "
                     "difference of this size 4 times in 5 at this level" if c.get("seeds_needed") else
                     ": the difference is too small against the seed noise for any practical number of seeds"))
    elif c["verdict"] == "equivalent":
        text += ": the whole interval lies inside the region, no difference that matters"
    elif c.get("within_region"):
        text += (": significant, but the whole interval lies inside the region, a difference too small to matter "
                 "(the word is read before the region, so a difference on the wrong side always reads reversed)")
    return text


def arm_table(claim: Claim, doc: dict, key: str = "results") -> str:
    results = doc[key]
    # the number the verdicts read leads (mask: honest_bpb, where bpb with the future visible flatters a leak)
    main = next((e.metric for e in claim.expect if any(e.metric in r for rs in results.values() for r in rs)), "bpb")
    skip = {main, "seed", "seconds", "step", "lr", "run", "sample"}
    keys = sorted({k for rs in results.values() for r in rs for k, v in r.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in skip})
    said = "bits/byte (mean ± sd)" if main == "bpb" else f"{main}, the verdicts' number (mean ± sd)"
    head = ["arm", "rate", "step scored", said, "per seed", "diverged"] + keys + ["seconds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in claim.arms:
        rs = results.get(arm.name, [])
        if not rs:
            continue
        b = np.array([r[main] for r in rs if r.get(main) is not None])
        cells = [arm.name, ", ".join(sorted({f"{r['lr']:g}" for r in rs})),
                 ", ".join(sorted({str(r["step"]) for r in rs if "step" in r})) or "-",
                 f"{b.mean():.4f} ± {b.std(ddof=1):.4f}" if len(b) > 1 else f"{b.mean():.4f}" if len(b) else "-",
                 ", ".join(f"{r[main]:.4f}" + ("†" if r.get("diverged") else "") if r.get(main) is not None
                           else "stopped†" for r in rs),
                 f"{sum(bool(r.get('diverged')) for r in rs)} of {len(rs)}"]
        for k in keys:
            v = [r[k] for r in rs if r.get(k) is not None]
            cells.append(_fmt(float(np.mean(v))) if v else "-")
        cells.append(f"{np.mean([r['seconds'] for r in rs]):.0f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _per_value(doc: dict, t: dict) -> list[tuple[float, dict]]:
    """The comparisons of one trend's expectation, one per value of the variable, ascending."""
    return sorted(((at, c) for c, at, of in zip(doc.get("comparisons", []), doc.get("at", []), doc.get("of", []))
                   if of == [t["better"], t["worse"]] and c["metric"] == t["metric"]), key=lambda x: x[0])


def trend_sentence(doc: dict, t: dict, per_value: list | None = None) -> str:
    """One trend in words: its slope per doubling with its interval, the mean at each value, the word at each
    (`per_value`: [(value, comparison)], default the claim's own comparisons along its variable)."""
    var, unit = t["variable"], UNITS.get(t["metric"], f"in {t['metric']}")
    n = len(t["seeds"])
    text = f"**{t['verdict']}**: {t['worse']} minus {t['better']} ({unit})"
    if math.isnan(t["slope"]):
        return text + ": too few values or seeds for a slope"
    level = f"{100 * t.get('confidence', 0.95):.3g}%"
    interval = (f"{level} interval {t['low']:+.4f} to {t['high']:+.4f} over {n} seeds" if not math.isnan(t["low"])
                else f"{n} seed: no interval")
    holm = (f", {_p(t['p_holm'])} after Holm's correction with the claim's other tests" if "p_holm" in t
            and not math.isnan(t["p_holm"]) else "")
    text += (f" changes by {t['slope']:+.4f} per doubling of {var} ({interval}, each seed's least-squares slope on "
             f"log2 {var}; p = {_p(t['p'])}{holm}; flat: not significant and inside ±{t['region']:g} per doubling)"
             + (", by less than the region: the whole interval lies inside it" if t.get("within_region")
                and t["verdict"] in ("grows", "shrinks") else "")
             + f". Mean difference at {var} = " + ", ".join(f"{v:g}: {m:+.4f}" for v, m in zip(t["values"], t["means"])))
    words: dict[str, list[str]] = {}
    for at, c in (per_value if per_value is not None else _per_value(doc, t)):
        words.setdefault(c["verdict"], []).append(f"{at:g}")
    if words:
        text += "; the verdict at each value: " + "; ".join(f"{w} at {var} = {', '.join(v)}" for w, v in words.items())
    return text


def trend_section(doc: dict) -> list[str]:
    if not doc.get("trends"):
        return []
    var = doc["variable"]
    lines = [f"## Along {var}", "", f"Every expectation is decided at each value of {var} (the verdicts above, which "
             f"lead), and one trend test per expectation asks second whether the difference grows or shrinks as {var} "
             "doubles (stats.trend: a one-sample t-test over the seeds' slopes, in the claim's Holm family with the "
             "comparisons; a value where the worse arm is at chance is left out of it).", ""]
    return lines + [f"- {trend_sentence(doc, t)}" for t in doc["trends"]] + ["", "The plot at the end: the difference "
                    f"at each {var} with the interval its verdict was read from, and each seed's.", ""]


def axis_section(doc: dict) -> list[str]:
    """Along a measured axis (no new runs): a trend per expectation, the paired difference at each value with the
    interval its word was read from (Holm across the values of one expectation)."""
    axis = doc.get("axis")
    if not axis or not axis["trends"]:
        return []
    lines = [f"## Along {axis['said']}", "",
             f"Every verdict seed measured along {axis['said']}, each expectation's paired difference at each value "
             "decided (Holm across the values) and one trend test per expectation (stats.trend)."
             + (" Learned positions have no row past their table: they are scored at 1x only." if axis["name"] ==
                "length" else ""), ""]
    for t, pv in zip(axis["trends"], axis["per_value"]):
        lines.append(f"- {trend_sentence(doc, t, [(v, c) for v, c in pv])}")
        lines.append("  - " + "; ".join(f"{v:g}: {c['mean']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]"
                                         if not math.isnan(c["low"]) else f"{v:g}: {c['mean']:+.4f}" for v, c in pv))
    return lines + [""]


def diverged_section(claim: Claim, doc: dict) -> list[str]:
    """The divergence rule and, per arm, how many of its runs diverged and which: in every report."""
    counts = doc.get("diverged", {})
    total = sum(c["sweep"][0] + c["seeds"][0] + c["common"][0] for c in counts.values())
    runs = sum(c["sweep"][1] + c["seeds"][1] + c["common"][1] for c in counts.values())
    lines = ["## Diverged runs", "", f"The rule: {doc.get('diverged_rule', '')}. A rate at which any sweep run "
             "diverged is never chosen; a verdict seed whose run diverged in either arm is left out of that "
             "comparison (named beside it) and never averaged in; † in the tables marks such a run.", ""]
    if not total:
        lines += [f"None of the {runs} runs read here diverged.", ""]
        return lines
    lines += ["| arm | sweep runs | verdict seeds | at the common rate | which |", "|---|---|---|---|---|"]
    for arm in (a.name for a in claim.arms if a.name in counts):
        c = counts[arm]
        lines.append(f"| {arm} | {c['sweep'][0]} of {c['sweep'][1]} | {c['seeds'][0]} of {c['seeds'][1]} | "
                     f"{c['common'][0]} of {c['common'][1]} | {'; '.join(c['runs']) or '-'} |")
    return lines + [""]


def common_section(claim: Claim, doc: dict) -> list[str]:
    """The common-rate verdict: every swept arm at one rate, the same seeds: does the verdict hang on the rates?"""
    if doc.get("rate_rule", "swept") != "swept" and _own_rates(doc) and \
            all(v is None for v in doc.get("rates", {}).values()):
        return ["## Rates", "", f"No sweep: each arm trained at a rate of its own fixed in advance ({_own_rates(doc)}; "
                "the notes above say where each comes from), so there is no common-rate verdict: the arms' rates "
                "differ by design.", ""]
    if doc.get("rate_rule", "swept") != "swept":
        return ["## Rates", "", f"No sweep: every arm that is not about its rate trained at {doc['common_rate']:g}, "
                "a rate fixed in advance (one rate and no bracketing), so the verdict above is already the "
                "common-rate one.", ""]
    cs = doc.get("comparisons_common", [])
    if not cs:
        return []
    lines = ["## Sensitivity: every arm at one rate", "",
             f"The same verdict seeds with every swept arm at the common rate {doc['common_rate']:g} (the base "
             "preset's) instead of its chosen one: a verdict that changes here hangs on the rates the sweep chose.",
             ""]
    lines += [f"- {sentence(c, len(cs))}" for c in cs] + [""]
    return lines + [arm_table(claim, doc, "results_common"), ""]


def sweep_table(claim: Claim, doc: dict) -> str:
    sweep = doc["sweep"]
    if not sweep:
        return ""
    sweep = {a.name: sweep[a.name] for a in claim.arms if a.name in sweep}  # the claim's order, not the JSON's
    rates = sorted({float(r) for v in sweep.values() for r in v})
    grid = [float(r) for r in doc.get("grid", [])] or rates
    rows = ["| arm | " + " | ".join(f"lr {r:g}" + ("" if r in grid else " *") for r in rates) + " | chosen |",
            "|---|" + "--:|" * len(rates) + "---|"]
    edge, beyond = [], []
    for arm, values in sweep.items():
        by_rate = {float(k): v for k, v in values.items()}
        bad = {float(k): v for k, v in doc.get("sweep_diverged", {}).get(arm, {}).items()}
        best = doc.get("rates", {}).get(arm) or min(by_rate, key=by_rate.get)
        seeds = {float(k): v for k, v in doc.get("sweep_per_seed", {}).get(arm, {}).items()}

        def cell(r: float) -> str:
            if r not in by_rate:
                return "-"
            value = "-" if by_rate[r] is None or math.isnan(by_rate[r]) else f"{by_rate[r]:.4f}"
            text = f"**{value}**" if math.isclose(r, best) else value
            each = list(seeds.get(r, {}).values())
            text += f" ({', '.join('stopped' if v is None else f'{v:.2f}' for v in each)})" if len(each) > 1 else ""
            if r in bad:
                text += f" diverged: seed{'s' * (len(bad[r]) > 1)} {', '.join(map(str, bad[r]))}"
            return text

        rows.append(f"| {arm} | " + " | ".join(cell(r) for r in rates) + f" | {best:g} |")
        if any(math.isclose(best, x) for x in (min(by_rate), max(by_rate))):
            edge.append(arm)
        if set(by_rate) - set(grid):
            beyond.append(arm)
    metric = "honest bits/byte" if doc["choose_by"] == "honest_bpb" else "bits/byte"
    sweep_seeds = doc.get("sweep_seeds", [1])
    which = (f"the mean of seeds {', '.join(map(str, sweep_seeds))} (each in brackets)" if len(sweep_seeds) > 1
             else f"seed {sweep_seeds[0]}")
    text = (f"The sweep: {metric} on the choose plays ({_docs(doc['split']['choose'])}), final checkpoint, "
            f"{which}; bold: the rate the arm's verdict seeds then trained at, the best among the rates at which no "
            "sweep run diverged.")
    if doc.get("bracket"):
        text += (f" The grid is {', '.join(f'{r:g}' for r in grid)}; where an arm's best rate sat at its edge the sweep "
                 f"tried the next rate beyond it (*), up to {doc['bracket']} more"
                 + (f": {', '.join(beyond)}." if beyond else "; no arm's best was at the edge."))
    text += "\n\n" + "\n".join(rows)
    if edge:
        text += (f"\n\nChosen at the edge of what was tried: {', '.join(edge)} (a rate beyond it might be better "
                 "still; `--rates` widens the grid).")
    return text


def _fmt(v: float) -> str:
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4f}" if abs(v) < 10 else f"{v:.2f}"


def verdict_summary(doc: dict) -> str:
    """The claim's verdicts in one table cell: each expectation's word, its difference and the interval the word
    was read from (Holm's step's level); along a variable, each trend and the word at each value."""
    if doc.get("trends"):
        parts = []
        for t in doc["trends"]:
            metric = "" if t["metric"] == "bpb" else f" ({t['metric']})"
            slope = "" if math.isnan(t["slope"]) else f" {t['slope']:+.3f}/doubling [{t['low']:+.3f}, {t['high']:+.3f}]"
            each = "/".join(c["verdict"] for _, c in _per_value(doc, t))
            at = "/".join(f"{v:g}" for v, _ in _per_value(doc, t))
            parts.append(f"{t['worse']} vs {t['better']}{metric} at {t['variable']} = {at}: {each}; along "
                         f"{t['variable']}: **{t['verdict']}**{slope}")
        return "; ".join(parts)
    parts = []
    for c in doc.get("comparisons", []):
        if c["better"] != c["worse"]:
            what = f"{c['worse']} vs {c['better']}" + ("" if c["metric"] == "bpb" else f" ({c['metric']})")
        else:
            what = f"{c['metric']}: trained attention vs the pasted control"
        interval = "" if math.isnan(c["low"]) else f" [{c['low']:+.3f}, {c['high']:+.3f}]"
        parts.append(f"{what}: **{c['verdict']}** {c['mean']:+.3f}{interval}")
    axis = doc.get("axis") or {}
    for t, pv in zip(axis.get("trends", []), axis.get("per_value", [])):  # along a measured axis: word, slope, each
        if not math.isnan(t["slope"]):
            each = "/".join(c["verdict"] for _, c in pv)
            unit = "" if t["metric"] == "bpb" else f" ({t['metric']})"  # the position trend is in nats/token
            parts.append(f"{t['worse']} vs {t['better']}{unit} at {t['variable']} = "
                         f"{'/'.join(f'{v:g}' for v, _ in pv)}: {each}; along {t['variable']}: **{t['verdict']}** "
                         f"{t['slope']:+.3f}/doubling [{t['low']:+.3f}, {t['high']:+.3f}]")
    return "; ".join(parts) if parts else doc.get("summary", "")


def write(claim: Claim, doc: dict, out: Path) -> Path:
    write_json_atomic(out / "results.json", doc)
    figure(claim, doc, out / "plot.png")
    return render(claim, out)


def figure(claim: Claim, doc: dict, path: Path) -> None:
    """The claim's key figure, from its results alone."""
    if not claim.arms:
        plot_wall(doc, path)
    elif doc.get("trends"):
        plot_trends(claim, doc, path)
    else:
        plot(claim, doc["results"], path)


def render(claim: Claim, out: Path) -> Path:
    """report.md from results.json alone."""
    doc = json.loads((out / "results.json").read_text())
    return _done(out, report_lines(claim, doc))


WORDS_SAID = ("**holds**: the difference is significant after Holm's correction and on the side the claim predicts; "
              "**reversed**: significant and on the other side, the reverse of the claim; **equivalent**: not "
              "significant, and the whole interval lies inside the region of practical equivalence (too small to "
              "matter); **undecided**: these seeds cannot tell. bits/byte: the bits a model needs on average to "
              "encode each byte of unseen text (lower is better; 8 would be knowing nothing about the next byte)")


def report_lines(claim: Claim, doc: dict, figure_path: str = "plot.png") -> list[str]:
    """The report from a results doc: What we found, the figure, then the fine print."""
    quick = " (--quick: a smoke run, not a measurement)" if doc["quick"] else ""
    lines = [f"# Claim `{claim.name}`{quick}", "", f"> {claim.statement}", "",
             f"**What we found.** {plain.found(claim, doc)}", ""]
    if not claim.arms:
        figure_line = [f"![{claim.name}: {claim.statement}]({figure_path})", ""] if doc.get("slopes") else []
        lines += figure_line + ["## The fine print", "", f"Machine: {doc['machine']}.", "", doc["body"], "",
                                "### Published", "",
                  claim.published]
        return lines
    lines += [f"![{claim.name}: {claim.statement}]({figure_path})", "", "## The fine print", ""]
    if doc.get("rules") != RULES:
        lines += [EARLIER_RULES, ""]
    n_runs = len(doc["run_seconds"])
    own = f" with {' '.join(claim.overrides)}" if claim.overrides else ""
    lines += [f"Machine: {doc['machine']}. Base preset: configs/experiment/claims.yaml{own}"
              f"{' and the --quick overrides (which beat them)' if doc['quick'] and own else ''}"
              f"{' with the --quick overrides' if doc['quick'] and not own else ''}; launcher: "
              f"{' '.join(doc['launcher']) or 'basic'}{_launch(doc)}. Verdict seeds "
              f"{', '.join(map(str, doc['seeds']))} per arm, paired (seed s: the same initialisation stream, batches "
              f"and test windows in every arm). " + _rates_said(doc) + "Every number below is the "
              f"final checkpoint scored on the test plays ({_docs(doc['split']['test'])}), which no choice read. "
              f"This run trained {n_runs} run{'s' * (n_runs != 1)} and reused the rest; it took "
              f"{doc['minutes']:.1f} min in all." + _cost(doc), ""]
    lines += [f"- {n}" for n in claim.notes] + ([""] if claim.notes else [])
    lines += [f"The words: {WORDS_SAID}.", ""]
    sub: list[str] = ["## Verdict", ""]
    n = len(doc["comparisons"]) + len(doc.get("trends", [])) + len((doc.get("axis") or {}).get("trends", []))
    sub += [f"- {sentence(c, n)}" for c in doc["comparisons"]] + [""]
    sub += trend_section(doc)
    sub += axis_section(doc)
    sub += outlier_section(doc)
    sub += diverged_section(claim, doc)
    sub += common_section(claim, doc)
    sub += second_section(claim, doc)
    sub += ["## Arms", "", arm_table(claim, doc), "",
              "bits/byte: every token of the test plays scored once, float32; step scored: the final checkpoint's; "
              "seconds: one run's wall clock (start-up included; runs that were reused keep the time they took).",
              ""]
    columns = column_lines(claim, {k for rs in doc["results"].values() for r in rs for k in r})
    sub += columns + ([""] if columns else [])
    if doc["sweep"]:
        sub += ["## Learning rates", "", sweep_table(claim, doc), ""]
    samples = [(arm, rs[0]["sample"]) for arm, rs in doc["results"].items() if rs and rs[0].get("sample")]
    if samples:
        sub += ["## Samples (temperature 0.8, the same test-play prompt, seed 1)", ""]
        sub += [f"- **{arm}**: {text.replace(chr(10), ' / ')[:400]}" for arm, text in samples] + [""]
    sub += ["## Published", "", claim.published]
    return lines + [("#" + x) if x.startswith("## ") else x for x in sub]


RULES = 43  # the rules this generator states (experiment.RULES writes it into results.json)
EARLIER_RULES = ("> **Numbers from earlier rules (issue 35).** These runs were decided before issue 43's rules: the "
                 "recall task's divergence read the last training batch, no seed was flagged far from its arm, the "
                 "trend tests stood outside the claim's Holm family, the region was read before significance, and "
                 "there was no second fixed rate. `python -m attention_lab.claims NAME` re-runs it under them.")


def outlier_section(doc: dict) -> list[str]:
    """The seeds flagged far from their arm, and the verdicts without them."""
    if "outliers" not in doc:
        return []
    lines = ["## Seeds far from their arm", "", f"The rule: {doc.get('outlier_rule', '')}.", ""]
    if not doc["outliers"]:
        return lines + ["No seed was flagged.", ""]
    lines += ["| arm | number | seed | value | the arm's median | scaled MADs away |", "|---|---|---|--:|--:|--:|"]
    lines += [f"| {f['arm']} | {f['metric']} | {f['seed']} | {f['value']:.4f} | {f['median']:.4f} | {f['mads']:.0f} |"
              for f in doc["outliers"]]
    robust = doc.get("comparisons_robust", [])
    n = len(robust) + len(doc.get("trends_robust", []))
    lines += ["", "The verdicts without the flagged seeds (each left out of every comparison of its arm):", ""]
    lines += [f"- {sentence(c, n)}" for c in robust]
    lines += [f"- {trend_sentence({'comparisons': robust, 'at': doc.get('at'), 'of': doc.get('of')}, t)}"
              for t in doc.get("trends_robust", [])]
    return lines + [""]


def second_section(claim: Claim, doc: dict) -> list[str]:
    """The rate check: every arm's verdict seeds at a second fixed rate."""
    second = doc.get("second_rate")
    if not second:
        return []
    cs = doc.get("comparisons_second", [])
    n = len(cs) + len(doc.get("trends_second", []))
    rates = ", ".join(f"{arm} at {lr:g}" for arm, lr in second["rates"].items())
    lines = ["## The rate check: a second fixed rate", "",
             f"The same verdict seeds with every arm at {second['factor']:.3g} x its rate ({rates}): a verdict "
             "word that differs from the one above depends on the rate, and the plain sentence says so.", ""]
    lines += [f"- {sentence(c, n)}" for c in cs]
    sdoc = {"comparisons": cs, "at": doc.get("at"), "of": doc.get("of")}
    lines += [f"- {trend_sentence(sdoc, t)}" for t in doc.get("trends_second", [])]
    lines += ["", arm_table(claim, doc, "results_second"), ""]
    for more in doc.get("more_rates") or []:  # further rates the claim names
        cs, ts = more["comparisons"], more.get("trends", [])
        rates = ", ".join(f"{arm} at {lr:g}" for arm, lr in more["rates"].items())
        lines += [f"At {more['factor']:.3g} x each arm's rate ({rates}):", ""]
        lines += [f"- {sentence(c, len(cs) + len(ts))}" for c in cs]
        mdoc = {"comparisons": cs, "at": doc.get("at"), "of": doc.get("of"), "results": more["results"]}
        lines += [f"- {trend_sentence(mdoc, t)}" for t in ts]
        lines += ["", arm_table(claim, mdoc), ""]
    return lines


def _launch(doc: dict) -> str:
    launch = doc.get("launch")
    return f" ({launch['threads']} thread{'s' * (launch['threads'] != 1)} a run, torch {launch['torch']})" if launch else ""


def _own_rates(doc: dict) -> str:
    """The arms that trained at the rate their overrides name (doc["rates"] None), as "arm at rate"."""
    own = [(arm, sorted({r["lr"] for r in rows})) for arm, rows in doc["results"].items()
           if doc.get("rates", {}).get(arm, 0) is None and rows]
    return ", ".join(f"{arm} at {'/'.join(f'{lr:g}' for lr in lrs)}" for arm, lrs in own)


def _rates_said(doc: dict) -> str:
    if doc.get("rate_rule") == "fixed in advance":
        if _own_rates(doc) and all(v is None for v in doc.get("rates", {}).values()):
            return f"Every arm trained at a rate of its own fixed in advance (no sweep): {_own_rates(doc)}. "
        return f"Every arm that is not about its rate trained at {doc['common_rate']:g}, fixed in advance (no sweep). "
    seeds = ", ".join(map(str, doc.get("sweep_seeds", [])))
    return (f"The rate of each arm was chosen on the choose plays ({_docs(doc['split']['choose'])}) by sweep "
            f"seeds {seeds}, which are not verdict seeds. ")


def _cost(doc: dict) -> str:
    """What the claim costs from nothing: its runs and their wall clocks summed (each as it was timed)."""
    if not doc.get("all_runs"):
        return ""
    n, minutes = len(doc["all_runs"]), sum(doc["all_runs"].values()) / 60
    said = (f" From nothing it is {n} runs whose own wall clocks sum to {minutes:.0f} min (each timed under the "
            "launcher it ran with; runs copied from another claim keep the time they took there).")
    if minutes / 2 > 60:  # issue 43: a claim takes at most about an hour on 2 cores; say which exceed it, and why
        said += (f" Two at a time on 2 cores that is about {minutes / 2:.0f} min, past the hour a claim aims for"
                 + (": half of the runs are the check at the second rate (`--no-rate-check` skips it)."
                    if doc.get("second_rate") else "."))
    return said


def _done(out: Path, lines: list[str]) -> Path:
    write_text(out / "report.md", "\n".join(lines))
    return out / "report.md"


def write_bench(claim: Claim, out: Path, quick: bool) -> Path:
    """The claim without arms (quadratic): the wall benchmark run now, its growth per doubling computed."""
    cmd = [sys.executable, "-m", "bench.run", "--only", "attention", "--out", str(out / "bench.json"),
           "--md", str(out / "bench.md")] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench/attention.py failed:\n{proc.stderr[-1500:]}")
    table = (out / "bench.md").read_text() if (out / "bench.md").exists() else proc.stdout
    rows = json.loads((out / "bench.json").read_text())["tables"]["attention"]["rows"]
    from attention_lab.claims.stats import loglog_slope

    slopes: list[dict] = []
    lines, summary = ["## Verdict", "", "Per method, the slope of a least-squares fit of log2(time) on log2(T) over the "
                      "upper half of the lengths measured (at least 3 where there are), with its 95% interval (n - 2 degrees of freedom): 2 is "
                      "quadratic, 1 linear; 2^slope is the factor per doubling. Each time is the median of the "
                      "benchmark's repeats.", ""], []
    for method in ("sdpa causal", "window blocks", "linear"):
        timed = sorted((r["T"], r["both_ms"]) for r in rows if r["method"] == method and r.get("both_ms"))
        grown = sorted((r["T"], r["growth"]) for r in rows if r["method"] == method and r.get("growth"))
        if len(timed) < 2:
            continue
        upper = timed[min(len(timed) // 2, max(0, len(timed) - 3)):]  # the upper half, at least 3 lengths if there are
        fit = loglog_slope([t for t, _ in upper], [ms for _, ms in upper])
        interval = ("" if math.isnan(fit.low) else f" (95% interval {fit.low:.2f} to {fit.high:.2f}, "
                    f"{2 ** fit.low:.2f}x to {2 ** fit.high:.2f}x)")
        lines.append(f"- {method}: log-log slope {fit.slope:.2f} over T = {upper[0][0]:,}-{upper[-1][0]:,} "
                     f"({fit.n} lengths){interval}: {2 ** fit.slope:.2f}x the forward + backward time per doubling "
                     "of the context; at each doubling: " + ", ".join(f"{g:.2f} at T = {t:,}" for t, g in grown))
        summary.append(f"{method}: slope {fit.slope:.2f}" + ("" if math.isnan(fit.low) else
                       f" [{fit.low:.2f}, {fit.high:.2f}]") + f" over T = {upper[0][0]:,}-{upper[-1][0]:,}")
        slopes.append({"method": method, "slope": fit.slope, "low": fit.low, "high": fit.high,
                       "from": upper[0][0], "to": upper[-1][0], "times": timed})
    body = "\n".join(lines) + "\n\nThe wall, measured now by `python -m bench.run --only attention`:\n\n" + table
    doc = {"claim": claim.name, "quick": quick, "machine": machine(), "body": body, "summary": "; ".join(summary),
           "slopes": slopes}
    write_json_atomic(out / "results.json", doc)
    figure(claim, doc, out / "plot.png")
    return render(claim, out)


def wall_guides(times: list) -> list[tuple[str, np.ndarray, np.ndarray, str]]:
    """The wall figure's two guides through the first point of `times` ([(T, ms), ...], one method's): (label, T,
    ms, line style) of slope 2 (quadratic: x4 per doubling) and slope 1 (linear: x2) on the log-log axes."""
    t0, m0 = times[0]
    t = np.array([p[0] for p in times], dtype=float)
    return [("quadratic (x4 per doubling), for the eye", t, m0 * (t / t0) ** 2, "k--"),
            ("linear (x2 per doubling), for the eye", t, m0 * (t / t0), "k:")]


def plot_wall(doc: dict, path: Path) -> None:
    """The quadratic claim's figure: one attention call's time against the context, log-log, each method, with
    the slopes 2 (quadratic) and 1 (linear) drawn through the first point for the eye."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s in doc.get("slopes", []):
        t = np.array([p[0] for p in s["times"]], dtype=float)
        ms = np.array([p[1] for p in s["times"]], dtype=float)
        ax.plot(t, ms, "o-", label=f"{s['method']}: x{2 ** s['slope']:.2f} per doubling (slope {s['slope']:.2f})")
    if doc.get("slopes"):
        for label, t, ms, style in wall_guides(doc["slopes"][0]["times"]):
            ax.plot(t, ms, style, lw=0.8, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length T (tokens)")
    ax.set_ylabel("one attention call, forward + backward (ms)")
    ax.set_title("Claim 'quadratic': the cost grows with the square of the context\n"
                 "(batch 1, 6 heads of 64, this CPU; slopes fitted over the upper half of T)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def position_keys(buckets: dict) -> list:
    """A run's position buckets in the order of the position: read back from JSON the keys are text, and "128"
    sorts before "16"."""
    return sorted(buckets, key=int)


def plot(claim: Claim, results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    arms = [a.name for a in claim.arms if results.get(a.name)]
    if claim.plot.startswith("bars:"):
        metrics = claim.plot[5:].split(",")
        width = 0.8 / len(metrics)
        for m, metric in enumerate(metrics):
            values = [[r[metric] for r in results[a] if r.get(metric) is not None] for a in arms]
            mean = np.array([np.mean(v) if v else np.nan for v in values])
            sd = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in values])
            x = np.arange(len(arms)) + m * width
            # a point, not a bar from 0: the axis spans the numbers, so a difference of 0.01 shows
            ax.errorbar(x, mean, yerr=sd, fmt="o", ms=7, capsize=4, label=LEGEND.get(metric, metric))
            for xi, v in zip(x, values):  # each seed as a dot: the spread, not only its summary
                ax.plot([xi + 0.08] * len(v), v, "k.", ms=3)
        ax.set_xticks(np.arange(len(arms)) + 0.4 - width / 2, arms, fontsize=8)
        losses = all(m in ("bpb", "leaky_bpb", "honest_bpb") for m in metrics)
        ax.set_ylabel(("bits/byte on the test plays" if losses else UNITS.get(metrics[0], metrics[0]).removeprefix("in "))
                      + "\n(circles: mean ± sd over seeds; dots: each seed)", fontsize=8)
        ax.set_xlabel("arm (each a config override on the same base model)", fontsize=8)
    else:
        for arm in arms:
            r = results[arm][0]  # the first seed of each arm
            if claim.plot == "position" and all("position_buckets" in x for x in results[arm]):
                rows = [x for x in results[arm] if not x.get("diverged")]
                keys = position_keys(rows[0]["position_buckets"])
                curves = np.array([[x["position_buckets"][k] for k in keys] for x in rows])
                mean = curves.mean(0)
                half = (stats.t.ppf(0.975, len(rows) - 1) * curves.std(0, ddof=1) / np.sqrt(len(rows))
                        if len(rows) > 1 else np.zeros_like(mean))
                pos = [int(k) for k in keys]
                ax.plot(pos, mean, marker="o", label=arm)
                ax.fill_between(pos, mean - half, mean + half, alpha=0.2)
                ax.set_xlabel("position in the context (tokens seen; buckets 1, 2, 3-4, 5-8, ...)")
                ax.set_ylabel(f"test-play loss (nats/token), mean of {len(rows)} seeds, 95% band")
                ax.set_xscale("log")
            elif r.get("val_curve"):
                steps, losses = zip(*r["val_curve"])
                ax.plot(steps, losses, marker="o", label=arm)
                ax.set_xlabel("step")
                ax.set_ylabel("trainer's validation loss (nats/token), seed 1")
    ax.set_title(_title(claim), fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


VARIABLE_WORDS = {"d_k": "d_k: the size of each head's queries and keys (channels)",
                  "n_embd": "n_embd: the model's width (channels)",
                  "distance": "d: how far back the token to recall is (tokens)"}


def _title(claim: Claim) -> str:
    """A figure's title: the claim's whole sentence, wrapped."""
    import textwrap

    return textwrap.fill(f"Claim '{claim.name}': {claim.statement}", 95)


def arm_series(doc: dict, t: dict) -> dict[str, list[tuple[float, float, float]]]:
    """For one trend: each of its two arms' (value, mean, sd over seeds) of the trend's metric along the variable,
    from the arm's runs at each value (diverged seeds without the number left out)."""
    out = {}
    # every value the comparisons were decided at: the trend may leave some out (an arm at chance there), the arms'
    # own numbers are drawn at all of them
    values = [at for at, _ in _per_value(doc, t)] or t["values"]
    for arm in (t["better"], t["worse"]):
        pts = [(v, [r[t["metric"]] for r in doc["results"].get(f"{arm}, {t['variable']}={v:g}", [])
                    if r.get(t["metric"]) is not None]) for v in values]
        out[arm] = [(v, float(np.mean(ys)), float(np.std(ys))) for v, ys in pts if ys]
    return out


def plot_trends(claim: Claim, doc: dict, path: Path) -> None:
    """Per expectation: the paired difference at each value of the variable, with the interval its verdict was
    read from, against the variable (log scale); the trend's slope in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trends = doc["trends"]
    cols = 2 * min(2, len(trends))  # per expectation two panels, the difference and each arm; two pairs a row
    rows = -(-2 * len(trends) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.9 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[2 * len(trends):]:
        ax.set_visible(False)
    for ax, t in zip(axes.flat[1::2], trends):  # each arm's own number along the variable: which arm moves
        for arm, pts in arm_series(doc, t).items():
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                            capsize=3, label=arm)
        ax.set_xscale("log", base=2)
        shown = sorted({p[0] for pts in arm_series(doc, t).values() for p in pts}) or list(t["values"])
        ax.set_xticks(shown, [f"{v:g}" for v in shown])
        ax.set_xlabel(VARIABLE_WORDS.get(t["variable"], t["variable"]), fontsize=8)
        ax.set_ylabel(textwrap.fill(UNITS.get(t["metric"], t["metric"]).removeprefix("in "), 42), fontsize=7)
        ax.set_title("each arm (mean ± sd over seeds)", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax, t in zip(axes.flat[0::2], trends):
        pts = [(at, c) for at, c in _per_value(doc, t) if not math.isnan(c["mean"])]
        x = [at for at, _ in pts]
        y = np.array([c["mean"] for _, c in pts])
        lo = np.array([c["mean"] - c["low"] if not math.isnan(c["low"]) else 0.0 for _, c in pts])
        hi = np.array([c["high"] - c["mean"] if not math.isnan(c["high"]) else 0.0 for _, c in pts])
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=4)
        for at, c in pts:
            ax.plot([at] * len(c["diffs"]), c["diffs"], "k.", ms=3)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(VARIABLE_WORDS.get(t["variable"], t["variable"]), fontsize=8)
        ax.set_ylabel(f"{t['worse']} minus {t['better']}\n"
                      + textwrap.fill(f"({UNITS.get(t['metric'], t['metric'])})", 42), fontsize=7)
        slope = "" if math.isnan(t["slope"]) else f" {t['slope']:+.3f}/doubling"
        each = "/".join(c["verdict"] for _, c in pts)  # the verdict at each value leads, the trend second
        ax.set_title(f"at {'/'.join(f'{at:g}' for at, _ in pts)}: {each}\nalong {t['variable']}: {t['verdict']}{slope}",
                     fontsize=8)
        ax.set_xticks([at for at, _ in pts], [f"{at:g}" for at, _ in pts])
    fig.suptitle(_title(claim) + "\n" + textwrap.fill("left of each pair: the paired difference (dots: seeds; bars: "
                                                      "the interval its verdict was read from); right: each arm's "
                                                      "own number", 95), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------
# docs/claims.md and the README's table, from the reports

DOCS_INTRO = """# The tutorials' claims, tested

<!-- generated by `python -m attention_lab.claims docs` from claims/*/results.json (or the copies in
docs/claims/results_*.json): edit attention_lab/claims/ (catalog.py for the claims, plain.py and report.py for this
text), not this file -->

The texts this project teaches from explain *why* attention is built the way it is. Each "why" is a claim, and
each claim is an experiment you run on a CPU with one command:

```
.venv/bin/python -m attention_lab.claims --list            # the claims, their statements and arms
.venv/bin/python -m attention_lab.claims qk                # seeds at two fixed rates, verdict -> claims/qk/report.md
.venv/bin/python -m attention_lab.claims qk --quick        # a tiny version in seconds (a smoke run, not a measurement)
.venv/bin/python -m attention_lab.claims heads --launcher joblib --jobs 8   # the runs side by side on 8 cores
.venv/bin/python -m attention_lab.claims heads --launcher submitit_slurm -- hydra.launcher.partition=gpu
.venv/bin/python -m attention_lab.claims docs              # this page and the README's list, from the results
```

**How to read a claim.** Each section opens with **What we found**: the tutorial's sentence, then what the models
trained here show, in words, with the size of each difference. Sizes are mostly in **bits/byte**: the number of
bits a model needs, on average, to encode each byte of unseen text (its loss, in base 2, spread over the bytes the
tokens stand for). Lower is better; 8 would be knowing nothing about the next byte (all 256 values equally
likely). A difference is said beside the **spread between seeds**: how much the same arm moves when only
its random seed changes; a difference several times that spread is one the seeds agree on. Then comes the claim's
figure, and then **the fine print**: every statistic behind the words. The words themselves: {words}.

**How a claim is judged.** Its arms are config overrides on one base preset (`configs/experiment/claims.yaml`: 2
layers, 4 heads, 128 wide, a context of 128 BPE tokens, vocabulary 512, RoPE, QK-norm off, AdamW, batch 16, 600
steps; a claim may change these for all its arms, and its report names the change). No claim here sweeps its
rates: {fixed} train every arm at one rate fixed in advance (3e-3, the base preset's; the `rnn` claim's arms at
rates of their own, named in its notes), since a sweep costs 9 or more runs an arm, more than its 5 verdict seeds,
and would bring a claim past an hour on 2 cores. Instead every verdict is checked at a **second fixed rate** (a
third of each arm's first; the `rnn` claim, whose rates were chosen at another context, at a ninth too), and a
verdict word that differs there reads "depends on the rate" in the plain sentence. (`--rates 0.333,1,3` sweeps a claim instead: each arm over three rates on three *sweep* seeds, 101-103,
a best rate at the edge bringing the next one beyond it, up to {bracket} more; swept in the results below:
{swept}.) Each arm trains five *verdict* seeds (1-5); every seed's final checkpoint (chosen by nothing) is scored
on the *test* plays, two held-out plays no choice read. Arms are paired by seed: arm A and arm B with seed s start
from the same random stream and read the same batches; how much that pairing removes is measured, not assumed
(each verdict prints the correlation of the two arms' seeds and the paired sd over the unpaired one). For each
expectation the fine print gives the mean paired difference, the paired t-test's p-value with Holm's correction
across the claim's tests (its comparisons and its trend tests together), the t interval at the level Holm's step
tested it at (so an interval excludes 0 exactly when the word is holds or reversed), a region of practical
equivalence (±0.01 bits/byte unless stated) with the smallest region those seeds could call equivalent, and the
word. Significance is read first: a significant difference on the wrong side reads **reversed** wherever it lies,
and one inside the region says so ("by less than the region"). Along a variable (d_k, width, distance) the word
at each value leads and one trend test per expectation comes second; a value where an arm sits at chance is left
out of the trend. A run is **diverged** when its training loss became non-finite or rose above 1.5 times a
uniform guess's (1.5 ln vocab: a blow-up in its first steps that later steps partly hide), when its final
validation loss is more than 10% above the lowest it reached, or (on tasks without a noise floor) when its final training loss is
above its first evaluation's validation loss; a diverged seed is left out of its comparisons and named. A seed
more than {outlier_k:g} scaled MADs from its arm's median is **flagged**: kept in the verdict, shown, and the
verdict decided once more without it. The runs of a claim are one Hydra multirun (`train.py -m`), so any Hydra
launcher runs them (by default joblib, one run per core with one thread each, where it is installed); finished
runs are reused, and a run another claim already trained is copied only if it was launched the same way
(launcher, threads a run, torch version), since a run's numbers move with its thread count. Statistics:
scipy.stats (Bouthillier et al. 2021 on the sources of variance; Dror et al. 2018 on significance testing; Holm
1979; Schuirmann 1987 on equivalence).

Nothing below is written by hand: each section is generated from its claim's results; a claim the list says was
not run has no section below.

"""


def runs_needed(claim: Claim, sweeping: bool = True, rate_check: bool = True) -> int:
    """Runs a claim trains at most when nothing can be reused and no rate is bracketed: each swept arm's sweep (its
    rates on the sweep seeds), its verdict seeds at the chosen rate and at the common rate (one set when the two
    rates are one); the seeds of the arms that keep a rate or need another's time. Without a sweep, seeds only,
    twice with the rate check (a second fixed rate). `claim`: as it runs, along its variable (catalog.along)."""
    seeds = len(claim.seeds)
    if not sweeping or claim.fixed_rate:
        return seeds * len(claim.arms) * (2 + len(claim.more_rates) if rate_check and claim.second_rate else 1)
    return sum(len(claim.rates) * len(claim.sweep_seeds) + 2 * seeds if a.sweep else
               2 * seeds if a.rate_of and not a.after else seeds for a in claim.arms)


EARLIER = ("earlier rules (issue 35), not re-run yet: trend tests outside the claim's Holm family, the region read "
           "before significance, no seed flagged far from its arm, no second fixed rate, the recall task's divergence "
           "read on its last training batch")
EARLIER_BENCH = "earlier rules (issue 35: log-log slopes fitted, which issue 43 does not change), kept as published"
EARLIER_NOTE = ("> **Numbers from the {earlier}.** This section is kept from the docs generated before those rules "
                "changed (issue 43) and is not a verdict under the rules described above; `python -m "
                "attention_lab.claims {name}` re-runs it under them.")


def _earlier(name: str) -> str:
    return EARLIER if CLAIMS[name].arms else EARLIER_BENCH


def earlier_sections(docs_md: Path) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """What docs/claims.md already holds for claims with no results here: each claim's table row (verdicts, runs)
    and its section, so that regenerating the page never drops a claim's published numbers, only marks them."""
    if not docs_md.exists():
        return {}, {}
    text = docs_md.read_text()
    rows = {m.group(1): (m.group(2), m.group(3))
            for m in re.finditer(r"^\| `([^`]+)` \| (.*) \| ([^|]*) \|$", text.split("\n## `", 1)[0], flags=re.M)}
    sections = {}
    for chunk in text.split("\n## `")[1:]:
        name, _, body = chunk.partition("`")
        sections[name] = body.split("\n", 1)[1] if "\n" in body else ""
    return rows, sections


def results_of(name: str, root: Path, docs: Path | None = None) -> dict | None:
    """A claim's results: claims/<name>/results.json when it is a real run (kept as docs/claims/results_<name>.json,
    so later sessions regenerate the docs from it), else the copy docs/claims/ keeps; None when neither exists.
    Only a run's own results.json is ever copied: nothing here makes a number."""
    path = root / name / "results.json"
    doc = json.loads(path.read_text()) if path.exists() else None
    kept = docs / "claims" / f"results_{name}.json" if docs is not None else None
    if doc is not None and not doc.get("quick"):
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(kept, doc)
        return doc
    if kept is not None and kept.exists():
        return json.loads(kept.read_text())
    return None


def summary_rows(root: Path, earlier: dict[str, tuple[str, str]] | None = None,
                 docs: Path | None = None) -> list[tuple[str, str, str]]:
    rows = []
    for name, claim in CLAIMS.items():
        doc = results_of(name, root, docs) or {"quick": True}
        if not doc.get("quick"):
            rows.append((name, verdict_summary(doc), _runs_cell(doc) if claim.arms else "-"))
        elif earlier and name in earlier and not earlier[name][0].startswith("not run"):
            verdicts, cost = earlier[name]
            mark = "(earlier rules: issue 35's, not re-run yet) "
            rows.append((name, verdicts if verdicts.startswith(mark) else mark + verdicts, cost))
        else:
            rows.append((name, f"not run under these rules yet ({runs_needed(along(claim))} runs when none can be reused)"
                         if claim.arms else "not run yet", "-"))
    return rows


def _runs_cell(doc: dict) -> str:
    if doc.get("all_runs"):
        return f"{len(doc['all_runs'])} runs, {sum(doc['all_runs'].values()) / 60:.0f} run-min"
    return f"{doc.get('minutes', float('nan')):.0f} min, {len(doc['run_seconds'])} runs trained"


def summary_table(root: Path, earlier: dict[str, tuple[str, str]] | None = None, docs: Path | None = None) -> str:
    rows = summary_rows(root, earlier, docs)
    lines = ["| claim | verdicts (the word at each value first; mean paired difference in bits/byte unless a number is "
             "named; [interval at the level of its verdict: Holm's step]) | runs (wall clocks summed) |",
             "|---|---|---|"]
    lines += [f"| `{n}` | {v} | {t} |" for n, v, t in rows]
    return "\n".join(lines)


def one_line(name: str, doc: dict | None, earlier: bool, link: str, earlier_row: tuple[str, str] | None = None) -> str:
    """A claim in one line: the tutorial's sentence, the finding in words (plain.headline), a link. A benchmark
    (no arms) kept from the earlier rules gives its kept summary: issue 43's rules do not change a fitted slope."""
    claim = CLAIMS[name]
    if doc is not None:
        found = plain.headline(claim, doc)
        if doc.get("rules") != RULES and claim.arms:
            found += " (numbers from earlier rules)"
    elif earlier and not claim.arms and earlier_row:
        summary = re.sub(r"^\(earlier rules[^)]*\) ", "", earlier_row[0])
        slopes = re.findall(r"([\w ]+): slope ([\d.]+) \[[^]]*\] over T = ([\d,]+-[\d,]+)", summary)
        found = (("the time of one attention call grew as T to the power " + plain.joined([f"{p} ({what.strip()})"
                  for what, p, _ in slopes]) + f" over T = {slopes[0][2]} tokens (2 is quadratic, 1 linear; "
                  "measured as published earlier: the seed rules do not apply to a benchmark)") if slopes else
                 f"measured as published earlier (the seed rules do not apply to a benchmark): {summary}")
    elif earlier:
        found = "not re-run under the current rules yet: the earlier numbers are in the details"
    else:
        found = "not run yet"
    found = plain.lower_first(found)
    return (f"- *{claim.statement[0].upper() + claim.statement[1:]}*: {found.rstrip('.')} "
            f"([`{name}`]({link}#{_anchor(name)})).")


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", name.lower()).replace(" ", "-")


README_LEAD = ("Each line: the tutorial's sentence, what the models trained here show (sizes in "
               "[bits/byte](docs/glossary.md#bitsbyte), lower is better, beside the spread between seeds), and a "
               "link to the claim's figure and fine print.")


def write_docs(root: Path = Path("claims"), docs: Path = REPO / "docs", readme: Path = REPO / "README.md") -> Path:
    """docs/claims.md from each claim's results (claims/<name>/results.json, else the copy docs/claims/ keeps):
    one line per claim, the verdict table, then each claim's report with its figure redrawn into docs/claims/;
    and the README's block between its markers: one line per claim (the method is the README's own paragraph)."""
    (docs / "claims").mkdir(parents=True, exist_ok=True)
    earlier_rows, sections = earlier_sections(docs / "claims.md")
    table = summary_table(root, earlier_rows, docs)
    found = {name: results_of(name, root, docs) for name in CLAIMS}
    swept = [f"`{c.name}`" for c in CLAIMS.values() if any(a.sweep for a in c.arms) and not c.fixed_rate]
    fixed = [f"`{c.name}`" for c in CLAIMS.values() if c.arms and (c.fixed_rate or not any(a.sweep for a in c.arms))]
    lines = [one_line(name, found[name], name in sections, "", earlier_rows.get(name)) for name in CLAIMS]
    parts = [DOCS_INTRO.format(bracket=BRACKET, swept=", ".join(swept) or "none", fixed=", ".join(fixed) or "none",
                               words=WORDS_SAID, outlier_k=OUTLIER_K),
             "## Each claim in one line", "", *lines, "", "## The verdicts at a glance", "", table, ""]
    for name, claim in CLAIMS.items():
        doc = found[name]
        if doc is None:
            if name in sections:  # published under earlier rules: kept, and said to be
                note = EARLIER_NOTE.format(earlier=_earlier(name), name=name)
                body = sections[name] if note in sections[name] else f"\n{note}\n" + sections[name]
                parts += [f"## `{name}`\n\n" + body.strip("\n"), ""]  # the same page however often regenerated
            continue
        claim = along(claim)  # the arms at each value of its variable, as the claim's own report names them
        if claim.arms or doc.get("slopes"):
            figure(claim, doc, docs / "claims" / f"{name}.png")
        body = report_lines(claim, doc, f"claims/{name}.png")[1:]  # below its own heading, one level down
        body = [("#" + x) if x.startswith("#") else x for x in body]
        body = [x.replace("](bench", f"]({root}/{name}/bench") for x in body]
        parts += [f"## `{name}`", "", f"`.venv/bin/python -m attention_lab.claims {name}`", *body, ""]
    write_text(docs / "claims.md", "\n".join(parts))
    if readme.exists():
        start, end = "<!-- claims table: python -m attention_lab.claims docs -->", "<!-- end claims table -->"
        text = readme.read_text()
        if start in text and end in text:
            head, rest = text.split(start, 1)
            _, tail = rest.split(end, 1)
            block = [README_LEAD, ""] + [one_line(name, found[name], name in sections, "docs/claims.md",
                                                  earlier_rows.get(name))
                                           for name in CLAIMS]
            write_text(readme, head + start + "\n" + "\n".join(block) + "\n" + end + tail)
    return docs / "claims.md"
