"""python -m attention_lab.claims: the verdict's statistics against simulated truth, the split that no choice reads,
windows over the whole part, the sweep's winner is the rate the seeds train at, a control that can fail, the
report from the numbers, and every claim end to end in its --quick form (as one Hydra multirun, any launcher)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from attention_lab.claims import CLAIMS, Expect, experiment, measure, report, runs, select, stats
from attention_lab.claims.catalog import BASE, BASE_LR, QUICK
from attention_lab.training.config import compose
from model import GPT, GPTConfig

# ---------------------------------------------------------------------------------------------------------------
# the statistics, against simulated claims with a known truth

def simulate(delta: float, n: int = 5, trials: int = 1000, sd: float = 1.0, shared_sd: float = 3.0,
             region: float = 0.3, seed: int = 0) -> dict[str, float]:
    """Share of each verdict word over simulated paired claims: every seed adds one noise both arms share (the
    data order, the initialisation stream) and each arm its own (sd); the worse arm is `delta` higher."""
    rng = np.random.default_rng(seed)
    counts = dict.fromkeys(stats.WORDS, 0)
    for _ in range(trials):
        shared = rng.normal(0, shared_sd, n)
        better = dict(enumerate(shared + rng.normal(0, sd, n)))
        worse = dict(enumerate(shared + delta + rng.normal(0, sd, n)))
        c = stats.decide([stats.paired(better, worse, better_name="a", worse_name="b", metric="bpb",
                                       region=region)])[0]
        counts[c.verdict] += 1
    return {k: v / trials for k, v in counts.items()}


def test_no_true_difference_says_holds_in_at_most_five_percent():
    share = simulate(0.0)
    assert share["holds"] <= 0.05, f"with no true difference 'holds' came out in {share['holds']:.1%} of claims"
    assert share["holds"] + share["reversed"] <= 0.08, share


def test_a_true_difference_of_three_sd_with_five_paired_seeds_is_found_in_most():
    share = simulate(3.0)
    assert share["holds"] >= 0.8, f"a 3-sd difference was found in only {share['holds']:.0%} of 5-seed claims"


def test_equivalence_is_reported_when_the_truth_is_inside_the_region():
    share = simulate(0.0, sd=0.02, region=0.3)  # significance first: the test's 5% false alarms read holds/reversed
    assert share["equivalent"] >= 0.93 and share["holds"] + share["reversed"] <= 0.07, share
    assert simulate(1.0, sd=0.02, region=0.3)["equivalent"] == 0.0, "a difference beyond the region is not equivalent"


def test_equivalence_needs_the_whole_interval_inside_the_region():
    d = {s: v for s, v in enumerate([0.2, 0.8, 0.5, 0.3, 0.7])}  # mean 0.5, interval about 0.19 to 0.81
    c = stats.decide([stats.paired(dict.fromkeys(d, 0.0), d, better_name="a", worse_name="b", metric="bpb",
                                   region=0.3)])[0]
    assert c.low < 0.3 < c.high and c.verdict == "holds", c
    d = {s: v for s, v in enumerate([0.5, -0.4, 0.3, -0.5, 0.2])}  # mean 0.02 inside the region, interval far beyond
    c = stats.decide([stats.paired(dict.fromkeys(d, 0.0), d, better_name="a", worse_name="b", metric="bpb",
                                   region=0.3)])[0]
    assert abs(c.mean) < 0.3 and c.low < -0.3 and c.verdict == "undecided", c


def test_pairing_is_used_noise_the_arms_share_cancels():
    """Seed noise 30x the effect, shared by both arms: only a paired test sees the consistent 0.05 difference."""
    share = simulate(0.05, sd=0.005, shared_sd=1.5, region=0.001)
    assert share["holds"] >= 0.95, f"a paired test should find it almost always, found {share['holds']:.0%}"


def test_one_seed_is_always_undecided_and_the_interval_is_the_t_interval():
    c = stats.decide([stats.paired({1: 1.0}, {1: 2.0}, better_name="a", worse_name="b", metric="bpb", region=0.01)])[0]
    assert c.verdict == "undecided" and math.isnan(c.low) and c.seeds_needed is None
    d = [0.1, 0.3, 0.2, 0.25, 0.15]
    c = stats.paired({s: 0.0 for s in range(5)}, dict(enumerate(d)), better_name="a", worse_name="b", metric="bpb",
                     region=0.01)
    half = 2.7764451051977987 * np.std(d, ddof=1) / math.sqrt(5)  # t(0.975, 4)
    assert c.low == pytest.approx(np.mean(d) - half) and c.high == pytest.approx(np.mean(d) + half)


def test_holm_adjusts_step_down_and_skips_missing():
    assert stats.holm([0.01, 0.04, 0.03, math.nan])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(stats.holm([0.01, math.nan])[1]) and stats.holm([0.01, math.nan])[0] == pytest.approx(0.01)


def test_holm_turns_a_p_of_003_among_three_into_undecided():
    zero = {s: 0.0 for s in range(5)}
    worse = [dict(enumerate([0.3, -0.2, 0.25, -0.1, 0.1])), dict(enumerate([0.2, 0.1, 0.25, 0.3, 0.05])),
             dict(enumerate([0.2, -0.3, 0.1, 0.3, -0.1]))]
    cs = [stats.paired(zero, w, better_name="a", worse_name=f"b{i}", metric="bpb", region=0.001)
          for i, w in enumerate(worse)]
    assert 0.01 < cs[1].p < 0.0167 * 3 and cs[1].p < min(cs[0].p, cs[2].p), [c.p for c in cs]
    decided = stats.decide(cs)
    assert decided[1].p_holm == pytest.approx(3 * cs[1].p) and decided[1].verdict == "undecided"
    assert stats.decide(cs[1:2])[0].verdict == "holds", "alone, the same comparison holds"


def test_seeds_needed_grows_as_the_effect_shrinks():
    assert stats.seeds_needed((0.2, 0.3, 0.1, 0.25, 0.15)) < stats.seeds_needed((0.2, -0.1, 0.3, 0.0, 0.1))
    assert stats.seeds_needed((0.1, -0.1, 0.1, -0.1)) is None


def _printed_interval(text: str) -> tuple[float, float]:
    import re

    m = re.search(r"% interval ([+-][0-9.]+) to ([+-][0-9.]+)", text)
    assert m, text
    return float(m.group(1)), float(m.group(2))


def test_the_printed_interval_is_the_one_the_verdict_word_was_read_from():
    """Over many simulated claims of 1-5 expectations: an undecided expectation never prints an interval that
    excludes 0, a holds one never prints one that reaches 0 (nor a reversed one), at Holm's step's level."""
    rng = np.random.default_rng(1)
    seen = set()
    for trial in range(300):
        m = int(rng.integers(1, 6))
        cs = []
        for i in range(m):
            n = int(rng.integers(3, 7))
            d = rng.normal(rng.choice([0.0, 0.5, -0.5, 1.5]), 1.0, n)
            cs.append(stats.paired(dict.fromkeys(range(n), 0.0), dict(enumerate(d)), better_name="a",
                                   worse_name=f"b{i}", metric="bpb", region=0.01))
        for c in stats.decide(cs):
            low, high = _printed_interval(report.sentence(c.as_dict(), m))
            seen.add(c.verdict)
            if c.verdict == "undecided":
                assert low <= 0 <= high, f"undecided beside an interval that excludes 0: {c}"
            elif c.verdict == "holds":
                assert low > 0, c
            elif c.verdict == "reversed":
                assert high < 0, c
            if m > 1:
                assert c.confidence >= 0.95 and f"{100 * c.confidence:.3g}% interval" in report.sentence(c.as_dict(), m)
    assert {"holds", "reversed", "undecided"} <= seen, seen


def test_holm_levels_step_down_and_stop_at_the_first_failure():
    levels = stats.holm_levels([0.001, 0.04, 0.012, math.nan])  # 0.001 < .05/3; 0.012 < .05/2; 0.04 < .05
    assert levels[:3] == pytest.approx([0.05 / 3, 0.05, 0.025]) and levels[3] == 0.05
    levels = stats.holm_levels([0.001, 0.0001, 0.03])  # 0.03 fails at .05/1? no: 0.03 < .05, all reject
    assert levels == pytest.approx([0.025, 0.05 / 3, 0.05])
    levels = stats.holm_levels([0.02, 0.03, 0.04])  # the first step fails: every comparison at .05/3
    assert levels == pytest.approx([0.05 / 3] * 3)


def test_equivalence_and_the_smallest_region_read_the_adjusted_interval():
    d = dict(enumerate([0.010, 0.014, 0.012, 0.008, 0.011]))
    zero = dict.fromkeys(d, 0.0)
    c95 = stats.paired(zero, d, better_name="a", worse_name="b", metric="bpb", region=0.0145)
    assert c95.high < 0.0145, "alone (95%) the interval lies inside the region"
    noisy = [stats.paired(zero, dict(enumerate(rng)), better_name="a", worse_name=f"n{i}", metric="bpb", region=0.01)
             for i, rng in enumerate(([0.3, -0.2, 0.1, -0.1, 0.2], [0.2, -0.3, 0.2, -0.2, 0.1]))]
    alone, among = stats.decide([c95])[0], stats.decide([c95, *noisy])[0]
    assert alone.verdict == "holds" and alone.within_region, "significant first; inside the region said beside it"
    assert among.confidence > 0.95 and among.high > alone.high
    assert among.smallest_region == pytest.approx(max(abs(among.low), abs(among.high)))
    assert among.within_region == (among.high <= 0.0145), among
    flat = dict(enumerate([0.004, -0.003, 0.002, -0.001, 0.0]))  # not significant, well inside the region
    assert stats.decide([stats.paired(zero, flat, better_name="a", worse_name="f", metric="bpb",
                                      region=0.0145)])[0].verdict == "equivalent"
    text = report.sentence(among.as_dict(), 3)
    assert f"smallest region these seeds could call equivalent ±{among.smallest_region:.4f}" in text


def test_seeds_needed_is_at_the_verdicts_level_and_never_inside_the_region():
    d = dict(enumerate([0.02, -0.01, 0.03, 0.0, 0.01]))  # mean 0.01
    zero = dict.fromkeys(d, 0.0)
    inside = stats.decide([stats.paired(zero, d, better_name="a", worse_name="b", metric="bpb", region=0.02)])[0]
    assert inside.verdict == "undecided" and inside.seeds_needed is None, inside
    assert "inside the region: more seeds would be spent to show equivalence" in report.sentence(inside.as_dict(), 1)
    outside = stats.decide([stats.paired(zero, d, better_name="a", worse_name="b", metric="bpb", region=0.001)])[0]
    assert outside.seeds_needed == stats.seeds_needed(outside.diffs), outside
    other = stats.paired(zero, dict(enumerate([0.9, -1.0, 0.5, -0.3, 0.1])), better_name="a", worse_name="c",
                         metric="bpb", region=0.001)
    among = stats.decide([stats.paired(zero, d, better_name="a", worse_name="b", metric="bpb", region=0.001),
                          other])[0]
    assert among.seeds_needed == stats.seeds_needed(among.diffs, alpha=1 - among.confidence) > outside.seeds_needed


def simulate_trend(slope: float, trials: int = 1000, n: int = 5, values=(8, 32, 128), sd: float = 0.02,
                   seed_sd: float = 0.05, region: float = 0.005, seed: int = 0) -> dict[str, float]:
    """Share of each trend word over simulated claims: difference = 0.03 + slope * log2(value) + a per-seed offset
    (shared along the variable) + noise at each value."""
    rng = np.random.default_rng(seed)
    counts = dict.fromkeys(stats.TREND_WORDS, 0)
    x = np.log2(values)
    for _ in range(trials):
        diffs = {s: dict(zip(values, 0.03 + slope * x + rng.normal(0, seed_sd) + rng.normal(0, sd, len(values))))
                 for s in range(n)}
        t = stats.trend(diffs, better="a", worse="b", metric="bpb", variable="d_k", region=region)
        counts[t.verdict] += 1
    return {k: v / trials for k, v in counts.items()}


def test_the_trend_test_finds_a_known_slope_and_not_a_flat_one_at_its_stated_rate():
    grows = simulate_trend(0.02)  # 0.02 bits/byte more per doubling, noise 0.02 at each value
    assert grows["grows"] >= 0.9, grows
    shrinks = simulate_trend(-0.02)
    assert shrinks["shrinks"] >= 0.9 and shrinks["grows"] == 0, shrinks
    flat = simulate_trend(0.0)
    assert flat["grows"] + flat["shrinks"] <= 0.05 + 0.015, f"a flat series called a trend too often: {flat}"
    flat = simulate_trend(0.0, sd=0.001, region=0.005)  # significance first: its 5% false alarms read grows/shrinks
    assert flat["flat"] >= 0.93 and flat["grows"] + flat["shrinks"] <= 0.07, f"a well-measured flat series: {flat}"


def test_the_trend_is_each_seeds_slope_on_log2_of_the_variable():
    diffs = {1: {8: 0.0, 32: 0.2, 128: 0.4}, 2: {8: 0.1, 32: 0.2, 128: 0.3}, 3: {8: 0.0, 32: 0.1}}
    t = stats.trend(diffs, better="a", worse="b", metric="bpb", variable="d_k", region=0.01)
    assert t.seeds == (1, 2) and t.values == (8, 32, 128), "seed 3 lacks a value: left out"
    assert t.slope == pytest.approx((0.1 + 0.05) / 2), "0.2 and 0.1 per 2 doublings"
    assert t.means == pytest.approx((0.05, 0.2, 0.35))


# ---------------------------------------------------------------------------------------------------------------
# the split nothing chose, and windows over the whole part

def _prepared(tmp_path, docs: list[list[int]], names=None):
    from data.prepare import PreparedData

    d = tmp_path / "prep"
    d.mkdir()
    flat = np.concatenate([np.asarray(x + [0], dtype=np.uint16) for x in docs])
    flat.tofile(d / "val.bin")
    np.zeros(4, dtype=np.uint16).tofile(d / "train.bin")
    return flat, PreparedData(d, d / "train.bin", d / "val.bin", d / "tokenizer.json",
                              {"dtype": "uint16", "eot_id": 0, "val_docs": names})


class _Tok:
    def decode(self, ids):
        return "".join("ab"[i % 2] * i for i in ids)  # token i -> i bytes


def test_the_held_out_parts_alternate_whole_documents_and_cover_the_split(tmp_path, monkeypatch):
    flat, data = _prepared(tmp_path, [[1, 2], [3], [4, 5, 6], [7]], ["a", "b", "c", "d"])
    monkeypatch.setattr(type(data), "tokenizer", property(lambda self: _Tok()))
    choose, test = data.held_out("choose"), data.held_out("test")
    assert choose.documents == ["a", "c"] and test.documents == ["b", "d"]
    assert choose.tokens.tolist() == [1, 2, 0, 4, 5, 6, 0] and test.tokens.tolist() == [3, 0, 7, 0]
    assert sorted(choose.tokens.tolist() + test.tokens.tolist()) == sorted(flat.tolist())
    assert (choose.text_bytes, test.text_bytes) == (1 + 2 + 4 + 5 + 6, 3 + 7)
    with pytest.raises(ValueError, match="not one of choose, test"):
        data.held_out("val")


def test_one_held_out_document_is_cut_in_halves(tmp_path, monkeypatch):
    _, data = _prepared(tmp_path, [[1, 2, 3, 4, 5]], ["only"])
    monkeypatch.setattr(type(data), "tokenizer", property(lambda self: _Tok()))
    assert data.held_out("choose").documents == ["only (first half)"]
    assert len(data.held_out("choose").tokens) + len(data.held_out("test").tokens) == 6


def test_measures_read_windows_spread_over_the_whole_part():
    held = measure.Held(None, torch.zeros(256, 8, dtype=torch.long), torch.zeros(256, 8, dtype=torch.long))
    idx = held.spread(16)
    assert len(idx) == 16 and idx[0] == 0 and idx[-1] == 255, idx
    assert np.all(np.diff(idx) >= 15), f"not evenly spread: {idx}"


# ---------------------------------------------------------------------------------------------------------------
# the catalog

def test_every_job_of_every_claim_composes_into_a_valid_config():
    for claim in CLAIMS.values():
        for arm in claim.arms:
            lr = None if not arm.sweep and not arm.rate_of else BASE_LR
            j = runs.job(arm, 1, lr, minutes=1.0 if arm.after else None)
            cfg = compose([*BASE, *j.overrides])
            assert cfg.train.seed == 1, (claim.name, arm.name)
            if lr is not None:
                assert cfg.optim.lr == pytest.approx(lr), (claim.name, arm.name)
            assert runs.nested(j.overrides), (claim.name, arm.name)
        for e in claim.expect:
            assert {e.better, e.worse} <= {a.name for a in claim.arms}, (claim.name, e)


def test_the_matched_tied_arm_has_exactly_the_separate_arms_parameter_count():
    base = dict(vocab_size=512, block_size=32, n_layer=2, n_head=4, n_embd=128, bias=False, pos_encoding="rope")
    count = lambda **kw: sum(p.numel() for p in GPT(GPTConfig(**base, **kw)).parameters())  # noqa: E731
    matched = runs.nested(next(a for a in CLAIMS["qk"].arms if a.name == "tied").overrides)["model"]
    assert count(**matched) == count() > count(qk_tied=True), f"the catalog's matched arm: {matched}"
    with pytest.raises(ValueError, match="mlp_ratio"):
        GPTConfig(**base, mlp_ratio=4.3)


def test_select_keeps_the_arms_an_arm_needs_and_names_unknown_ones():
    c = select(CLAIMS["rnn"], seeds=(1, 2), arms=("lstm equal time",))
    assert [a.name for a in c.arms] == ["transformer", "lstm equal time"] and c.seeds == (1, 2), "its time budget"
    from attention_lab.claims.catalog import Arm, Claim

    chain = Claim("x", "s", (Arm("a"), Arm("b", rate_of="a"), Arm("c", after="b"), Arm("d")), (), (), "p")
    assert [a.name for a in select(chain, arms=("c",)).arms] == ["a", "b", "c"], "the budget's arm and its rate's"
    with pytest.raises(ValueError, match="has no arm"):
        select(CLAIMS["qk"], arms=("nonsense",))
    with pytest.raises(ValueError, match="distinct"):
        select(CLAIMS["qk"], seeds=(1, 1))
    with pytest.raises(ValueError, match="share \\[101\\]"):
        select(CLAIMS["qk"], seeds=(1, 101))


def test_every_claim_sweeps_on_three_seeds_that_decide_no_verdict():
    for claim in CLAIMS.values():
        if claim.arms:
            assert len(claim.sweep_seeds) >= 3 and not set(claim.sweep_seeds) & set(claim.seeds), claim.name


def test_list_and_unknown_claims(capsys):
    from attention_lab.claims.cli import main

    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in CLAIMS:
        assert f"{name} " in out, f"--list does not name {name}"
    with pytest.raises(SystemExit):
        main(["nonsense"])
    assert "unknown claim 'nonsense'" in capsys.readouterr().err
    assert main(["qk", "--launcher", "basic", "--jobs", "2"]) == 2
    assert "--jobs sizes the joblib launcher" in capsys.readouterr().err


def test_the_default_launcher_runs_one_run_per_core_where_joblib_is_installed():
    from attention_lab.claims.cli import auto_launcher

    assert auto_launcher(1) == ("basic", None), "one core: one run at a time with it"
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    assert auto_launcher(2) == ("joblib", 2) and auto_launcher(16) == ("joblib", 16)


def test_jobs_sizes_the_launcher_the_claim_runs_under(tmp_path, monkeypatch, capsys):
    """`--launcher joblib --jobs N` reaches the runs as N at a time with the cores shared between them; `--jobs`
    with another launcher is one error line, not ignored."""
    from attention_lab.claims import cli as claims_cli

    seen = []

    def fake_run_claim(claim, out, quick, launcher=(), rate_check=None):
        seen.append(tuple(launcher))
        return out / "report.md"

    monkeypatch.setattr(claims_cli, "run_claim", fake_run_claim)
    monkeypatch.setattr(claims_cli.os, "cpu_count", lambda: 6)
    assert claims_cli.main(["mask", "--quick", "--launcher", "joblib", "--jobs", "3", "--out", str(tmp_path)]) == 0
    assert seen == [("hydra/launcher=joblib", "hydra.launcher.n_jobs=3", "train.num_threads=2")], seen
    capsys.readouterr()
    assert claims_cli.main(["mask", "--quick", "--launcher", "basic", "--jobs", "3", "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(seen) == 1 and err and err[-1].startswith("error:") and "--jobs" in err[-1], err


# ---------------------------------------------------------------------------------------------------------------
# the context control can fail

def _tiny(seed: int, uniform: bool) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=16, block_size=24, n_layer=2, n_head=2, n_embd=16, pos_encoding="rope"))
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.normal_(0, 1.0)  # sharp attention, far from uniform
            if uniform:
                block.attn.c_attn.weight[:16] = 0  # q = 0: every score 0, attention already uniform
    return model.eval()


def test_the_context_control_says_not_holds_on_a_model_built_to_fail_it():
    x = torch.randint(1, 16, (12, 24), generator=torch.Generator().manual_seed(0))
    e = CLAIMS["context"].expect[0]
    for uniform, words in ((True, {"equivalent"}), (False, {"holds", "reversed", "undecided"})):
        results = {"base": [{"seed": s} | measure.context_measures(_tiny(s, uniform), x, quick=True)
                            for s in range(4)]}
        c = stats.decide([experiment.compare(e, results)])[0]
        assert c.verdict in words, (uniform, c)
    same = measure.context_measures(_tiny(0, True), x, quick=True)
    assert same["context_left"] == pytest.approx(same["context_left_uniform"], abs=1e-6)
    sharp = measure.context_measures(_tiny(0, False), x, quick=True)
    assert abs(sharp["context_left"] - sharp["context_left_uniform"]) > 1e-3, "the control must edit the model"


# ---------------------------------------------------------------------------------------------------------------
# the report: every number from results.json

_SEPARATE_TIED = tuple(a for a in CLAIMS["qk"].arms if a.name in ("separate", "tied"))  # the qk claim's first expectation


def _doc(comparisons) -> dict:
    rs = {"separate": [{"seed": s, "lr": 0.003, "step": 600, "bpb": 2.4 + s / 100, "seconds": 50.0} for s in (1, 2)],
          "tied": [{"seed": s, "lr": 0.009, "step": 600, "bpb": 2.5 + s / 100, "seconds": 50.0} for s in (1, 2)]}
    return {"claim": "qk", "quick": False, "machine": "a CPU", "launcher": [], "seeds": [1, 2],
            "rates": {"separate": 0.003, "tied": 0.009}, "sweep": {"separate": {"0.001": 2.6, "0.003": 2.5, "0.009": 2.55},
                                                                  "tied": {"0.001": 2.7, "0.003": 2.65, "0.009": 2.6,
                                                                           "0.027": 2.62}},
            "grid": ["0.001", "0.003", "0.009"], "bracket": 2, "choose_by": "bpb", "sweep_seeds": [1, 2],
            "sweep_per_seed": {"separate": {"0.003": {"1": 2.49, "2": 2.51}}}, "split": {"choose": ["a", "c"], "test": ["b", "d"]}, "runs_trained": 2,
            "run_seconds": [50.0, 50.0], "minutes": 3.0, "results": rs, "comparisons": comparisons,
            "all_runs": {f"runs/r{i}": 60.0 for i in range(7)}}


def test_the_report_says_what_results_json_holds(tmp_path):
    cs = stats.decide([stats.paired({1: 2.41, 2: 2.42}, {1: 2.51, 2: 2.53}, better_name="separate",
                                    worse_name="tied", metric="bpb", region=0.01),
                       stats.paired({1: 2.41, 2: 2.42}, {1: 2.43, 2: 2.50}, better_name="separate",
                                    worse_name="tied, matched", metric="bpb", region=0.01)])
    claim = replace(CLAIMS["qk"], arms=_SEPARATE_TIED, expect=CLAIMS["qk"].expect[:1])
    (tmp_path / "results.json").write_text(json.dumps(_doc([c.as_dict() for c in cs])))
    text = report.render(claim, tmp_path).read_text()
    for c in cs:
        assert f"**{c.verdict}**" in text and f"{c.mean:.4f}" in text and f"{c.low:+.4f} to {c.high:+.4f}" in text
        assert f"p = {report._p(c.p)}, {report._p(c.p_holm)} after Holm's correction for 2" in text, text
    assert cs[0].p_holm != cs[0].p
    assert "choose plays (a, c)" in text and "test plays (b, d)" in text
    assert "| tied | 0.009 | 600 |" in text, "the table names the rate and the scored step"
    assert "| separate | 2.6000 | **2.5000** (2.49, 2.51) | 2.5500 | - | 0.003 |" in text
    assert "the mean of seeds 1, 2 (each in brackets)" in text
    assert "| tied | 2.7000 | 2.6500 | **2.6000** | 2.6200 | 0.009 |" in text
    assert "| lr 0.009 | lr 0.027 * |" in text and "the next rate beyond it (*), up to 2 more: tied." in text
    assert "Chosen at the edge" not in text, "tied's winner is inside what was tried once 0.027 lost"
    assert "From nothing it is 7 runs whose own wall clocks sum to 7 min" in text
    doc = json.loads((tmp_path / "results.json").read_text())
    del doc["sweep"]["tied"]["0.027"]
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert "Chosen at the edge of what was tried: tied (" in report.render(claim, tmp_path).read_text()


def test_a_winner_at_the_edge_is_bracketed_one_grid_step_further():
    grid = [1 / 3, 1.0, 3.0]
    at = {f"{BASE_LR * r:.6g}": v for r, v in zip(grid, (2.6, 2.5, 2.4))}
    assert experiment._beyond(grid, at) == pytest.approx(9.0), "the top edge: one step up, the grid's ratio"
    at = {f"{BASE_LR * r:.6g}": v for r, v in zip(grid, (2.4, 2.5, 2.6))}
    assert experiment._beyond(grid, at) == pytest.approx(1 / 9), "the bottom edge: one step down"
    at = {f"{BASE_LR * r:.6g}": v for r, v in zip(grid, (2.6, 2.4, 2.5))}
    assert experiment._beyond(grid, at) is None, "a winner inside the grid is bracketed already"
    assert experiment._beyond([1.0], {f"{BASE_LR:.6g}": 2.5}) == pytest.approx(3.0)


# ---------------------------------------------------------------------------------------------------------------
# diverged runs: a stated rule, never chosen, never averaged in, always counted

def test_the_divergence_rule_flags_a_non_finite_or_rising_run_and_nothing_else():
    from attention_lab.claims.trained import divergence

    val = [(200, 3.0), (400, 2.8), (600, 2.7)]
    assert divergence([4.0, 3.1, 2.9, 2.75], val) is None, "a run that kept improving"
    assert divergence([4.0, 2.9, 3.2], val).startswith("final training loss 3.2000 above the first evaluation's 3.0000")
    assert divergence([4.0, float("nan"), 2.0], val).startswith("non-finite")
    assert divergence([4.0, float("inf")], []).startswith("non-finite")
    assert divergence([4.0, 2.0], val, stopped="the training loss became nan at step 3").startswith("non-finite")
    assert divergence([], []) is None


def test_a_run_thrown_far_above_a_uniform_guess_early_is_diverged_even_when_it_recovers():
    """The equal-time LSTM without warmup: 56-104 nats at step 10 on 4,096 tokens (a guess is ln 4096 = 8.3), then
    back to 5.2 nats by its first evaluation and still improving, so the validation rules saw nothing (issue 43)."""
    from attention_lab.claims.trained import divergence

    recovered = [(200, 5.32), (400, 5.28), (600, 5.23)]
    why = divergence([56.0, 76.0, 92.0, 6.9, 5.35, 5.25], recovered, vocab=4096)
    assert why and why.startswith("training loss 92.0 (logged loss 3 of 6) above 1.5 x"), why
    assert divergence([8.4, 7.9, 6.0, 5.3], recovered, vocab=4096) is None, "a fresh model starts near ln(vocab)"
    assert divergence([12.0, 6.0, 5.3], recovered, vocab=4096) is None, "below 1.5 ln(vocab) = 12.48"
    assert divergence([56.0, 5.3], recovered, vocab=4096, held_out=True), "the held-out rule reads it too"


def test_a_rate_where_a_sweep_run_diverged_never_wins_and_all_diverged_steps_down():
    means = {"0.001": 2.60, "0.003": 2.50, "0.009": 2.45}  # 0.009 scores best on average, but one seed diverged there
    ok = experiment.pickable(means, {"0.009": {102: "final training loss 3.1 above the first evaluation's 3.0"}})
    assert min(ok, key=ok.get) == "0.003" and math.isinf(ok["0.009"]), ok
    assert experiment.pickable(means | {"0.027": math.nan}, {})["0.027"] == math.inf, "a rate with no number"
    grid = [1 / 3, 1.0, 3.0]
    at = {f"{BASE_LR * r:.6g}": v for r, v in zip(grid, (2.6, 2.5, math.inf))}
    assert experiment._beyond(grid, at) is None, "the best clean rate is inside: the one above it diverged"
    at = {f"{BASE_LR * r:.6g}": v for r, v in zip(grid, (math.inf, math.inf, math.inf))}
    assert experiment._beyond(grid, at) == pytest.approx(1 / 9), "every rate diverged: one below the lowest"
    assert experiment._beyond([1.0], {f"{BASE_LR:.6g}": math.inf}) == pytest.approx(1 / 3)


def test_a_seed_whose_run_diverged_is_left_out_of_its_comparisons_and_named():
    e = Expect("separate", "tied")
    rs = {"separate": [{"seed": s, "bpb": 2.40 + s / 1000, "diverged": None} for s in (1, 2, 3, 4)],
          "tied": [{"seed": s, "bpb": 2.50 + s / 1000, "diverged": None} for s in (1, 2, 3, 4)]}
    rs["tied"][2] = {"seed": 3, "bpb": 9.0, "diverged": "final training loss 5 above the first evaluation's 3"}
    c = experiment.compare(e, rs)
    assert c.seeds == (1, 2, 4) and c.mean == pytest.approx(0.1), c
    assert c.left_out == ("tied seed 3 (final training loss 5 above the first evaluation's 3)",)
    assert "left out by the divergence rule: tied seed 3" in report.sentence(stats.decide([c])[0].as_dict(), 1)


def test_a_diverged_sweep_run_is_counted_its_rate_refused_and_the_report_says_so(tmp_path, data_cache):
    """A rate at which the trainer stops on a non-finite loss (no gradient clipping, a huge rate): the run is
    recorded as diverged, the multirun goes on, the rate is never chosen, and the report counts it."""
    claim, rep, doc = _quick(tmp_path, "qk", data_cache, ("separate",), rates=(1.0, 3e7), bracket=0,
                             overrides=("optim.grad_clip=0",))
    assert doc["rates"]["separate"] == pytest.approx(BASE_LR), doc["sweep"]
    assert doc["diverged"]["separate"]["sweep"] == [1, 2] and doc["diverged"]["separate"]["seeds"] == [0, 1]
    assert list(doc["sweep_diverged"]["separate"]) == [f"{BASE_LR * 3e7:.6g}"]
    text = rep.read_text()
    assert "## Diverged runs" in text and "| separate | 1 of 2 | 0 of 1 |" in text, text
    assert "diverged: seed 11" in text and doc["diverged_rule"] in text


def _rendered_qk(tmp_path: Path) -> tuple[Path, stats.Comparison]:
    """A claims folder holding one rendered qk report (two seeds, tied vs separate), what `claims docs` assembles,
    and its one comparison."""
    root = tmp_path / "claims"
    (root / "qk").mkdir(parents=True)
    c = stats.decide([stats.paired({1: 2.41, 2: 2.42}, {1: 2.51, 2: 2.53}, better_name="separate", worse_name="tied",
                                   metric="bpb", region=0.01)])[0]
    (root / "qk" / "results.json").write_text(json.dumps(_doc([c.as_dict()])))
    report.render(replace(CLAIMS["qk"], arms=_SEPARATE_TIED, expect=CLAIMS["qk"].expect[:1]), root / "qk")
    return root, c


def test_docs_are_assembled_from_the_reports_and_the_readme_table_replaced(tmp_path):
    root, c = _rendered_qk(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- claims table: python -m attention_lab.claims docs -->\nOLD TABLE\n<!-- end claims table -->\nend\n")
    out = report.write_docs(root, tmp_path / "docs", readme)
    text = out.read_text()
    assert "## `qk`" in text and f"**{c.verdict}**" in text and "| `qk` |" in text
    assert "OLD TABLE" not in readme.read_text() and "[`qk`](docs/claims.md#qk)" in readme.read_text()
    assert readme.read_text().endswith("end\n")


# ---------------------------------------------------------------------------------------------------------------
# end to end, --quick: a real `train.py -m`

NO_PEAK = "train.peak_flops=1e11"  # no test here reads MFU: the matmul peak is not measured (3.5 s a multirun, shared)


def _quick(tmp_path, name, data_cache, arms, rates=(1.0,), seeds=(1,), launcher=(), sweep_seeds=(11,),
           overrides=(), bracket=None):
    claim = select(CLAIMS[name], seeds, arms, rates, sweep_seeds)
    out = tmp_path / name
    rep = experiment.run_claim(claim, out, quick=True,
                               overrides=(f"data.cache_dir={data_cache}", NO_PEAK, *overrides),
                               launcher=launcher, log=lambda *a: None, progress=False, bracket=bracket)
    return claim, rep, json.loads((out / "results.json").read_text())


def test_a_grid_of_one_rate_is_bracketed_and_the_seeds_train_at_the_winner_of_both(tmp_path, data_cache):
    """A winner at the edge (a grid of one is all edge) trains one rate further before the seeds; the verdict
    seeds train at whichever of the two won (and at the common rate), none of them a sweep seed."""
    claim = select(CLAIMS["qk"], (1, 2), ("separate",), (1 / 3,), sweep_seeds=(11,))
    out = tmp_path / "qk"
    experiment.run_claim(claim, out, quick=True, overrides=(f"data.cache_dir={data_cache}", NO_PEAK),
                         log=lambda *a: None, progress=False, bracket=1)
    doc = json.loads((out / "results.json").read_text())
    assert sorted(map(float, doc["sweep"]["separate"])) == pytest.approx([BASE_LR / 3, BASE_LR]), doc["sweep"]
    assert doc["grid"] == [f"{BASE_LR / 3:.6g}"] and doc["bracket"] == 1
    best = float(min(doc["sweep"]["separate"], key=doc["sweep"]["separate"].get))
    assert [r["lr"] for r in doc["results"]["separate"]] == pytest.approx([best, best])
    at_common = best == pytest.approx(BASE_LR)
    assert doc["runs_trained"] == 2 + 2 + (0 if at_common else 2), "two rates on the sweep's seed; the verdict seeds"
    assert len(doc["all_runs"]) == doc["runs_trained"] and all(s > 0 for s in doc["all_runs"].values())
    assert [r["lr"] for r in doc["results_common"]["separate"]] == pytest.approx([BASE_LR, BASE_LR])


def test_the_sweep_chooses_on_the_choose_plays_its_winner_trains_the_seeds_and_nothing_trains_twice(
        tmp_path, data_cache, monkeypatch):
    """The sweep's choice is measured on the choose plays and only the seeds' verdict numbers on the test plays;
    every measure reads the final checkpoint, which no split chose; the seeds train at the sweep's winner."""
    seen = []
    real_measure = measure.measure

    def spy(claim, run_dir, held, quick):
        seen.append(held.part.part)
        return real_measure(claim, run_dir, held, quick)

    monkeypatch.setattr(experiment, "measure", spy)
    opened = []
    real_load = measure.load_checkpoint
    monkeypatch.setattr(measure, "load_checkpoint", lambda run, which="best": opened.append(which) or real_load(run, which))
    claim, rep, doc = _quick(tmp_path, "qk", data_cache, ("separate", "tied"), rates=(1 / 3, 3.0), seeds=(1, 2),
                             sweep_seeds=(11, 12))
    assert set(opened) == {"latest"}, f"every measure reads the final checkpoint, none a chosen one: {set(opened)}"
    assert seen == ["choose"] * 8 + ["test"] * 8, f"the sweep on the choose plays, the seeds on the test plays: {seen}"
    assert measure.WHICH == "latest"
    for arm, rates in doc["sweep"].items():
        best = float(min(rates, key=rates.get))
        assert all(r["lr"] == pytest.approx(best) for r in doc["results"][arm]), (arm, rates, doc["results"][arm])
        assert doc["rates"][arm] == pytest.approx(best)
    assert doc["sweep_seeds"] == [11, 12] and doc["seeds"] == [1, 2]
    for arm, rates in doc["sweep_per_seed"].items():
        for lr, by_seed in rates.items():
            assert doc["sweep"][arm][lr] == pytest.approx(np.mean(list(by_seed.values()))), "the mean picks"
            assert set(by_seed) == {"11", "12"}
    assert doc["runs_trained"] == 2 * 2 * 2 + 2 * 2 * 2, "the sweep; the verdict seeds at the chosen and common rate"
    sweep_runs = set(doc["all_runs"]) - {r["run"] for rs in (doc["results"], doc["results_common"])
                                         for rows in rs.values() for r in rows}
    assert len(sweep_runs) == 8 and all(run.endswith(("-s11", "-s12")) for run in sweep_runs), sweep_runs
    for r in doc["results"]["tied"]:
        assert r["step"] == 24 and (tmp_path / "qk" / r["run"] / "checkpoints").is_dir(), "the final checkpoint"
    assert not set(doc["split"]["choose"]) & set(doc["split"]["test"]), doc["split"]
    text = rep.read_text()
    assert "## Verdict" in text and "## Learning rates" in text and claim.statement in text
    again = experiment.run_claim(claim, tmp_path / "qk", quick=True,
                                 overrides=(f"data.cache_dir={data_cache}", NO_PEAK),
                                 log=lambda *a: None, progress=False)
    assert json.loads((again.parent / "results.json").read_text())["runs_trained"] == 0


