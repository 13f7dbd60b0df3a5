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
                                 "train.max_steps=2", "train.eval_interval=2", "train.head_roles=false",
                                 "train.film=false", "train.tensorboard=false", "train.sample_tokens=0"]), run_dir)
        said[name] = (run_dir / "console.log").read_text().splitlines()
    last = said["default"][-2:]
    assert last[0].startswith("done:"), last
    assert "python train.py experiment=induction" in last[1], "make train's last line should point to the induction run"
    assert not any("experiment=induction" in line for line in said["debug"]), "only the default preset says it"


def expected_rows() -> list[dict]:
    text = (REPO / "docs" / "recipe.md").read_text(encoding="utf-8")
    table = text.split("<!-- expected-scores")[1].split("<!-- /expected-scores -->")[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[0] in ("CPU kind", "---"):
            continue
        kind, precision, run, date, steps, bpb, whole = cells
        rows.append({"kind": kind, "precision": precision, "run": run, "date": date,
                     "steps": int(steps.replace(",", "")), "bpb": float(bpb), "whole": float(whole) if whole else None})
    return rows


def test_the_expected_score_table_holds_dated_runs_of_each_cpu_kind():
    import re

    rows = expected_rows()
    assert rows, "docs/recipe.md's expected-score table is missing or unreadable"
    for r in rows:
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", r["date"]), f"a row without its date: {r}"
        assert r["kind"] and r["run"] and 100 < r["steps"] < 10_000 and 1.0 < r["bpb"] < 3.0, r
    kinds = {r["kind"] for r in rows}
    assert {"Intel Xeon, AMX + AVX512-BF16", "AMD EPYC, AVX512-BF16 (no AMX)", "AMD EPYC, no native bf16"} <= kinds
    # the sentence under the table states the float32 EPYC's spread: computed from its rows
    f32 = [r for r in rows if r["precision"] == "float32"]
    span = max(r["bpb"] for r in f32) - min(r["bpb"] for r in f32)
    text = (REPO / "docs" / "recipe.md").read_text(encoding="utf-8")
    said = (f"the float32 EPYC's {len(f32)} runs span {span:.3f} bits/byte,\n"
            f"{min(r['steps'] for r in f32)} to {max(r['steps'] for r in f32)} steps")
    said_words = said.replace(f"{len(f32)} runs", {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}.get(len(f32), str(len(f32))) + " runs")
    assert said_words in text, f"docs/recipe.md should say: {said_words!r}"
    # the README's headline scores are rows of the table, and it links the table
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/recipe.md#is-my-make-train-normal-expected-scores-per-cpu-kind" in readme
    headline = re.search(r"\*\*(\d\.\d{3}) bits/byte\*\*.*?\*\*(\d\.\d{3})-(\d\.\d{3})\*\*", readme, re.S)
    assert headline, "the README's headline scores moved: update this test"
    scores = {r["bpb"] for r in rows}
    assert {float(g) for g in headline.groups()} <= scores, "a README score that no recorded run in the table holds"


def test_one_name_per_probe_the_films_prompt_is_never_called_a_probe(tmp_path):
    import re

    import numpy as np

    from attention_lab.training.callbacks import ProbeAttention
    from attention_lab.viewer import page as viewer

    # "probe" is the head roles' repeated-tokens probe; the film's prompt is the film's prompt, in the docs ...
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        found = re.findall(r"probe prompt", path.read_text(encoding="utf-8"), re.I)
        assert not found, f"{path.name} calls the film's prompt the probe prompt (the probe is the repeated tokens)"
    # ... and on the film: the subtitle a run's page shows, from what ProbeAttention records
    run = tmp_path / "run"
    (run / "attention").mkdir(parents=True)
    description = ProbeAttention(None, [1, 2, 3, 4, 5]).description
    (run / "attention" / "probe.json").write_text(json.dumps({"tokens": list("abcde"), "ids": [1, 2, 3, 4, 5],
                                                              "description": description}))
    np.save(run / "attention" / "step_00000010.npy", np.tril(np.ones((1, 1, 5, 5), np.float16)) / 5)
    page = viewer.build_film(run).read_text(encoding="utf-8")
    subtitle = json.loads(re.search(r'id="data">(.*?)</script>', page, re.S).group(1))["subtitle"]
    assert "the film's prompt: 5 tokens" in subtitle and "probe" not in subtitle, subtitle


def test_the_mask_claims_report_says_which_bits_per_byte_the_verdict_reads(tmp_path):
    from dataclasses import replace

    from test_claims import _doc

    from attention_lab.claims import report
    from attention_lab.claims.catalog import CLAIMS

    claim = replace(CLAIMS["mask"], arms=CLAIMS["mask"].arms[:2])
    doc = _doc([])
    doc["claim"], doc["choose_by"], doc["sweep"], doc["sweep_per_seed"] = "mask", "honest_bpb", {}, {}
    doc["rates"] = {"before_softmax": 0.003, "after_softmax": 0.003}
    doc["results"] = {arm: [{"seed": s, "lr": 0.003, "step": 24, "bpb": 5.07, "leaky_bpb": 5.35 - d,
                             "honest_bpb": 5.35 + d, "seconds": 4.0} for s in (1, 2)]
                      for arm, d in (("before_softmax", 0.0), ("after_softmax", 0.4))}
    (tmp_path / "results.json").write_text(json.dumps(doc))
    text = report.render(claim, tmp_path).read_text()
    lines = {k: next((line for line in text.splitlines() if line.startswith(f"- {k}")), None)
             for k in ("bpb:", "leaky_bpb", "honest_bpb")}
    assert all(lines.values()), f"each of the mask claim's three numbers gets a line saying what it is: {lines}"
    assert "the verdict reads this one" in lines["honest_bpb"], "say which number the verdict reads, and why"
    assert "verdict" not in lines["leaky_bpb"] and "verdict" not in lines["bpb:"]
    head = next(line for line in text.splitlines() if line.startswith("| arm |"))
    assert head.index("honest_bpb, the verdicts' number") < head.index("| bpb |"), \
        "the arm table leads with the number the verdict reads, not the leaky bits/byte that flatter a leak"
    # a claim with one bits/byte needs no such lines
    assert report.column_lines(CLAIMS["qk"], {"bpb", "seed"}) == []


def test_snapshots_add_film_frames_and_light_checkpoints_spread_over_the_run(tmp_path, data_cache):
    import train as train_mod
    from attention_lab.store.checkpoint import find_checkpoint, is_snapshot, load_checkpoint
    from attention_lab.training.config import compose

    run = tmp_path / "run"
    train_mod.train(compose(["experiment=debug", f"data.cache_dir={data_cache}", "train.snapshots=5",
                             "train.head_roles=false", "train.tensorboard=false", "train.sample_tokens=0"]),
                    run)  # 20 steps, evaluations at 10 and 20
    frames = sorted(int(p.stem.split("_")[1]) for p in (run / "attention").glob("step_*.npy"))
    assert frames == [4, 8, 10, 12, 16, 20], f"a frame at each fifth of the run besides the evaluations: {frames}"
    steps = {int(p.name.split("_")[1]): p for p in (run / "checkpoints").glob("step_*")}
    assert sorted(steps) == [4, 8, 10, 12, 16, 20], f"the light checkpoints are kept beside the full ones: {steps}"
    assert [s for s, p in sorted(steps.items()) if is_snapshot(p)] == [4, 8, 12, 16]
    assert not (steps[4] / "train_state.pt").exists(), "a snapshot is light: the weights, no optimizer state"
    assert find_checkpoint(run, "latest") == steps[20], "a resume opens the last full checkpoint, never a snapshot"
    light = load_checkpoint(steps[8])  # the lab's slider and sample.py open a snapshot as any checkpoint
    assert light.step == 8
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows if "seconds_snapshot" in r) == [4, 8, 12, 16], "each snapshot's cost"
    film = (run / "attention.html").read_text(encoding="utf-8")
    assert "6 frames (evaluations and snapshots), steps 4\u201320" in film, "the film shows the snapshots' frames"


