"""Shared test fixtures: a fixed torch seed for every test and the bundled sample file."""

from pathlib import Path

import pytest
import torch

SAMPLE_PARQUET = Path(__file__).resolve().parents[1] / "examples" / "data" / "sample.parquet"


@pytest.fixture(autouse=True)
def _seed_torch() -> None:
    torch.manual_seed(0)


@pytest.fixture
def sample_parquet() -> Path:
    """Path of examples/data/sample.parquet (2 symbols, 15 days, 16 features, seed 7)."""
    return SAMPLE_PARQUET
