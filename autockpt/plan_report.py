"""The plan report: the memory plan as a table with a few lines of totals under it.

:func:`print_plan` shows what the planner chose, one row per segment: its activation memory
(with a bar against the largest), whether it is kept or recomputed (and in how many chunks), and
what recomputing it costs. Under the table: the budget, the predicted peak and its breakdown, the
step time the plan adds (signed: a plan can be faster than the plain step; a note says whether
the times were timed on the real model or estimated), micro-batching and the planner's notes.
The command line's ``plan``, ``train`` and ``demo`` print it after the columns table
(:mod:`autockpt.cli.report`); the Lightning callback prints it when it has planned.

On a terminal rich fits the table to the window (folding long segment names); in a file or a
pipe the console from :func:`autockpt.cli.console.make_console` is wide enough that every column
is printed in full and every row on one line.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from autockpt.planner.core.units import format_bytes
from autockpt.planner.plan_types import PeakBreakdown, Plan, read_plans_with


def _bar(fraction: float, width: int = 12) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "·" * (width - filled)


def report(plan: Plan, *, width: int = 120) -> str:
    """The plan as ``autockpt plan`` prints it (the segment table, the peak, its breakdown,
    the step time and the notes), as plain text ``width`` characters wide.

    Example::

        plan = autockpt.plan(model, (x,), "4GB")
        print(autockpt.report(plan))
    """
    text = io.StringIO()
    console = Console(file=text, width=width, color_system=None, soft_wrap=True)
    print_plan(console, plan, budget_given=True)
    return text.getvalue()


read_plans_with(report)  # print(plan) gives this table (NOTE [The plan as text])


def print_plan(console: Console, plan: Plan, *, budget_given: bool) -> None:
    """The plan as a table: per-segment memory bars, actions, the peak and its breakdown."""
    console.print(_segment_table(plan))
    _print_summary(console, plan, budget_given=budget_given)


def _segment_table(plan: Plan) -> Table:
    """One row per segment: what it keeps, as bytes and a bar, and what the plan does."""
    largest = max((s.saved_bytes for s in plan.segments), default=1) or 1
    ranks = (
        f"batch {plan.batch_size} per rank, {plan.world_size} ranks {plan.parallelism}"
        if plan.world_size > 1
        else f"batch {plan.batch_size}"
    )
    table = Table(title=f"memory plan ({plan.strategy}, {ranks}, {plan.device})")
    table.add_column("#", justify="right")
    table.add_column("segment", overflow="fold", min_width=20)
    table.add_column("activations", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("plan")
    table.add_column("recompute", justify="right", no_wrap=True)
    compiled = plan.compile_fraction is not None
    if compiled:
        # Each segment's activation memory budget: its own graph's, or the step's.
        table.add_column("compile", justify="right", no_wrap=True)
    for index, segment in enumerate(plan.segments):
        if segment.compile_fraction is not None:
            action = "[cyan]own graph, compile recomputes[/cyan]"
        elif not segment.recomputed:
            action = "[green]kept[/green]"
        elif segment.num_chunks > 1:
            action = f"[yellow]recomputed, {segment.num_chunks} chunks[/yellow]"
        else:
            action = "[yellow]recomputed[/yellow]"
        row = [
            str(index),
            segment.name,
            format_bytes(segment.saved_bytes),
            _bar(segment.saved_bytes / largest),
            action,
            f"{segment.recompute_s * 1000:.2f} ms" if segment.recomputed else "-",
        ]
        if compiled:
            own = segment.compile_fraction
            row.append(f"{own if own is not None else plan.compile_fraction:g}")
        table.add_row(*row)
    return table


def _context_label(breakdown: PeakBreakdown) -> str:
    """The context's name in the breakdown, with where its size came from (NOTE [What the
    first card must measure])."""
    return "CUDA context (" + ("measured" if breakdown.context_measured else "a stand-in") + ")"


def _headroom_label(breakdown: PeakBreakdown) -> str:
    """The allocator's share in the breakdown, with the slack the check step measured."""
    slack = breakdown.measured_slack
    return "allocator headroom" + (
        "" if slack is None else f" (the check step's slack {slack:.0%})"
    )


