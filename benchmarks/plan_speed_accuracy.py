"""The planner's step-time prediction against the measured step, plain and planned alternating.

For each preset and each budget (a fraction of the unplanned peak), ``--runs`` times: plan (the
planner times the real model in this process, NOTE [Measured step time]), then train two deep
copies of the same model with AdamW, the plain one and the planned one, one step each in turn
(``--steps`` timed pairs after ``--warmup`` untimed ones), and take the ratio of the median
planned step to the median plain step. Each run's ratio and prediction are printed as it finishes; the
table gives, per preset and budget, the plan(s) chosen, the predicted overhead
(``plan.predicted_extra_s / plan.unplanned_step_s``, what ``autockpt plan`` prints), the measured
ratios of every run, their median, and whether the prediction is within ``TOLERANCE`` (15
points) of the median. ``--keep-freed-memory`` first sets glibc's malloc as the trainer's
process does (NOTE [Tuning the host process]), so that planning and steps run as in training.

Where this differs from ``memory_time.py``: that script times ten strategies round-robin, each
step among the others' (whose different working sets leave the allocator and caches in other
states), plans once per strategy, and reports one median; this one times one plan against the
plain step only, alternating, and repeats the whole (planning included) ``--runs`` times, so
that the spread between runs shows.

    python benchmarks/plan_speed_accuracy.py                       # tiny, small, tft-225 at 50%, 25%
    python benchmarks/plan_speed_accuracy.py --presets tft-225 --runs 5 --steps 8 --json out.json

Run it as a script, so that its folder is on ``sys.path`` (it uses ``memory_time_strategies``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from memory_time_measure import timed_step
from memory_time_strategies import (
    UNLIMITED_BYTES,
    Strategy,
    Workload,
    _fresh_copy,
    make_workload,
    plan_for,
    planned_strategy,
    unplanned_budget_bytes,
)

import autockpt
from autockpt.training.host.host_tuning import keep_freed_memory
from tft.model.config import PRESET_NAMES

#: What "within" means: the predicted overhead may miss the measured one by this many points.
TOLERANCE = 0.15


def chosen(plan: autockpt.Plan) -> str:
    """The plan's actions in a few words: chunked and recomputed segments, micro-batches."""
    parts = [
        f"{s.name} x{s.num_chunks}"
        if s.num_chunks > 1
        else f"{s.name} (cheap ops)"
        if s.selective
        else s.name
        for s in plan.segments
        if s.recomputed
    ]
    if plan.num_micro_batches > 1:
        parts.append(f"{plan.num_micro_batches} micro-batches")
    return ", ".join(parts) or "nothing"


def one_run(work: Workload, budget: int, steps: int, seed: int, warmup: int = 1) -> dict[str, Any]:
    """Plan at ``budget``, then time plain and planned steps alternating, after ``warmup``
    untimed pairs."""
    started = time.perf_counter()
    planned = planned_strategy(work, "planned", budget)
    planning_s = time.perf_counter() - started
    model, optimizer = _fresh_copy(work)
    plain = Strategy(name="plain", model=model, optimizer=optimizer, runner=model)
    assert planned.plan is not None
    pair = (plain, planned)
    for _ in range(warmup):  # untimed steps of each
        for strategy in pair:
            torch.manual_seed(seed)
            strategy.step(work)
    for index in range(steps):
        # Alternate which goes first, so that neither always follows the other.
        for strategy in pair if index % 2 == 0 else pair[::-1]:
            torch.manual_seed(seed + 1 + index)
            strategy.step_s.append(timed_step(strategy, work))
    plan = planned.plan
    timing = next((n.removeprefix("step times ") for n in plan.notes if "step times" in n), "")
    plain_s = statistics.median(plain.step_s)
    planned_s = statistics.median(planned.step_s)
    return {
        "plan": chosen(plan),
        "predicted_overhead": plan.predicted_extra_s / plan.unplanned_step_s,
        "predicted_extra_s": plan.predicted_extra_s,
        "predicted_step_s": plan.unplanned_step_s,
        "plain_step_s": plain_s,
        "planned_step_s": planned_s,
        "measured_ratio": planned_s / plain_s,
        "plain_steps_s": plain.step_s,
        "planned_steps_s": planned.step_s,
        "planning_s": planning_s,
        "timing": timing,
        "notes": plan.notes,
    }


