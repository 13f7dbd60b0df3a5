"""Shared fixtures. Prepared token files are cached once per test session in a temporary folder."""

from __future__ import annotations

import pytest
import torch

# two cores: keep every test on the same thread count so timings and results are stable
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """A data cache folder shared by the tests that prepare the default corpora."""
    return tmp_path_factory.mktemp("data_cache")
