"""How long ``autockpt.plan`` takes per TFT preset, and where the time goes.

For each preset, at its own batch size, ``plan()`` runs ``--repeats`` times at each of three
budgets: unlimited (nothing to recompute: the fast path), and 50% and 25% of the unplanned peak
(chunks and micro-batches searched). Reported: the median wall time of the call, the median
``plan.planning_s`` it reports, and the median seconds in each stage. Stages are timed by
wrapping the functions ``autockpt.plan`` calls (in this process only, nothing is edited):

* trace: ``trace_or_find_modules`` (torch.fx, or forward hooks for a model fx cannot trace);
* calibrate: the device's time model (measured once per process, so only the first call pays);
* fake state: ``FakeTrainingState``, the fake model's parameters and the optimizer state;
* measure: ``profile_step``, fake-tensor steps of the model (each plan needs several);
* simulate: ``simulated_profile``, recomputed steps worked out from a kept step's record;
* separability: ``analyse_separability``, small real runs that decide chunks and micro-batches;
* solve: ``solve`` and ``minimum_peak``, the chain solver;
* whole-plan timing: ``timed_side_by_side``, the plans that fit timed whole on the real model;
* other: the rest (building chains, the Plan).

With ``--fresh-process`` each row is also timed as the first ``plan()`` of a new Python
process, which is what one ``autockpt plan`` command pays.

``--commands`` times the commands instead, each in ``--repeats`` new processes: ``autockpt plan
--vram-budget 8MB`` on the bundled sample (the command run once, "cold", then twice more in the
same process, "warm": the third's planning is the warm figure) and ``autockpt demo``; for each,
the wall time, the ``plan()`` calls it made and the planning time of each call.

    python benchmarks/planning_speed.py [--presets tiny,small,tft-225] [--repeats 3] [--fresh-process]
    python benchmarks/planning_speed.py --commands [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import autockpt
from tft.model.config import PRESET_NAMES, get_preset
from tft.model.loss import quantile_loss
from tft.model.transformer import TemporalFusionTransformer

#: The repository root: where the fresh processes of ``--fresh-process`` import from.
REPO = Path(__file__).resolve().parents[1]

#: The functions of ``autockpt.plan`` timed, by the stage they belong to.
STAGES = {
    "trace_or_find_modules": "trace",
    "calibrate": "calibrate",
    "FakeTrainingState": "fake state",
    "profile_step": "measure",
    "simulated_profile": "simulate",
    "analyse_separability": "separability",
    "solve": "solve",
    "minimum_peak": "solve",
    "timed_side_by_side": "whole-plan timing",
}
STAGE_NAMES = (
    "trace",
    "calibrate",
    "fake state",
    "measure",
    "simulate",
    "separability",
    "solve",
    "whole-plan timing",
    "other",
)
BUDGETS = (("unlimited", None), ("50%", 0.5), ("25%", 0.25))


@contextmanager
def stage_timers() -> Iterator[dict[str, float]]:
    """Seconds spent in each stage while active (the plan module's names are wrapped)."""
    seconds: dict[str, float] = defaultdict(float)
    # The modules that call the stages (not the function ``autockpt.plan``).
    modules = [
        importlib.import_module(f"autockpt.planner.{name}")
        for name in (
            "pipeline",
            "measure.step_measurer",
            "solve.widening",
            "solve.budget_search",
            "solve.forced_checkpointing",
            "solve.staged_search",
            "solve.whole_plan_timing",
        )
    ]
    originals = [
        (module, name, getattr(module, name))
        for module in modules
        for name in STAGES
        if hasattr(module, name)
    ]

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[STAGES[name]] += time.perf_counter() - started

        return wrapper

    for module, name, function in originals:
        setattr(module, name, timed(name, function))
    try:
        yield seconds
    finally:
        for module, name, function in originals:
            setattr(module, name, function)


def time_plan(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], budget: int, loss_fn: Any
) -> dict[str, Any]:
    with stage_timers() as seconds:
        started = time.perf_counter()
        try:
            plan = autockpt.plan(model, inputs, budget, loss_fn=loss_fn)
            outcome = (
                f"{plan.num_recomputed} recomputed, "
                f"{sum(s.num_chunks > 1 for s in plan.segments)} chunked, "
                f"{plan.num_micro_batches} micro-batches"
            )
            planning_s = plan.planning_s
        except autockpt.InfeasibleBudgetError as error:
            minimum = autockpt.format_bytes(error.minimum_bytes)
            outcome, planning_s = f"infeasible (minimum {minimum})", None
        wall_s = time.perf_counter() - started
    stages = dict(seconds)
    stages["other"] = max(wall_s - sum(stages.values()), 0.0)
    return {"wall_s": wall_s, "planning_s": planning_s, "stages": stages, "outcome": outcome}


