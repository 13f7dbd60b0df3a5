"""python -m attention_lab.claims: the verdict follows the numbers, every arm composes, every claim runs end to end
in its --quick form (arms trained in-process here, so the test pays no interpreter start per arm)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import train as train_mod
from attention_lab import claims as C
from attention_lab.training.config import compose


def results(**arms) -> dict:
    return {name: [{"bpb": b, "seed": i, "seconds": 1.0} for i, b in enumerate(bpbs)] for name, bpbs in arms.items()}


def test_verdict_holds_when_the_gap_is_beyond_twice_the_seed_spread():
    r = results(sqrt=[1.00, 1.02], none=[1.20, 1.22])
    assert C.seed_spread(r) == pytest.approx(0.02)
    v = C.verdict(C.Expect("sqrt", "none"), r)
    assert "none is worse than sqrt by 0.200 bits/byte" in v and "the claim holds at this scale" in v, v
    assert "10.0x the seed spread (0.020)" in v, v


def test_verdict_says_no_difference_within_the_spread_and_fails_when_reversed():
    close = results(a=[1.00, 1.04], b=[1.03, 1.05])
    assert "no difference beyond the seed spread" in C.verdict(C.Expect("a", "b"), close)
    reversed_ = results(a=[1.30, 1.31], b=[1.00, 1.01])
    v = C.verdict(C.Expect("a", "b"), reversed_)
    assert "b is better than a" in v and "the claim fails at this scale" in v, v
    one_seed = results(a=[1.0], b=[1.1])
    assert "one seed" in C.verdict(C.Expect("a", "b"), one_seed)
    assert "not measured" in C.verdict(C.Expect("a", "missing"), one_seed)


def test_verdict_reads_the_named_metric():
    r = {"before": [{"bpb": 2.0, "honest_bpb": 2.0}], "none": [{"bpb": 0.5, "honest_bpb": 4.0}]}
    v = C.verdict(C.Expect("before", "none", "honest_bpb"), r)
    assert "none is worse than before by 2.000 bits/byte" in v, v


def test_every_arm_of_every_claim_composes_into_a_valid_config():
    for claim in C.CLAIMS.values():
        for arm in claim.arms:
            overrides = [o.replace("{minutes}", "1.5") for o in arm.overrides]
            for quick in ((), C.QUICK):
                cfg = compose([*C.BASE, *quick, *overrides])
                assert cfg.train.max_steps > 0, (claim.name, arm.name)
    base = compose(list(C.BASE))
    assert base.model.qk_norm is False, "the scale and tied-Q/K claims need QK-norm off in the base preset"


def test_list_and_unknown_claims(capsys):
    assert C.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("qk", "scale", "mask", "heads", "positions", "rnn", "context", "quadratic"):
        assert out.count(f"{name} ") >= 1, f"--list does not name {name}:\n{out}"
    with pytest.raises(SystemExit):
        C.main(["nonsense"])
    assert "unknown claim 'nonsense'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def in_process(data_cache):
    def train(run_dir: Path, overrides: list[str]) -> float:
        t0 = time.time()
        train_mod.train(compose([*overrides, f"data.cache_dir={data_cache}"]), run_dir)
        return time.time() - t0
    return train


# two arms of each claim, one seed: every override and every measurement runs; the numbers mean nothing
QUICK_ARMS = {"qk": ("separate", "tied"), "scale": ("sqrt", "none-3xlr"), "mask": ("before_softmax", "none"),
              "heads": ("1 head", "16 heads"), "positions": ("none", "alibi"), "rnn": ("transformer", "lstm equal time")}


@pytest.mark.parametrize("name", sorted(QUICK_ARMS))
def test_each_claim_runs_end_to_end_quick(name, tmp_path, in_process):
    claim = C.CLAIMS[name]
    report = C.run_claim(claim, tmp_path, quick=True, seeds=(1,), arms=QUICK_ARMS[name], train=in_process,
                         log=lambda *a: None)
    text = report.read_text()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["results"]) == set(QUICK_ARMS[name]), saved["results"].keys()
    for arm, rows in saved["results"].items():
        assert rows[0]["bpb"] > 0 and rows[0]["steps"] > 0, (arm, rows[0])
        assert (tmp_path / "runs" / f"{arm.replace(' ', '_')}-s1" / "checkpoints").is_dir(), "each arm is a run"
    assert "| arm |" in text and claim.statement in text and (tmp_path / "plot.png").stat().st_size > 1000
    if claim.expect:
        assert "## Verdict" in text
    if name == "mask":
        r = saved["results"]["none"][0]
        assert r["honest_bpb"] > r["leaky_bpb"], f"an unmasked model must look better than it is: {r}"
        assert "## Samples" in text
    if name == "rnn":
        assert saved["results"]["lstm equal time"][0]["tokens_per_s"] > 0


def test_context_and_compare_read_trained_runs(tmp_path, in_process, monkeypatch):
    run = tmp_path / "run"
    in_process(run, [*C.BASE, *C.QUICK, "train.max_steps=12"])
    report = C.run_claim(C.CLAIMS["context"], tmp_path / "context", quick=True, run=run)
    text = report.read_text()
    assert "| embedding |" in text and "| block 1 |" in text and "One token in two contexts" in text, text
    sim = json.loads((tmp_path / "context" / "similarity.json").read_text())
    assert len(sim["self_similarity"]) == 2 and sim["pairs"] > 0
    # compare's whole-split score is attention_lab.evaluate's (tested with it); here its table and plot
    monkeypatch.setattr(C, "score_run", lambda run, **kw: type("S", (), {"bits_per_byte": 2.5})())
    out = C.compare([run, run], tmp_path / "compare")
    assert out.read_text().count(str(run)) == 2


def test_the_spread_is_the_two_compared_arms_own():
    """An unstable third arm's wide seed spread must not drown a clear difference between two steady arms."""
    r = results(sqrt=[1.00, 1.01], inverse=[1.10, 1.11], unstable=[1.0, 2.0])
    assert C.seed_spread(r) == pytest.approx(1.0) and C.seed_spread(r, arms=("sqrt", "inverse")) == pytest.approx(0.01)
    assert "the claim holds at this scale" in C.verdict(C.Expect("sqrt", "inverse"), r)


