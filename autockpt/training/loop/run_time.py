"""The run's time said before its first step, and measured beside it at the end.

NOTE [The run's expected time]
A user who asks for a 20-step run to see that things work should know before it starts that
it takes a minute, not a quarter of an hour. After planning, the trainer adds up:

- the training steps: the steps the run has left (epochs x steps per epoch: early stopping can
  end it sooner) times the planned step's predicted seconds, the plain step's measured seconds
  plus what the plan adds (NOTE [Time model]);
- validation: its windows each epoch (NOTE [Scores in proportion]) at the scoring rate,
  measured before the run on four batches of those windows after one batch's warm-up (which
  pays for lazy set-up: the allocator's first blocks, a cache's first pages); timed on one
  batch, a scoring's fixed costs put the rate 20% under the whole test part's;
- the test windows, at the same rate;
- the data: read before planning, so its seconds are measured, not expected (a row cache's
  build is most of them for a large file).

The line is logged as an event (printed, and a JSON line under ``--quiet``), and the summary's
``run_time`` gives each item expected and measured. What it leaves out: planning again after a
step over the budget, checkpoints written at the end of each epoch, and the time the first
steps take to warm up; the measured side counts validation's and the test's whole waits, data
reads included.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import torch

from autockpt.training.forecasts.evaluate import evaluate
from autockpt.training.forecasts.scoring_sample import held_out_sample, validation_sample
from autockpt.training.host.progress import seconds_text
from autockpt.training.setup.prepare import Setup
from tft.data.windows import WindowDataset


@dataclass
class RunTimes:
    """Seconds of each part of a run (expected, or measured)."""

    data_s: float = 0.0
    train_s: float = 0.0
    validation_s: float = 0.0
    test_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.data_s + self.train_s + self.validation_s + self.test_s

    def record(self) -> dict[str, float]:
        return {**asdict(self), "total_s": self.total_s}


class RunClock:
    """The windows a run scores (NOTE [Scores in proportion]) and its times, expected before
    its first step and measured as it goes (NOTE [The run's expected time]).

    Args:
        setup: the run's setup.
        steps_per_epoch: training steps an epoch takes.
    """

    def __init__(self, setup: Setup, *, steps_per_epoch: int) -> None:
        config, data = setup.config, setup.data
        self.steps_per_epoch = steps_per_epoch
        self.validation = validation_sample(
            data.validation.run_counts,
            config.val_windows,
            windows_per_epoch=steps_per_epoch * setup.global_batch_size,
        )
        """The validation windows scored each epoch."""
        self.test = held_out_sample(data.test.run_counts, config.test_windows)
        """The test windows scored at the end."""
        self.expected = RunTimes(data_s=setup.data_s)
        self.measured = RunTimes(data_s=setup.data_s)

    def expect(self, setup: Setup, *, epochs: int, model: torch.nn.Module | None) -> str:
        """Measure the scoring rate (on ``model``; None: the setup's), keep the expected times
        of ``epochs`` more epochs and the test, and return the line that says them."""
        data = setup.data
        scored, positions = (
            (data.validation, self.validation.positions)
            if len(data.validation)
            else (data.test, self.test.positions)
        )
        rate = scoring_rate(setup, scored, positions, model=model)
        self.expected, line = expected_run_time(
            setup,
            steps=epochs * self.steps_per_epoch,
            validations=epochs if len(data.validation) else 0,
            validation_windows=self.validation.count,
            test_windows=self.test.count,
            windows_per_s=rate,
        )
        return line

    @contextmanager
    def timing(self, part: Literal["validation_s", "test_s"]) -> Iterator[None]:
        """Add the block's seconds to the measured ``part``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            setattr(self.measured, part, getattr(self.measured, part) + elapsed)

    def record(self, train_s: float) -> dict[str, Any]:
        """The summary's ``run_time``, the steps having taken ``train_s`` seconds."""
        self.measured.train_s = train_s
        return {"expected": self.expected.record(), "measured": self.measured.record()}


# Batches the scoring rate is timed on: a scoring's fixed costs (its reader's start, the model
# put in eval mode) weigh on one batch as they do not on the thousands of windows a part
# scores; one batch put the rate 20% under the whole test part's.
TIMED_BATCHES = 4


def scoring_rate(
    setup: Setup,
    dataset: WindowDataset,
    positions: np.ndarray | None,
    *,
    model: torch.nn.Module | None = None,
) -> float:
    """Windows scored a second on ``dataset``'s windows at ``positions`` (every window: None),
    timed on up to :data:`TIMED_BATCHES` global batches of them after one batch's warm-up
    (NOTE [The run's expected time]); 0.0 where there is no window to score."""
    size = setup.global_batch_size
    count = min(len(dataset) if positions is None else len(positions), size * TIMED_BATCHES)
    batch = np.arange(count) if positions is None else positions[:count]
    if len(batch) == 0:
        return 0.0
    evaluate(setup, dataset, positions=batch[:size], model=model)
    started = time.perf_counter()
    evaluate(setup, dataset, positions=batch, model=model)
    seconds = time.perf_counter() - started
    return len(batch) / max(seconds, 1e-9)


def expected_run_time(
    setup: Setup,
    *,
    steps: int,
    validations: int,
    validation_windows: int,
    test_windows: int,
    windows_per_s: float,
) -> tuple[RunTimes, str]:
    """The run's expected seconds by part, and the line that says them (NOTE [The run's
    expected time]): ``steps`` training steps, ``validations`` scorings of
    ``validation_windows``, one of ``test_windows``, at ``windows_per_s``."""
    plan = setup.plan
    step_s = plan.unplanned_step_s + plan.predicted_extra_s
    per_window = 1.0 / windows_per_s if windows_per_s > 0 else 0.0
    expected = RunTimes(
        data_s=setup.data_s,
        train_s=steps * step_s,
        validation_s=validations * validation_windows * per_window,
        test_s=test_windows * per_window,
    )
    rate = f" at {windows_per_s:,.0f} windows/s" if windows_per_s > 0 else ""
    line = (
        f"expected run time: about {seconds_text(expected.total_s)}: {steps:,} steps x "
        f"{step_s * 1000:.1f} ms predicted = {seconds_text(expected.train_s)}, validation "
        f"{validations} x {validation_windows:,} windows = {seconds_text(expected.validation_s)}, "
        f"test {test_windows:,} windows = {seconds_text(expected.test_s)}{rate}, the data "
        f"{seconds_text(setup.data_s)} (read)"
    )
    return expected, line