QUICK_ARMS = {"scale": ("sqrt", "none-unit"), "mask": ("before_softmax", "none"), "heads": ("1 head", "4 heads"),
              "positions": ("none", "sinusoidal"),
              "rnn": ("transformer", "lstm equal time"), "context": ("base",)}


@pytest.mark.parametrize("name", sorted(QUICK_ARMS))
def test_each_claim_runs_end_to_end_quick(name, tmp_path, data_cache):
    from attention_lab.claims.catalog import along

    claim, rep, doc = _quick(tmp_path, name, data_cache, QUICK_ARMS[name])
    assert set(doc["results"]) == {a.name for a in along(claim).arms}, doc["results"].keys()
    for arm, rows in doc["results"].items():
        assert rows[0]["bpb"] > 0 and rows[0]["step"] > 0, (arm, rows[0])
    text = rep.read_text()
    assert "| arm |" in text and claim.statement in text and (tmp_path / name / "plot.png").stat().st_size > 1000
    assert "## Verdict" in text and len(doc["comparisons"]) == len(along(claim).expect)
    if name == "mask":
        r = doc["results"]["none"][0]
        assert r["honest_bpb"] > r["leaky_bpb"], f"an unmasked model must look better than it is: {r}"
        assert "## Samples" in text
    if name == "rnn":  # the equal-time arm trains on a budget, so assert what it did, never how long it took
        assert doc["results"]["lstm equal time"][0]["step"] >= 1
        from attention_lab.claims.catalog import RNN_RATES

        assert doc["results"]["lstm equal time"][0]["lr"] == pytest.approx(RNN_RATES["lstm"]), "the LSTM's own rate"
        assert doc["results"]["transformer"][0]["lr"] == pytest.approx(RNN_RATES["transformer"])
        from attention_lab.claims.trained import metrics_of

        transformer = metrics_of(tmp_path / name / doc["results"]["transformer"][0]["run"])["seconds"]
        cfg = json.loads((tmp_path / name / doc["results"]["lstm equal time"][0]["run"] / "config.json").read_text())
        assert cfg["train"]["max_minutes"] == pytest.approx(max(transformer / 60, 0.05), abs=1e-3), \
            "the equal-time LSTM trains for the transformer's wall time"
        assert cfg["train"]["stop"] == "budget", "the clock alone ends the equal-time LSTM"
        steps = json.loads((tmp_path / name / doc["results"]["transformer"][0]["run"] / "config.json").read_text())
        assert cfg["train"]["max_steps"] == steps["train"]["max_steps"], (
            "the equal-time LSTM's schedule is the transformer's stretched over its time: the same planned steps, so "
            "the same shares of warmup and decay")
        # the warmup's share of the clock, from the plan (the lr logged at the first step depends on how long that
        # step took, which a busy machine stretches: 0.5 of the rate, not under it, on a loaded 2-core EPYC)
        share = cfg["optim"]["warmup_steps"] / cfg["train"]["max_steps"]
        assert share >= 0.05, (
            f"the equal-time LSTM warms up over {share:.3%} of its clock: no warmup to speak of (a run planned for "
            "100,000 steps that the clock ends puts its warmup in the first fraction of a second)")
        assert cfg["model"]["block_size"] == 32, "--quick's sizes beat the claim's own context (512)"
    if name == "heads":  # two widths: the same head count at two head sizes
        widths = {json.loads((tmp_path / name / r["run"] / "config.json").read_text())["model"]["n_embd"]
                  for rows in doc["results"].values() for r in rows}
        assert widths == {128, 256} and doc["trends"] and doc["variable"] == "n_embd", widths
    if name == "positions":  # scored at 1x, 2x and 4x the trained context; a trend along it
        r = doc["results"]["sinusoidal"][0]
        assert {"bpb_windows_1x", "bpb_windows_2x", "bpb_windows_4x"} <= set(r) and r["bpb_windows_4x"] > 0, r
        t = doc["axis"]["trends"][0]
        assert doc["axis"]["name"] == "length" and t["values"] == [1, 2, 4] and t["verdict"] in stats.TREND_WORDS
        assert "## Along the scored length" in text
    if name == "rnn":
        assert doc["axis"]["name"] == "position" and doc["axis"]["trends"][0]["values"][:3] == [1, 2, 4]
        assert "## Along the position in the context" in text
    if name == "context":
        r = doc["results"]["base"][0]
        assert {"context_left", "context_left_uniform", "context_at_embedding"} <= set(r)
    if name == "scale":  # the unit-init arm starts q and k at unit variance: its config says so, the other's not
        model_of = {arm: json.loads((tmp_path / name / rows[0]["run"] / "config.json").read_text())["model"]
                    for arm, rows in doc["results"].items()}
        assert model_of["none-unit, d_k=32"]["qk_init"] == "unit" and model_of["sqrt, d_k=32"]["qk_init"] == "normal"
        assert model_of["none-unit, d_k=32"]["attn_scale"] == "none"


