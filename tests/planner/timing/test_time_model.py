"""Step times: the real model timed segment by segment, and the solver choosing by timed costs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import nn

import autockpt
from autockpt.planner import pipeline
from autockpt.planner.core.decisions import KEEP
from autockpt.planner.measure.fake_step import FakeTrainingState, profile_step
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.simulate.step_spec import StepSpec
from autockpt.planner.solve.whole_plan_timing import StepRunner
from autockpt.planner.timing import calibration
from autockpt.planner.timing.calibration import TimeModel
from autockpt.planner.timing.stopwatch import StepTimes, Stopwatch
from autockpt.planner.timing.time_model import EstimatedCosts, MeasuredCosts
from autockpt.planner.trace.fx_graph import TracedModel
from autockpt.planner.trace.module_chain import trace_or_find_modules
from tests.conftest import FIXED_TIME_MODEL
from tests.helpers import BatchNormNet, MLPStack
from tests.oracle import LiveBytes
from tests.planner.fake_times import mlp_with_fake_times

FORWARD_SLEEP_S = 0.1
BACKWARD_SLEEP_S = 0.15


class _Sleepy(torch.autograd.Function):
    """Identity that takes a known time in forward and in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        time.sleep(FORWARD_SLEEP_S)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(BACKWARD_SLEEP_S)
        return grad


@torch.fx.wrap
def sleepy(x: torch.Tensor) -> torch.Tensor:
    return _Sleepy.apply(x)


