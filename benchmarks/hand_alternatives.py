"""The plan against what a user would do by hand, side by side (issue 19's first table).

For each zoo model at its benchmark batch and at budgets of 50% and 25% of its unplanned peak,
every way to fit is measured on the same model and batch:

* ``autockpt``: the plan for the budget;
* ``ckpt all``: ``torch.utils.checkpoint`` (non-reentrant) around every block;
* ``ckpt every other``: around blocks 0, 2, 4, ...;
* ``micro k``: the batch in k equal pieces with gradient accumulation, k = 2, 4, 8, 16
  (only where the step is batch-separable and the inputs are tensors).

The blocks are the items of the model's largest ``nn.ModuleList``, or its top-level children
when it has none: what a user reaches for first. Each way's peak is one real AdamW step
counted by ``tests/oracle.LiveBytes`` (which shares no code with the planner); its time is
forward and backward against the plain step's, timed alternately in one process, the median
of ``--repeats`` ratios. A row gives, per budget, the plan's time, whether its counted peak
held and what the plan does, and the fastest hand-made way that fits. "beats" says whether the
plan is at least as fast as that way (within 3%), timed against it directly, alternating, with
the ratio of the two in brackets.

    python benchmarks/hand_alternatives.py [--only NAME,...] [--repeats 3]
"""

from __future__ import annotations

import copy
import functools
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the zoo and the counter live in the tests package

from zoo import chosen_models, what_it_does, zoo_parser  # noqa: E402

import autockpt  # noqa: E402
from autockpt.planner.measure.fake_step import default_loss  # noqa: E402
from tests.oracle import measured_step  # noqa: E402
from tests.zoo import ZOO  # noqa: E402
from tests.zoo.case import ZooCase  # noqa: E402

MIB = 2**20
BUDGET_SHARES = (0.5, 0.25)


def blocks_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The largest ModuleList's items, or the top-level children."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    if lists:
        return list(max(lists, key=len))
    return list(model.children())


def hand_checkpointed(model: torch.nn.Module, every: int) -> torch.nn.Module:
    """A deep copy with every ``every``-th block's forward under non-reentrant checkpoint."""
    copied = copy.deepcopy(model)
    for index, block in enumerate(blocks_of(copied)):
        if index % every == 0:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return copied


def timed_ratio(plain: Callable[[], None], other: Callable[[], None], repeats: int) -> float:
    ratios = []
    for _ in range(repeats + 1):
        times = []
        for step in (plain, other):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        ratios.append(times[1] / times[0])
    return statistics.median(ratios[1:])  # the first pair warms up


def one_model(case: ZooCase, repeats: int) -> list[str]:
    torch.manual_seed(0)
    model = case.build()
    inputs, targets = case.batch(case.bench_batch_size)
    loss_fn = case.loss_fn or default_loss
    options: dict[str, Any] = {"loss_fn": loss_fn, "targets": targets}

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(*inputs), *targets).backward()

    unplanned_peak, _, _ = measured_step(model, inputs, **options)
    # name -> (counted peak, time ratio, its step for the head-to-head timing)
    ways: dict[str, tuple[int, float, Callable[[], None]]] = {}
    failed: list[str] = []
    for name, every in (("ckpt all", 1), ("ckpt every other", 2)):
        variant = hand_checkpointed(model, every)

        def step(variant: torch.nn.Module = variant) -> None:
            variant.zero_grad(set_to_none=True)
            loss_fn(variant(*inputs), *targets).backward()

        try:
            peak = measured_step(variant, inputs, **options)[0]
        except RuntimeError as error:  # e.g. an in-place op on a checkpointed block's output
            failed.append(f"{name} fails ({str(error).split(':')[0]})")
            continue
        ways[name] = (peak, timed_ratio(plain, step, repeats), step)
    # Splitting by hand is written for tensor inputs (a dict batch needs its own splitter).
    if case.separable and all(isinstance(x, torch.Tensor) for x in inputs):
        batch = len(inputs[0]) if isinstance(inputs[0], torch.Tensor) else case.bench_batch_size
        for pieces in (2, 4, 8, 16):
            if pieces > batch:
                break

            def step(pieces: int = pieces) -> None:
                model.zero_grad(set_to_none=True)
                for k in range(pieces):
                    rows = slice(k * batch // pieces, (k + 1) * batch // pieces)
                    part = [x[rows] if isinstance(x, torch.Tensor) else x for x in inputs]
                    part_targets = [t[rows] for t in targets]
                    loss_fn(model(*part), *part_targets).backward()

            peak = measured_step(model, inputs, num_pieces=pieces, **options)[0]
            ways[f"micro {pieces}"] = (peak, timed_ratio(plain, step, repeats), step)

    rows = []
    for share in BUDGET_SHARES:
        budget = int(unplanned_peak * share)
        fitting = {name: ratio for name, (peak, ratio, _) in ways.items() if peak <= budget}
        best = min(fitting, key=fitting.__getitem__) if fitting else None
        best_text = f"{best} {fitting[best]:.2f}x" if best else "none fits"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = autockpt.plan(
                    model, inputs, budget, loss_fn=loss_fn, example_targets=targets
                )
        except autockpt.InfeasibleBudgetError as error:
            plan_text = f"refused (min {error.minimum_bytes / unplanned_peak:.0%})"
            beats = "-"
        else:
            peak, _, _ = measured_step(
                model, inputs, plan, loss_reduction=case.loss_reduction, **options
            )
            planned = autockpt.apply(model, plan)

            def with_plan(planned: torch.nn.Module = planned, plan: autockpt.Plan = plan) -> None:
                model.zero_grad(set_to_none=True)
                autockpt.training_step(
                    planned, plan, inputs, targets, loss_fn, loss_reduction=case.loss_reduction
                )

            ratio = timed_ratio(plain, with_plan, repeats)
            predicted = (
                plan.predicted_extra_s / plan.unplanned_step_s if plan.unplanned_step_s else 0.0
            )
            held = "held" if peak <= budget else f"OVER by {(peak - budget) / MIB:.2f} MiB"
            plan_text = f"{ratio:.2f}x ({predicted:+.0%} predicted), {held}: {what_it_does(plan)}"
            beats = "-"
            if best is not None:
                # Each way's ratio to the plain step moves by up to 10% between runs on 10-20 ms
                # steps: the verdict comes from the plan timed against that way directly.
                head_to_head = timed_ratio(ways[best][2], with_plan, repeats)
                beats = f"{'yes' if head_to_head <= 1.03 else 'no'} ({head_to_head:.2f}x)"
        rows.append(
            f"| {case.name} | {case.bench_batch_size} | {unplanned_peak / MIB:.1f} | {share:.0%} "
            f"| {plan_text} | {best_text} | {beats} |"
        )
    summary = ", ".join(
        [
            f"{name} {peak / unplanned_peak:.0%}/{ratio:.2f}x"
            for name, (peak, ratio, _) in ways.items()
        ]
        + failed
    )
    rows.append(f"|  |  |  | hand-made (peak share / time) | {summary} |  |  |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = zoo_parser(__doc__.splitlines()[0], repeats=3, repeats_help="timed step pairs per way")
    options = parser.parse_args(argv)
    names = chosen_models(options)
    print(
        "| model | batch | unplanned MiB (counted) | budget | autockpt | fastest hand-made that fits "
        "| beats (plan / that way) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        for line in one_model(ZOO[name], options.repeats):
            print(line, flush=True)


if __name__ == "__main__":
    main()