def test_the_results_do_not_depend_on_the_launcher(tmp_path, data_cache):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    _, _, basic = _quick(tmp_path / "basic", "qk", data_cache, ("separate", "tied"))
    from attention_lab.claims.cli import launcher_overrides

    _, _, joblib = _quick(tmp_path / "joblib", "qk", data_cache, ("separate", "tied"),
                          launcher=launcher_overrides("joblib", 2, []))
    for arm in basic["results"]:
        # the same runs; the thread count (2 a run, or 1 each when two share the cores) moves float32 sums only
        assert [r["bpb"] for r in basic["results"][arm]] == pytest.approx([r["bpb"] for r in joblib["results"][arm]],
                                                                        rel=1e-6), arm
    assert joblib["launcher"][0] == "hydra/launcher=joblib"


def test_a_run_another_claim_trained_is_found_by_its_run_config(tmp_path):
    overrides = [*BASE, *QUICK, "train.seed=1"]
    sibling = tmp_path / "qk" / "runs" / "separate-s1"
    sibling.mkdir(parents=True)
    cfg = runs.resolved([*overrides, "name=claims-qk"]) | {"name": "claims-qk"}
    (sibling / "config.json").write_text(json.dumps(cfg))
    (sibling / runs.DONE).write_text(json.dumps({"seconds": 1.0, "launch": runs.launch_of(())}))
    out = tmp_path / "scale"
    assert runs.finished_twin(out, [*overrides, "name=claims-scale", "model.attn_scale=sqrt"]) == sibling.resolve()
    assert runs.finished_twin(out, [*BASE, *QUICK, "train.seed=2"]) is None, "another seed is another run"
    assert runs.finished_twin(out, [*overrides, "model.attn_scale=none"]) is None, "another setting is another run"
    assert runs.finished_twin(tmp_path / "qk", overrides, skip=sibling) is None, "a run is not its own twin"


