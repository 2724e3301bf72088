"""The plan report: how the step time a plan adds (or saves) and planning's own peak are
printed."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console

import autockpt
from autockpt.cli import main
from autockpt.plan_report import print_plan
from tests.helpers import MLPStack


@pytest.fixture(scope="module")
def plan() -> autockpt.Plan:
    model, inputs = MLPStack(32, 3, 0.0), (torch.randn(16, 32),)
    return autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=True)


def _line(plan: autockpt.Plan, start: str, *, width: int = 200) -> str:
    out = io.StringIO()
    print_plan(Console(file=out, width=width, highlight=False), plan, budget_given=True)
    return next(line for line in out.getvalue().splitlines() if line.startswith(start))


@pytest.mark.parametrize(
    ("extra_s", "shown"),
    [
        (0.25, "+250.00 ms predicted over 1000.00 ms (+25%)"),
        (-0.25, "-250.00 ms predicted over 1000.00 ms (-25%)"),
    ],
)
def test_the_step_time_a_plan_adds_or_saves_is_printed_with_its_sign(plan, extra_s, shown):
    line = _line(
        plan.model_copy(update={"predicted_extra_s": extra_s, "unplanned_step_s": 1.0}),
        "step time:",
    )
    assert shown in line, line


def test_planning_s_own_peak_is_printed_beside_the_step_s(plan):
    assert plan.planning_peak_bytes > 0
    line = _line(plan.model_copy(update={"planning_peak_bytes": 3 * 2**20}), "planning:")
    assert "held 3.00 MiB at its peak" in line, line


def test_the_library_gives_the_table_the_command_line_prints(plan):
    text = autockpt.report(plan)
    out = io.StringIO()
    print_plan(
        Console(file=out, width=120, color_system=None, soft_wrap=True), plan, budget_given=True
    )
    assert text == out.getvalue()
    assert "\x1b[" not in text  # plain text, for a notebook or a log
    for segment in plan.segments:
        assert segment.name in text
    assert "recomputed" in text and text.count("\n") > len(plan.segments)
    peak = next(line for line in text.splitlines() if line.startswith("peak:"))
    assert autockpt.format_bytes(plan.predicted_peak_bytes) in peak


def test_print_and_a_notebook_show_the_plan_as_the_table(plan, capsys):
    """NOTE [The plan as text]: ``print(plan)`` and IPython's display give the table; ``repr``
    keeps the fields."""
    print(plan)
    assert capsys.readouterr().out == autockpt.report(plan) + "\n"

    class Printer:  # what IPython hands ``_repr_pretty_``
        def __init__(self) -> None:
            self.parts: list[str] = []

        def text(self, value: str) -> None:
            self.parts.append(value)

    printer = Printer()
    plan._repr_pretty_(printer, False)
    assert "".join(printer.parts) == autockpt.report(plan)
    assert repr(plan).startswith("Plan(budget_bytes=")


def test_the_plan_line_says_what_its_minimum_covers(plan):
    """NOTE [One minimum]: a search stopped early by a cheap plan says its minimum is that of
    the options it examined."""
    whole = _line(plan.model_copy(update={"minimum_searched": "every option"}), "peak:")
    assert whole.endswith("(the lowest plan, measured: a budget of it plans)"), whole
    early = _line(plan.model_copy(update={"minimum_searched": "recompute alone"}), "peak:")
    assert "(the lowest plan with recompute alone, measured: a cheaper plan fitted" in early, early


def test_the_plan_line_and_a_refusal_name_one_minimum(
    sample_parquet, capsys: pytest.CaptureFixture[str]
) -> None:
    """NOTE [One minimum]: on the sample the chain model estimates 3.50 MiB and the lowest
    plan measures 3.46 MiB; the plan's line gives the measured one, as a refusal does."""
    args = ["plan", str(sample_parquet), "--quiet"]
    assert main([*args, "--vram-budget", "12MB"]) == 0
    plan = json.loads(capsys.readouterr().out.splitlines()[1])
    assert plan["minimum_searched"] == "every option"
    minimum = plan["minimum_feasible_bytes"]
    assert main([*args, "--vram-budget", str(minimum - 1024)]) == 2
    err = capsys.readouterr().err
    assert f"is below the minimum {autockpt.format_bytes(minimum)} " in err, err
    assert f"raise the budget to at least {autockpt.format_bytes(minimum)}" in err, err


def test_the_breakdown_says_whether_the_context_was_measured_and_the_slack_checked(monkeypatch):
    # NOTE [What the first card must measure]: a context measured on the card (a stand-in
    # for one here, planning on the CPU) is carried to the plan and said in its breakdown,
    # and so is the slack the check step measured.
    from autockpt.planner.core import step_budget

    model, inputs = MLPStack(32, 3, 0.0), (torch.randn(16, 32),)
    context = 300 * 2**20
    for measured in (True, False):
        monkeypatch.setattr(
            step_budget,
            "device_reserve",
            lambda device, m=measured: step_budget.DeviceReserve(context, 0.1, m),
        )
        planned = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=True)
        assert planned.breakdown.context_measured is measured
        line = _line(planned, "breakdown:", width=1000)
        named = "measured" if measured else "a stand-in"
        assert f"CUDA context ({named}) 300.00 MiB" in line, line
        assert "slack" not in line, line
    checked = planned.breakdown.model_copy(update={"measured_slack": 0.27})
    line = _line(planned.model_copy(update={"breakdown": checked}), "breakdown:", width=1000)
    assert "allocator headroom (the check step's slack 27%)" in line, line
