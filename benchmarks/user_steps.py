"""Training steps written the way users write them (tests/user_steps.py): each planned at its
share of the unplanned peak, with the path it took, the budget, the planned step's peak and
planning's own peak, both counted by the tests' independent counter (tests/oracle.py), as a
Markdown table.

    python benchmarks/user_steps.py [--only NAME,...]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the steps live in the tests package

from autockpt import format_bytes  # noqa: E402
from tests.oracle import measured_step  # noqa: E402
from tests.planner.test_user_steps import _planned  # noqa: E402
from tests.user_steps import STEPS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated step names")
    args = parser.parse_args()
    names = [n for n in STEPS if not args.only or n in args.only.split(",")]
    print("| step | path | budget | step peak | planning peak | plan |")
    print("|---|---|---|---|---|---|")
    for name in names:
        step = STEPS[name]
        if step.needs is not None and importlib.util.find_spec(step.needs) is None:
            print(f"| {name} | skipped: {step.needs} is not installed | | | | |")
            continue
        _, model, (inputs, targets), plan, planning_peak = _planned(name, True)
        peak, _, _ = measured_step(
            model,
            inputs,
            plan,
            loss_fn=step.loss_fn,
            targets=targets,
            loss_reduction=step.loss_reduction,
        )
        budget = plan.budget_bytes
        recomputed = sum(s.recomputed for s in plan.segments)
        chunked = sum(s.num_chunks > 1 for s in plan.segments)
        what = f"{recomputed} recomputed, {chunked} chunked, {plan.num_micro_batches} micro-batches"
        print(
            f"| {name} | {plan.tracing} | {format_bytes(budget)} ({step.budget_share:.0%}) "
            f"| {format_bytes(peak)} ({peak / budget:.0%}) "
            f"| {format_bytes(planning_peak)} ({planning_peak / budget:.0%}) | {what} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
