"""The claims' results in plain words (claims/plain.py) and issue 43's rules, on synthetic results with a known
answer: a reversal reads as one, an undecided never reads as a finding, a rate flip says "depends on the rate";
significance before the region; the trend tests in the claim's Holm family; a seed far from its arm flagged by a
stated rule and the verdict decided without it; divergence on held-out loss where the task has a noise floor; the
qk arms' parameters; the docs regenerated from the results they keep."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from attention_lab.claims import CLAIMS, experiment, plain, report, runs, stats
from attention_lab.claims.catalog import BASE, along
from attention_lab.training.config import compose


def _rows(mean: float, seeds=(1, 2, 3, 4, 5), sd: float = 0.01, seed: int = 0, lr: float = 0.003,
          bump: dict | None = None) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for s in seeds:
        v = mean + float(rng.normal(0, sd)) + (bump or {}).get(s, 0.0)
        out.append({"seed": s, "bpb": v, "lr": lr, "step": 600, "seconds": 50.0, "diverged": None})
    return out


def _doc(name: str, means: dict[str, float], second: dict[str, float] | None = None, sd: float = 0.01,
         bump: dict | None = None) -> tuple:
    """A results doc for claim `name` whose arms score `means` (bits/byte, seeds 1-5, each arm its own noise),
    decided by the code a real run uses (experiment.decided); `second`: the rate check's means."""
    claim = along(CLAIMS[name])
    results = {a: _rows(m, sd=sd, seed=i, bump=(bump or {}).get(a)) for i, (a, m) in enumerate(means.items())}
    results_second = ({a: _rows(m, sd=sd, seed=10 + i, lr=0.001) for i, (a, m) in enumerate(second.items())}
                      if second else None)
    doc = {"claim": name, "quick": False, "machine": "a CPU", "launcher": [], "seeds": [1, 2, 3, 4, 5],
           "rates": dict.fromkeys(means, 0.003), "rate_rule": "fixed in advance", "common_rate": 0.003,
           "diverged_rule": "the rule", "sweep": {}, "sweep_seeds": [], "split": {"choose": ["a"], "test": ["b"]},
           "runs_trained": 1, "run_seconds": [50.0], "minutes": 1.0, "results_common": {}, "comparisons_common": [],
           "diverged": {}}
    doc |= experiment.decided(claim, results, results_second, 1 / 3 if second else None)
    return CLAIMS[name], json.loads(json.dumps(doc))  # as results.json holds it


QK = {"separate": 2.40, "separate, no self": 2.40, "tied": 2.50, "tied, no self": 2.50}


# ---------------------------------------------------------------------------------------------------------------
# the plain sentence

def test_a_finding_in_the_claimed_direction_reads_as_one_with_its_size_beside_the_seeds_spread():
    claim, doc = _doc("qk", QK)
    text = plain.found(claim, doc)
    assert text.startswith(f"The tutorials say: *{claim.statement}*"), text
    assert re.search(r"Separate query and key projections predicted the test text better than one projection for "
                     r"both, by 0\.(09|10)\d bits/byte", text), text
    assert "times the spread between seeds (sd 0.0" in text and "reverse" not in text, text
    line = plain.headline(claim, doc)
    assert line.startswith("Separate query and key projections predicted the test text better") and "sd" not in line


def test_a_reversal_reads_as_a_reversal():
    claim, doc = _doc("qk", QK | {"tied": 2.30})
    assert doc["comparisons"][0]["verdict"] == "reversed"
    text = plain.found(claim, doc)
    assert re.search(r"The reverse of the claim: one projection for both predicted the test text better than "
                     r"separate query and key projections, by 0\.(09|10)\d bits/byte", text), text
    assert "reverse of the claim" in plain.headline(claim, doc)
    assert "Separate query and key projections predicted the test text better than one projection for both" not in text


def test_an_undecided_comparison_never_reads_as_a_finding():
    claim, doc = _doc("qk", QK | {"tied": 2.405}, sd=0.05)
    c = doc["comparisons"][0]
    assert c["verdict"] == "undecided", c
    line = next(x for x in plain.found(claim, doc).splitlines() if "one projection for both" in x
                and "no token" not in x)
    assert line.startswith("- These seeds cannot tell separate query and key projections from one projection for "
                           "both"), line
    assert "predicted the test text better" not in line and "reverse" not in line, line


