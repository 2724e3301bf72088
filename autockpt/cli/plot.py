"""The plan as a picture: ``autockpt plan --plot plan.png`` (needs matplotlib, ``autockpt[plot]``).

:func:`check_plot_available` runs before any planning, so a missing matplotlib is one error line
up front rather than a traceback after the work; :func:`plot_plan` draws and writes the PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autockpt.errors import ConfigError

if TYPE_CHECKING:
    from autockpt.planner.plan_types import Plan


def check_plot_available(path: Path | None) -> None:
    """Raise a :class:`ConfigError` saying how to install matplotlib if ``--plot`` needs it."""
    if path is None:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"--plot {path} needs matplotlib, which is not installed; pip install autockpt[plot]"
        ) from None


def plot_plan(plan: Plan, path: Path, *, budget_given: bool) -> None:
    """Left: activation memory per segment, recomputed ones hatched. Right: the predicted peak
    by part next to the peak with nothing recomputed, and the budget line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autockpt.training.runs import write_atomic

    mib = 2**20
    names = [f"{i}: {s.name}" for i, s in enumerate(plan.segments)]
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(13, max(3.5, 0.3 * len(names) + 1.5)), width_ratios=[3, 2]
    )
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
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png", dpi=120))
    plt.close(figure)
