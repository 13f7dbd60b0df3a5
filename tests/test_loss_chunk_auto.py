"""train.loss_chunk=auto (attention_lab/training/loss_chunk.py): train.py turns it into 0 (the loss all at once) or
CHUNK rows at a time before the first step, from a measurement on a CPU (0 on a GPU), kept across processes in
decoding.py's measurement file; config.json records the number, and the training step gets it.

Nothing here is timed: the decision is driven by stubbed timings, and the one real measurement only runs,
unjudged. Speed itself lives in bench/step_profile.py (its "loss" row) and docs/benchmarks.md.
"""

from __future__ import annotations

import json

import pytest
import torch

import train as train_mod
from attention_lab.runtime import decoding
from attention_lab.runtime.distributed import DistInfo
from attention_lab.training import loss_chunk
from attention_lab.training.config import compose
from attention_lab.training.loss_chunk import (
    CHUNK,
    MARGIN,
    choose_loss_chunk,
    faster_chunk,
    settle_loss_chunk,
    time_loss,
)

CPU = torch.device("cpu")
CHUNKS_WIN, WHOLE_WINS = {"whole": 2.0, "chunked": 1.0}, {"whole": 1.0, "chunked": 2.0}
SHAPE = dict(n_embd=32, block_size=16, vocab=97)  # what choose_loss_chunk reads of the model


pytestmark = pytest.mark.usefixtures("fresh_measurements")  # conftest.py: a measurement file of its own


def stub(seconds: dict[str, float], calls: list | None = None):
    def measure(rows, n_embd, vocab, device, dtype):
        if calls is not None:
            calls.append((rows, n_embd, vocab, device, dtype))
        return dict(seconds)
    return measure


def auto(*overrides: str):
    return compose(["train.loss_chunk=auto", *overrides])


@pytest.mark.parametrize("seconds, want", [
    (CHUNKS_WIN, CHUNK),
    (WHOLE_WINS, 0),
    ({"whole": 1.0, "chunked": 1.0}, 0),  # a tie keeps the reference
    ({"whole": 1.0, "chunked": 1.0 - MARGIN / 2}, 0),  # inside the margin
    ({"whole": 1.0, "chunked": 1.0 - 2 * MARGIN}, CHUNK),
])
def test_chunks_are_picked_only_when_faster_than_the_whole_loss_by_the_margin(seconds, want):
    assert faster_chunk(seconds) == want


@pytest.mark.parametrize("seconds, want", [(CHUNKS_WIN, CHUNK), (WHOLE_WINS, 0)])
def test_auto_on_a_cpu_picks_what_its_measurement_says_at_the_runs_shape_and_dtype(seconds, want):
    calls = []
    choice = choose_loss_chunk(auto("train.batch_size=3"), **SHAPE, device=CPU, dtype=torch.bfloat16,
                               measure=stub(seconds, calls))
    assert choice.rows == want
    assert calls == [(3 * 16, 32, 97, CPU, torch.bfloat16)], "measured at another shape or dtype than the run's"
    assert "loss: auto picked" in choice.line and "2000.0 ms" in choice.line and "1000.0 ms" in choice.line


def test_a_kept_measurement_is_read_without_measuring_and_each_shape_has_its_own():
    calls = []
    for _ in range(2):
        assert choose_loss_chunk(auto(), **SHAPE, device=CPU, dtype=torch.float32,
                                 measure=stub(CHUNKS_WIN, calls)).rows == CHUNK
    decoding.forget_measurements()  # a later process: the file, not this one's memory
    again = choose_loss_chunk(auto(), **SHAPE, device=CPU, dtype=torch.float32, measure=stub(WHOLE_WINS, calls))
    assert len(calls) == 1 and again.rows == CHUNK and again.seconds == 0.0, "the kept measurement was not read"
    assert "as measured before" in again.line
    other = choose_loss_chunk(auto(), **{**SHAPE, "vocab": 98}, device=CPU, dtype=torch.float32,
                              measure=stub(WHOLE_WINS, calls))
    assert len(calls) == 2 and other.rows == 0, "another vocabulary must be measured on its own"
    in_bf16 = choose_loss_chunk(auto(), **SHAPE, device=CPU, dtype=torch.bfloat16, measure=stub(WHOLE_WINS, calls))
    assert len(calls) == 3 and in_bf16.rows == 0, "a bf16 run read float32's measurement"


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_gpu_takes_the_loss_whole_and_is_never_measured(device):
    def refuse(*args):
        raise AssertionError("measured on a GPU")
    choice = choose_loss_chunk(auto(), **SHAPE, device=torch.device(device), dtype=torch.bfloat16, measure=refuse)
    assert choice.rows == 0 and "nothing measured" in choice.line