def _print_summary(console: Console, plan: Plan, *, budget_given: bool) -> None:
    """The lines under the table: budget, ranks, peak, planning, breakdown, time, notes."""
    breakdown = plan.breakdown
    parts = [
        ("parameters", breakdown.parameters_bytes),
        ("gradients", breakdown.gradients_bytes),
        ("optimizer state", breakdown.optimizer_state_bytes),
        ("batch (inputs, targets)", breakdown.inputs_bytes),
        ("activations", breakdown.activations_bytes),
        ("transient", breakdown.transient_bytes),
        ("gathered by FSDP", breakdown.gathered_bytes),
        (_context_label(breakdown), breakdown.context_bytes),
        (_headroom_label(breakdown), breakdown.headroom_bytes),
    ]
    per_rank = " per rank" if plan.world_size > 1 else ""
    console.print(
        "budget:        " + (plan.budget_reading + per_rank if budget_given else _no_budget_text())
    )
    if plan.world_size > 1:
        held = "its shards of " if plan.parallelism == "fsdp" else "all of "
        console.print(
            f"ranks:         {plan.world_size} ({plan.parallelism}); each holds {held}the "
            "parameters, gradients and optimizer state; the peak and breakdown are one rank's"
        )
    if plan.batch_shapes is not None:
        console.print(
            f"shapes:        made for {plan.batch_shapes.text()}; holds for every batch no "
            "larger along any dimension"
        )
    verdict = "[green]fits[/green]" if plan.fits else "[red]does not fit[/red]"
    against = f" of budget {format_bytes(plan.budget_bytes)} ({verdict})" if budget_given else ""
    if plan.compile_fraction is None:
        console.print(
            f"peak:          {format_bytes(plan.predicted_peak_bytes)} predicted{against}; "
            f"{format_bytes(plan.unplanned_peak_bytes)} with nothing recomputed; minimum about "
            f"{format_bytes(plan.minimum_feasible_bytes)} {_minimum_scope(plan)}"
        )
    else:
        regions = sum(segment.compile_fraction is not None for segment in plan.segments)
        console.print(
            f"compiled:      torch.compile (inductor) at activation memory budget "
            f"{plan.compile_fraction:g}"
            + (f", {regions} segments in graphs of their own at theirs" if regions else "")
            + "; the peak and step times are of compiled steps, measured (the allocator's "
            "count) and timed"
        )
        console.print(
            f"peak:          {format_bytes(plan.predicted_peak_bytes)} measured{against}; "
            f"{format_bytes(plan.unplanned_peak_bytes)} plain compiled; lowest compiled step "
            f"tried {format_bytes(plan.minimum_feasible_bytes)}"
        )
    if plan.planning_peak_bytes:
        console.print(
            f"planning:      held {format_bytes(plan.planning_peak_bytes)} at its peak, model "
            f"and batch included, in {plan.planning_s:.1f} s"
        )
    console.print(
        "breakdown:     "
        + per_rank.strip()
        + (": " if per_rank else "")
        + ", ".join(f"{name} {format_bytes(size)}" for name, size in parts if size)
    )
    # Signed: a plan measured faster than the plain step (smaller chunks can be) saves time.
    overhead = plan.predicted_extra_s / plan.unplanned_step_s if plan.unplanned_step_s else 0.0
    selective = sum(s.selective for s in plan.segments)
    console.print(
        f"step time:     {plan.predicted_extra_s * 1000:+.2f} ms predicted over "
        f"{plan.unplanned_step_s * 1000:.2f} ms ({overhead:+.0%}); "
        f"{plan.num_recomputed} of {len(plan.segments)} segments recomputed"
        + (f" ({selective} only their cheap ops)" if selective else "")
    )
    if plan.num_micro_batches > 1:
        console.print(
            f"micro-batches: {plan.num_micro_batches} of at most "
            f"{-(-plan.batch_size // plan.num_micro_batches)} samples, gradients accumulated"
        )
    if (chunks := plan.loss_chunks) is not None:
        console.print(
            f"loss chunks:   {chunks.head} and the loss in {chunks.num_chunks} chunks of "
            f"positions (dim {chunks.dim}, {chunks.reduction}), each chunk's gradients taken in forward"
        )
    for note in plan.notes:
        console.print(f"note:          {note}")


def _no_budget_text() -> str:
    return "none given: on the CPU training is not limited (pass --vram-budget to plan for one)"


def _minimum_scope(plan: Plan) -> str:
    """What the minimum on the plan's line covers (NOTE [One minimum])."""
    if plan.minimum_searched == "every option":
        return "(the lowest plan, measured: a budget of it plans)"
    return (
        f"(the lowest plan with {plan.minimum_searched}, measured: a cheaper plan fitted, so "
        "a lower budget searches further and may plan below it)"
    )


def print_run_plan(console: Console, plan: Plan, num_plans: int, planning_s: float) -> None:
    """What a callback shows of a run's plans (NOTE [Plans that follow the shapes of a run]):
    the first plan's table, then a line for each plan made for a new shape."""
    if num_plans == 1:
        print_plan(console, plan, budget_given=True)
        return
    shapes = plan.batch_shapes.text() if plan.batch_shapes is not None else "a new shape"
    console.print(
        f"autockpt: plan {num_plans} for {shapes}: peak "
        f"{format_bytes(plan.predicted_peak_bytes)} of {plan.budget_text}, "
        f"{plan.num_recomputed} recomputed ({planning_s:.1f} s of planning so far)"
    )