def test_a_twin_launched_another_way_is_not_reused(tmp_path):
    """Threads, launcher and torch change the last digits of a run, and a high rate amplifies them: a run is
    reused as another claim's only when it was launched the same way (and one that does not say is never)."""
    overrides = [*BASE, *QUICK, "train.seed=1"]
    sibling = tmp_path / "qk" / "runs" / "separate-s1"
    sibling.mkdir(parents=True)
    joblib = ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "train.num_threads=1")
    (sibling / "config.json").write_text(json.dumps(runs.resolved([*overrides, *joblib[2:]])))
    here = runs.launch_of(joblib)
    assert here == {"launcher": "joblib n_jobs=2", "threads": 1, "torch": torch.__version__}
    out = tmp_path / "scale"
    for launch, found in ((None, False), (here, True), (here | {"threads": 2}, False),
                          (here | {"launcher": "basic"}, False), (here | {"torch": "0.0"}, False)):
        (sibling / runs.DONE).write_text(json.dumps({"seconds": 1.0} | ({"launch": launch} if launch else {})))
        twin = runs.finished_twin(out, [*overrides, *joblib[2:]], launch=here)
        assert (twin == sibling.resolve()) is found, (launch, twin)
    (sibling / runs.DONE).write_text(json.dumps({"seconds": 1.0, "launch": here}))
    assert runs.finished_twin(out, [*overrides, "train.num_threads=2"], launch=here | {"threads": 2}) is None, \
        "a run config with other threads is another run"