@pytest.mark.parametrize("asked", [0, 37])
def test_a_number_is_kept_as_asked_unmeasured(asked):
    cfg = compose([f"train.loss_chunk={asked}"])
    settled, seconds = settle_loss_chunk(cfg, **SHAPE, device=CPU, dtype=torch.float32, info=DistInfo(),
                                         say=lambda line: pytest.fail(f"said {line!r}"))
    assert settled.train.loss_chunk == asked and seconds == 0.0


def test_the_real_measurement_times_both_ways_and_leaves_the_rng_alone():
    before = torch.random.get_rng_state()
    seconds = time_loss(rows=40, n_embd=16, vocab=50, device=CPU, dtype=torch.float32, rounds=2)
    assert set(seconds) == {"whole", "chunked"} and all(s > 0 for s in seconds.values())
    assert torch.equal(torch.random.get_rng_state(), before), "the measurement moved the run's random stream"


def test_the_cpu_preset_defaults_to_auto_and_the_tests_and_claims_presets_do_not():
    assert compose([]).train.loss_chunk == "auto"
    for preset in ("debug", "claims"):
        assert compose([f"experiment={preset}"]).train.loss_chunk == 0, f"{preset}'s numbers would follow a timing"


@pytest.mark.parametrize("bad", ["fast", "-1", "2.5", "true"])
def test_anything_but_auto_or_a_count_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"train\.loss_chunk=.* must be auto, 0"):
        compose([f"train.loss_chunk={bad}"])


@pytest.mark.parametrize("seconds, want", [(CHUNKS_WIN, CHUNK), (WHOLE_WINS, 0)])
def test_a_debug_run_with_auto_trains_its_loss_the_way_it_picked_and_records_it(tmp_path, data_cache, monkeypatch,
                                                                                  chunks_taken, seconds, want):
    calls = []
    monkeypatch.setattr(loss_chunk, "time_loss", stub(seconds, calls))
    run = tmp_path / "run"
    train_mod.train(debug_run(data_cache, "train.max_steps=4", "train.eval_interval=4"), run)
    assert len(calls) == 1, f"measured {len(calls)} times"
    assert json.loads((run / "config.json").read_text())["train"]["loss_chunk"] == want, "config.json records auto"
    assert set(chunks_taken) == ({want} if want else set()), (
        f"the step took its loss {chunks_taken or 'whole'}; auto picked {want}")
    console = (run / "console.log").read_text()
    assert "loss: auto picked" in console, console[:2000]


def test_the_measurement_counts_in_the_runs_time_budget(tmp_path, data_cache, monkeypatch, measurement_took):
    """A measurement said to have taken 2 minutes leaves nothing of a 1-minute budget: the run stops after its
    first step (the budget is checked after each), as with the attention backend's."""
    monkeypatch.setattr(loss_chunk, "time_loss", stub(WHOLE_WINS))
    measurement_took("settle_loss_chunk", 120.0)
    run = tmp_path / "run"
    train_mod.train(debug_run(data_cache, "train.max_steps=20", "train.max_minutes=1"), run)
    assert "time budget of 1.0 min spent: stopped at step 1" in (run / "console.log").read_text()


def test_an_auto_run_stopped_and_resumed_chunks_as_it_began_and_equals_the_uninterrupted_run(
        whole_and_resumed, data_cache, monkeypatch, chunks_taken):
    """On the machine that measured, the resumed half reads the kept measurement: it takes its loss the same way,
    and its losses are the uninterrupted run's to the last bit."""
    calls = []
    monkeypatch.setattr(loss_chunk, "time_loss", stub(CHUNKS_WIN, calls))
    overrides = ["experiment=debug", f"data.cache_dir={data_cache}", "train.loss_chunk=auto", "train.max_steps=12",
                 "optim.schedule=wsd", "optim.decay_steps=6", "train.log_interval=1", "train.head_roles=false",
                 "train.sample_tokens=0"]
    a, b = whole_and_resumed(overrides, stop_at=6)
    assert sorted(a) == list(range(1, 13)) and [a[s] for s in range(7, 13)] == [b[s] for s in range(7, 13)]
    assert len(calls) == 1, f"measured {len(calls)} times: the three runs share one machine's measurement"
    assert set(chunks_taken) == {CHUNK}, f"the runs took their loss {set(chunks_taken)}"


def debug_run(cache, *overrides: str):
    return compose(["experiment=debug", f"data.cache_dir={cache}", "train.loss_chunk=auto", "train.sample_tokens=0",
                    "train.head_roles=false", "train.tensorboard=false", *overrides])