def bench_preset(name: str, repeats: int) -> list[dict[str, Any]]:
    config = get_preset(name)
    torch.manual_seed(0)
    model = TemporalFusionTransformer(config).train()
    inputs = model.example_inputs(config.batch_size, generator=torch.Generator().manual_seed(0))

    def loss_fn(prediction: torch.Tensor) -> torch.Tensor:
        return quantile_loss(
            prediction, prediction.new_zeros(prediction.shape[:2]), config.quantiles
        )

    first = time_plan(model, inputs, 2**50, loss_fn)
    unplanned = autockpt.plan(model, inputs, 2**50, loss_fn=loss_fn).unplanned_peak_bytes
    rows = []
    for label, fraction in BUDGETS:
        budget = 2**50 if fraction is None else int(fraction * unplanned)
        runs = [time_plan(model, inputs, budget, loss_fn) for _ in range(repeats)]
        planning = [r["planning_s"] for r in runs if r["planning_s"] is not None]
        rows.append(
            {
                "preset": name,
                "batch_size": config.batch_size,
                "budget": label,
                "budget_bytes": budget,
                "outcome": runs[-1]["outcome"],
                "wall_s": [r["wall_s"] for r in runs],
                "median_wall_s": statistics.median(r["wall_s"] for r in runs),
                "median_planning_s": statistics.median(planning) if planning else None,
                "median_stage_s": {
                    stage: statistics.median(r["stages"].get(stage, 0.0) for r in runs)
                    for stage in STAGE_NAMES
                },
                "first_call_wall_s": first["wall_s"] if fraction is None else None,
                "first_call_stage_s": first["stages"] if fraction is None else None,
            }
        )
    return rows


def fresh_process_s(preset: str, budget_bytes: int, threads: int) -> float:
    """Seconds of the first ``plan()`` in a new Python process (what one ``autockpt plan``
    command pays: modules imported on first use, empty fake-tensor caches)."""
    child = (
        "import sys, time, torch\n"
        f"torch.set_num_threads({threads})\n"
        "import autockpt\n"
        "from tft.model.config import get_preset\n"
        "from tft.model.loss import quantile_loss\n"
        "from tft.model.transformer import TemporalFusionTransformer\n"
        f"config = get_preset({preset!r})\n"
        "torch.manual_seed(0)\n"
        "model = TemporalFusionTransformer(config).train()\n"
        "inputs = model.example_inputs(config.batch_size, "
        "generator=torch.Generator().manual_seed(0))\n"
        "def loss_fn(p):\n"
        "    return quantile_loss(p, p.new_zeros(p.shape[:2]), config.quantiles)\n"
        "started = time.perf_counter()\n"
        "try:\n"
        f"    autockpt.plan(model, inputs, {budget_bytes}, loss_fn=loss_fn)\n"
        "except autockpt.InfeasibleBudgetError:\n"
        "    pass\n"
        "print(time.perf_counter() - started)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, cwd=REPO
    )
    return float(result.stdout.strip().splitlines()[-1])


#: What a new process runs for ``--commands``: the command line given, ``times`` times, with
#: every ``autockpt.plan`` call (the trainer's, through ``make_plan``) counted and timed; one
#: JSON line on stderr per run of the command.
COMMAND_CHILD = """
import json, sys, tempfile, time
started = time.perf_counter()
import autockpt
from autockpt.cli.main import main
calls = []
plan = autockpt.plan
def counted(*args, **kwargs):
    called = time.perf_counter()
    result = plan(*args, **kwargs)
    calls.append({"call_s": time.perf_counter() - called, "planning_s": result.planning_s})
    return result
autockpt.plan = counted
argv, times = json.loads(sys.argv[1]), int(sys.argv[2])
imported = time.perf_counter() - started
for run in range(times):
    calls.clear()
    began = time.perf_counter()
    line = [a.replace("{out}", tempfile.mkdtemp() + "/run") for a in argv]
    code = main(line)
    record = {"run": run, "code": code, "main_s": time.perf_counter() - began, "calls": calls}
    record["import_s"] = imported if run == 0 else 0.0
    print(json.dumps(record), file=sys.stderr)
"""

