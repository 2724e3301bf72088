"""Memory and step time of one TFT training step under each checkpointing strategy, side by side.

Strategies, each training its own deep copy of the same model (same seed) with AdamW, run in one
process and timed round-robin (the order rotates every round) so all see the same machine load:

* ``no checkpointing``: the plain model;
* ``checkpoint all``: every segment recomputed (``use_gradient_checkpointing=True``, what a
  plain on/off flag does);
* ``autockpt F``: the planner at a budget of F times the unplanned peak, for each fraction
  (and ``autockpt 4GiB`` for budgets given outright with ``--budgets``);
* ``autockpt min``: the planner at its own minimum feasible budget (the minimum an infeasible
  budget reports; a little above it when planning at exactly that fails);
* ``compile B`` (``--compile``): ``torch.compile`` with
  ``torch._functorch.config.activation_memory_budget = B`` for B in 1.0 and 0.5.

Memory is measured on one untimed step per strategy: on the CPU as tracked tensor bytes (a
:class:`autockpt.MemoryTracker` started from the parameters, the optimizer state and the batch:
the figure the CPU budget is enforced on); on CUDA as ``max_memory_allocated`` and, for what
``nvidia-smi`` shows, ``max_memory_reserved`` plus the CUDA context. Every strategy's model
lives on the device at once, so on CUDA the bytes resident before the step that belong to the
other strategies are subtracted (see ``_cuda_peaks`` in ``memory_time_measure.py``). Compiled
code allocates outside the dispatcher, so tracked bytes cannot see it: the CPU table shows ``n/a``
for compile rows.

    python benchmarks/memory_time.py --preset tft-225 --json tft225.json
    python benchmarks/memory_time.py --preset tft-225 --device cuda --batch-size-for 4GiB

``--batch-size-for BUDGET`` first searches for the largest batch (a multiple of
``--batch-granularity``, found by bisection) that the planner says fits BUDGET on the device,
then benchmarks it,
with autockpt at BUDGET among the strategies.

This script is the command line and the run (batch search, the line-up, warm-up, round-robin
timing); ``memory_time_strategies.py`` builds the strategies, ``memory_time_measure.py`` measures
them and ``memory_time_report.py`` writes the rows and the table. Run it as a script, so that
its folder is on ``sys.path`` for those modules.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from memory_time_measure import (
    _compile_within,
    _timed_into,
    cuda_context_bytes,
    measure_memory,
    run_guarded,
)
from memory_time_report import _mib, print_report, report
from memory_time_strategies import (
    COMPILE_BUDGETS,
    UNLIMITED_BYTES,
    Inputs,
    Strategy,
    Workload,
    _fresh_copy,
    compiled_strategy,
    make_batch,
    make_workload,
    minimum_bytes,
    minimum_strategy,
    plan_for,
    planned_strategy,
    unplanned_budget_bytes,
)

import autockpt
from autockpt import format_bytes
from tft.model.config import PRESET_NAMES

# ---------------------------------------------------------------------------- the run


def largest_fitting_batch(
    work: Workload, budget: str, granularity: int, limit: int = 1 << 16
) -> tuple[int, list[str]]:
    """A large multiple of ``granularity`` whose step the planner says fits ``budget``.

    The minimum feasible budget grows about linearly with the batch, so two probes give an
    estimate; bisection between multiples that fit and do not fit settles it. Feasibility is
    not monotone in the batch (the planner only tries micro-batch counts that divide it: at
    3 MiB tiny fits at 224 and 416 but not at 232), so searching multiples of a power of two
    helps, and the answer is the largest the bisection saw, not a proven maximum.
    """
    log: list[str] = []
    budget_bytes = autockpt.parse_budget(budget, device=work.device).bytes

    def inputs_at(batch: int) -> Inputs:
        return make_batch(work.model, work.config, batch, work.device, seed=0)[0]

    def fits(batch: int) -> bool:
        try:
            plan = plan_for(work, budget, inputs_at(batch))
        except autockpt.InfeasibleBudgetError:
            log.append(f"batch {batch}: does not fit")
            return False
        log.append(
            f"batch {batch}: fits, predicted {format_bytes(plan.predicted_peak_bytes)}, "
            f"{plan.num_micro_batches} micro-batches"
        )
        return True

    # Both probes past the largest micro-batch count, where the minimum grows with the batch.
    small, large = 4 * granularity, 16 * granularity
    low_minimum, high_minimum = (
        minimum_bytes(work, inputs_at(small)),
        minimum_bytes(work, inputs_at(large)),
    )
    per_sample = max((high_minimum - low_minimum) / (large - small), 1.0)
    estimate = small + (budget_bytes - low_minimum) / per_sample
    log.append(
        f"minimum {format_bytes(low_minimum)} at {small}, {format_bytes(high_minimum)} at "
        f"{large}: about {estimate:.0f} fits"
    )
    low = max(int(0.7 * estimate) // granularity * granularity, granularity)
    high = min(
        max(math.ceil(1.05 * estimate / granularity) * granularity, low + granularity), limit
    )
    while not fits(low):
        if low == granularity:
            raise autockpt.InfeasibleBudgetError(
                f"not even batch {granularity} fits {budget}",
                budget_bytes=budget_bytes,
                minimum_bytes=low_minimum,
            )
        low, high = max(low // 2 // granularity * granularity, granularity), low
    while high < limit and fits(high):
        low, high = high, min(2 * high, limit)
    while high - low > granularity:
        middle = (low + high) // 2 // granularity * granularity
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, log


def build_strategies(
    work: Workload, fractions: Sequence[float], budgets: Sequence[str], with_compile: bool
) -> tuple[list[Strategy], autockpt.Plan, int]:
    reference = plan_for(work, UNLIMITED_BYTES, use_gradient_checkpointing=False)
    unplanned = unplanned_budget_bytes(reference)
    model, optimizer = _fresh_copy(work)
    baseline = Strategy(
        name="no checkpointing",
        model=model,
        optimizer=optimizer,
        runner=model,
        predicted_peak_bytes=unplanned,
    )
    strategies = [
        baseline,
        planned_strategy(
            work, "checkpoint all", unplanned, record_budget=False, use_gradient_checkpointing=True
        ),
    ]
    named: list[tuple[str, int | str]] = [
        (f"autockpt {f:.0%}", int(f * unplanned)) for f in fractions
    ]
    named += [(f"autockpt {text}", text) for text in budgets]
    for name, budget in named:
        try:
            strategies.append(planned_strategy(work, name, budget))
        except autockpt.InfeasibleBudgetError as error:
            model, optimizer = _fresh_copy(work)
            strategies.append(
                Strategy(
                    name=name,
                    model=model,
                    optimizer=optimizer,
                    runner=model,
                    budget_bytes=error.budget_bytes,
                    failed=f"infeasible (minimum {_mib(error.minimum_bytes)})",
                    notes=[str(error)],
                )
            )
    strategies.append(minimum_strategy(work))
    if with_compile:
        strategies += [compiled_strategy(work, budget) for budget in COMPILE_BUDGETS]
    return strategies, reference, unplanned


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    batch_search: list[str] = []
    work = make_workload(args.preset, args.batch_size, device, args.seed)
    if args.batch_size_for:
        batch, batch_search = largest_fitting_batch(
            work, args.batch_size_for, args.batch_granularity
        )
        work = make_workload(args.preset, batch, device, args.seed)
    context_bytes = 0
    if device.type == "cuda":
        torch.zeros(1, device=device)
        context_bytes = cuda_context_bytes(device)
    budgets = list(args.budgets)
    if args.batch_size_for and args.batch_size_for not in budgets:
        budgets.append(args.batch_size_for)
    load_before = os.getloadavg()
    started = time.perf_counter()
    strategies, reference, unplanned = build_strategies(
        work, args.budget_fractions, budgets, args.compile
    )
    planning_wall_s = time.perf_counter() - started

    # The memory step is each strategy's warm-up; compiled ones compile first, under a limit.
    for strategy in strategies:
        if strategy.compile_budget is None:
            continue
        torch.manual_seed(args.seed)
        run_guarded(
            strategy,
            work,
            functools.partial(_compile_within, strategy, work, args.compile_timeout),
        )
    active = [s for s in strategies if s.failed is None]
    for strategy in active:
        torch.manual_seed(args.seed + 1)
        run_guarded(
            strategy, work, functools.partial(measure_memory, strategy, work, context_bytes)
        )
    active = [s for s in active if s.failed is None]
    for round_index in range(args.steps):
        shift = round_index % max(len(active), 1)
        for strategy in active[shift:] + active[:shift]:
            if strategy.failed is not None:
                continue
            torch.manual_seed(args.seed + 2 + round_index)
            run_guarded(strategy, work, functools.partial(_timed_into, strategy, work))
    load_after = os.getloadavg()
    return report(
        args,
        work,
        strategies,
        reference,
        unplanned,
        planning_wall_s,
        (load_before, load_after),
        batch_search,
    )


def _fractions(text: str) -> list[float]:
    if text.strip().lower() in ("", "none"):
        return []
    values = [float(part) for part in text.split(",") if part.strip()]
    if not values or not all(0 < v <= 1.5 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give fractions such as 0.9,0.5,0.25")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Memory and step time of a TFT training step under each strategy."
    )
    parser.add_argument("--preset", choices=PRESET_NAMES, default="tft-225")
    parser.add_argument("--batch-size", type=int, help="default: the preset's")
    parser.add_argument(
        "--batch-size-for",
        metavar="BUDGET",
        help="use the largest batch (by bisection) the planner says fits BUDGET (e.g. 4GiB)",
    )
    parser.add_argument(
        "--batch-granularity",
        type=int,
        default=32,
        help="--batch-size-for searches multiples of this (default: 32)",
    )
    parser.add_argument(
        "--steps", type=int, help="timed steps per strategy (default: 3 for tft-225, 5 otherwise)"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--budget-fractions",
        type=_fractions,
        default=_fractions("0.9,0.7,0.5,0.3,0.25"),
        help="autockpt budgets as fractions of the unplanned peak ('none' for none)",
    )
    parser.add_argument(
        "--budgets",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        default=[],
        help="autockpt budgets given outright, e.g. 4GiB,800MB (--batch-size-for adds its own)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time torch.compile at activation_memory_budget 1.0 and 0.5",
    )
    parser.add_argument(
        "--compile-timeout",
        type=float,
        default=300.0,
        help="skip a compile strategy still compiling after this many seconds",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 3 if args.preset == "tft-225" else 5
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_report(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
