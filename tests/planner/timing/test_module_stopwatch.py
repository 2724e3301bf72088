"""A module chain's plain step and plans timed whole on the real model (NOTE [Timing a module
chain])."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import autockpt
from autockpt.planner.solve.chain_decoding import Decision
from autockpt.planner.solve.whole_plan_timing import StepRunner
from autockpt.planner.timing.module_stopwatch import ModuleStopwatch
from tests.oracle import LiveBytes, measured_step, starting_tensors


class DictBlocks(nn.Module):
    """Residual MLP blocks on a dict batch (torch.fx's planner takes no dict), counting its
    calls in a Python attribute as user code counts steps."""

    def __init__(self, width: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.calls = 0

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        x = batch["x"]
        for block in self.blocks:
            x = x + block(x)
        return x


def _model_and_batch() -> tuple[DictBlocks, tuple[dict[str, torch.Tensor]]]:
    torch.manual_seed(0)
    return DictBlocks(), ({"x": torch.randn(32, 64, 32)},)


def test_a_module_chain_plan_is_the_fastest_timed_whole_against_its_timed_plain_step(
    monkeypatch,
):
    """The options of a module chain are estimates; the plans that fit are timed whole, and
    the plain step the plan reports is timed too, in the same rounds, not estimated."""
    model, inputs = _model_and_batch()
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    timed: list[Decision | None] = []  # every plan timed, in order (each timed once)
    seconds_of: dict[int, float] = {}

    def fake_seconds(
        self: StepRunner, decision: Decision | None, samples: int | None = None
    ) -> Callable[[], float]:
        assert isinstance(self.stopwatch, ModuleStopwatch)
        if decision not in timed:
            timed.append(decision)
        # Later plans are faster; a plan takes as long at every sample count it runs at.
        value = 2.0 if decision is None else 3.0 - 0.1 * timed.index(decision)
        seconds_of[id(decision)] = value
        return lambda: value

    monkeypatch.setattr(StepRunner, "seconds", fake_seconds)
    # Timed apart from the rounds, the plain step came out faster: the plan reports the one
    # of the rounds its own time comes from (NOTE [Whole-plan timing], *Choice*).
    monkeypatch.setattr(ModuleStopwatch, "plain_step_s", lambda self: 1.5)
    monkeypatch.setattr(ModuleStopwatch, "optimizer_s", lambda self: 0.25)
    plan = autockpt.plan(model, inputs, unplanned // 2)
    assert plan.tracing == "forward-hooks"
    assert plan.unplanned_step_s == pytest.approx(2.25)
    candidates = [d for d in timed if d is not None]
    assert candidates, "the plans that fit were not timed whole"
    fastest = candidates[-1]
    assert plan.num_micro_batches == fastest.num_micro_batches
    assert [s.recomputed for s in plan.segments] == [a.recompute for a in fastest.actions]
    assert plan.predicted_extra_s == pytest.approx(seconds_of[id(fastest)] - 2.0)
    assert any(n.startswith("timed ") and "whole" in n for n in plan.notes), plan.notes
    assert any("plain step and of whole plans timed on the real model" in n for n in plan.notes)


def test_a_module_chain_is_timed_on_a_copy_within_the_budget():
    """Timing runs the real model, on a copy: the caller's Python state is not written, its
    parameters get no ``.grad``; and planning holds the budget by a count that shares no code
    with the planner's, which the plan's reported planning peak is not under."""
    model, inputs = _model_and_batch()
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    budget = unplanned // 2
    real_samples: list[int] = []  # the samples each real forward of the first block held
    model.blocks[0][0].register_forward_pre_hook(
        lambda module, args: (
            real_samples.append(args[0].shape[0])
            if not isinstance(args[0], FakeTensor) and args[0].device.type == "cpu"
            else None
        )
    )
    counter = LiveBytes()
    optimizer = torch.optim.AdamW(model.parameters())
    for tensor in starting_tensors(model, optimizer, [inputs[0]["x"]]):
        counter.hold(tensor)
    calls = model.calls
    with counter:
        plan = autockpt.plan(model, inputs, budget)
    assert plan.tracing == "forward-hooks"
    assert real_samples, "the real model was not timed"
    assert model.calls == calls, "timing ran the caller's model, not a copy"
    assert all(p.grad is None for p in model.parameters())
    assert counter.peak_bytes <= budget, f"planning held {counter.peak_bytes:,} over {budget:,}"
    assert plan.planning_peak_bytes >= 0.97 * counter.peak_bytes
    peak, _, _ = measured_step(model, inputs, plan)
    assert peak <= budget


def test_a_plan_that_fails_to_run_whole_leaves_the_sums_and_says_so(monkeypatch):
    """A model that refuses a piece of its batch (here: every plan, made to raise) is not a
    planning error: the solver's sums stand, the notes say why, and the plan still fits."""
    model, inputs = _model_and_batch()
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes

    def refused(
        self: StepRunner, decision: Decision | None, samples: int | None = None
    ) -> Callable[[], float]:
        if decision is not None:
            raise RuntimeError("expected 32 samples, got 13\nsecond line")
        return lambda: 1.0

    monkeypatch.setattr(StepRunner, "seconds", refused)
    plan = autockpt.plan(model, inputs, unplanned // 2)
    failed = [n for n in plan.notes if n.startswith("timing the plans whole failed")]
    assert failed == [
        "timing the plans whole failed (RuntimeError: expected 32 samples, got 13): the "
        "solver's sums stand for the plan's step time"
    ], plan.notes
    assert not any(n.startswith("timed ") for n in plan.notes)
    peak, _, _ = measured_step(model, inputs, plan)
    assert plan.fits and peak <= unplanned // 2
