"""The plan as a picture: ``autockpt plan --plot plan.png`` (needs matplotlib, ``autockpt[plot]``),
its memory per segment, its peak by part and the bytes alive across one step.

:func:`check_plot_available` runs before any planning, so a missing matplotlib is one error line
up front rather than a traceback after the work; :func:`plot_plan` draws and writes the PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autockpt.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from autockpt import Plan
    from autockpt.planner.plan_types import StepTimeline


#: The plan's picture a training run writes into its folder, where matplotlib is installed.
PLAN_PICTURE = "plan.png"


def plot_available() -> bool:
    """Whether matplotlib is installed (``autockpt[plot]``)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def check_plot_available(path: Path | None) -> None:
    """Raise a :class:`ConfigError` saying how to install matplotlib if ``--plot`` needs it."""
    if path is not None and not plot_available():
        raise ConfigError(
            f"--plot {path} needs matplotlib, which is not installed; pip install autockpt[plot]"
        )


def plot_plan(plan: Plan, path: Path, *, budget_given: bool) -> None:
    """:func:`plan_figure` written to ``path`` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # a file, no window: here, not in plan_figure, which a notebook shows
    import matplotlib.pyplot as plt

    from autockpt.training.setup.runs import write_atomic

    figure = plan_figure(plan, budget_given=budget_given)
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png", dpi=120))
    plt.close(figure)


def plan_figure(plan: Plan, *, budget_given: bool = True) -> Figure:
    """The plan as a matplotlib figure (for a notebook: ``plan_figure(plan)``).

    Top left: activation memory per segment, recomputed ones hatched. Top right: the predicted
    peak by part next to the peak with nothing recomputed, and the budget line. Below, where the
    plan has its timeline: bytes alive across one step, plain and planned, with the phases
    marked and the recomputed segments' backward shaded (:func:`draw_timeline`).
    """
    import matplotlib.pyplot as plt

    mib = 2**20
    names = [f"{i}: {s.name}" for i, s in enumerate(plan.segments)]
    top_height = max(3.5, 0.3 * len(names) + 1.5)
    figure = plt.figure(figsize=(13, top_height + (4.5 if plan.timeline else 0)))
    grid = figure.add_gridspec(
        2 if plan.timeline else 1,
        2,
        width_ratios=[3, 2],
        height_ratios=[top_height, 4.5] if plan.timeline else [1],
    )
    left, right = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
    if plan.timeline:
        draw_timeline(figure.add_subplot(grid[1, :]), plan, budget_given=budget_given)
    kept = [s.saved_bytes / mib if not s.recomputed else 0 for s in plan.segments]
    dropped = [s.saved_bytes / mib if s.recomputed else 0 for s in plan.segments]
    left.barh(names, kept, color="tab:green", label="kept for backward")
    left.barh(names, dropped, color="tab:orange", hatch="//", label="recomputed in backward")
    left.invert_yaxis()
    left.set_xlabel("activations (MiB)")
    left.set_title("activation memory per segment")
    left.legend(loc="lower right")

    right.bar(["nothing\nrecomputed"], [plan.unplanned_peak_bytes / mib], color="tab:gray")
    bottom = 0.0
    for name, size in plan.breakdown.model_dump().items():
        if size:
            label = name.removesuffix("_bytes").replace("_", " ")
            right.bar(["this plan"], [size / mib], bottom=bottom, label=label)
            bottom += size / mib
    top = max(plan.unplanned_peak_bytes, plan.predicted_peak_bytes)
    if budget_given:
        right.axhline(plan.budget_bytes / mib, color="red", linestyle="--", label="budget")
        top = max(top, plan.budget_bytes)
    right.set_ylim(0, 1.1 * top / mib)
    right.set_ylabel("MiB")
    right.set_title("predicted peak of one step")
    right.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.tight_layout()
    return figure


#: Each phase of the step: its colour behind the timeline and its share of the x axis (both
#: steps' phases are drawn over the same spans, so the plain and planned steps line up).
_PHASES = {
    "forward": ("#e8f0fb", 0.40),
    "loss": ("#fdf3e1", 0.05),
    "backward": ("#eaf6ea", 0.45),
    "optimizer": ("#f3e9f7", 0.10),
}


def _phase_positions(timeline: StepTimeline) -> list[float]:
    """Each point's x: its phase's span of the axis, its place within the phase."""
    starts, position = {}, 0.0
    for phase, (_, width) in _PHASES.items():
        starts[phase] = (position, width)
        position += width
    xs = [0.0] * len(timeline.bytes)
    for phase, first, last in timeline.phases:
        start, width = starts.get(phase, (0.0, 0.0))
        count = last - first + 1
        for i in range(first, last + 1):
            xs[i] = start + width * ((i - first + 0.5) / count)
    return xs


def draw_timeline(axes: Axes, plan: Plan, *, budget_given: bool) -> None:
    """Bytes alive across one step, as the device would show them (context and allocator
    slack added), plain and planned, each phase over the same span of the axis (its ops
    spread evenly in it): the phases as coloured bands, the planned step's backward through
    recomputed segments shaded, the budget as a line."""
    assert plan.timeline is not None
    mib = 2**20
    breakdown = plan.breakdown
    tensor_peak = plan.predicted_peak_bytes - breakdown.context_bytes - breakdown.headroom_bytes
    slack = breakdown.headroom_bytes / tensor_peak if tensor_peak > 0 else 0.0

    def shown(values: list[int]) -> list[float]:
        return [(b * (1 + slack) + breakdown.context_bytes) / mib for b in values]

    planned, plain = plan.timeline.planned, plan.timeline.plain
    position = 0.0
    for phase, (colour, width) in _PHASES.items():
        axes.axvspan(position, position + width, color=colour, zorder=0)
        axes.text(
            position + width / 2,
            1.01,
            phase,
            ha="center",
            va="bottom",
            fontsize="small",
            transform=axes.get_xaxis_transform(),
        )
        position += width
    planned_x = _phase_positions(planned)
    for number, (first, last) in enumerate(planned.recomputed):
        axes.axvspan(
            planned_x[first],
            planned_x[last],
            color="tab:orange",
            alpha=0.3,
            zorder=1,
            label="backward of recomputed segments" if number == 0 else None,
        )
    axes.plot(_phase_positions(plain), shown(plain.bytes), color="tab:gray", label="plain step")
    pieces = (
        f" (one of {plan.num_micro_batches} micro-batches)" if plan.num_micro_batches > 1 else ""
    )
    axes.plot(planned_x, shown(planned.bytes), color="tab:blue", label=f"planned step{pieces}")
    if budget_given:
        axes.axhline(plan.budget_bytes / mib, color="red", linestyle="--", label="budget")
    axes.set_xlim(0, 1)
    axes.set_xticks([])
    axes.set_ylim(bottom=0)
    axes.set_xlabel("one training step, phase by phase (operations spread evenly within each)")
    axes.set_ylabel("MiB alive")
    axes.set_title("memory across one step (the planner's measurement)", pad=16)
    axes.legend(fontsize="small", loc="upper right")
