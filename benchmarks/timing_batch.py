"""Plans chosen timing the real model at a batch that fits, against plans chosen timing it at the
whole batch (NOTE [Timing at a batch that fits]).

On the CPU the planner times the plain step and the candidate plans on the real model; it now
does so on the batch's leading samples whose real step fits the budget, and scales. This checks
that the plans so chosen are as fast as the plans whole-batch timing chose. For every case and
budget (a share of the unplanned peak):

* plan twice, in this process: as users get it (timed at the batch that fits) and with the old
  whole-batch timing (the room set to the whole batch), each with planning's own peak counted by
  ``tests/oracle.LiveBytes`` (the model, its batch and every real tensor planning made);
* time the plain step and both planned steps (forward and backward through
  ``autockpt.training_step``) in rounds, the order rotating every round; each step's median;
* print the samples timed, what each plan does, each plan's step against the plain one, and
  planning's peak against the budget.

Cases: ``tft-225`` (batch 32) at 50% and 25%, and every zoo model at its benchmark batch at 50%.

    python benchmarks/timing_batch.py [--only NAME,...] [--rounds 7] [--no-zoo] [--no-tft]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the zoo and the oracle live in the tests package

import autockpt  # noqa: E402
from autockpt.planner.measure.fake_step import default_loss  # noqa: E402
from autockpt.planner.timing.timing_room import TimingRoom  # noqa: E402
from tests.oracle import LiveBytes, starting_tensors  # noqa: E402
from tests.zoo import ZOO  # noqa: E402
from tests.zoo.tft_like import tft_batch, tft_loss  # noqa: E402
from tft.model.config import get_preset  # noqa: E402
from tft.model.transformer import TemporalFusionTransformer  # noqa: E402

MIB = 2**20


@dataclass(frozen=True)
class Case:
    """One model, batch, loss and budget share."""

    name: str
    model: torch.nn.Module
    inputs: tuple[Any, ...]
    targets: tuple[Any, ...]
    loss_fn: Callable[..., torch.Tensor] | None
    loss_reduction: str
    share: float


@contextlib.contextmanager
def whole_batch_timing() -> Iterator[None]:
    """The planner timing the real model at the whole batch, as it did before."""
    within = TimingRoom.within

    def whole(cls: type[TimingRoom], traced: Any, kept: Any, batch: int, usable: int) -> Any:
        return cls.whole(batch)

    TimingRoom.within = classmethod(whole)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        TimingRoom.within = within  # type: ignore[method-assign]


def counted_plan(case: Case, budget: int) -> tuple[autockpt.Plan | None, int]:
    """The plan at ``budget`` (None: refused) and planning's peak by the independent counter."""
    counter = LiveBytes()
    optimizer = torch.optim.AdamW(case.model.parameters())
    for tensor in starting_tensors(case.model, optimizer, [*case.inputs, *case.targets]):
        counter.hold(tensor)
    options: dict[str, Any] = {}
    if case.loss_fn is not None:
        options = {"loss_fn": case.loss_fn, "example_targets": case.targets}
    with counter, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            plan = autockpt.plan(case.model, case.inputs, budget, **options)
        except autockpt.InfeasibleBudgetError:
            plan = None
    return plan, counter.peak_bytes


def step_medians(case: Case, plans: list[autockpt.Plan], rounds: int) -> list[float]:
    """Median seconds of the plain step and of each plan's step, timed in rotating rounds."""
    loss_fn = case.loss_fn or default_loss
    model = case.model

    def plain() -> None:
        loss_fn(model(*case.inputs), *case.targets).backward()

    def planned(plan: autockpt.Plan) -> Callable[[], None]:
        runner = autockpt.apply(model, plan)
        return lambda: autockpt.training_step(
            runner, plan, case.inputs, case.targets, loss_fn, loss_reduction=case.loss_reduction
        )

    steps = [plain, *(planned(p) for p in plans)]
    times: list[list[float]] = [[] for _ in steps]
    for round_index in range(rounds + 1):
        order = [*range(round_index % len(steps), len(steps)), *range(round_index % len(steps))]
        for index in order:
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            steps[index]()
            if round_index:  # the first round warms up
                times[index].append(time.perf_counter() - started)
    return [statistics.median(t) for t in times]


def does(plan: autockpt.Plan) -> str:
    chunks = sorted({s.num_chunks for s in plan.segments if s.num_chunks > 1})
    parts = [f"{plan.num_recomputed}/{len(plan.segments)} recomputed"]
    if chunks:
        parts.append(f"chunks {','.join(map(str, chunks))}")
    if plan.num_micro_batches > 1:
        parts.append(f"{plan.num_micro_batches} micro-batches")
    return ", ".join(parts)


def samples_timed(plan: autockpt.Plan) -> str:
    for note in plan.notes:
        if note.startswith("step times timed on the real model at "):
            return note.split(" at ", 1)[1].split(" samples")[0].replace("of the batch's ", "/")
        if note.startswith("step times estimated: timing the real model failed"):
            return "timing failed"
        if note.startswith("step times estimated"):
            return "not timed"
    return "whole"


def row(case: Case, rounds: int) -> str:
    unplanned, _ = counted_plan(case, 10**12)
    assert unplanned is not None
    budget = int(unplanned.unplanned_peak_bytes * case.share)
    fits, fits_peak = counted_plan(case, budget)
    with whole_batch_timing():
        whole, whole_peak = counted_plan(case, budget)
    head = f"| {case.name} | {case.share:.0%} ({budget / MIB:.2f} MiB) "
    if fits is None or whole is None:
        return head + "| refused | | | | | |"
    plain_s, fits_s, whole_s = step_medians(case, [fits, whole], rounds)
    same = " (same)" if does(fits) == does(whole) else ""
    return (
        head + f"| {samples_timed(fits)} | {does(fits)} | {does(whole)}{same} "
        f"| {fits_s / plain_s:.2f}x | {whole_s / plain_s:.2f}x "
        f"| {fits_peak / budget:.0%} | {whole_peak / budget:.0%} |"
    )


def tft_cases() -> list[Case]:
    config = get_preset("tft-225", batch_size=32)
    torch.manual_seed(0)
    model = TemporalFusionTransformer(config)
    inputs, targets = tft_batch(config, 32)
    return [
        Case("tft-225, batch 32", model, inputs, targets, tft_loss, "sum", share)
        for share in (0.5, 0.25)
    ]


def zoo_cases(only: list[str]) -> list[Case]:
    cases = []
    for name, case in ZOO.items():
        if only and name not in only:
            continue
        torch.manual_seed(0)
        inputs, targets = case.batch(case.bench_batch_size)
        model = case.build()
        cases.append(Case(name, model, inputs, targets, case.loss_fn, case.loss_reduction, 0.5))
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated zoo names (default: all)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of the three steps")
    parser.add_argument("--no-zoo", action="store_true", help="tft-225 only")
    parser.add_argument("--no-tft", action="store_true", help="the zoo only")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    cases = [] if options.no_tft else tft_cases()
    if not options.no_zoo:
        cases += zoo_cases([n for n in options.only.split(",") if n])
    print(
        "| model | budget | timed at | plan (timed at a batch that fits) | plan (timed whole) "
        "| step: fits | step: whole | planning peak: fits | planning peak: whole |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        print(row(case, options.rounds), flush=True)


if __name__ == "__main__":
    main()