def test_tensorboard_draws_a_named_line_per_head(tmp_path, data_cache):
    """Each head's role scores also go to its own TensorBoard run (tb/heads/L<l>H<h>): a chart of one tag then
    draws a line per head in the head's colour, named in the run list and tooltip; the custom-scalars layout
    charts those tags (16 tags of one run were 16 lines of one colour, unnamed)."""
    import re

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import train as train_mod
    from attention_lab.interp.roles import ROLES
    from attention_lab.training.callbacks import HeadRoles
    from attention_lab.training.config import compose

    cfg = compose(["experiment=debug", f"data.cache_dir={data_cache}", "train.max_steps=10", "train.eval_interval=10"])
    run = tmp_path / "run"
    train_mod.train(cfg, run)
    heads = sorted(p.name for p in (run / "tb" / "heads").iterdir())
    assert heads == [f"L{layer}H{h}" for layer in range(cfg.model.n_layer) for h in range(cfg.model.n_head)], heads
    tags = EventAccumulator(str(run / "tb" / "heads" / "L1H0")).Reload().Tags()["scalars"]
    layout = HeadRoles.layout(None)
    charts = next(v for k, v in layout.items() if k.startswith("head roles"))
    for role in ROLES:
        matched = [t for t in tags if re.search(charts[role][1][0], t)]
        assert len(matched) == 1, f"the {role} chart should draw one line per head run: {matched} of {tags}"