def test_a_twin_trained_before_a_config_field_existed_counts_only_at_its_default(tmp_path):
    """A run whose config.json predates a field (train.snapshots was added later; its default 0 trains the same run
    to every digit) is the twin of a run that holds the default, and of no run that sets it to anything else."""
    overrides = [*BASE, *QUICK, "train.seed=1"]
    sibling = tmp_path / "qk" / "runs" / "separate-s1"
    sibling.mkdir(parents=True)
    old = runs.resolved(overrides)
    del old["train"]["snapshots"]
    (sibling / "config.json").write_text(json.dumps(old))
    (sibling / runs.DONE).write_text(json.dumps({"seconds": 1.0, "launch": runs.launch_of(())}))
    out = tmp_path / "scale"
    assert runs.finished_twin(out, [*overrides, "train.snapshots=0"]) == sibling.resolve(), "the default: the same run"
    assert runs.finished_twin(out, [*overrides, "train.snapshots=3"]) is None, "another value is another run"


def test_quadratic_runs_the_wall_benchmark_and_computes_the_growth(tmp_path):
    rep = experiment.run_claim(CLAIMS["quadratic"], tmp_path, quick=True).read_text()
    rows = json.loads((tmp_path / "bench.json").read_text())["tables"]["attention"]["rows"]
    timed = sorted((r["T"], r["both_ms"]) for r in rows if r["method"] == "sdpa causal")
    upper = timed[min(len(timed) // 2, max(0, len(timed) - 3)):]
    fit = stats.loglog_slope(*zip(*upper))
    assert len(upper) >= 2 and not math.isnan(fit.slope), upper
    assert f"- sdpa causal: log-log slope {fit.slope:.2f} over T = {upper[0][0]:,}" in rep, rep[:2000]
    assert f"{2 ** fit.slope:.2f}x the forward + backward time per doubling" in rep
    assert "| T | method |" in rep


def test_the_rnn_claim_reads_a_context_of_512_tokens_at_the_base_preset_s_tokens_a_step():
    claim = CLAIMS["rnn"]
    for arm in claim.arms:
        cfg = compose([*BASE, *claim.overrides, *runs.job(arm, 1, BASE_LR, minutes=1.0).overrides])
        assert cfg.model.block_size == 512 and cfg.train.batch_size * 512 == 16 * 128, (arm.name, cfg.model)


def test_a_claim_s_own_overrides_reach_its_runs(tmp_path, data_cache):
    """The overrides a claim puts on the base preset (the rnn claim's context) are in every run it trains."""
    claim = replace(select(CLAIMS["qk"], (1,), ("separate",)), overrides=("model.rope_base=5000.0",))
    out = tmp_path / "qk"
    experiment.run_claim(claim, out, quick=True, overrides=(f"data.cache_dir={data_cache}", NO_PEAK),
                         log=lambda *a: None, progress=False)
    run = json.loads((out / "results.json").read_text())["results"]["separate"][0]["run"]
    assert json.loads((out / run / "config.json").read_text())["model"]["rope_base"] == 5000.0


def test_an_expectation_between_two_numbers_of_one_arm_pairs_them_by_seed():
    e = Expect("base", "base", "context_left", worse_metric="context_left_uniform")
    rs = {"base": [{"seed": s, "context_left": 0.5, "context_left_uniform": 0.6 + s / 100} for s in (1, 2, 3)]}
    c = experiment.compare(e, rs)
    assert c.diffs == pytest.approx((0.11, 0.12, 0.13)) and c.seeds == (1, 2, 3)


def test_an_arm_whose_time_is_a_budget_is_trained_here_not_copied(tmp_path, monkeypatch):
    """The equal-time LSTM spends the transformer's mean wall time: a transformer copied from another claim would
    bring a time measured under that claim's load, so the rnn claim trains its own (and copies the rest)."""
    overrides = [*BASE, *QUICK, "train.seed=1"]
    sibling = tmp_path / "qk" / "runs" / "separate-s1"
    sibling.mkdir(parents=True)
    (sibling / "config.json").write_text(json.dumps(runs.resolved([*overrides, "name=claims-qk"])))
    (sibling / runs.DONE).write_text(json.dumps({"seconds": 1.0, "launch": runs.launch_of(())}))
    launched = []
    same = runs.Job("transformer", 1, None, ("train.seed=1",))
    for timed, out in ((frozenset({"transformer"}), "rnn"), (frozenset(), "other")):
        runner = runs.Runner(tmp_path / out, out, (*BASE, *QUICK), progress=False, log=lambda *_: None, timed=timed)
        monkeypatch.setattr(runner, "_launch", lambda todo: launched.extend(j.arm for j in todo))
        runner.train([same])
        assert launched == ["transformer"], f"{out}: a timed arm copied, or an untimed one not copied ({launched})"
    assert runs.finished(tmp_path / "other" / "runs" / same.name), "an arm nobody times is copied from its twin"


def test_a_twin_trained_under_the_same_launcher_is_copied(tmp_path, monkeypatch):
    """Under joblib every run's config holds train.num_threads=1 (the launcher's setting): a run another claim
    trained under the same launcher is found and copied, not trained again."""
    joblib = ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "train.num_threads=1")
    overrides = [*BASE, *QUICK, "train.seed=1"]
    sibling = tmp_path / "qk" / "runs" / "separate-s1"
    sibling.mkdir(parents=True)
    (sibling / "config.json").write_text(json.dumps(runs.resolved([*overrides, "train.num_threads=1"])))
    (sibling / runs.DONE).write_text(json.dumps({"seconds": 1.0, "launch": runs.launch_of(joblib)}))
    runner = runs.Runner(tmp_path / "mask", "mask", (*BASE, *QUICK), joblib, progress=False, log=lambda *_: None)
    launched = []
    monkeypatch.setattr(runner, "_launch", lambda todo: launched.extend(todo))
    runner.train([runs.Job("before_softmax", 1, None, ("train.seed=1",))])
    assert launched == [], "the same run under the same launcher is copied"
    assert runs.finished(tmp_path / "mask" / "runs" / "before_softmax-s1")


def test_the_rnn_claim_trains_its_own_transformer_though_another_claim_has_its_twin(tmp_path, data_cache,
                                                                                      monkeypatch):
    """The transformer's mean wall time is the equal-time LSTM's budget: every transformer run of the rnn claim,
    the sweep's and the later seeds', is trained beside the LSTM's, never copied from qk's identical base arm."""
    from attention_lab.claims.catalog import RNN_RATES

    _, _, qk = _quick(tmp_path, "qk", data_cache, ("separate",), seeds=(1, 2), rates=(RNN_RATES["transformer"] / BASE_LR,))
    assert qk["results"]["separate"][0]["lr"] == pytest.approx(RNN_RATES["transformer"]), "qk's twin of the transformer"
    claim, _, doc = _quick(tmp_path, "rnn", data_cache, ("transformer", "lstm equal time"), seeds=(1, 2))
    trained = doc["runs_trained"]
    assert trained == 4, f"transformer and lstm equal time, seeds 1 and 2, all trained here: {trained}"


# ---------------------------------------------------------------------------------------------------------------
# along the variable: the saturation measures, the claim repeated at each value, a trend per expectation

def _causal(scores: np.ndarray) -> np.ndarray:
    t = scores.shape[-1]
    masked = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_saturation_of_one_hot_and_uniform_rows():
    t = 6
    one_hot = _causal(np.where(np.eye(t, dtype=bool), 60.0, 0.0))  # every query takes itself: one-hot rows
    s = measure.saturation(one_hot[None, None, None])
    assert s["max_weight"] == pytest.approx(1.0) and s["saturated_rows"] == 1.0, s
    assert s["entropy_rows"] == pytest.approx(0.0, abs=1e-9), s
    uniform = measure.saturation(_causal(np.zeros((t, t)))[None])
    assert uniform["saturated_rows"] == 0.0 and uniform["entropy_rows"] == pytest.approx(1.0)
    assert uniform["max_weight"] == pytest.approx(np.mean([1 / k for k in range(2, t + 1)])), "query 0 is not a row"
    half = _causal(np.where(np.eye(t, dtype=bool), 60.0, 0.0))
    half[::2] = _causal(np.zeros((t, t)))[::2]  # odd queries one-hot, even ones uniform
    assert measure.saturation(half)["saturated_rows"] == pytest.approx(3 / 5), "rows 1, 3, 5 of 1..5"


def test_a_claim_along_its_variable_is_decided_at_each_value_and_trained_at_each():
    from attention_lab.claims.catalog import along

    base = CLAIMS["scale"]
    claim, var = along(base), base.variable
    assert len(var.values) >= 3 and len(claim.arms) == len(base.arms) * len(var.values)
    heads = {compose([*BASE, *runs.job(a, 1, BASE_LR).overrides]).model.n_head for a in claim.arms}
    assert heads == {16, 4, 1}, "each value trains its own model"
    assert {e.at for e in claim.expect} == set(var.values) and all(e.of for e in claim.expect)
    assert len({runs.job(a, 1, BASE_LR).name for a in claim.arms}) == len(claim.arms), "one run folder an arm"
    assert report.runs_needed(claim, False, rate_check=False) == len(base.arms) * 3 * 5
    assert report.runs_needed(claim, False) == len(base.arms) * 3 * 5 * 2, "and again at the second fixed rate"


def test_expectations_along_a_variable_keep_their_own_region():
    """Scale's saturated rows (±0.02), its gradient (±0.1) and recall's copy bits (±0.1) are judged against their own
    region at every value of the variable, not the default ±0.01 bits/byte: saturated rows that differ by nothing on
    average, within ±0.014 over five seeds, are equivalent as the claim defines it, at each d_k. Planted bug:
    region_lost_along_the_variable."""
    from attention_lab.claims.catalog import along

    for name in ("scale", "recall"):
        base = CLAIMS[name]
        own = {(e.better, e.worse, e.metric): e.region for e in base.expect}
        assert any(r != 0.01 for r in own.values()), f"{name} has no region of its own left to test"
        for e in along(base).expect:
            want = own[(*e.of, e.metric)]
            assert e.region == want, (f"{name}: {e.of[0]} vs {e.of[1]} on {e.metric} at {base.variable.name}="
                                      f"{e.at:g} is judged against ±{e.region}, not its own ±{want}")
    e = next(e for e in along(CLAIMS["scale"]).expect if e.metric == "saturated_rows" and e.at == 32)
    diffs = (0.012, -0.012, 0.010, -0.010, 0.0)  # mean 0, its 95% interval about ±0.014: inside ±0.02, not ±0.01
    rs = {e.better: [{"seed": s, "saturated_rows": 0.300} for s in range(1, 6)],
          e.worse: [{"seed": s, "saturated_rows": 0.300 + d} for s, d in zip(range(1, 6), diffs)]}
    c = stats.decide([experiment.compare(e, rs)])[0]
    assert c.verdict == "equivalent", (
        f"{e.better} vs {e.worse}: saturated rows within ±{c.high:.3f} of each other read {c.verdict!r} against "
        f"±{c.region}; the claim's region is ±0.02")


def test_a_claim_along_its_variable_runs_end_to_end_quick_with_a_trend(tmp_path, data_cache):
    claim, rep, doc = _quick(tmp_path, "scale", data_cache, ("sqrt", "none"), seeds=(1, 2))
    assert doc["variable"] == "d_k" and len(doc["trends"]) == 2 and doc["rate_rule"] == "fixed in advance"
    assert len(doc["comparisons"]) == 6 and sorted(set(doc["at"])) == [8, 32, 128]
    for r in doc["results"]["none, d_k=32"]:
        assert {"max_weight", "saturated_rows", "entropy_rows", "log10_score_grad", "log10_score_grad_init"} <= set(r)
        assert r["lr"] == pytest.approx(BASE_LR) and r["log10_score_grad_init"] < 0, r
    t = doc["trends"][0]
    assert t["values"] == [8, 32, 128] and t["verdict"] in stats.TREND_WORDS
    diffs = {s: {} for s in (1, 2)}
    for c, at in zip(doc["comparisons"], doc["at"]):
        if c["metric"] == "bpb":
            for s, d in zip(c["seeds"], c["diffs"]):
                diffs[s][at] = d
    want = stats.trend(diffs, better="sqrt", worse="none", metric="bpb", variable="d_k", region=0.01)
    assert t["slope"] == pytest.approx(want.slope), "the trend is read from the per-value differences"
    text = rep.read_text()
    assert "## Along d_k" in text and f"changes by {t['slope']:+.4f} per doubling of d_k" in text
    assert "at d_k = 8/32/128" in report.verdict_summary(doc)


def test_the_gradient_at_the_scores_vanishes_when_the_softmax_saturates():
    """Unscaled scores from q and k rows ever larger: uniform rows (q = k = 0) pass the most gradient to the scores,
    one-hot rows (sd 1 a weight: scores with sd ~128) almost none; and the number is per prediction, so the same
    windows twice give the same number."""
    from attention_lab.interp.measures import score_gradient
    from model import GPT, GPTConfig

    x = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, 1)
    grads = []
    for sd in (0.0, 0.088, 0.35, 1.0):
        torch.manual_seed(0)
        m = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=1, n_embd=128, attn_scale="none",
                          pos_encoding="none"))
        with torch.no_grad():
            m.transformer.h[0].attn.c_attn.weight[:256].normal_(0, sd) if sd else \
                m.transformer.h[0].attn.c_attn.weight[:256].zero_()
        grads.append(score_gradient(m, x, y))
        assert all(p.grad is None for p in m.parameters()), "the measure leaves no gradient behind"
        if sd == 0.088:
            assert score_gradient(m, x.repeat(2, 1), y.repeat(2, 1)) == pytest.approx(grads[-1], rel=1e-4), \
                "per prediction: more windows of the same kind give the same number"
    assert grads == sorted(grads, reverse=True) and grads[-1] < grads[0] / 20, grads