def test_a_verdict_that_changes_with_the_rate_says_it_depends_on_the_rate():
    claim, doc = _doc("qk", QK, second=QK | {"tied": 2.30})
    text = plain.found(claim, doc)
    assert doc["comparisons_second"][0]["verdict"] == "reversed" and doc["comparisons"][0]["verdict"] == "holds"
    assert ("At 0.001 instead of 0.003, separate query and key projections against one projection for both reads "
            "otherwise (holds at the first rate): the reverse of the claim" in text), text
    assert "this finding depends on the rate." in text, text
    assert "depends on the rate" in plain.headline(claim, doc)
    claim, same = _doc("qk", QK, second=QK)
    assert "every verdict reads the same" in plain.found(claim, same) and "depends" not in plain.found(claim, same)
    assert "## The rate check: a second fixed rate" in "\n".join(report.report_lines(claim, same))


def test_a_trend_is_said_in_its_own_direction():
    """A gap that grows along the width reads "rises", one that shrinks "falls", each with its signed slope."""
    def heads(gap128: float, gap256: float) -> dict:
        return {f"{n} head{'s' * (n > 1)}, n_embd={w}": 2.50 - 0.1 * (w == 256) - (gap128 if w == 128 else gap256) * (n > 1)
                for n in (1, 4, 8) for w in (128, 256)}
    claim, doc = _doc("heads", heads(0.02, 0.10), sd=0.003)
    grows = next(t for t in doc["trends"] if (t["better"], t["worse"]) == ("8 heads", "1 head"))
    assert grows["verdict"] == "grows", grows
    text = plain.found(claim, doc)
    assert "the difference (1 head minus 8 heads) rises along n_embd, +0.08" in text, text
    claim, doc = _doc("heads", heads(0.10, 0.02), sd=0.003)
    text = plain.found(claim, doc)
    assert "the difference (1 head minus 8 heads) falls along n_embd, -0.07" in text, text


def test_a_reversal_that_survives_the_second_rate_says_so():
    claim, doc = _doc("qk", QK | {"tied": 2.30}, second=QK | {"tied": 2.30})
    text = plain.found(claim, doc)
    assert ("At 0.001 instead of 0.003 the reversal above reads the same: the reverse of the claim: one projection "
            "for both predicted the test text better than separate query and key projections") in text, text
    claim, doc = _doc("qk", QK, second=QK)
    assert "reversal" not in plain.found(claim, doc)


def test_the_readme_line_puts_a_rate_flip_on_the_finding_it_belongs_to_and_says_how_it_reads():
    claim, doc = _doc("qk", QK, second=QK | {"separate, no self": 2.30})  # only the third comparison flips
    assert [c["verdict"] for c in doc["comparisons_second"]] == ["holds", "holds", "reversed"], doc
    line = plain.headline(claim, doc)
    assert line.endswith(" — another of its comparisons depends on the rate."), line
    claim, doc = _doc("qk", QK, second=QK | {"tied": 2.30})  # the first, which the line gives, flips
    line = plain.headline(claim, doc)
    assert line.endswith("— depends on the rate: at 0.001, one projection for both was better."), line


def test_a_gap_smaller_than_its_region_whose_interval_reaches_past_it_says_so():
    """positions' none vs learned is judged at Haviv's ±0.05: a gap of 0.04 whose interval reaches 0.06 holds, and
    the sentence says it is less than the region yet cannot be called too small; a gap of 0.10 says neither."""
    base = {"none": 2.70, "sinusoidal": 2.60, "rope": 2.40, "alibi": 2.42}
    claim, doc = _doc("positions", base | {"learned": 2.66}, sd=0.012)
    c = next(c for c in doc["comparisons"] if c["better"] == "learned")
    assert c["verdict"] == "holds" and abs(c["mean"]) < 0.05 < c["high"], c
    text = plain.found(claim, doc)
    assert "that is less than the region ±0.05 that we count as too small to matter, but its interval" in text, text
    assert "cannot call a causal model without positions competitive" in text, text
    claim, doc = _doc("positions", base | {"learned": 2.60}, sd=0.012)
    assert "less than the region" not in plain.found(claim, doc)


def test_the_quadratic_benchmark_s_line_gives_its_slopes_in_words():
    row = ("(earlier rules: issue 35's, not re-run yet) sdpa causal: slope 1.89 [1.86, 1.93] over T = 2,048-16,384; "
           "linear: slope 1.09 [0.71, 1.46] over T = 2,048-16,384", "-")
    line = report.one_line("quadratic", None, True, "docs/claims.md", row)
    assert "grew as T to the power 1.89 (sdpa causal) and 1.09 (linear) over T = 2,048-16,384 tokens" in line, line
    assert "not re-run" not in line and "[1.86" not in line, line


