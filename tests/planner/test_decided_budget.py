"""What planning decides once the plain step is measured: a budget given as a function of that
step's bytes (NOTE [A budget decided from the plain step]) and the threads training times at
(NOTE [Threads chosen from the plain step]). Each is decided in the one planning, and gives
the plan a number given up front would."""

from __future__ import annotations

import warnings

import pytest
import torch

import autockpt
from autockpt.errors import ConfigError, InfeasibleBudgetError
from autockpt.planner import pipeline
from autockpt.planner.measure.step_measurer import StepMeasurer
from tests.helpers import MLPStack
from tests.planner.test_loss_chunks import TinyLM, _batch, _minimum, smoothed_loss


def _counting_measurers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time planning measures a plain step (a StepMeasurer)."""
    made: list[int] = []
    original = StepMeasurer.__init__

    def counted(self: StepMeasurer, *args: object, **kwargs: object) -> None:
        made.append(1)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(StepMeasurer, "__init__", counted)
    return made


def test_half_of_the_plain_step_plans_once_as_its_number_does(
    fixed_time_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, inputs = MLPStack(64, 6, 0.0), (torch.randn(256, 64),)
    asked: list[int] = []

    def half(plain_bytes: int) -> int:
        asked.append(plain_bytes)
        return plain_bytes // 2

    made = _counting_measurers(monkeypatch)
    decided = autockpt.plan(model, inputs, half)
    assert len(made) == 1, "the plain step measured once: one planning"
    assert asked == [decided.unplanned_peak_bytes]
    given = autockpt.plan(model, inputs, decided.unplanned_peak_bytes // 2)
    assert decided.budget_bytes == given.budget_bytes == decided.unplanned_peak_bytes // 2
    assert decided.budget_reading == given.budget_reading
    assert decided.num_micro_batches == given.num_micro_batches
    assert [(s.recomputed, s.num_chunks) for s in decided.segments] == [
        (s.recomputed, s.num_chunks) for s in given.segments
    ]
    assert decided.predicted_peak_bytes == given.predicted_peak_bytes <= given.budget_bytes
    assert decided.minimum_feasible_bytes == given.minimum_feasible_bytes


def test_a_decided_budget_below_every_plan_is_refused_as_its_number_is(fixed_time_model):
    model, inputs = MLPStack(64, 6, 0.0), (torch.randn(256, 64),)
    with pytest.raises(InfeasibleBudgetError) as decided:
        autockpt.plan(model, inputs, lambda plain: "1KB")
    with pytest.raises(InfeasibleBudgetError) as given:
        autockpt.plan(model, inputs, "1KB")
    assert decided.value.minimum_bytes == given.value.minimum_bytes
    assert str(decided.value) == str(given.value)


def test_a_loss_in_chunks_plans_for_the_budget_the_whole_loss_decided() -> None:
    """The plan with the head and the loss in chunks has a smaller plain step of its own; the
    budget is the one decided from the plain step with the loss whole."""
    torch.manual_seed(0)
    model = TinyLM().train()
    inputs, targets = _batch()
    whole = _minimum(model, inputs, targets, smoothed_loss, allow_loss_chunks=False)
    chunked = _minimum(model, inputs, targets, smoothed_loss)
    budget = (chunked.minimum_bytes + whole.minimum_bytes) // 2
    asked: list[int] = []

    def decide(plain_bytes: int) -> int:
        asked.append(plain_bytes)
        return budget

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autockpt.plan(model, inputs, decide, loss_fn=smoothed_loss, example_targets=targets)
    assert plan.loss_chunks is not None and plan.budget_bytes == budget
    assert asked and set(asked) == {whole.unplanned_bytes}


def test_a_compiled_search_needs_its_budget_in_bytes() -> None:
    model, inputs = MLPStack(16, 2, 0.0), (torch.randn(8, 16),)
    with pytest.raises(ConfigError, match="compile=True needs the budget in bytes"):
        autockpt.plan(model, inputs, lambda plain: plain // 2, compile=True)


def test_threads_chosen_from_the_plain_step_are_the_ones_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real model is timed at the count the function returns for the plain step's bytes,
    not at the process's count when planning began."""
    model, inputs = MLPStack(64, 6, 0.0), (torch.randn(256, 64),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    timed_on: list[int] = []
    original = pipeline.Stopwatch.plain_step

    def record(self: pipeline.Stopwatch, pieces: int = 1) -> object:
        timed_on.append(self.threads)
        return original(self, pieces)

    monkeypatch.setattr(pipeline.Stopwatch, "plain_step", record)
    asked: list[int] = []

    def threads(plain_bytes: int) -> int:
        asked.append(plain_bytes)
        return 1

    outside = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        plan = autockpt.plan(model, inputs, int(unplanned * 0.6), cpu_threads=threads)
        assert torch.get_num_threads() == 2  # planning leaves the process's count alone
    finally:
        torch.set_num_threads(outside)
    assert asked == [plan.unplanned_peak_bytes]
    assert timed_on and set(timed_on) == {1}
    assert any("on 1 thread" in note for note in plan.notes), plan.notes
