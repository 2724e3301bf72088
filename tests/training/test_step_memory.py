"""Which training steps are measured (NOTE [Enforcing the budget]), and what a measured one does.

The meter is driven with a small MLP and its real plan: the schedule (the first steps after a
plan and after a change of shapes, then every Nth), no tracker at all without a budget. The
trainer test checks that a step measured only because the schedule sampled it still re-plans
when it is over the budget, and that the steps between samples are recorded as not measured.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

import autockpt
from autockpt.planner.core.memory_tracker import MemoryTracker
from autockpt.training.host.progress import JsonLinesReporter
from autockpt.training.loop import step_memory
from autockpt.training.loop.replanning import Replanner
from autockpt.training.loop.step_memory import STEPS_MEASURED_AFTER_CHANGE, StepMemoryMeter
from autockpt.training.loop.train import Trainer
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.checkpoint import RunState
from autockpt.training.setup.prepare import prepare
from autockpt.training.setup.runs import RunFolder
from tests.helpers import MLPStack
from tests.oracle import LiveBytes, starting_tensors
from tft.data.windows import Batch


class CountingTracker(MemoryTracker):
    """A MemoryTracker that counts how often one is made (one per measured CPU step)."""

    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).made += 1
        super().__init__(*args, **kwargs)


@pytest.fixture
def counting_tracker(monkeypatch: pytest.MonkeyPatch) -> type[CountingTracker]:
    monkeypatch.setattr(CountingTracker, "made", 0)
    monkeypatch.setattr(step_memory, "MemoryTracker", CountingTracker)
    return CountingTracker


@pytest.fixture(scope="module")
def mlp_and_plan() -> tuple[torch.nn.Module, autockpt.Plan]:
    model = MLPStack(16, 2, 0.0)
    return model, autockpt.plan(model, (torch.randn(4, 16),), 10**9, verify=False)


def make_meter(
    mlp_and_plan: tuple[torch.nn.Module, autockpt.Plan], *, budget_bytes: int | None
) -> StepMemoryMeter:
    model, plan = mlp_and_plan
    optimizer = torch.optim.AdamW(model.parameters())
    return StepMemoryMeter(
        torch.device("cpu"),
        model,
        optimizer,
        plan,
        parallelism="single",
        budget_bytes=budget_bytes,
        check_every=5,
    )


def run_steps(meter: StepMemoryMeter, steps: range, *, batch: int = 4) -> dict[int, int | None]:
    """Run ``steps`` (global step numbers) of the MLP through ``meter``; their peaks."""
    x, target = torch.randn(batch, 16), torch.randn(batch, 1)
    peaks = {}
    for step in steps:
        with meter.measure((x,), target, step=step) as reading:
            (meter.model(x) - target).square().mean().backward()
            meter.optimizer.step()
            meter.optimizer.zero_grad(set_to_none=True)
        assert reading.measured == (reading.peak_bytes is not None)
        peaks[step] = reading.peak_bytes
    return peaks


def measured(peaks: dict[int, int | None]) -> list[int]:
    return [step for step, peak in peaks.items() if peak is not None]


def test_first_steps_after_a_plan_or_a_shape_change_then_every_nth(
    mlp_and_plan: tuple[torch.nn.Module, autockpt.Plan], counting_tracker: type[CountingTracker]
) -> None:
    assert STEPS_MEASURED_AFTER_CHANGE == 2
    meter = make_meter(mlp_and_plan, budget_bytes=10**9)
    peaks = run_steps(meter, range(1, 13))
    assert measured(peaks) == [1, 2, 5, 10]
    assert all(peak is not None and peak > 0 for step, peak in peaks.items() if step in (1, 2))
    meter.use_plan(mlp_and_plan[1])  # a re-plan: its first steps are measured again
    assert measured(run_steps(meter, range(13, 17))) == [13, 14, 15]
    # A batch of another shape is measured as a new start, then the old shape again too.
    assert measured(run_steps(meter, range(17, 19), batch=3)) == [17, 18]
    assert measured(run_steps(meter, range(19, 23))) == [19, 20]
    assert counting_tracker.made == 4 + 3 + 2 + 2


def test_nothing_is_tracked_without_a_budget(
    mlp_and_plan: tuple[torch.nn.Module, autockpt.Plan], counting_tracker: type[CountingTracker]
) -> None:
    meter = make_meter(mlp_and_plan, budget_bytes=None)
    peaks = run_steps(meter, range(1, 12))
    meter.use_plan(mlp_and_plan[1])
    peaks |= run_steps(meter, range(12, 14), batch=3)
    assert measured(peaks) == []
    assert counting_tracker.made == 0
    assert not meter.measures_anything
    assert "no budget" in meter.description


@pytest.mark.slow
def test_a_sampled_step_over_the_budget_re_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TrainConfig(
        data=SAMPLE_DATA, preset="tiny", vram_budget="1GB", memory_check_every=4, batch_size=8
    )
    trainer = Trainer(
        prepare(config), RunFolder.create(tmp_path / "run"), JsonLinesReporter(io.StringIO())
    )
    budget = 10**9
    over_at = {4}  # not among the first steps after the plan: measured because it is sampled

    class OverAtSampledStep(MemoryTracker):
        def __exit__(self, *exc: object) -> None:
            super().__exit__(*exc)
            if trainer.state.global_step + 1 in over_at:
                self.peak_bytes = budget + 1

    replans: list[int] = []

    def record_replan(self: Replanner, budget_bytes: int, state: RunState, *, reason: str) -> None:
        replans.append(state.global_step)
        assert budget_bytes == int(budget * 0.9) and "over the budget" in reason
        self.new_plan(self.plan)

    monkeypatch.setattr(step_memory, "MemoryTracker", OverAtSampledStep)
    monkeypatch.setattr(Replanner, "replan", record_replan)
    batch: Batch = trainer.setup.data.train.batch(torch.arange(8).numpy())
    records = [trainer.train_step(batch, epoch=1, step_in_epoch=i) for i in range(1, 8)]
    assert [r["peak_measured"] for r in records] == [True, True, False, True, True, True, False]
    assert [r["peak_bytes"] is None for r in records] == [
        False,
        False,
        True,
        False,
        False,
        False,
        True,
    ]
    assert replans == [4]
    assert records[3]["peak_bytes"] == budget + 1


def test_a_trainer_step_under_a_budget_stays_under_it_by_an_independent_count(
    tmp_path: Path,
) -> None:
    # The trainer's own measurement is the planner's tracker; here the same steps are also
    # counted by the tests' counter (NOTE [Oracle counter]), which shares no code with it.
    base = {"data": SAMPLE_DATA, "preset": "tiny", "batch_size": 8, "max_steps_per_epoch": 3}
    unplanned = prepare(TrainConfig(**base)).plan
    budget = (unplanned.unplanned_peak_bytes + unplanned.minimum_feasible_bytes) // 2
    setup = prepare(TrainConfig(**base, vram_budget=str(budget), memory_check_every=1))
    assert setup.plan.num_recomputed > 0 or setup.plan.num_micro_batches > 1
    trainer = Trainer(setup, RunFolder.create(tmp_path / "run"), JsonLinesReporter(io.StringIO()))
    batches = setup.data.train.batch(range(8)), setup.data.train.batch(range(8, 16))
    trainer.train_step(batches[0], epoch=1, step_in_epoch=1)  # makes AdamW's state
    counter = LiveBytes()
    batch = batches[1]
    for tensor in starting_tensors(trainer.model, trainer.optimizer, [*batch]):
        counter.hold(tensor)
    with counter:
        record = trainer.train_step(batch, epoch=1, step_in_epoch=2)
    assert record["peak_measured"] and record["budget_bytes"] == budget
    assert counter.peak_bytes <= budget, f"counted {counter.peak_bytes} over {budget}"
    assert abs(counter.peak_bytes - record["peak_bytes"]) <= 0.02 * counter.peak_bytes
    assert trainer.state.num_replans == 0


@pytest.mark.parametrize(
    ("budget_bytes", "capped"), [(4 * 2**30, True), (100 * 2**30, False)], ids=["4GB", "100GB"]
)
def test_a_budget_smaller_than_the_card_caps_the_allocator(
    monkeypatch: pytest.MonkeyPatch, mlp_and_plan: Any, budget_bytes: int, capped: bool
) -> None:
    # NOTE [Enforcing the budget]: on an 80 GiB card a 4 GiB budget caps the allocator at the
    # budget less the context, so an overshoot runs out of memory there (the retry path).
    class Card:
        total_memory = 80 * 2**30

    caps: list[tuple[float, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Card())
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, d: caps.append((f, d))
    )
    model, plan = mlp_and_plan
    context = 300 * 2**20
    plan = plan.model_copy(
        update={"breakdown": plan.breakdown.model_copy(update={"context_bytes": context})}
    )
    device = torch.device("cuda", 0)
    meter = StepMemoryMeter(
        device,
        model,
        torch.optim.AdamW(model.parameters()),
        plan,
        parallelism="single",
        budget_bytes=budget_bytes,
        check_every=5,
    )
    if capped:
        assert caps == [((budget_bytes - context) / Card.total_memory, device)]
        assert meter.cap_fraction == caps[0][0]
    else:
        assert caps == [] and meter.cap_fraction is None


def test_on_a_card_the_meter_reads_the_context_after_its_first_step_and_the_largest_slack(
    monkeypatch: pytest.MonkeyPatch, mlp_and_plan: Any
) -> None:
    # NOTE [What the first card must measure]: stand-ins for torch.cuda's answers on an 80 GiB
    # card; two steps reserve 100 and 120 MiB over 80 and 100 MiB allocated, and the card
    # shows 700 MiB beyond the allocator's blocks after the first.
    gib, mib = 2**30, 2**20

    class Card:
        total_memory = 80 * gib

    peaks = iter([(100 * mib, 80 * mib), (120 * mib, 100 * mib)])
    current: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Card())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: None)
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda device=None: current.append(next(peaks))
    )
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: current[-1][0])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: current[-1][1])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 60 * mib)
    monkeypatch.setattr(
        torch.cuda,
        "mem_get_info",
        lambda device=None: (Card.total_memory - 760 * mib, Card.total_memory),
    )
    model, plan = mlp_and_plan
    meter = StepMemoryMeter(
        torch.device("cuda", 0),
        model,
        torch.optim.AdamW(model.parameters()),
        plan,
        parallelism="single",
        budget_bytes=4 * gib,
        check_every=5,
    )
    x = torch.randn(4, 16)
    for step in (1, 2):
        with meter.measure((x,), x, step=step) as reading:
            pass
        assert reading.peak_bytes == current[-1][0] + plan.breakdown.context_bytes
    assert meter.context_bytes == 700 * mib
    assert meter.slack == pytest.approx(0.25)  # the first step's 100 over 80, not 120 over 100