def test_along_a_variable_the_verdict_at_each_value_leads_and_the_trend_comes_second():
    means = {f"{n} head{'s' * (n > 1)}, n_embd={w}": 2.42 - 0.03 * (n > 1) - 0.12 * (w == 256)
             for n in (1, 4, 8) for w in (128, 256)}
    claim, doc = _doc("heads", means, sd=0.004)
    first = plain.found(claim, doc).splitlines()[2]
    assert first.startswith("- 4 heads predicted the test text better than 1 head at n_embd = 128 and 256, by 0.0")
    assert first.index("at n_embd = 128") < first.index("along n_embd"), first
    summary = report.verdict_summary(doc)
    assert summary.index("at n_embd = 128/256: holds/holds") < summary.index("along n_embd: **"), summary


def test_a_caveat_is_added_only_when_its_word_is_read():
    means = {f"{n} head{'s' * (n > 1)}, n_embd={w}": 2.42 - 0.12 * (w == 256) for n in (1, 4, 8) for w in (128, 256)}
    claim, doc = _doc("heads-learned", means | {"1 head, n_embd=256": 2.20})
    assert "we do not know why" in plain.found(claim, doc).lower() and "we do not know why" in plain.headline(claim, doc)
    claim, doc = _doc("heads-learned", means | {"1 head, n_embd=256": 2.40})
    assert "we do not know why" not in plain.found(claim, doc).lower()


# ---------------------------------------------------------------------------------------------------------------
# significance before the region; the Holm family

def _c(diffs, region=0.01, name="b"):
    return stats.paired(dict.fromkeys(range(len(diffs)), 0.0), dict(enumerate(diffs)), better_name="a",
                        worse_name=name, metric="bpb", region=region)


def test_a_significant_difference_on_the_wrong_side_reads_reversed_even_inside_the_region():
    c = stats.decide([_c([-0.004, -0.005, -0.0045, -0.0042, -0.0048])])[0]
    assert c.verdict == "reversed" and c.within_region and c.high < 0, c
    text = report.sentence(c.as_dict(), 1)
    assert text.startswith("**reversed**") and "too small to matter" in text
    assert "though only by" in plain.clause(CLAIMS["qk"], {}, ("a", "b"), "bpb", [(None, c.as_dict())], None)


def test_a_significant_slope_inside_the_region_grows_by_less_than_the_region():
    diffs = {s: {8: 0.01 + 0.0, 32: 0.01 + 0.004 + s * 1e-4, 128: 0.01 + 0.008 + s * 2e-4} for s in range(5)}
    t = stats.trend(diffs, better="a", worse="b", metric="bpb", variable="d_k", region=0.01)
    assert t.verdict == "grows" and t.within_region and t.p < 0.05, t
    assert "by less than the region" in plain.trend_clause(t.as_dict(), "d_k", 3)
    assert "by less than the region" in report.trend_sentence({"comparisons": []}, t.as_dict(), [])


def test_the_trend_tests_are_in_the_claims_holm_family():
    """A known family: two comparisons with p 0.5 and 0.6 beside one trend with p about 0.02. Alone the trend
    grows; in the family Holm multiplies its p by 3 and it does not."""
    slopes = [0.010, 0.028, 0.012, 0.030, 0.002]
    diffs = {s: {8: 0.0, 16: slopes[s]} for s in range(5)}
    t = stats.trend(diffs, better="a", worse="b", metric="bpb", variable="d_k", region=0.001)
    assert 0.05 / 3 < t.p < 0.05 and t.verdict == "grows", t
    flat = [_c([0.1, -0.2, 0.15, -0.05, 0.02], name="c1"), _c([0.1, -0.1, 0.2, -0.25, 0.03], name="c2")]
    assert min(c.p for c in flat) > 3 * t.p, [c.p for c in flat]
    comparisons, trends = stats.decide_all(flat, [t])
    assert trends[0].p_holm == pytest.approx(stats.holm([*(c.p for c in flat), t.p])[2]) == pytest.approx(3 * t.p)
    assert trends[0].verdict == "no trend detected" and trends[0].confidence > 0.95, trends[0]
    assert trends[0].low < 0 < trends[0].high, "the slope's interval at its Holm step's level reaches 0"
    assert stats.decide_all([], [t])[1][0].verdict == "grows", "alone it grows"


def test_a_claims_trends_are_decided_with_its_comparisons():
    means = {f"{n} head{'s' * (n > 1)}, n_embd={w}": 2.42 - 0.03 * (n > 1) - 0.12 * (w == 256)
             for n in (1, 4, 8) for w in (128, 256)}
    _, doc = _doc("heads", means)
    ps = [c["p"] for c in doc["comparisons"]] + [t["p"] for t in doc["trends"]]
    assert [t["p_holm"] for t in doc["trends"]] == pytest.approx(stats.holm(ps)[len(doc["comparisons"]):])


# ---------------------------------------------------------------------------------------------------------------
# a seed far from its arm