def test_the_gradient_at_the_scores_is_the_rms_over_the_keys_each_query_sees():
    """Against a written-out reference: the scores' gradient read on the math path, times the B T predictions, its
    RMS over (query i >= 1, key j <= i) only: hidden keys and the first query (one key) get no gradient and would
    only dilute it."""
    from attention_lab.interp.measures import score_gradient

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, attn_backend="math"))
    x = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, 1)
    kept = []

    def keep(scores):
        scores.retain_grad()
        kept.append(scores)
        return scores

    from model.hooks import hooked

    with hooked(m, edits={f"h.{i}.attn.hook_scores": keep for i in range(2)}):
        m(x, y).loss.backward()
    m.zero_grad(set_to_none=True)
    entries = [g * x.numel() for s in kept for g in
               (s.grad[:, :, i, j] for i in range(1, 16) for j in range(i + 1))]
    want = torch.stack(entries).pow(2).mean().sqrt().item()
    assert score_gradient(m, x, y) == pytest.approx(want, rel=1e-5)


def test_the_untrained_gradient_is_the_run_s_config_initialised_under_its_seed(tmp_path):
    """log10_score_grad_init reads a fresh model of the run's config drawn under the run's seed: the same number for
    the same seed whatever the trained weights, another for another seed, and not the trained model's number."""
    from attention_lab.interp.measures import score_gradient

    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, 1)
    trained = GPT(cfg)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.05 * torch.randn_like(p))
    got = {}
    for seed in (7, 8):
        (tmp_path / "config.json").write_text(json.dumps({"train": {"seed": seed}}))
        torch.manual_seed(seed)
        want = math.log10(score_gradient(GPT(cfg), x, y))
        torch.manual_seed(123)  # whatever the state before, the seed decides
        got[seed] = measure.score_gradients(trained, tmp_path, x, y)
        assert got[seed]["log10_score_grad_init"] == pytest.approx(want, abs=1e-9), seed
    assert got[7]["log10_score_grad_init"] != got[8]["log10_score_grad_init"]
    assert got[7]["log10_score_grad"] == got[8]["log10_score_grad"] != got[7]["log10_score_grad_init"]


