"""The plan report: how the step time a plan adds (or saves) is printed."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

import autockpt
from autockpt.cli.report import print_plan
from tests.helpers import MLPStack


@pytest.fixture(scope="module")
def plan() -> autockpt.Plan:
    model, inputs = MLPStack(32, 3, 0.0), (torch.randn(16, 32),)
    return autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=True)


def _step_time_line(plan: autockpt.Plan) -> str:
    out = io.StringIO()
    print_plan(Console(file=out, width=200, highlight=False), plan, budget_given=True)
    return next(line for line in out.getvalue().splitlines() if line.startswith("step time:"))


@pytest.mark.parametrize(
    ("extra_s", "shown"),
    [
        (0.25, "+250.00 ms predicted over 1000.00 ms (+25%)"),
        (-0.25, "-250.00 ms predicted over 1000.00 ms (-25%)"),
    ],
)
def test_the_step_time_a_plan_adds_or_saves_is_printed_with_its_sign(plan, extra_s, shown):
    line = _step_time_line(
        plan.model_copy(update={"predicted_extra_s": extra_s, "unplanned_step_s": 1.0})
    )
    assert shown in line, line