def test_the_outlier_rule_flags_the_seed_far_from_its_arm_and_nothing_else():
    arm = {1: 2.4594, 2: 3.9698, 3: 2.4389, 4: 2.6719, 5: 2.4310}  # the rnn claim's equal-time LSTM (issue 43)
    far = stats.outliers(arm)
    assert list(far) == [2] and far[2] == pytest.approx(abs(3.9698 - 2.4594) / (1.4826 * 0.0284), rel=1e-3), far
    assert stats.outliers({1: 2.41, 2: 2.42, 3: 2.40, 4: 2.43, 5: 2.415}) == {}, "an ordinary arm"
    assert stats.outliers({1: 2.4, 2: 9.0}) == {}, "two seeds: neither is far from the other's median"
    assert stats.outliers({1: 2.4, 2: 2.4, 3: 2.4, 4: 2.4005}) == {}, "the MAD's floor: agreement to the last digits"


def test_a_flagged_seed_is_shown_kept_in_the_verdict_and_the_verdict_decided_without_it():
    claim, doc = _doc("qk", QK, bump={"tied": {3: 1.5}})
    assert [(f["arm"], f["seed"]) for f in doc["outliers"]] == [("tied", 3)], doc["outliers"]
    kept, robust = doc["comparisons"][0], doc["comparisons_robust"][0]
    assert 3 in kept["seeds"] and 3 not in robust["seeds"], "kept in the verdict; left out of the second one"
    assert robust["left_out"] and "tied seed 3 (flagged" in robust["left_out"][0]
    assert kept["verdict"] == "undecided" and robust["verdict"] == "holds", (kept, robust)
    text = plain.found(claim, doc)
    assert "One seed lies far from the other seeds of its arm (more than 10 scaled MADs" in text, text
    assert "one projection for both, seed 3" in text and "Without the flagged seeds: separate query and key " \
        "projections predicted" in text, text
    lines = "\n".join(report.report_lines(claim, doc))
    assert "### Seeds far from their arm" in lines and doc["outlier_rule"] in lines


# ---------------------------------------------------------------------------------------------------------------
# divergence on held-out loss where the task has a noise floor

def test_a_run_at_its_noise_floor_is_judged_on_held_out_loss_and_a_blow_up_is_caught():
    from attention_lab.claims.trained import divergence

    floor = [(200, 2.1458), (400, 2.1400), (600, 2.1452), (1000, 2.1460)]  # a recall run copying perfectly
    assert divergence([2.30, 2.1756], floor).startswith("final training loss"), "the last batch above the floor"
    assert divergence([2.30, 2.1756], floor, held_out=True) is None, "held out: it works"
    blown = [(200, 3.70), (400, 3.40), (600, 4.10)]
    for rule in (False, True):
        assert divergence([4.0, 3.0, 3.3], blown, held_out=rule).startswith("final validation loss 4.1000"), rule
    assert CLAIMS["recall"].noise_floor and not CLAIMS["qk"].noise_floor


# ---------------------------------------------------------------------------------------------------------------
# the designs

def test_the_qk_claim_is_a_2x2_of_tying_and_self_at_parameters_within_one_percent():
    from model import GPT

    counts = {}
    for arm in CLAIMS["qk"].arms:
        cfg = compose([*BASE, *runs.job(arm, 1, 0.003).overrides])
        counts[arm.name] = sum(p.numel() for p in GPT(cfg.model.to_gpt_config(512)
                                                      if hasattr(cfg.model, "to_gpt_config") else cfg.model).parameters())
    assert set(counts) == {"separate", "separate, no self", "tied", "tied, no self"}, counts
    low, high = min(counts.values()), max(counts.values())
    assert (high - low) / high <= 0.01, f"the arms' parameters differ by more than 1%: {counts}"
    pairs = {(e.better, e.worse) for e in CLAIMS["qk"].expect}
    assert {("separate", "tied"), ("separate, no self", "tied, no self")} <= pairs, "tying at self and at no self"


def test_every_claim_at_a_fixed_rate_has_a_second_rate_and_every_arm_can_be_scaled_to_it():
    for claim in CLAIMS.values():
        if not claim.arms:
            continue
        assert claim.second_rate and claim.second_rate != 1, claim.name
        for arm in claim.arms:
            lr = None if not arm.sweep and not arm.rate_of else 0.003
            scaled, r = experiment.at_rate(arm, lr, claim.second_rate)
            assert not any(o.startswith("optim.lr=") for o in scaled.overrides), (claim.name, arm.name)
            assert r < (lr or 1.0), (claim.name, arm.name, r)
            first = runs.job(arm, 1, lr, minutes=1.0 if arm.after else None)
            second = runs.job(scaled, 1, r, minutes=1.0 if arm.after else None)
            assert first.name != second.name, "the rate check's runs are named apart from the first rate's"


