"""The time budget ends the default run (train.stop=budget): a faster machine never stops early at max_steps.

With train=cpu's 8 minutes, max_steps is the number of steps the budget was sized for: a machine that gets there
early goes on, along a schedule that follows the clock, until the budget is spent; the run's clock is saved
with the checkpoint, so a resume goes on from the time already spent. train.stop=steps (the debug, claims and
induction presets) keeps max_steps as the cap. No timing is asserted: the budgets are a few seconds, and a test
asks only whether the run went past max_steps, stopped on its clock, and where its schedule ended.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

import train as train_mod
from attention_lab.training.config import compose
from attention_lab.training.loop import schedule_position, steps_left

# ------------------------------------------------------------------------------------------------ pure functions


def test_budget_mode_never_stops_at_max_steps_and_its_schedule_follows_the_clock():
    # a fast machine: 3,000 steps when half of an 8-minute budget sized for 1,800 is spent
    assert steps_left(3000, 1800, 8.0, "budget"), "the budget alone ends the run: step 3000 of 1800 goes on"
    assert schedule_position(3000, 240.0, 1800, 8.0, "budget") == 900, "half the budget: half the schedule"
    # a slow machine: 300 steps at half the budget, the same place in the schedule
    assert schedule_position(300, 240.0, 1800, 8.0, "budget") == 900
    assert schedule_position(0, 480.0, 1800, 8.0, "budget") == 1800, "the budget spent: the schedule's end"


def test_steps_mode_keeps_max_steps_as_the_cap_and_its_schedule_by_steps():
    assert not steps_left(1800, 1800, 8.0, "steps") and steps_left(1799, 1800, 8.0, "steps")
    assert schedule_position(1000, 60.0, 1800, 8.0, "steps") == 1000, "ahead of the clock: by steps"
    assert schedule_position(300, 240.0, 1800, 8.0, "steps") == 900, "behind the clock: by the budget's share"
    # no budget: max_steps caps the run whatever train.stop says
    assert not steps_left(20, 20, None, "budget") and schedule_position(7, 99.0, 20, None, "budget") == 7


def test_the_progress_bar_of_a_budget_run_counts_the_budgets_seconds_and_a_steps_run_its_steps():
    """A learner's `make train` ends on its 8 minutes: a bar over max_steps (sized for a fast CPU) would promise an
    hour on a slow one (the learner's walk saw an ETA of 56 min). Resumed, each bar starts where the run was."""
    from types import SimpleNamespace

    budget = train_mod.open_progress(SimpleNamespace(stop="budget", max_minutes=8.0, max_steps=1800),
                                     SimpleNamespace(seconds=90.4, step=300), by_budget=True)
    steps = train_mod.open_progress(SimpleNamespace(stop="steps", max_minutes=8.0, max_steps=1800),
                                    SimpleNamespace(seconds=90.4, step=300), by_budget=False)
    try:
        assert (budget.total, budget.n, budget.unit) == (480, 90, "s"), (budget.total, budget.n, budget.unit)
        assert "90/480 s of the time budget" in str(budget), str(budget)
        assert (steps.total, steps.n, steps.unit) == (1800, 300, "step"), (steps.total, steps.n, steps.unit)
    finally:
        budget.close()
        steps.close()


def test_the_default_preset_runs_on_its_budget_and_the_short_presets_on_their_steps():
    assert compose([]).train.stop == "budget" and compose([]).train.max_minutes is not None
    for preset in ("debug", "claims", "induction"):
        assert compose([f"experiment={preset}"]).train.stop == "steps", preset


# ---------------------------------------------------------------------------------------------- real (tiny) runs

FAST = ["experiment=debug", "train.max_steps=10", "train.eval_interval=100000", "train.log_interval=1",
        "train.sample_tokens=0", "train.head_roles=false", "train.film=false", "train.tensorboard=false",
        "optim.schedule=cosine", "optim.warmup_steps=0", "optim.min_lr=0.0"]
BUDGET_MIN = 0.1  # 6 s: a debug step takes milliseconds (tens on busy cores), so 10 steps are done long before


def lrs(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in rows if "lr" in r}


def saved_seconds(run: Path) -> float:
    state = torch.load(max((run / "checkpoints").glob("step_*")) / "train_state.pt", weights_only=True)
    return state["seconds"]


def test_a_run_on_its_budget_goes_past_max_steps_until_the_time_is_spent(tmp_path, data_cache, capsys):
    common = [*FAST, f"data.cache_dir={data_cache}", f"train.max_minutes={BUDGET_MIN}"]
    capped = train_mod.train(compose([*common, "train.stop=steps"]), tmp_path / "steps")
    assert capped["step"] == 10, f"train.stop=steps: max_steps=10 caps the run, it stopped at {capped['step']}"

    run = tmp_path / "budget"
    final = train_mod.train(compose([*common, "train.stop=budget", "train.progress=true"]), run)
    assert final["step"] > 10, (f"train.stop=budget stopped at step {final['step']}, max_steps: a machine faster than "
                               f"the budget assumed must train until its {BUDGET_MIN} min are spent")
    console = (run / "console.log").read_text()
    assert f"time budget of {BUDGET_MIN} min spent" in console, console[-500:]
    rates = lrs(run)
    lr = compose([*common]).optim.lr
    assert rates[1] == lr, f"the first step is at the schedule's start: lr {rates[1]}, peak {lr}"
    assert rates[max(rates)] < 0.25 * lr, (f"the schedule ends with the budget, not at max_steps: lr "
                                           f"{rates[max(rates)]} at the last step (peak {lr})")
    assert saved_seconds(run) >= 60 * BUDGET_MIN, "the checkpoint holds the run's clock (seconds trained)"
    bar = capsys.readouterr().err
    assert f"/{round(60 * BUDGET_MIN)} s of the time budget" in bar, f"the bar counts the budget's seconds: {bar[-300:]}"


def test_a_resume_on_a_budget_goes_on_from_the_time_already_spent(tmp_path, data_cache, capsys):
    common = [*FAST, f"data.cache_dir={data_cache}", "train.stop=budget"]
    run = tmp_path / "run"
    first = train_mod.train(compose([*common, f"train.max_minutes={BUDGET_MIN}"]), run)
    again = train_mod.train(compose([*common, f"train.max_minutes={BUDGET_MIN}"]), run)
    assert again["steps_this_session"] == 0, (
        f"the budget was spent before the resume, yet it trained {again['steps_this_session']} more steps: the "
        "run's clock restarted")
    capsys.readouterr()
    more = train_mod.train(compose([*common, f"train.max_minutes={2 * BUDGET_MIN}", "train.progress=true"]), run)
    total = round(120 * BUDGET_MIN)
    counts = [float(n) for n in re.findall(rf"(\d+)/{total} s of the time budget", capsys.readouterr().err)]
    assert counts and min(counts) >= 60 * BUDGET_MIN - 1 and max(counts) >= total - 2, (
        f"resumed with {60 * BUDGET_MIN:.0f} of {total} s spent, the bar counts the run's clock from there to the "
        f"end; it showed {counts}")
    assert more["step"] > first["step"], "a larger budget goes on"
    resumed = lrs(run)[first["step"] + 1]
    peak = compose(common).optim.lr
    assert resumed < 0.75 * peak, (
        f"resumed at half of a doubled budget, the cosine should be at about half its peak; it restarted at "
        f"{resumed} (peak {peak}): the run's clock was not carried")
