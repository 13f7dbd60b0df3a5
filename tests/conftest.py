"""Shared fixtures. Prepared token files are cached once per test session in a temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# two cores: keep every test on the same thread count so timings and results are stable
torch.set_num_threads(min(2, torch.get_num_threads()))


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


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """A data cache folder shared by the tests that prepare the default corpora."""
    return tmp_path_factory.mktemp("data_cache")