# ---------------------------------------------------------------------------------------------------------------
# the docs, regenerated from the results they keep

def test_the_docs_keep_each_real_results_json_and_regenerate_from_it(tmp_path):
    claim, doc = _doc("qk", QK)
    root, docs = tmp_path / "claims", tmp_path / "docs"
    (root / "qk").mkdir(parents=True)
    (root / "qk" / "results.json").write_text(json.dumps(doc))
    (root / "mask").mkdir()
    (root / "mask" / "results.json").write_text(json.dumps({"quick": True, "results": {}}))
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- claims table: python -m attention_lab.claims docs -->\nold\n<!-- end claims table -->\nb\n")
    first = report.write_docs(root, docs, readme).read_text()
    assert json.loads((docs / "claims" / "results_qk.json").read_text()) == doc
    assert not (docs / "claims" / "results_mask.json").exists(), "a --quick run is never kept as a result"
    assert (docs / "claims" / "qk.png").stat().st_size > 1000
    assert "**What we found.**" in first and first.index("**What we found.**") < first.index("#### Verdict")
    assert first.index("![qk:") < first.index("### The fine print")
    (root / "qk" / "results.json").unlink()
    assert report.write_docs(root, docs, readme).read_text() == first, "the same page from the kept results alone"
    block = readme.read_text().split("-->\n", 1)[1].split("<!-- end", 1)[0]
    lines = [x for x in block.splitlines() if x.startswith("- ")]
    assert len(lines) == len(CLAIMS) and all(f"[`{n}`](docs/claims.md#" in x for n, x in zip(CLAIMS, lines))
    assert lines[0].startswith(f"- *{claim.statement[0].upper()}") and "predicted the test text better" in lines[0]
    assert "[bits/byte](docs/glossary.md#bitsbyte)" in block.split("\n- ", 1)[0], "the unit, linked where first used"


def test_the_docs_intro_says_no_claim_is_swept_when_none_is():
    text = report.DOCS_INTRO
    assert "Swept (" not in text
    swept = [c.name for c in CLAIMS.values() if any(a.sweep for a in c.arms) and not c.fixed_rate]
    assert swept == [], f"the intro says no claim sweeps its rates: {swept}"
    assert all(c.second_rate for c in CLAIMS.values() if c.arms), "every claim with arms has the rate check"


def test_the_catalog_s_wrong_sentences_of_issue_43_stay_fixed():
    assert "predicts nothing" not in CLAIMS["mask"].published
    assert "denominator" in " ".join(CLAIMS["mask"].notes), "after_softmax's mechanism is stated"
    assert "length generalisation" in CLAIMS["recall"].published
    assert "200 words" in CLAIMS["rnn"].published and "200 tokens" not in CLAIMS["rnn"].published
    assert "reasoning and arithmetic" in CLAIMS["positions"].published and "Haviv" in CLAIMS["positions"].published
    heads = " ".join(CLAIMS["heads"].notes)
    assert "(128, 64, 32, 16, 8)" not in heads and "16 channels" in heads, "the note names the 1/4/8-head arms"
    units = report.summary_table(__import__("pathlib").Path("/nonexistent"))
    assert "bits/byte unless a number is named" in units


def test_the_recall_trend_leaves_out_the_distances_where_the_lstm_is_at_chance():
    """A curve saturated at chance has no slope: the trend is fitted only where the worse arm is below chance, and
    the per-distance verdicts still say what happened at every distance."""
    claim = along(CLAIMS["recall"])
    lstm = {8: 1.0, 32: 2.0, 128: 3.99, 512: 4.0}
    results = {}
    for d in (8, 32, 128, 512):
        results[f"transformer, distance={d}"] = [{"seed": s, "recall_bits": 0.01 + 0.001 * s, "bpb": 3.0,
                                                  "diverged": None} for s in range(1, 6)]
        results[f"lstm, distance={d}"] = [{"seed": s, "recall_bits": min(4.0, lstm[d] + 0.01 * s), "bpb": 4.0,
                                           "diverged": None} for s in range(1, 6)]
    doc = experiment.decided(claim, results)
    assert [c["verdict"] for c in doc["comparisons"]] == ["holds"] * 4
    assert doc["trends"][0]["values"] == (8, 32), "fitted where the LSTM is not at chance (3.8 bits or more of 4)"
    text = plain.found(CLAIMS["recall"], json.loads(json.dumps(doc)))
    assert "fitted at distance = 8 and 32 only: elsewhere the worse arm is at chance" in text, text