def bench(
    preset: str, fractions: Sequence[float], runs: int, steps: int, seed: int, warmup: int = 1
) -> list[dict[str, Any]]:
    work = make_workload(preset, None, torch.device("cpu"), seed)
    reference = plan_for(work, UNLIMITED_BYTES, use_gradient_checkpointing=False)
    unplanned = unplanned_budget_bytes(reference)
    rows = []
    for fraction in fractions:
        budget = int(fraction * unplanned)
        row: dict[str, Any] = {"preset": preset, "fraction": fraction, "budget_bytes": budget}
        try:
            results = []
            for run in range(runs):
                result = one_run(work, budget, steps, seed, warmup)
                results.append(result)
                print(
                    f"{preset} {fraction:.0%} run {run + 1}: {result['plan']}; predicted "
                    f"{result['predicted_overhead']:+.0%}, measured "
                    f"{result['measured_ratio']:.2f}x (plain {result['plain_step_s'] * 1e3:.0f} "
                    f"ms, planned {result['planned_step_s'] * 1e3:.0f} ms; planning "
                    f"{result['planning_s']:.1f} s, step times {result['timing'] or 'estimated'})",
                    flush=True,
                )
        except autockpt.InfeasibleBudgetError as error:
            row["infeasible"] = str(error)
            print(f"{preset} {fraction:.0%}: {error}", flush=True)
            rows.append(row)
            continue
        predicted = statistics.median(r["predicted_overhead"] for r in results)
        measured = statistics.median(r["measured_ratio"] for r in results)
        row.update(
            runs=results,
            predicted_overhead=predicted,
            measured_ratio=measured,
            within=abs((1.0 + predicted) - measured) <= TOLERANCE,
        )
        rows.append(row)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| preset | budget | plan | predicted | measured (each run) | measured (median) "
        "| within 15 points | planning |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        budget = f"{row['fraction']:.0%} ({autockpt.format_bytes(row['budget_bytes'])})"
        if "infeasible" in row:
            lines.append(f"| {row['preset']} | {budget} | infeasible | - | - | - | - | - |")
            continue
        runs = row["runs"]
        plans = sorted({r["plan"] for r in runs})
        predicted = ", ".join(f"{r['predicted_overhead']:+.0%}" for r in runs)
        measured = ", ".join(f"{r['measured_ratio']:.2f}x" for r in runs)
        planning = ", ".join(f"{r['planning_s']:.1f}" for r in runs)
        lines.append(
            f"| {row['preset']} | {budget} | {'; '.join(plans)} | {predicted} "
            f"(median {row['predicted_overhead']:+.0%}) | {measured} | "
            f"{row['measured_ratio']:.2f}x ({row['measured_ratio'] - 1:+.0%}) | "
            f"{'yes' if row['within'] else 'no'} | {planning} s |"
        )
    return "\n".join(lines)


def _fractions(text: str) -> list[float]:
    values = [float(part) for part in text.split(",") if part.strip()]
    if not values or not all(0 < v <= 1.5 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give fractions such as 0.5,0.25")
    return values


def _presets(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in PRESET_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(PRESET_NAMES)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", type=_presets, default=list(PRESET_NAMES))
    parser.add_argument("--budget-fractions", type=_fractions, default=[0.5, 0.25])
    parser.add_argument("--runs", type=int, default=3, help="runs per budget (default: 3)")
    parser.add_argument("--steps", type=int, default=6, help="timed pairs per run (default: 6)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed pairs before them (default: 1; more where the first steps of a process "
        "still map fresh pages)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="reuse freed pages, as the trainer's process does (before planning, so that the "
        "planner times the process that trains; NOTE [Tuning the host process])",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kept = keep_freed_memory() if args.keep_freed_memory else False
    load_before = os.getloadavg()
    rows = [
        row
        for preset in args.presets
        for row in bench(
            preset, args.budget_fractions, args.runs, args.steps, args.seed, args.warmup
        )
    ]
    load_after = os.getloadavg()
    print()
    print(
        f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or 'cpu'}, "
        f"freed pages {'kept' if kept else 'returned (glibc default)'}; "
        f"load average {' / '.join(f'{x:.1f}' for x in load_before)} before, "
        f"{' / '.join(f'{x:.1f}' for x in load_after)} after"
    )
    print(table(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "threads": args.threads,
            "keep_freed_memory": kept,
            "load": [load_before, load_after],
            "rows": rows,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
