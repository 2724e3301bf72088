"""What a plan reports across one step: the timeline of bytes alive, plain and planned."""

from __future__ import annotations

import pytest
import torch

import autockpt
from autockpt.planner.plan_types import StepTimeline
from tests.helpers import MLPStack


@pytest.fixture(scope="module")
def plans() -> tuple[autockpt.Plan, autockpt.Plan]:
    torch.manual_seed(0)
    # Deep enough for more ops than a timeline keeps points: each point stands for several.
    model, inputs = MLPStack(64, 48, 0.0), (torch.randn(256, 64),)
    plain = autockpt.plan(model, inputs, 10**12)
    budget = int(0.75 * plain.unplanned_peak_bytes)
    return plain, autockpt.plan(model, inputs, budget, allow_micro_batches=False)


def _phases(timeline: StepTimeline) -> list[str]:
    return [name for name, _, _ in timeline.phases]


def test_the_timeline_peaks_where_the_plan_says_and_shades_its_recomputes(plans) -> None:
    _, plan = plans
    assert plan.num_recomputed > 0 and plan.timeline is not None
    planned, plain = plan.timeline.planned, plan.timeline.plain
    # Every point is the highest of its ops: the peaks survive the downsampling (on the CPU
    # there is no context or allocator slack to add).
    assert max(planned.bytes) == plan.predicted_peak_bytes
    assert max(plain.bytes) == plan.unplanned_peak_bytes
    assert _phases(planned) == ["forward", "loss", "backward", "optimizer"]
    assert _phases(plain) == ["forward", "loss", "backward", "optimizer"]
    assert 200 < len(planned.bytes) <= 400
    # The recomputed segments' backward is shaded, inside the backward, in the planned step only.
    (_, back_first, back_last) = planned.phases[2]
    assert planned.recomputed
    assert all(back_first <= a <= b <= back_last for a, b in planned.recomputed)
    assert not plain.recomputed
    # Saved with the plan.
    assert autockpt.Plan.model_validate_json(plan.model_dump_json()).timeline == plan.timeline


def test_a_plan_that_changes_nothing_has_the_plain_step_twice(plans) -> None:
    plain, _ = plans
    assert plain.timeline is not None
    assert plain.timeline.planned == plain.timeline.plain


def test_the_picture_draws_the_timeline_under_the_segments(plans, tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    from autockpt.cli.plot import plan_figure, plot_plan

    _, plan = plans
    figure = plan_figure(plan)
    titles = [axes.get_title() for axes in figure.axes]
    assert "memory across one step (the planner's measurement)" in titles
    timeline_axes = figure.axes[titles.index("memory across one step (the planner's measurement)")]
    labels = [line.get_label() for line in timeline_axes.get_lines()]
    assert {"plain step", "planned step", "budget"} <= set(labels)
    path = tmp_path / "plan.png"
    plot_plan(plan, path, budget_given=True)
    assert path.read_bytes()[:4] == b"\x89PNG"