def test_quadratic_runs_the_wall_benchmark_and_computes_the_growth(tmp_path):
    report = C.run_claim(C.CLAIMS["quadratic"], tmp_path, quick=True).read_text()
    assert "doubling the context multiplies the forward + backward time by" in report, report[:2000]
    assert (tmp_path / "bench.json").exists() and "| T | method |" in report


def test_an_arm_another_claim_trained_is_found_by_its_run_config(tmp_path):
    """The base arm is the same run in six claims: a finished arm of a sibling claim with the same run config
    (its name aside) is found, one with another seed or another setting is not."""
    overrides = [*C.BASE, *C.QUICK, "train.seed=1"]
    sibling = tmp_path / "qk" / "runs" / "separate-s1"
    sibling.mkdir(parents=True)
    (sibling / "config.json").write_text(json.dumps(C.resolved([*overrides, "name=claims-qk"]) | {"name": "claims-qk"}))
    (sibling / "claims_done.json").write_text(json.dumps({"seconds": 1.0}))
    out = tmp_path / "scale"
    assert C.finished_twin(out, [*overrides, "name=claims-scale", "model.attn_scale=sqrt"]) == sibling.resolve()
    assert C.finished_twin(out, [*C.BASE, *C.QUICK, "train.seed=2"]) is None, "another seed is another run"
    assert C.finished_twin(out, [*overrides, "model.attn_scale=none"]) is None, "another setting is another run"
    assert C.finished_twin(tmp_path / "qk", overrides) is None, "a claim does not copy its own arms"