def test_the_report_names_each_arm_s_own_rate_or_the_common_one():
    rows = lambda lr: [{"lr": lr}]  # noqa: E731
    own = {"rate_rule": "fixed in advance", "common_rate": 0.003, "rates": {"transformer": None, "lstm": None},
           "results": {"transformer": rows(0.009), "lstm": rows(0.243)}}
    said = report._rates_said(own)
    assert "a rate of its own" in said and "transformer at 0.009" in said and "lstm at 0.243" in said, said
    assert "no common-rate verdict" in " ".join(report.common_section(CLAIMS["rnn"], own))
    mixed = own | {"rates": {"transformer": None, "lstm": 0.003}, "results": {"transformer": rows(0.009),
                                                                              "lstm": rows(0.003)}}
    assert "that is not about its rate trained at 0.003" in report._rates_said(mixed)
    assert "that is not about its rate trained at 0.003" in " ".join(report.common_section(CLAIMS["rnn"], mixed))


def test_the_trend_plot_draws_each_arm_along_the_variable():
    t = {"better": "sqrt", "worse": "none", "metric": "bpb", "variable": "d_k", "values": [8, 32]}
    results = {f"{arm}, d_k={v}": [{"bpb": base + v / 100 + s / 10} for s in (0, 1)]
               for arm, base in (("sqrt", 2.0), ("none", 3.0)) for v in (8, 32)}
    series = report.arm_series({"results": results}, t)
    assert set(series) == {"sqrt", "none"}, "both arms, not one"
    assert [v for v, _, _ in series["none"]] == [8, 32]
    assert [m for _, m, _ in series["none"]] == pytest.approx([3.13, 3.37])
    assert [sd for _, _, sd in series["sqrt"]] == pytest.approx([0.05, 0.05])


