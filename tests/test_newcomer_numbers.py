"""Issue 36's remaining numbers a newcomer reads: the quick claims' time estimate is a quick run's, not a full one's;
the expected-score table for `make train` holds only recorded measurements (machine, date, steps)."""

from __future__ import annotations

import json
from pathlib import Path

from attention_lab.claims.catalog import BASE, QUICK
from attention_lab.claims.runs import DONE, GUESS_SECONDS, Runner, minutes_or_seconds

REPO = Path(__file__).resolve().parent.parent


def finished_run(root: Path, claim_dir: str, job: str, seconds: float) -> None:
    run = root / claim_dir / "runs" / job
    run.mkdir(parents=True)
    (run / DONE).write_text(json.dumps({"seconds": seconds}))


def test_the_quick_claims_estimate_uses_quick_runs_only(tmp_path):
    for i in range(5):  # full-size runs of another claim beside it: a minute each
        finished_run(tmp_path, "qk", f"base-s{i}", 60.0)
    quick = Runner(tmp_path / "mask-quick", "mask", (*BASE, *QUICK))
    assert quick.estimate() < 10, "with no quick run finished yet, a quick run is guessed at seconds, not a minute"
    finished_run(tmp_path, "qk-quick", "base-s1", 3.0)
    finished_run(tmp_path, "qk-quick", "base-s2", 5.0)
    finished_run(tmp_path, "qk-quick", "base-s3", 4.0)
    assert quick.estimate() == 4.0, "the quick estimate is the median of the quick runs finished beside it"
    full = Runner(tmp_path / "mask", "mask", BASE)
    assert full.estimate() == 60.0, "a full claim's estimate ignores the quick runs"
    assert Runner(tmp_path / "empty" / "x", "x", BASE).estimate() == GUESS_SECONDS
    assert minutes_or_seconds(40) == "40 s" and minutes_or_seconds(9 * 60) == "9 min"


def test_the_default_runs_last_lines_point_to_the_induction_preset(tmp_path, data_cache):
    import train as train_mod
    from attention_lab.training.config import compose

    said = {}
    for name in ("default", "debug"):  # the debug preset's tiny run, once under the default preset's name
        run_dir = tmp_path / name
        train_mod.train(compose(["experiment=debug", f"data.cache_dir={data_cache}", f"name={name}",
                                 "train.max_steps=2", "train.eval_interval=2", "train.head_roles=false"]), run_dir)
        said[name] = (run_dir / "console.log").read_text().splitlines()
    last = said["default"][-2:]
    assert last[0].startswith("done:"), last
    assert "python train.py experiment=induction" in last[1], "make train's last line should point to the induction run"
    assert not any("experiment=induction" in line for line in said["debug"]), "only the default preset says it"