class SleepyNet(nn.Module):
    """Six linear layers, the fourth followed by an op that sleeps in forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = torch.relu(layer(x))  # (B, 64)
            if index == 3:
                x = sleepy(x)
        return x


#: What a process's first steps pay for mapping their memory: one slow step where that is
#: cheap, a few ever less slow ones where mapping a page is slow.
COLD_START_S = (0.3,)
SETTLING_S = (0.3, 0.15, 0.08)
_first_steps: dict[str, Any] = {"sleeps_s": COLD_START_S, "calls": 0}


@torch.fx.wrap
def slow_the_first_steps(x: torch.Tensor) -> torch.Tensor:
    """Sleeps ``_first_steps["sleeps_s"][i]`` on its ``i``-th call, then not at all."""
    sleeps_s, calls = _first_steps["sleeps_s"], _first_steps["calls"]
    if calls < len(sleeps_s):
        time.sleep(sleeps_s[calls])
    _first_steps["calls"] = calls + 1
    return x * 1.0


class ColdStartNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(32, 32)
        self.second = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(slow_the_first_steps(torch.relu(self.first(x))))  # (B, 32)


def _plain_step_with_first_steps(sleeps_s: tuple[float, ...]) -> StepTimes:
    watch = _stopwatch(ColdStartNet(), (torch.randn(16, 32),))
    _first_steps.update(sleeps_s=sleeps_s, calls=0)
    times = watch.plain_step()
    assert _first_steps["calls"] > len(sleeps_s), "the step ran past its slow first calls"
    return times


def _stopwatch(model: nn.Module, inputs: Sequence[torch.Tensor]) -> Stopwatch:
    traced = trace_or_find_modules(model, inputs)
    assert isinstance(traced, TracedModel)
    return Stopwatch(traced, StepSpec(model, inputs, (), None, "adamw"), threads=1)


def test_the_plain_step_is_timed_segment_by_segment():
    watch = _stopwatch(SleepyNet(), (torch.randn(32, 64),))
    slow = next(s.index for s in watch.traced.segments if any("sleepy" in n for n in s.node_names))
    assert len(watch.traced.segments) > 2, "the chain must have segments besides the slow one"
    times = watch.plain_step()
    assert times.forward_s[slow] >= FORWARD_SLEEP_S
    assert times.backward_s[slow] >= BACKWARD_SLEEP_S
    others = [i for i in range(len(times.forward_s)) if i != slow]
    # The other segments are a 32 x 64 linear each: far under the sleeps even on a busy host.
    assert max(times.forward_s[i] for i in others) < FORWARD_SLEEP_S / 2
    assert max(times.backward_s[i] for i in others) < BACKWARD_SLEEP_S / 2
    assert times.total_s >= FORWARD_SLEEP_S + BACKWARD_SLEEP_S


def test_the_plain_step_is_timed_warm_not_as_the_first_step_of_the_process():
    times = _plain_step_with_first_steps(COLD_START_S)
    assert times.total_s < COLD_START_S[-1] / 2


def test_the_plain_step_is_timed_again_until_it_stops_getting_faster():
    times = _plain_step_with_first_steps(SETTLING_S)
    # Settled, the step is two 16 x 32 linears: far under the last settling sleep.
    assert times.total_s < SETTLING_S[-1] / 2


def test_timing_leaves_parameters_gradients_and_buffers_as_they_were():
    model = BatchNormNet().train()
    inputs = (torch.randn(64, 48),)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    watch = _stopwatch(model, inputs)
    watch.plain_step()
    watch.plain_step(pieces=2)
    watch.optimizer_s()
    watch.region_piece_s(0, 64, ())
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    for key, value in before.items():
        torch.testing.assert_close(after[key], value, rtol=0, atol=0, msg=key)


def test_the_fastest_timed_chunk_count_is_chosen_and_predicted(monkeypatch):
    model, inputs, traced, fake = mlp_with_fake_times(monkeypatch)
    # Timed whole (the sums say the plan adds nothing, so it is timed whole before the search
    # stops), the plan takes what its pieces summed to: 0.2 s less than the plain step, which
    # takes as long in those rounds as the stopwatch's plain step.
    plain_s = 3.0 * len(traced.segments) + 0.5
    monkeypatch.setattr(
        StepRunner,
        "seconds",
        lambda self, d, n=None: lambda: plain_s if d is None else plain_s - 0.2,
    )
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    lowest = autockpt.plan(model, inputs, unplanned).minimum_feasible_bytes
    # Below every plain-recompute plan: only chunks (or micro-batches) fit, and 4 chunks do.
    plan = autockpt.plan(model, inputs, int(lowest * 0.85), allow_micro_batches=False)
    chunked = [s for s in plan.segments if s.num_chunks > 1]
    assert chunked, "the budget needs chunks"
    # Fewer chunks fit and cost less memory-wise, but 8 were timed fastest.
    assert {s.num_chunks for s in chunked} == {8}
    assert {samples for _, samples in fake.timed} > {256 // 8}, "other counts were timed too"
    assert plan.predicted_extra_s == pytest.approx(sum(s.recompute_s for s in chunked))
    assert all(s.recompute_s == pytest.approx(-0.1) for s in chunked)
    assert plan.unplanned_step_s == pytest.approx(3.0 * len(traced.segments) + 0.5 + 0.25)
    assert any("timed on the real model" in note for note in plan.notes)
    assert any("timed the plan whole" in note for note in plan.notes)


def test_a_fit_whose_sums_say_free_but_timed_whole_is_slow_does_not_end_the_search(monkeypatch):
    # The pieces of 8 chunks sum to less than keeping, but the whole chunked step is 2x the
    # plain one and micro-batches 1.05x: the search must go on to micro-batches and take them.
    # (The fake plain step: 3 s a segment, as the pieces say.)
    model, inputs, traced, fake = mlp_with_fake_times(monkeypatch)

    plain_s = 3.0 * len(traced.segments)

    def whole_s(self: StepRunner, decision: Any, samples: Any = None) -> Any:
        if decision is None:
            return lambda: plain_s
        return lambda: plain_s * (1.05 if decision.num_micro_batches > 1 else 2.0)

    monkeypatch.setattr(StepRunner, "seconds", whole_s)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    lowest = autockpt.plan(model, inputs, unplanned).minimum_feasible_bytes
    plan = autockpt.plan(model, inputs, int(lowest * 0.85))
    assert plan.num_micro_batches > 1, [s.reason for s in plan.segments]
    assert plan.predicted_extra_s == pytest.approx(0.05 * plain_s)


def test_a_budget_the_plain_step_meets_times_nothing(monkeypatch):
    # Recorded, not raised: the planner treats a timing that raises as one that failed and
    # goes on with estimates, so an exception here would pass unseen.
    timed: list[str] = []
    plain_step, region_piece_s = Stopwatch.plain_step, Stopwatch.region_piece_s

    def record_plain(self: Stopwatch, *args: Any) -> StepTimes:
        timed.append("plain step")
        return plain_step(self, *args)

    def record_piece(self: Stopwatch, *args: Any) -> float:
        timed.append("region piece")
        return region_piece_s(self, *args)

    monkeypatch.setattr(Stopwatch, "plain_step", record_plain)
    monkeypatch.setattr(Stopwatch, "region_piece_s", record_piece)
    model, inputs = MLPStack(64, 4, 0.1), (torch.randn(128, 64),)
    plan = autockpt.plan(model, inputs, 10**12)
    assert plan.num_recomputed == 0 and plan.predicted_extra_s == 0.0
    assert timed == []
    assert not any("tim" in note for note in plan.notes), plan.notes


def test_a_model_that_cannot_be_timed_is_planned_with_estimates(monkeypatch):
    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("no real step here")

    monkeypatch.setattr(Stopwatch, "plain_step", broken)
    model, inputs = MLPStack(64, 6, 0.1), (torch.randn(128, 64),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    # Recompute alone: on estimates, micro-batches can price lower than recompute or not,
    # as the machine's calibration goes; the plan must need work either way.
    only_recompute = dict(allow_micro_batches=False, allow_chunks=False)
    plan = autockpt.plan(model, inputs, int(unplanned * 0.7), **only_recompute)
    assert plan.num_recomputed > 0
    assert any(
        "timing the real model failed (RuntimeError: no real step here)" in n for n in plan.notes
    )
    assert plan.unplanned_step_s > 0.0


def test_measured_costs_wait_for_timing_then_replace_the_estimate():
    model, inputs = MLPStack(64, 4, 0.0), (torch.randn(64, 64),)
    traced = trace_or_find_modules(model, inputs)
    assert isinstance(traced, TracedModel)
    watch = _stopwatch(model, inputs)
    fallback = EstimatedCosts(TimeModel(1e10, 1e9, 1e-5), _kept_profile(traced, inputs))
    costs = MeasuredCosts(watch, traced.regions, 64, fallback=fallback)
    first, end = traced.regions[0]
    kept = watch.plain_step().kept_s(first, end)
    dims = (0,) * len(traced.region_segments[0].input_names)
    estimate = costs.recompute_s(first, end, chunks=4, input_batch_dims=dims)
    # Untimed, a chunked region is as cheap as it could possibly be: free.
    assert estimate.timing is not None and estimate.seconds == pytest.approx(-kept)
    assert costs.take([estimate.timing]) and not costs.take([estimate.timing])
    timed = costs.recompute_s(first, end, chunks=4, input_batch_dims=dims)
    assert timed.timing is None
    assert timed.seconds == pytest.approx(4 * watch.region_piece_s(0, 16, dims) - kept)
    split = costs.micro_batch_s(2)
    assert split.timing is not None and split.seconds == 0.0
    costs.take([split.timing])
    assert costs.micro_batch_s(2).seconds == pytest.approx(
        2 * watch.plain_step(2).total_s - watch.plain_step().total_s
    )


def _kept_profile(traced: TracedModel, inputs: Sequence[torch.Tensor]) -> StepProfile:
    state = FakeTrainingState(traced)
    return profile_step(state, inputs, [KEEP] * len(traced.segments))


def test_the_thread_count_outside_planning_is_the_one_timed(monkeypatch):
    seen: list[int] = []
    original = pipeline.Stopwatch.__init__

    def record(self: Stopwatch, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seen.append(self.threads)

    monkeypatch.setattr(pipeline.Stopwatch, "__init__", record)
    model, inputs = MLPStack(64, 6, 0.1), (torch.randn(128, 64),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    threads = torch.get_num_threads()
    seen.clear()
    try:
        torch.set_num_threads(2)
        autockpt.plan(model, inputs, int(unplanned * 0.7))
    finally:
        torch.set_num_threads(threads)
    assert seen and set(seen) == {2}


def test_a_region_that_cannot_be_timed_ends_planning_with_estimates(monkeypatch):
    # The plain step times, then a chunked region fails: every option the solver chose before
    # stays "to be timed", and a cost source that kept answering "timed something new" made
    # the search solve again forever.
    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("this region does not run alone")

    monkeypatch.setattr(Stopwatch, "region_piece_s", broken)
    model, inputs = MLPStack(64, 6, 0.1), (torch.randn(2048, 64),)
    traced = trace_or_find_modules(model, inputs)
    assert isinstance(traced, TracedModel)
    fallback = EstimatedCosts(TimeModel(1e10, 1e9, 1e-5), _kept_profile(traced, inputs))
    costs = MeasuredCosts(_stopwatch(model, inputs), traced.regions, 2048, fallback=fallback)
    first, end = traced.regions[0]
    dims = (0,) * len(traced.region_segments[0].input_names)
    wanted = costs.recompute_s(first, end, chunks=4, input_batch_dims=dims).timing
    assert wanted is not None
    # The failed timing says nothing new was timed, then and every time it is asked again.
    assert not costs.take([wanted]) and not costs.take([wanted])
    assert costs.failure.startswith("RuntimeError")
    unplanned = autockpt.plan(model, inputs, 10**12, optimizer=None).unplanned_peak_bytes
    plan = autockpt.plan(model, inputs, int(unplanned * 0.3), optimizer=None)
    assert plan.predicted_peak_bytes <= int(unplanned * 0.3)
    assert any("timing the real model failed (RuntimeError: this region" in n for n in plan.notes)


class _KeywordBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return x + scale * torch.tanh(self.linear(x))  # (B, 64)


class _KeywordNet(nn.Module):
    """Blocks called with a keyword argument the root's own keyword default feeds."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_KeywordBlock() for _ in range(6))

    def forward(self, x: torch.Tensor, *, scale: float = 0.5) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, scale=scale)
        return x


