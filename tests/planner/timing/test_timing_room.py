"""Timing the real model on the samples whose step fits (NOTE [Timing at a batch that fits])."""

from __future__ import annotations

import pytest
import torch

import autockpt
from autockpt.planner.measure.scaled_step import ROOM_SHARE
from autockpt.planner.measure.step_measurer import StepMeasurer
from autockpt.planner.simulate.step_spec import StepSpec
from autockpt.planner.timing.stopwatch import StepTimes, Stopwatch
from autockpt.planner.timing.timing_room import MIN_TIMED_SAMPLES, TimingRoom, on_line
from autockpt.planner.trace.module_chain import trace_or_find_modules
from tests.helpers import MLPStack
from tests.oracle import LiveBytes, starting_tensors
from tests.zoo import ZOO


def test_a_time_is_read_off_the_line_through_two_points() -> None:
    # 1 s fixed, 0.5 s a sample: exact at any count.
    assert on_line(1.0 + 0.5 * 4, 4, 1.0 + 0.5 * 8, 8, 64) == pytest.approx(1.0 + 0.5 * 64)
    # A line whose fixed part would be negative: the time is taken in proportion.
    assert on_line(1.0, 4, 3.0, 8, 16) == pytest.approx(6.0)
    # A line falling with the samples (noise): the time is taken as all fixed.
    assert on_line(3.0, 4, 2.0, 8, 16) == pytest.approx(2.0)
    # One point only: in proportion.
    assert on_line(2.0, 8, 2.0, 8, 16) == pytest.approx(4.0)


def _mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return MLPStack(64, 6, 0.0), (torch.randn(2048, 64),)


def _counted_plan(model: torch.nn.Module, inputs: tuple[torch.Tensor], budget: int):
    counter = LiveBytes()
    for tensor in starting_tensors(model, torch.optim.AdamW(model.parameters()), list(inputs)):
        counter.hold(tensor)
    with counter:
        plan = autockpt.plan(model, inputs, budget)
    return plan, counter.peak_bytes


def test_planning_times_a_part_of_the_batch_and_holds_the_budget() -> None:
    model, inputs = _mlp()
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    budget = unplanned // 2
    plan, planning_peak = _counted_plan(model, inputs, budget)
    source = next(n for n in plan.notes if n.startswith("step times"))
    assert "timed on the real model at " in source and "of the batch's 2048 samples" in source
    samples = int(source.split(" at ", 1)[1].split(" of ")[0])
    assert MIN_TIMED_SAMPLES <= samples < 2048
    assert planning_peak <= budget, f"planning held {planning_peak} over {budget}"
    # The planner's own bound on what its runs held is not under the counter's count.
    assert plan.planning_peak_bytes >= 0.97 * planning_peak
    assert plan.fits


@pytest.mark.parametrize("name", ["functional_dropout", "lstm_batch_first", "multihead_attention"])
def test_a_zoo_model_is_timed_on_part_of_its_batch_under_the_budget(name: str) -> None:
    # Regions recomputed whole whose inputs' batch dimensions are unknown cannot be cut to the
    # samples timed: their cost is their forward's, and the rest is still timed.
    case = ZOO[name]
    torch.manual_seed(0)
    inputs, targets = case.batch(case.bench_batch_size)
    model = case.build()
    options = {"loss_fn": case.loss_fn, "example_targets": targets} if case.loss_fn else {}
    unplanned = autockpt.plan(model, inputs, 10**12, **options).unplanned_peak_bytes
    counter = LiveBytes()
    optimizer = torch.optim.AdamW(model.parameters())
    for tensor in starting_tensors(model, optimizer, [*inputs, *targets]):
        counter.hold(tensor)
    with counter:
        plan = autockpt.plan(model, inputs, unplanned // 2, **options)
    source = next(n for n in plan.notes if n.startswith("step times"))
    assert source.startswith("step times timed on the real model at "), source
    assert counter.peak_bytes <= plan.budget_bytes


def test_the_samples_timed_are_the_most_whose_step_fits_and_none_below_two() -> None:
    model, inputs = _mlp()
    traced = trace_or_find_modules(model, inputs)
    spec = StepSpec(model, inputs, (), None, "adamw")
    kept = StepMeasurer(traced, spec, room_bytes=10**12).kept
    fixed = kept.parameter_bytes + kept.input_bytes + kept.gradient_bytes
    whole = TimingRoom.within(traced, kept, 2048, 10**12)
    assert whole.samples == 2048 and whole.lower_samples == 2048 and not whole.untimed_reason()
    usable = kept.peak_bytes // 2
    half = TimingRoom.within(traced, kept, 2048, usable)
    assert MIN_TIMED_SAMPLES <= half.samples < 2048 and half.lower_samples == half.samples // 2
    assert half.step_bytes <= ROOM_SHARE * usable
    # One more sample would not fit.
    per_sample = (half.step_bytes - fixed) / half.samples
    assert half.step_bytes + per_sample > ROOM_SHARE * usable
    none = TimingRoom.within(traced, kept, 2048, int((fixed + per_sample) / ROOM_SHARE))
    assert none.samples == 0 and "not timed" in none.untimed_reason()


def test_a_step_past_the_samples_timed_is_read_off_a_line_not_scaled(monkeypatch) -> None:
    """Timed at a quarter of the batch, the plain step's fixed part must stay fixed: scaled in
    proportion it grows with the batch, and micro-batches come out free."""
    model, inputs = _mlp()
    fixed_s, per_sample_s = 0.4, 0.001

    def made_up(self: Stopwatch, step_inputs, targets, *, capture: bool) -> StepTimes:
        samples = step_inputs[0].shape[0]
        seconds = fixed_s + per_sample_s * samples
        return StepTimes((seconds / 2,), (seconds / 2,), 0.0)

    monkeypatch.setattr(Stopwatch, "_time_step", made_up)
    traced = trace_or_find_modules(model, inputs)
    room = TimingRoom(
        samples=512,
        batch_size=2048,
        step_bytes=0,
        optimizer_room_bytes=0,
        optimizer_state_share=0.0,
        held_bytes=0,
        trained_bytes=0,
    )
    watch = Stopwatch(traced, StepSpec(model, inputs, (), None, "adamw"), threads=1, room=room)
    assert watch.plain_step().total_s == pytest.approx(fixed_s + per_sample_s * 2048)
    four = watch.plain_step(4).total_s  # 512 samples: timed at its size
    assert four == pytest.approx(fixed_s + per_sample_s * 512)
    # Four micro-batches pay the fixed part three more times.
    assert 4 * four - watch.plain_step().total_s == pytest.approx(3 * fixed_s)