def test_the_log_log_slope_of_a_cost_and_its_interval():
    t = np.array([1024, 2048, 4096, 8192, 16384])
    exact = stats.loglog_slope(t, 3e-6 * t ** 2.0)
    assert exact.slope == pytest.approx(2.0) and exact.high - exact.low == pytest.approx(0.0, abs=1e-9)
    rng = np.random.default_rng(0)
    noisy = stats.loglog_slope(t, 1e-3 * t * np.exp(rng.normal(0, 0.05, len(t))))
    assert noisy.low < 1.0 < noisy.high and noisy.high - noisy.low > 0.01, noisy
    assert math.isnan(stats.loglog_slope(t[:2], t[:2]).low), "two points: a slope, no interval"


def test_the_log_log_slopes_interval_covers_the_true_slope_95_times_in_100():
    """Four lengths (what a short benchmark measures): the 95% interval must hold the true slope in 95% of noisy
    repeats. With one degree of freedom too many (n - 1 instead of n - 2) it holds it in about 89%: a quadratic
    claim said with more confidence than its four points give."""
    t = np.array([2048, 4096, 8192, 16384])
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(4000):
        fit = stats.loglog_slope(t, 1e-6 * t ** 1.9 * np.exp(rng.normal(0, 0.1, len(t))))
        covered += fit.low <= 1.9 <= fit.high
    assert 0.935 <= covered / 4000 <= 0.965, f"the 95% interval held the true slope in {covered / 40:.1f}% of repeats"


def test_regenerating_the_docs_keeps_earlier_sections_marked_as_earlier(tmp_path):
    """A claim with no results under the current rules keeps its published section and table row, each marked as
    the earlier rules' numbers (once, however often the page is regenerated); a claim re-run replaces its own."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "claims.md").write_text("# old intro\n\n| claim | verdicts | runs |\n|---|---|---|\n"
                                    "| `mask` | after vs before: **holds** +0.991 [+0.901, +1.080] | 31 runs, 50 run-min |\n"
                                    "| `qk` | old qk | 29 runs |\n\n## `mask`\n\n`.venv/bin/python -m attention_lab.claims "
                                    "mask`\n\nold mask body +0.991\n\n## `qk`\n\nold qk body\n")
    root, c = _rendered_qk(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- claims table: python -m attention_lab.claims docs -->\n<!-- end claims table -->\n")
    for _ in range(2):
        text = report.write_docs(root, docs, readme).read_text()
        assert text.count("old mask body +0.991") == 1 and text.count("**Numbers from the earlier rules") == 1, text
        assert "\n## `mask`\n\n> **Numbers from the earlier rules" in text, "the heading on a line of its own"
        assert "old qk body" not in text and f"**{c.verdict}**" in text
        row = next(line for line in text.splitlines() if line.startswith("| `mask` |"))
        assert row.count("(earlier rules") == 1 and "+0.991 [+0.901, +1.080] | 31 runs, 50 run-min |" in row, row
    assert "not re-run under the current rules yet" in readme.read_text() and "[`mask`](docs/claims.md#mask)" in \
        readme.read_text()
    assert "not run under these rules yet" in text, "a claim never published says so"


def test_buckets_and_a_trend_along_a_measured_axis():
    assert measure.buckets(np.arange(8.0)) == {"1": 0.0, "2": 1.0, "4": 2.5, "8": 5.5}
    rng = np.random.default_rng(0)
    claim = replace(CLAIMS["rnn"], expect=(Expect("transformer", "lstm"),))
    results = {"transformer": [], "lstm": []}
    for s in range(1, 6):
        base = {str(2 ** k): 3.0 - 0.1 * k + rng.normal(0, 0.01) for k in range(8)}
        results["transformer"].append({"seed": s, "position_buckets": base, "diverged": None})
        gap = {k: v + 0.02 * math.log2(int(k)) + rng.normal(0, 0.01) for k, v in base.items()}  # grows with position
        results["lstm"].append({"seed": s, "position_buckets": gap, "diverged": None})
    results["lstm"][4]["diverged"] = "final training loss above the first evaluation's"
    axis = experiment.axis_trends(claim, results)
    t = axis["trends"][0]
    assert t["verdict"] == "grows" and t["slope"] == pytest.approx(0.02, abs=0.01) and len(t["seeds"]) == 4, t
    per_value = axis["per_value"][0]
    assert [v for v, _ in per_value] == [2.0 ** k for k in range(8)]
    assert all(list(c["seeds"]) == [1, 2, 3, 4] for _, c in per_value), "seed 5 diverged: left out at every value"


def test_a_jobs_own_value_beats_a_common_one():
    """An arm's own setting wins over the claim's common one for the same key (the equal-time LSTM's clock over
    --quick's step cap); a common key the arm does not set stays, and config-group choices stay off the file.
    The quick end-to-end run cannot show this: no --quick value shares a key with an arm's own."""
    from attention_lab.claims.runs import job_values

    got = job_values(["data=shakespeare_char", "train.max_steps=24", "train.stop=steps", "optim.lr=0.01"],
                     ["train.stop=budget", "train.max_minutes=0.5", "optim.lr=0.003"])
    assert got["train"] == {"max_steps": 24, "stop": "budget", "max_minutes": 0.5}, got
    assert got["optim"] == {"lr": 0.003} and "data" not in got, got