# ---------------------------------------------------------------------------------------------------------------
# the rate check, end to end (--quick: a real `train.py -m`)

def test_the_rate_check_trains_every_arm_again_at_a_third_of_its_rate_with_the_equal_time_arm_on_its_budget(
        tmp_path, data_cache):
    """The rnn claim (arms at rates of their own, one on another's time budget) with the rate check on: every arm's
    seed again at a third of its own rate, the equal-time LSTM on the transformer's time at that rate; the report
    gives the check's verdicts and the plain sentence compares them."""
    from attention_lab.claims import select
    from attention_lab.claims.catalog import RNN_RATES
    from attention_lab.claims.trained import metrics_of

    claim = select(CLAIMS["rnn"], (1,), ("transformer", "lstm equal time"))
    out = tmp_path / "rnn"
    rep = experiment.run_claim(claim, out, quick=True, rate_check=True, log=lambda *a: None, progress=False,
                               overrides=(f"data.cache_dir={data_cache}", "train.peak_flops=1e11"))
    doc = json.loads((out / "results.json").read_text())
    assert doc["second_rate"]["factor"] == pytest.approx(1 / 3)
    assert doc["second_rate"]["rates"] == pytest.approx({"transformer": RNN_RATES["transformer"] / 3,
                                                        "lstm equal time": RNN_RATES["lstm"] / 3}), doc["second_rate"]
    second = {arm: rows[0] for arm, rows in doc["results_second"].items()}
    first = {arm: rows[0] for arm, rows in doc["results"].items()}
    assert all(second[a]["run"] != first[a]["run"] and second[a]["step"] >= 1 for a in second), (first, second)
    budget = metrics_of(out / second["transformer"]["run"])["seconds"] / 60
    cfg = json.loads((out / second["lstm equal time"]["run"] / "config.json").read_text())
    assert cfg["train"]["max_minutes"] == pytest.approx(max(budget, 0.05), abs=1e-3), "the budget at this rate"
    assert len(doc["comparisons_second"]) == 1 and doc["comparisons_second"][0]["worse"] == "lstm equal time"
    # and at the further rate the claim names (a ninth): every arm trained there too, the LSTM on that budget
    (ninth,) = doc["more_rates"]
    assert ninth["factor"] == pytest.approx(1 / 9) and set(ninth["rates"]) == set(second), ninth
    assert ninth["rates"]["transformer"] == pytest.approx(RNN_RATES["transformer"] / 9), ninth["rates"]
    assert len(ninth["comparisons"]) == 1, ninth
    text = rep.read_text()
    assert "### The rate check: a second fixed rate" in text and "**What we found.**" in text


