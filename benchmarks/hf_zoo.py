"""Twenty-one Hugging Face classes (tests/hf/model_zoo.py) planned as ``transformers.Trainer``
runs them (``model(**batch)``, module-level segments, the batch not split): the path, the
unplanned peak, the minimum, the budget (half the peak, or the stated minimum x1.05 where half
cannot be met), the planned step's peak by the tests' own counter, and the planned step's time
against the plain one's, timed side by side, as a Markdown table.

    python benchmarks/hf_zoo.py [--only NAME,...] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the models live in the tests package

import torch  # noqa: E402

import autockpt  # noqa: E402
from autockpt import format_bytes  # noqa: E402
from autockpt.errors import InfeasibleBudgetError  # noqa: E402
from autockpt.hf.step import HuggingFaceStep, output_loss  # noqa: E402
from tests.hf.model_zoo import ZOO  # noqa: E402
from tests.oracle import measured_step  # noqa: E402

BATCH = 8
OPTIONS: dict[str, Any] = dict(
    loss_fn=output_loss, tracing="forward-hooks", allow_micro_batches=False, allow_chunks=False
)


def _step_s(step: torch.nn.Module, batch: dict[str, torch.Tensor], repeats: int) -> float:
    """The median seconds of a forward and backward of ``step`` on ``batch``."""
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        output_loss(step(batch)).backward()
        times.append(time.perf_counter() - started)
        step.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--repeats", type=int, default=7, help="timed steps of each")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print("| class | path | unplanned peak | minimum | budget | step peak | plan | step time |")
    print("|---|---|---|---|---|---|---|---|")
    for entry in ZOO:
        if args.only and entry.name not in args.only.split(","):
            continue
        torch.manual_seed(0)
        step = HuggingFaceStep(entry.make())
        batch = entry.batch(BATCH)
        plain = autockpt.plan(step, (batch,), 10**12, **OPTIONS)
        try:  # a budget of one byte: the refusal states the measured minimum
            autockpt.plan(step, (batch,), 1, **OPTIONS)
            raise AssertionError("a one-byte budget was met")
        except InfeasibleBudgetError as error:
            minimum = error.minimum_bytes
        budget = max(plain.unplanned_peak_bytes // 2, int(minimum * 1.05))
        plan = autockpt.plan(step, (batch,), budget, **OPTIONS)
        unplanned = plain.unplanned_peak_bytes
        floor = f"{format_bytes(minimum)} ({minimum / unplanned:.0%})"
        share = f"{budget / unplanned:.0%}"
        peak, _, _ = measured_step(step, (batch,), plan, loss_fn=output_loss)
        planned = autockpt.apply(step, plan)
        # Side by side, alternating, so that the machine's load weighs on both alike.
        plain_s, planned_s = [], []
        for _ in range(3):
            plain_s.append(_step_s(step, batch, args.repeats))
            planned_s.append(_step_s(planned, batch, args.repeats))
        ratio = statistics.median(planned_s) / statistics.median(plain_s)
        print(
            f"| {entry.name} | {plan.tracing} | {format_bytes(plain.unplanned_peak_bytes)} "
            f"| {floor} | {format_bytes(budget)} ({share}) "
            f"| {format_bytes(peak)} ({peak / budget:.0%}) "
            f"| {plan.num_recomputed} of {len(plan.segments)} recomputed | {ratio:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