def test_a_region_fed_a_keyword_default_is_timed_with_that_default():
    model, inputs = _KeywordNet(), (torch.randn(2048, 64),)
    traced = trace_or_find_modules(model, inputs)
    assert isinstance(traced, TracedModel)
    assert any("scale" in s.input_names for s in traced.region_segments)
    watch = _stopwatch(model, inputs)
    for region, segment in enumerate(traced.region_segments):
        dims = tuple(0 if name != "scale" else None for name in segment.input_names)
        assert watch.region_piece_s(region, 256, dims) > 0.0
    unplanned = autockpt.plan(model, inputs, 10**12, optimizer=None).unplanned_peak_bytes
    plan = autockpt.plan(model, inputs, int(unplanned * 0.3), optimizer=None)
    assert not any("timing the real model failed" in note for note in plan.notes), plan.notes


@pytest.mark.parametrize("room_bytes", [2**16, 2**20, 8 * 2**20])
def test_calibration_stays_within_the_room_it_is_given(room_bytes):
    # Planning calibrates on the device the user says is full: its tensors must fit what the
    # budget leaves (on CUDA, 4096x4096 matrices and 64M-element vectors were ~0.7 GB).
    counter = LiveBytes()
    with counter:
        rates = calibration._calibrate.__wrapped__("cpu", None, room_bytes)
    assert counter.peak_bytes <= room_bytes
    assert counter.peak_bytes >= room_bytes // 2  # the room is used, not ignored
    assert rates.flops_per_s > 0 and rates.bytes_per_s > 0


def test_planning_calibrates_within_what_the_budget_leaves(monkeypatch):
    rooms: list[int | None] = []

    def record(device_type, device_index=None, *, max_bytes=None):
        rooms.append(max_bytes)
        return FIXED_TIME_MODEL

    monkeypatch.setattr(pipeline, "calibrate", record)
    model, x = MLPStack(width=128, depth=4), torch.randn(2048, 128)
    plan = autockpt.plan(model, (x,), 10**12)
    budget = int(0.6 * plan.unplanned_peak_bytes)
    autockpt.plan(model, (x,), budget)
    assert rooms[0] is not None and rooms[-1] is not None
    assert 0 < rooms[-1] <= budget // 2 < rooms[0]
