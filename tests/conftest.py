"""Shared fixtures. Prepared token files are cached once per test session in a temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attention_lab.runtime.omp import bound_spinning

# before torch loads OpenMP: a bounded spin, as the entry points use (runtime/omp.py). `make test` runs a process a
# core (pytest-xdist), each with the two threads below, and libgomp's default spin would keep a core busy waiting for
# a thread the other process has descheduled: the suite took 14.5 min that way on a 2-core EPYC, 11.8 with this
bound_spinning()

import torch  # noqa: E402

# two cores: keep every test on the same thread count so timings and results are stable
torch.set_num_threads(min(2, torch.get_num_threads()))


# The longest files first. `make test` gives each pytest process a whole file at a time (--dist loadfile) in this
# order (--no-loadscope-reorder; xdist's own order puts the files with the most tests first, which left the GPU
# check's one 69-s test to start last while the other core idled). Seconds each file took on 2 idle cores of the AMD
# EPYC without native bf16 (2026-11-29): 271, 105, 96, 73, 72, 69, 60, 41, 36, 34, 34, 32. The others follow in
# the order pytest collects them.
LONGEST_FIRST = ("test_claims.py", "test_notebooks.py", "test_train.py", "test_viewer.py", "test_lab_page.py",
                 "test_gpu_check.py", "test_claims_findings.py", "test_attn_backend.py", "test_lab_server.py",
                 "test_model_switches.py", "test_export_attention.py", "test_bench.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its own order


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory):
    """dtype auto's stored measurements (attention_lab/runtime/decoding.py) go to a session folder, never to the
    user's ~/.cache: a test's stubbed timings must not decide how the user's sample.py decodes. Set in os.environ
    so the subprocesses the tests start (sample.py, train.py) inherit it."""
    from attention_lab.runtime.decoding import CACHE_DIR_ENV

    before = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("user_cache"))
    yield Path(os.environ[CACHE_DIR_ENV])
    if before is None:
        del os.environ[CACHE_DIR_ENV]
    else:
        os.environ[CACHE_DIR_ENV] = before


@pytest.fixture
def fresh_measurements(tmp_path, monkeypatch):
    """A fresh process's memory of the autos' measurements (attention_lab/runtime/decoding.py) and an empty
    measurement file of the test's own: a stub's timings kept in the session's file would decide later tests' runs.
    A test file takes it for all its tests with `pytestmark = pytest.mark.usefixtures("fresh_measurements")`."""
    from attention_lab.runtime import decoding

    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path / "cache"))
    decoding.forget_measurements()
    yield
    decoding.forget_measurements()


@pytest.fixture(autouse=True)
def determinism_as_it_was():
    """torch's deterministic-algorithms flags as they were before the test: a compiled run turns them on for its
    process (attention_lab/training/compiling.py compiled_for_training), and the tests after it must not inherit
    that."""
    from attention_lab.training.compiling import determinism, restore_determinism

    before = determinism()
    yield
    restore_determinism(before)


@pytest.fixture
def chunks_taken(monkeypatch) -> list:
    """The `rows` of every chunked loss the training step computes from now on (an empty list: the loss was taken
    whole, as model(x, y).loss)."""
    from attention_lab.training import loop

    chunks = []
    real = loop.chunked_next_token_loss
    monkeypatch.setattr(loop, "chunked_next_token_loss", lambda z, y, rows: chunks.append(rows) or real(z, y, rows))
    return chunks


@pytest.fixture
def measurement_took(monkeypatch):
    """A function (settler, seconds): train.py's `settler` (settle_attn_backend, settle_loss_chunk) decides as it
    does but reports that its measurement took `seconds`, the time the run must count in its budget."""
    import train as train_mod

    def took(name: str, seconds: float) -> None:
        real = getattr(train_mod, name)

        def settle(*args, **kwargs):
            return real(*args, **kwargs)[0], seconds

        monkeypatch.setattr(train_mod, name, settle)

    return took


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """A data cache folder shared by the tests that prepare the default corpora."""
    return tmp_path_factory.mktemp("data_cache")


@pytest.fixture
def whole_and_resumed(tmp_path):
    """A function (overrides, stop_at) -> (losses, losses): a run trained whole, and the same run stopped after
    stop_at steps and resumed, each as {step: logged training loss}. Exact resume means equal losses after stop_at."""
    import json

    import train as train_mod
    from attention_lab.training.config import compose

    def losses(run: Path) -> dict[int, float]:
        rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    def run(overrides: list[str], stop_at: int) -> tuple[dict[int, float], dict[int, float]]:
        whole, part = tmp_path / "whole", tmp_path / "part"
        train_mod.train(compose(overrides), whole)
        train_mod.train(compose(overrides + [f"train.max_steps={stop_at}"]), part)
        train_mod.train(compose(overrides), part)
        return losses(whole), losses(part)

    return run


@pytest.fixture
def torch_threads(monkeypatch) -> dict:
    """torch's thread count as a number the test reads and sets: {"n": the count (2 to begin), "set": every count
    the code set, in order}. Code that sets threads is seen doing it, and the real pool is never changed under the
    tests that run after."""
    import torch

    state = {"n": 2, "set": []}
    monkeypatch.setattr(torch, "get_num_threads", lambda: state["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (state["set"].append(n), state.update(n=n)))
    return state