def test_the_parallel_bench_runs_the_rnn_claims_two_models_at_each_thread_count(capsys):
    """bench/rnn_parallel.py, --quick (tiny models: it runs, it measures nothing): a row per thread count with
    both models' tokens/s and their ratio, the CPU named; a bad --threads is one error line."""
    from bench import rnn_parallel

    assert rnn_parallel.main(["--quick", "--reps", "1", "--threads", "1,2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| cpu |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1", "2"], out
    assert "CPU " in out and "transformer / LSTM" in out and "From 1 to 2 threads" in out
    assert rnn_parallel.main(["--threads", "0"]) == 2 and capsys.readouterr().err.startswith("error: --threads")
    from attention_lab.claims.catalog import BASE, LONG

    assert rnn_parallel.CONTEXT == LONG and rnn_parallel.CLAIMS_PRESET == BASE, "the rnn claim's own configuration"
    model, shape = rnn_parallel.build("lstm", quick=False)
    assert shape == (4, 512) and type(model).__name__.lower().startswith("lstm"), "the rnn claim's own arm"


def test_a_real_run_without_the_rate_check_says_the_rate_is_not_known():
    claim, doc = _doc("qk", QK)
    assert doc["second_rate"] is None and "whether a verdict depends on the rate is not known" in plain.found(claim, doc)
    assert "not known" not in plain.found(claim, doc | {"quick": True}), "a --quick smoke run says nothing of it"


def test_the_verdict_table_names_a_trend_s_unit_when_it_is_not_bits_per_byte():
    """The rnn claim's trends along the position are in nats/token: the table's cell says so (its header says
    bits/byte unless a number is named), and the word at each position comes before the trend."""
    claim = along(CLAIMS["rnn"])
    results = {}
    for i, arm in enumerate(("transformer", "lstm", "lstm equal time")):
        rng = np.random.default_rng(i)
        results[arm] = [{"seed": s, "bpb": 2.4 + 0.1 * i + float(rng.normal(0, 0.01)), "diverged": None,
                         "position_buckets": {str(2 ** k): 3.0 + 0.05 * i * k + float(rng.normal(0, 0.01))
                                              for k in range(4)}} for s in range(1, 6)]
    doc = json.loads(json.dumps(experiment.decided(claim, results)))
    cell = report.verdict_summary(doc)
    assert "lstm vs transformer (nats/token) at position = 1/2/4/8:" in cell, cell
    assert cell.index("(nats/token) at position") < cell.index("along position: **"), cell


def test_a_caveat_reads_the_word_with_the_region_so_a_tiny_significant_gap_is_not_called_a_real_one():
    """Positions: learned vs none at Haviv et al.'s region (±0.05). A significant gap of 0.01 lies inside it, so
    the sentence calls no positions competitive, never "not competitive"; a gap of 0.2 is not."""
    from attention_lab.claims.catalog import HAVIV_REGION

    means = {"none": 2.70, "learned": 2.69, "sinusoidal": 2.63, "rope": 2.37, "alibi": 2.42}
    claim, doc = _doc("positions", means, sd=0.001)
    c = next(c for c in doc["comparisons"] if c["better"] == "learned")
    assert c["verdict"] == "holds" and c["within_region"] and c["region"] == HAVIV_REGION, c
    text = plain.found(claim, doc)
    assert "is competitive with learned ones" in text and "not competitive" not in text, text
    claim, doc = _doc("positions", means | {"learned": 2.50}, sd=0.001)
    assert "cannot call a causal model without positions competitive" in plain.found(claim, doc)
    assert "RoPE predicted the test text better than no positions" in plain.found(claim, doc)


def test_a_claim_with_further_rates_is_checked_at_each_and_a_flip_at_any_says_so():
    """The rnn claim checks three rates at 512 tokens: its own, a third and a ninth. A verdict that flips at the
    ninth alone reads "depends on the rate"; the fine print gives each rate's verdicts."""
    claim = along(CLAIMS["rnn"])
    assert CLAIMS["rnn"].more_rates == (1 / 9,) and report.runs_needed(claim, False) == 3 * 5 * 3

    def rows(transformer: float, seed: int) -> dict:
        out = {}
        for i, (arm, m) in enumerate((("transformer", transformer), ("lstm", 2.55), ("lstm equal time", 2.50))):
            rng = np.random.default_rng(seed + i)
            out[arm] = [{"seed": s, "bpb": m + float(rng.normal(0, 0.005)), "lr": 0.009, "step": 600,
                         "seconds": 50.0, "diverged": None} for s in range(1, 6)]
        return out

    doc = experiment.decided(claim, rows(2.40, 0), rows(2.41, 10), 1 / 3, [(1 / 9, rows(2.70, 20))])
    doc = json.loads(json.dumps(doc | {"rates": {"transformer": None}, "quick": False}))
    assert [m["factor"] for m in doc["more_rates"]] == [pytest.approx(1 / 9)]
    text = plain.found(CLAIMS["rnn"], doc)
    assert "At a ninth of each arm's own rate, the transformer against an LSTM of the same size and steps" in text, text
    assert "At a third of each arm's own rate every verdict reads the same as well." in text, text
    assert "depend on the rate." in text and plain.flipped(doc), text
    assert "reverse of the claim" in text
    doc |= {"machine": "a CPU", "launcher": [], "seeds": [1, 2, 3, 4, 5], "rate_rule": "fixed in advance",
            "common_rate": 0.003, "diverged_rule": "r", "sweep": {}, "split": {"test": ["b"]}, "run_seconds": [1.0],
            "minutes": 1.0, "diverged": {}}
    fine = "\n".join(report.report_lines(CLAIMS["rnn"], doc))
    assert "At 0.111 x each arm's rate (transformer at 0.009" in fine, fine[-3000:]


def test_along_a_variable_the_arms_keep_their_words_in_every_sentence():
    """docs/claims.md reads a claim along its variable (catalog.along: "transformer, distance=8"), while its
    results name the base arm ("transformer"): the sentences say "the transformer", "the LSTM" all the same."""
    claim = along(CLAIMS["recall"])
    results = {}
    for i, d in enumerate((8, 32, 128, 512)):
        for j, (arm, m) in enumerate((("transformer", 0.1), ("lstm", 3.9))):
            rng = np.random.default_rng(10 * i + j)
            rows = [{"seed": s, "recall_bits": m + float(rng.normal(0, 0.05)), "val_loss": 1.0, "lr": 0.003,
                     "step": 1000, "seconds": 5.0, "diverged": None} for s in range(1, 6)]
            results[f"{arm}, distance={d}"] = rows
    results["transformer, distance=512"][2]["recall_bits"] = 11.5  # a seed far from its arm
    doc = json.loads(json.dumps(experiment.decided(claim, results) | {"rates": {}, "quick": False}))
    text = plain.found(claim, doc)
    assert "The transformer recalled the item better than the LSTM at distance = 8, 32 and 128" in text, text
    assert "Without the flagged seeds: the transformer recalled the item better than the LSTM at distance = 512" in text
    assert "the transformer at distance = 512, seed 3 (11.50 bits per recalled item" in text, text
    assert not re.search(r"\blstm\b|Transformer recalled", text), text
    line = plain.headline(claim, doc)
    assert line.startswith("The transformer recalled the item better than the LSTM") and \
        line.endswith(" — a seed flagged far from its arm."), line


def test_the_figures_draw_positions_in_order_and_each_arm_at_every_value_decided():
    """Read back from results.json, position buckets are text keys ("1", "128", "16"): drawn in that order the
    rnn figure's curves zigzagged. And recall's trend leaves out the distances where an arm is at chance: the
    arms' own numbers must still be drawn at every distance the verdicts were decided at."""
    import json

    from attention_lab.claims import report

    buckets = json.loads(json.dumps({1: 4.1, 2: 3.4, 16: 3.2, 128: 3.25, 4: 3.4}))
    assert [int(k) for k in report.position_keys(buckets)] == [1, 2, 4, 16, 128]
    doc = json.loads((report.REPO / "docs" / "claims" / "results_recall.json").read_text())
    t = doc["trends"][0]
    series = report.arm_series(doc, {**t, "values": []})
    assert all(len(pts) == 4 for pts in series.values()), (
        f"each arm drawn at d = 8, 32, 128, 512 even when the trend keeps none: {series}")


def test_a_claim_past_the_hour_says_so_and_why():
    """Issue 43: each claim takes at most about an hour on 2 cores; the fine print says which exceed it, and why."""
    from attention_lab.claims import report

    long_run = {"all_runs": {f"r{i}": 82.0 for i in range(150)}, "second_rate": 0.001}  # 205 run-min
    said = report._cost(long_run)
    assert "past the hour" in said and "--no-rate-check" in said, said
    assert "past the hour" not in report._cost({"all_runs": {f"r{i}": 82.0 for i in range(75)}, "second_rate": 0.001})
    assert "--no-rate-check" not in report._cost({"all_runs": {f"r{i}": 100.0 for i in range(150)}})


def test_the_wall_benchmark_in_words_says_each_factor_and_which_side_of_quadratic_it_is():
    """The quadratic claim's What we found and README line, from its slopes: the factor per doubling (2^slope) and
    nearer quadratic / nearer linear / between, read from the slope's interval against 1.5."""
    slopes = [{"method": "sdpa causal", "slope": 1.89, "low": 1.86, "high": 1.93, "from": 2048, "to": 16384},
              {"method": "window blocks", "slope": 0.99, "low": 0.28, "high": 1.69, "from": 2048, "to": 16384},
              {"method": "linear", "slope": 1.09, "low": 0.71, "high": 1.46, "from": 2048, "to": 16384}]
    said = plain.wall_words(slopes)
    assert "3.71 for sdpa causal (log-log slope 1.89, nearer quadratic)" in said, said
    assert "window blocks (log-log slope 0.99, between the two" in said and "linear (log-log slope 1.09, nearer linear)" in said
    assert "T = 2,048 to 16,384" in said and "4 per doubling is quadratic" in said
    doc = {"quick": False, "slopes": slopes, "summary": "s", "machine": "m", "body": "b"}
    assert plain.headline(CLAIMS["quadratic"], doc) == said
    assert said in plain.found(CLAIMS["quadratic"], doc)


def test_the_wall_figures_guides_have_the_slopes_their_labels_say():
    """The quadratic figure's dashed guide is labelled x4 per doubling: on the log-log axes it must rise with slope 2
    through the first measured point, and the dotted linear guide with slope 1 (a guide drawn at slope 1 under the
    quadratic label would make every method look quadratic)."""
    times = [[2048, 3.0], [4096, 11.0], [8192, 40.0], [16384, 150.0]]
    guides = {label.split(" ")[0]: (t, ms, style) for label, t, ms, style in report.wall_guides(times)}
    assert set(guides) == {"quadratic", "linear"}
    for name, slope in (("quadratic", 2.0), ("linear", 1.0)):
        t, ms, _ = guides[name]
        assert ms[0] == pytest.approx(3.0) and list(t) == [2048, 4096, 8192, 16384]
        assert np.polyfit(np.log2(t), np.log2(ms), 1)[0] == pytest.approx(slope), name
    assert guides["quadratic"][2] != guides["linear"][2], "the two guides share a line style"