#: The commands ``--commands`` times, and how many times each runs in one process.
COMMANDS = (
    ("plan --vram-budget 8MB (sample)", ["plan", "--vram-budget", "8MB", "--quiet"], 3),
    ("demo", ["demo", "--quiet", "--out", "{out}"], 1),
)


def time_commands(repeats: int) -> list[dict[str, Any]]:
    """Each of ``COMMANDS`` in ``repeats`` new processes: its runs' wall and planning times."""
    sample = REPO / "examples" / "data" / "sample.parquet"
    rows = []
    for label, argv, times in COMMANDS:
        line = [*argv, str(sample)] if argv[0] == "plan" else argv
        for repeat in range(repeats):
            started = time.perf_counter()
            result = subprocess.run(
                [sys.executable, "-c", COMMAND_CHILD, json.dumps(line), str(times)],
                capture_output=True,
                text=True,
                cwd=REPO,
            )
            wall_s = time.perf_counter() - started
            runs = [json.loads(x) for x in result.stderr.splitlines() if x.startswith('{"run"')]
            if result.returncode != 0 or len(runs) != times:
                raise RuntimeError(f"{label} failed:\n{result.stderr[-3000:]}")
            rows.append({"command": label, "repeat": repeat, "process_s": wall_s, "runs": runs})
            cold, warm = runs[0], runs[-1]
            print(
                f"{label}, process {repeat + 1}: {wall_s:.2f} s in all; cold: "
                f"{len(cold['calls'])} plan() call(s), planning "
                + " + ".join(f"{c['planning_s']:.2f}" for c in cold["calls"])
                + f" s (plan() {sum(c['call_s'] for c in cold['calls']):.2f} s)"
                + (
                    f"; warm (run {times} in the process): planning "
                    + " + ".join(f"{c['planning_s']:.2f}" for c in warm["calls"])
                    + f" s (plan() {sum(c['call_s'] for c in warm['calls']):.2f} s)"
                    if times > 1
                    else ""
                )
            )
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    heads = [
        "preset",
        "batch",
        "budget",
        "plan() wall (median)",
        "plan.planning_s",
        *STAGE_NAMES,
        "chosen",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in rows:
        planning = row["median_planning_s"]
        lines.append(
            "| "
            + " | ".join(
                [
                    row["preset"],
                    str(row["batch_size"]),
                    row["budget"],
                    f"{row['median_wall_s']:.2f} s",
                    "-" if planning is None else f"{planning:.2f} s",
                    *(f"{row['median_stage_s'][stage]:.2f}" for stage in STAGE_NAMES),
                    row["outcome"],
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time autockpt.plan per TFT preset.")
    parser.add_argument(
        "--presets", default=",".join(PRESET_NAMES), help="comma-separated presets (default: all)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="plan() calls per budget")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--fresh-process",
        action="store_true",
        help="also time each row's plan() as the first call of a new process",
    )
    parser.add_argument(
        "--commands",
        action="store_true",
        help="time the plan command on the sample and the demo instead, in new processes",
    )
    args = parser.parse_args(argv)
    if args.commands:
        load_before = os.getloadavg()
        command_rows = time_commands(args.repeats)
        print(f"load average {'/'.join(f'{x:.1f}' for x in load_before)} before")
        if args.json is not None:
            args.json.write_text(json.dumps({"commands": command_rows}, indent=2) + "\n")
        return 0
    torch.set_num_threads(args.threads)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    load_before = os.getloadavg()
    rows = [row for preset in presets for row in bench_preset(preset, args.repeats)]
    load_after = os.getloadavg()
    print(
        f"autockpt.plan on the CPU, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"{args.repeats} calls per budget; load average "
        f"{'/'.join(f'{x:.1f}' for x in load_before)} before, "
        f"{'/'.join(f'{x:.1f}' for x in load_after)} after"
    )
    first = [r for r in rows if r["first_call_wall_s"] is not None]
    for row in first:
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in row["first_call_stage_s"].items())
        print(
            f"{row['preset']}: first plan() of the preset (unlimited budget): "
            f"{row['first_call_wall_s']:.2f} s ({stages})"
        )
    if args.fresh_process:
        for row in rows:
            row["fresh_process_s"] = fresh_process_s(
                row["preset"], row["budget_bytes"], args.threads
            )
            print(
                f"{row['preset']} at {row['budget']}: first plan() of a new process "
                f"{row['fresh_process_s']:.2f} s"
            )
    print()
    print(markdown_table(rows))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"rows": rows, "load": [load_before, load_after]}, indent=2) + "\n"
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
