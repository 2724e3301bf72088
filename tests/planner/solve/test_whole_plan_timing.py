"""The plans that fit, timed whole against the plain step (NOTE [Whole-plan timing])."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import autockpt
from autockpt.planner.solve.chain_decoding import Decision
from autockpt.planner.solve.whole_plan_timing import MAX_CANDIDATES, StepRunner
from tests.helpers import MLPStack
from tests.oracle import LiveBytes, measured_step, starting_tensors
from tests.planner.fake_times import mlp_with_fake_times


def _budget(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], share: float) -> int:
    """``share`` of the way from the lowest feasible peak to the unplanned one."""
    unplanned = autockpt.plan(model, inputs, 10**12)
    lowest = autockpt.plan(model, inputs, unplanned.unplanned_peak_bytes).minimum_feasible_bytes
    return int(lowest + share * (unplanned.unplanned_peak_bytes - lowest))


def _plan_timed(monkeypatch: pytest.MonkeyPatch, budget_share: float):
    """A plan at ``budget_share`` of the way from the lowest peak to the unplanned one whose
    whole-plan timings are made up:
    every plan timed later is faster than the ones before (none is the estimate's pick)."""
    timed: list[Decision | None] = []  # every timing's plans (each starts with the plain step)
    seconds_of: dict[int, float] = {}
    position = [0]

    def fake_seconds(
        self: StepRunner, decision: Decision | None, samples: int | None = None
    ) -> Callable[[], float]:
        position[0] = 0 if decision is None else position[0] + 1
        timed.append(decision)
        # Every candidate is more than WIDEN_PAST_SHARE slower than the plain step, so that a
        # stage's fit timed whole never ends the search; later ones are faster.
        value = plain_s * (1.0 if decision is None else 1.7 - 0.1 * len(timed))
        seconds_of[id(decision)] = value
        return lambda: value

    monkeypatch.setattr(StepRunner, "seconds", fake_seconds)
    # The stopwatch's runs are made up too: with real ones, which plans fit and are timed
    # moved with the machine's load.
    model, inputs, traced, _ = mlp_with_fake_times(monkeypatch)
    plain_s = 3.0 * len(traced.segments)  # the fake stopwatch's forward and backward
    budget = _budget(model, inputs, budget_share)
    return model, inputs, budget, autockpt.plan(model, inputs, budget), timed, seconds_of


def _key(decision: Decision) -> tuple[object, ...]:
    return (tuple(decision.spans), tuple(decision.actions), decision.num_micro_batches)


def test_the_fastest_plan_timed_whole_is_chosen_and_predicted(monkeypatch):
    model, inputs, budget, plan, timed, seconds_of = _plan_timed(monkeypatch, 0.5)
    assert timed[0] is None, "the plain step is timed with the candidates"
    candidates = [d for d in timed if d is not None]
    fastest = candidates[-1]
    assert plan.num_micro_batches == fastest.num_micro_batches
    assert [s.recomputed for s in plan.segments] == [a.recompute for a in fastest.actions]
    assert [s.num_chunks for s in plan.segments] == [a.num_chunks for a in fastest.actions]
    assert plan.predicted_extra_s == pytest.approx(seconds_of[id(fastest)] - seconds_of[id(None)])
    note = next(n for n in plan.notes if n.startswith("timed "))
    compared = re.match(r"timed (\d+) plans that fit whole", note)
    assert compared and 2 <= int(compared[1]) <= MAX_CANDIDATES, note
    # Every candidate fits: the chosen one, counted by the oracle, holds the budget.
    peak, _, _ = measured_step(model, inputs, plan)
    assert peak <= budget


def test_each_plan_is_timed_whole_once_a_planning(monkeypatch):
    """NOTE [Whole-plan timing], *once a planning*: a fit a stage timed whole is read from its
    rounds when a later stage or the final choice asks for it again, not run again."""
    _, _, _, plan, timed, _ = _plan_timed(monkeypatch, 0.5)
    keys = [_key(d) for d in timed if d is not None]
    assert len(keys) == len(set(keys)), f"a plan was timed whole {len(keys) - len(set(keys))} extra"
    note = next(n for n in plan.notes if n.startswith("timed "))
    # The stage's fit is among the final candidates: nothing shown if none was asked again.
    assert "timed earlier in this planning" in note, note


def test_a_budget_the_plain_step_meets_times_no_whole_plan(monkeypatch):
    _, _, _, plan, timed, _ = _plan_timed(monkeypatch, 2.0)
    assert plan.num_recomputed == 0 and plan.num_micro_batches == 1
    assert timed == []


def test_a_plan_is_judged_by_its_fastest_round_not_by_runs_after_other_plans(monkeypatch):
    """A plan's run right after another plan's can pay for what that one left (fresh pages on
    the CPU); training repeats one plan, so its fastest round is its step time."""
    position = [0]
    settled_fast: list[Decision] = []

    def fake_seconds(
        self: StepRunner, decision: Decision | None, samples: int | None = None
    ) -> Callable[[], float]:
        if decision is None:  # each timing starts with the plain step
            position[0] = 0
            return lambda: 1.0
        position[0] += 1
        if position[0] == 1:  # the first candidate: slow in two rounds of three, then 1.2 s
            settled_fast.append(decision)
            runs = itertools.cycle([4.5, 4.5, 1.2])
            return lambda: next(runs)
        return lambda: 1.5 + 0.1 * position[0]

    monkeypatch.setattr(StepRunner, "seconds", fake_seconds)
    model, inputs, _, _ = mlp_with_fake_times(monkeypatch)
    budget = _budget(model, inputs, 0.5)
    plan = autockpt.plan(model, inputs, budget)
    # Each timing's first plan settles at 1.2 s (a stage's, timed once, is read again later).
    chosen = [
        (d.num_micro_batches, [a.recompute for a in d.actions], [a.num_chunks for a in d.actions])
        for d in settled_fast
    ]
    planned = (
        plan.num_micro_batches,
        [s.recomputed for s in plan.segments],
        [s.num_chunks for s in plan.segments],
    )
    assert planned in chosen
    assert plan.predicted_extra_s == pytest.approx(0.2)


def test_a_plan_cut_finer_than_the_samples_timed_runs_at_the_whole_batch_within_the_budget(
    monkeypatch,
):
    """NOTE [Whole-plan timing], at the whole batch: the runs use 5 of 32 samples, too few for
    a plan's micro-batches and chunks, so the plans run at the whole batch as training runs
    them, the plain step on its line, and planning still holds the budget by a count that shares
    no code with the planner's."""
    torch.manual_seed(0)
    model, inputs = MLPStack(32, 6, 0.0), (torch.randn(32, 256, 32),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    budget = int(0.3 * unplanned)
    # Whichever plan the timed sums pick, it is taken as too fine for the samples timed.
    monkeypatch.setattr(StepRunner, "can_run", lambda self, decision: False)
    runs: list[tuple[Decision | None, int | None]] = []
    seconds = StepRunner.seconds

    def recorded(self: StepRunner, decision: Decision | None, samples: int | None = None):
        runs.append((decision, samples))
        return seconds(self, decision, samples)

    monkeypatch.setattr(StepRunner, "seconds", recorded)
    real_samples: list[int] = []  # the samples each real forward of the first block held
    model.blocks[0][0].register_forward_pre_hook(  # a Linear: fx traces around it
        lambda module, args: (
            real_samples.append(args[0].shape[0])
            if args[0].device.type == "cpu" and not isinstance(args[0], FakeTensor)
            else None
        )
    )
    counter = LiveBytes()
    for tensor in starting_tensors(model, torch.optim.AdamW(model.parameters()), list(inputs)):
        counter.hold(tensor)
    with counter:
        plan = autockpt.plan(model, inputs, budget)
    note = next(n for n in plan.notes if n.startswith("timed "))
    assert "at the whole batch (32 samples" in note, note
    assert {samples for decision, samples in runs if decision is not None} == {32}
    plain_counts = {samples for decision, samples in runs if decision is None}
    assert plain_counts and max(plain_counts) < 32
    # Each micro-batch of a plan run at the whole batch holds more samples than the runs
    # use: the plans ran on the caller's batch, not on the samples timed.
    assert max(real_samples) > max(plain_counts), real_samples
    # Timed at the whole batch, a plan that only adds work is not predicted faster than the
    # plain step's line (timed on the samples timed, it came out at a fraction of it).
    assert plan.predicted_extra_s > -0.1 * plan.unplanned_step_s
    assert counter.peak_bytes <= budget, f"planning held {counter.peak_bytes:,} over {budget:,}"
    assert plan.planning_peak_bytes >= 0.97 * counter.peak_bytes
    assert plan.fits


def test_a_plan_that_fits_at_the_whole_batch_is_timed_there_not_on_a_line_of_small_pieces(
    monkeypatch,
):
    """NOTE [Whole-plan timing]: a plan that fits the budget at the whole batch is timed there
    even where it could run on the samples timed, whose pieces are too small to stand for it
    (a line through 11 and 22 of 64 samples put a zoo model's 4 micro-batches 30% under their
    time at 64)."""
    torch.manual_seed(0)
    model, inputs = MLPStack(32, 6, 0.0), (torch.randn(32, 256, 32),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    runs: list[tuple[Decision | None, int | None]] = []
    seconds = StepRunner.seconds
    could_run: list[bool] = []
    can_run = StepRunner.can_run

    def recorded(self: StepRunner, decision: Decision | None, samples: int | None = None):
        runs.append((decision, samples))
        if decision is not None:
            could_run.append(can_run(self, decision))
        return seconds(self, decision, samples)

    monkeypatch.setattr(StepRunner, "seconds", recorded)
    # Every plan taken to fit at the whole batch, whichever the machine's timing picks (which
    # ones really fit there is the test above's); the choice of where to time them is this one's.
    monkeypatch.setattr(
        StepRunner,
        "fits_whole",
        lambda self, profile, usable_bytes: (
            self.stopwatch.batch_size < self.stopwatch.whole_batch_size
        ),
    )
    plan = autockpt.plan(model, inputs, int(0.5 * unplanned))
    note = next(n for n in plan.notes if n.startswith("timed "))
    assert "at the whole batch (32 samples" in note, note
    assert {samples for decision, samples in runs if decision is not None} == {32}
    assert any(could_run), "no candidate could have run on the samples timed: nothing shown"
    assert max(samples or 0 for decision, samples in runs if decision is None) < 32
