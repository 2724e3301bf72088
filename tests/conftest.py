"""Shared test fixtures: a fixed torch seed for every test, the bundled sample file, and a
fixed time model for tests that need the planner to choose the same plan every run; and, where
``AUTOCKPT_SKIPPED_TESTS`` names a file, the name of every test or module that skipped is added
to it (``.ci/run`` runs those again once the extras are installed)."""

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode

from autockpt.planner import pipeline
from autockpt.planner.timing.calibration import TimeModel

SAMPLE_PARQUET = Path(__file__).resolve().parents[1] / "examples" / "data" / "sample.parquet"

#: Rates of a 2-core CPU like the one the tests were written on (flops, bytes moved, per-op
#: overhead), fixed so that plans do not depend on how busy the machine is.
FIXED_TIME_MODEL = TimeModel(flops_per_s=6e10, bytes_per_s=3.5e9, op_overhead_s=1e-5)


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    # The tests' tensors are small; with two threads on a shared 2-core machine, OpenMP's
    # spin-waiting makes a tiny step up to 100x slower whenever anything else runs.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_torch() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_dispatch_mode_left_on() -> Iterator[None]:
    # A memory counter (a dispatch mode) a test enters and never leaves sees every op of every
    # test after it in the process; under it dynamo compiles nothing (a test counting compiled
    # regions failed 3 tests later, in a single-process run with the extras installed).
    # Left on, they are taken off here and the test is named in a warning (a warning, not a
    # failure: the slow tests have not all been run with this check yet).
    yield
    left = _get_current_dispatch_mode_stack()
    if left:
        while _get_current_dispatch_mode_stack():
            _pop_mode()
        warnings.warn(f"the test left dispatch modes on, taken off: {left}", stacklevel=1)


@pytest.fixture
def sample_parquet() -> Path:
    """Path of examples/data/sample.parquet (2 symbols, 15 days, 16 features, seed 7)."""
    return SAMPLE_PARQUET


@pytest.fixture
def fixed_time_model(monkeypatch: pytest.MonkeyPatch) -> TimeModel:
    """Plan with :data:`FIXED_TIME_MODEL` instead of timings taken on the busy machine.

    The planner picks the cheapest plan that fits, by rates it measures and by timing the real
    model, and both move with the load; a test that asserts which kind of plan a budget gets
    (chunks, micro-batches) would otherwise depend on what else runs.
    """
    monkeypatch.setattr(pipeline, "calibrate", lambda *_args, **_kwargs: FIXED_TIME_MODEL)
    monkeypatch.setattr(pipeline, "can_time", lambda *_args, **_kwargs: False)
    return FIXED_TIME_MODEL


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skipped(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skipped(report)


def _note_skipped(report: pytest.CollectReport | pytest.TestReport) -> None:
    # A module that skips at import (pytest.importorskip of an extra) reports it on collection;
    # a test that skips in its body or fixtures, on its run.
    path = os.environ.get("AUTOCKPT_SKIPPED_TESTS")
    # An expected failure reports as skipped too; it ran, and needs nothing more.
    if path and report.skipped and not hasattr(report, "wasxfail"):
        with open(path, "a", encoding="utf-8") as skipped:
            skipped.write(report.nodeid + "\n")
