"""The zoo (tests/zoo) at benchmark batch sizes: how low each model's budget goes, and what the
half-peak plan costs.

For each zoo model, at its ``bench_batch_size``:

* unplanned: the predicted peak of the plain step (tracked bytes on the CPU);
* minimum: the lowest peak the planner reaches, as a share of the unplanned peak (the
  ``minimum_bytes`` of the refusal of a 1-byte budget: a measured minimum); the goal is 15%
  for every batch-separable model, and the "bound" column says what stops the others;
* plan 50%: what the plan at half the unplanned peak does (micro-batches, chunks, recomputed
  segments) and its planning time;
* step 50%: that plan's real training step (forward, backward) against the plain one, timed
  alternately in one process, the median of ``--repeats`` ratios.

``--tft-225`` adds the check of issue 13: the TFT written with functional dropout (225
observed inputs, 130 steps, batch 16 and 32) against the bundled one: both minimums, and the
functional one planned at the bundled one's minimum.

    python benchmarks/zoo.py [--only NAME,...] [--repeats 5] [--tft-225]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the zoo lives in the tests package

import autockpt  # noqa: E402
from autockpt.planner.measure.fake_step import default_loss  # noqa: E402
from tests.zoo import ZOO  # noqa: E402
from tests.zoo.case import ZooCase  # noqa: E402
from tests.zoo.tft_like import functional_dropout_tft, tft_batch, tft_loss  # noqa: E402
from tft.model.config import get_preset  # noqa: E402
from tft.model.transformer import TemporalFusionTransformer  # noqa: E402

MIB = 2**20


def zoo_parser(description: str, *, repeats: int, repeats_help: str) -> argparse.ArgumentParser:
    """The zoo benchmarks' common options: ``--only NAME,...`` and ``--repeats N``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--only", default="", help="comma-separated zoo names (default: all)")
    parser.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    return parser


def chosen_models(options: argparse.Namespace) -> list[str]:
    """The ``--only`` names, or the whole zoo; torch set to the one thread the tables time."""
    torch.set_num_threads(1)
    return [n for n in options.only.split(",") if n] or list(ZOO)


def plan_quietly(model: torch.nn.Module, batch: Any, budget: int, loss_fn: Any) -> autockpt.Plan:
    """``autockpt.plan`` with the fallback's warning silenced."""
    inputs, targets = batch
    options: dict[str, Any] = {}
    if loss_fn is not None:
        options = {"loss_fn": loss_fn, "example_targets": targets}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autockpt.plan(model, inputs, budget, **options)


def measured_minimum(model: torch.nn.Module, batch: Any, loss_fn: Any) -> tuple[int, str]:
    """The refusal of a 1-byte budget: its measured minimum and what bounds it."""
    try:
        plan_quietly(model, batch, 1, loss_fn)
    except autockpt.InfeasibleBudgetError as error:
        return error.minimum_bytes, error.bound
    raise AssertionError("a 1-byte budget was met")


def step_ratio(
    model: torch.nn.Module, plan: autockpt.Plan, batch: Any, case: ZooCase, repeats: int
) -> float:
    """Median of planned / plain step time, the two alternating in one process."""
    inputs, targets = batch
    loss_fn = case.loss_fn or default_loss
    planned = autockpt.apply(model, plan)

    def plain() -> None:
        loss_fn(model(*inputs), *targets).backward()

    def with_plan() -> None:
        autockpt.training_step(
            planned, plan, inputs, targets, loss_fn, loss_reduction=case.loss_reduction
        )

    ratios = []
    for _ in range(repeats + 1):
        times = []
        for step in (plain, with_plan):
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        ratios.append(times[1] / times[0])
    return statistics.median(ratios[1:])  # the first pair warms up


