"""The plans that fit, timed whole against the plain step (NOTE [Whole-plan timing])."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import autockpt
from autockpt.planner.chain import Decision
from autockpt.planner.whole_plans import MAX_CANDIDATES, StepRunner
from tests.helpers import MLPStack
from tests.oracle import measured_step


def _plan_timed(monkeypatch: pytest.MonkeyPatch, budget_share: float):
    """A plan at ``budget_share`` of the unplanned peak whose whole-plan timings are made up:
    every plan timed later is faster than the ones before (none is the estimate's pick)."""
    timed: list[Decision | None] = []
    seconds_of: dict[int, float] = {}

    def fake_seconds(self: StepRunner, decision: Decision | None) -> Callable[[], float]:
        timed.append(decision)
        value = 1.0 if decision is None else 3.0 - 0.5 * len(timed)
        seconds_of[id(decision)] = value
        return lambda: value

    monkeypatch.setattr(StepRunner, "seconds", fake_seconds)
    model, inputs = MLPStack(128, 6, 0.1), (torch.randn(256, 128),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    budget = int(budget_share * unplanned)
    return model, inputs, budget, autockpt.plan(model, inputs, budget), timed, seconds_of


def test_the_fastest_plan_timed_whole_is_chosen_and_predicted(monkeypatch):
    model, inputs, budget, plan, timed, seconds_of = _plan_timed(monkeypatch, 0.5)
    assert timed[0] is None, "the plain step is timed with the candidates"
    candidates = [d for d in timed if d is not None]
    assert 2 <= len(candidates) <= MAX_CANDIDATES
    fastest = candidates[-1]
    assert plan.num_micro_batches == fastest.num_micro_batches
    assert [s.recomputed for s in plan.segments] == [a.recompute for a in fastest.actions]
    assert [s.num_chunks for s in plan.segments] == [a.num_chunks for a in fastest.actions]
    assert plan.predicted_extra_s == pytest.approx(seconds_of[id(fastest)] - 1.0)
    note = next(n for n in plan.notes if n.startswith("timed "))
    assert f"timed {len(candidates)} plans that fit whole" in note
    # Every candidate fits: the chosen one, counted by the oracle, holds the budget.
    peak, _, _ = measured_step(model, inputs, plan)
    assert peak <= budget


def test_a_budget_the_plain_step_meets_times_no_whole_plan(monkeypatch):
    _, _, _, plan, timed, _ = _plan_timed(monkeypatch, 2.0)
    assert plan.num_recomputed == 0 and plan.num_micro_batches == 1
    assert timed == []
