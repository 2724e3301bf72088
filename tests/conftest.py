"""Shared test fixtures: a fixed torch seed for every test and the bundled sample file."""

from pathlib import Path

import pytest
import torch

SAMPLE_PARQUET = Path(__file__).resolve().parents[1] / "examples" / "data" / "sample.parquet"


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    # The tests' tensors are small; with two threads on a shared 2-core machine, OpenMP's
    # spin-waiting makes a tiny step up to 100x slower whenever anything else runs.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_torch() -> None:
    torch.manual_seed(0)


@pytest.fixture
def sample_parquet() -> Path:
    """Path of examples/data/sample.parquet (2 symbols, 15 days, 16 features, seed 7)."""
    return SAMPLE_PARQUET