def what_it_does(plan: autockpt.Plan) -> str:
    chunks = sorted({s.num_chunks for s in plan.segments if s.num_chunks > 1})
    parts = [f"{plan.num_recomputed}/{len(plan.segments)} recomputed"]
    regions = [s.compile_fraction for s in plan.segments if s.compile_fraction is not None]
    if regions:
        at = ",".join(sorted({f"{fraction:g}" for fraction in regions}))
        parts.insert(0, f"{len(regions)}/{len(plan.segments)} own graphs at {at}")
    if plan.compile_fraction is not None:
        parts.append(f"at compile {plan.compile_fraction:g}")
    if selective := sum(s.selective for s in plan.segments):
        parts[0] += f" ({selective} selectively)"
    if chunks:
        parts.append(f"chunks {','.join(map(str, chunks))}")
    if plan.num_micro_batches > 1:
        parts.append(f"{plan.num_micro_batches} micro-batches")
    return ", ".join(parts)


def row(case: ZooCase, repeats: int) -> str:
    torch.manual_seed(0)
    model = case.build()
    batch = case.batch(case.bench_batch_size)
    unplanned = plan_quietly(model, batch, 10**12, case.loss_fn).unplanned_peak_bytes
    minimum, bound = measured_minimum(model, batch, case.loss_fn)
    started = time.perf_counter()
    try:
        half = plan_quietly(model, batch, unplanned // 2, case.loss_fn)
    except autockpt.InfeasibleBudgetError:
        planning = f"{time.perf_counter() - started:.2f}"
        does, ratio = "refused", "-"
    else:
        planning = f"{time.perf_counter() - started:.2f}"
        does = what_it_does(half)
        ratio = f"{step_ratio(model, half, batch, case, repeats):.2f}x"
    share = minimum / unplanned
    goal = "" if not case.separable else (" ok" if share <= 0.15 else " OVER")
    bound_text = "" if case.separable and share <= 0.15 else bound
    return (
        f"| {case.name} | {case.bench_batch_size} | {unplanned / MIB:.1f} | {share:.1%}{goal} "
        f"| {does} | {ratio} | {planning} | {bound_text} |"
    )


def tft_check(batch_sizes: tuple[int, ...] = (16, 32)) -> None:
    """Issue 13: the TFT with functional dropout reaches the bundled TFT's budgets: at each
    batch, both minimums, and the functional one planned at the bundled one's minimum."""
    print("\n| tft-225 | batch | unplanned MiB | minimum | at the bundled minimum | planning s |")
    print("|---|---|---|---|---|---|")
    for batch_size in batch_sizes:
        config = get_preset("tft-225", batch_size=batch_size, dropout=0.1)
        batch = tft_batch(config, batch_size)
        bundled_minimum = 0
        for name, build in (
            ("bundled (nn.Dropout)", TemporalFusionTransformer),
            ("functional dropout", functional_dropout_tft),
        ):
            torch.manual_seed(0)
            model = build(config)
            unplanned = plan_quietly(model, batch, 10**12, tft_loss).unplanned_peak_bytes
            minimum, _ = measured_minimum(model, batch, tft_loss)
            bundled_minimum = bundled_minimum or minimum
            started = time.perf_counter()
            try:
                does = what_it_does(plan_quietly(model, batch, bundled_minimum, tft_loss))
            except autockpt.InfeasibleBudgetError:
                does = "refused"
            seconds = time.perf_counter() - started
            print(
                f"| {name} | {batch_size} | {unplanned / MIB:.0f} | {minimum / unplanned:.1%} "
                f"| {does} | {seconds:.1f} |",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    parser = zoo_parser(
        __doc__.splitlines()[0], repeats=5, repeats_help="timed step pairs per model"
    )
    parser.add_argument("--tft-225", action="store_true", help="also the TFT-225 check")
    options = parser.parse_args(argv)
    names = chosen_models(options)
    print(
        "| model | batch | unplanned MiB | minimum | plan at 50% | step 50% | planning s "
        "| what bounds the minimum |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        print(row(ZOO[name], options.repeats), flush=True)
    if options.tft_225:
        tft_check()


if __name__ == "__main__":
    main()
