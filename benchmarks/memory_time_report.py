"""The memory/time benchmark's results: one row per strategy, the markdown table, the printout.

:func:`report` turns the measured strategies into JSON-able rows with the run's metadata
(machine, torch, source commit, load average); :func:`print_report` prints them with
:func:`markdown_table`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from memory_time_strategies import Strategy, Workload

import autockpt


def _actions(plan: autockpt.Plan | None) -> dict[str, Any]:
    if plan is None:
        return {}
    return {
        "num_recomputed": plan.num_recomputed,
        "num_segments": len(plan.segments),
        "chunks": {s.name: s.num_chunks for s in plan.segments if s.num_chunks > 1},
        "num_micro_batches": plan.num_micro_batches,
        "recomputed": [s.name for s in plan.segments if s.recomputed],
    }


def _measured_peak(strategy: Strategy) -> int | None:
    measured = strategy.measured
    return measured.get("tracked_bytes", measured.get("visible_bytes"))


def row_of(strategy: Strategy, unplanned: int, baseline: Strategy) -> dict[str, Any]:
    median_s = statistics.median(strategy.step_s) if strategy.step_s else None
    min_s = min(strategy.step_s) if strategy.step_s else None
    baseline_s = statistics.median(baseline.step_s) if baseline.step_s else None
    baseline_min_s = min(baseline.step_s) if baseline.step_s else None
    peak = _measured_peak(strategy)
    held = None
    if strategy.budget_bytes is not None and peak is not None:
        held = peak <= strategy.budget_bytes
    return {
        "strategy": strategy.name,
        "budget_bytes": strategy.budget_bytes,
        "budget_fraction": strategy.budget_bytes / unplanned if strategy.budget_bytes else None,
        "predicted_peak_bytes": strategy.predicted_peak_bytes,
        "measured": strategy.measured,
        "measured_peak_bytes": peak,
        "measured_over_predicted": (
            peak / strategy.predicted_peak_bytes if peak and strategy.predicted_peak_bytes else None
        ),
        "budget_held": held,
        "step_s": strategy.step_s,
        "median_step_s": median_s,
        "ratio_to_no_checkpointing": median_s / baseline_s if median_s and baseline_s else None,
        "min_step_s": min_s,
        "min_ratio_to_no_checkpointing": min_s / baseline_min_s
        if min_s and baseline_min_s
        else None,
        "planning_s": strategy.planning_s,
        "actions": _actions(strategy.plan),
        "failed": strategy.failed,
        "notes": strategy.notes,
    }


def _mib(num_bytes: int | None) -> str:
    """Bytes in MiB with three significant figures (KiB below one MiB)."""
    if num_bytes is None:
        return "-"
    if num_bytes < 2**20:
        return f"{num_bytes / 2**10:.3g} KiB"
    value = num_bytes / 2**20
    return f"{value:,.0f} MiB" if value >= 1000 else f"{value:.3g} MiB"


def markdown_table(rows: list[dict[str, Any]], device: torch.device) -> str:
    on_cuda = device.type == "cuda"
    measured_heads = (
        ["max allocated", "reserved + context"] if on_cuda else ["measured peak (tracked)"]
    )
    heads = [
        "strategy",
        "budget",
        "predicted peak",
        *measured_heads,
        "held",
        "step (median)",
        "vs none",
        "step (min)",
        "vs none (min)",
        "planning",
        "recomputed",
        "chunks",
        "micro-batches",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in rows:
        budget = "-"
        if row["budget_bytes"] is not None:
            budget = f"{_mib(row['budget_bytes'])} ({row['budget_fraction']:.0%})"
        measured = row["measured"]
        if row["failed"]:
            cells = [row["failed"]] + [""] * (len(measured_heads) - 1)
        elif on_cuda:
            cells = [_mib(measured.get("max_allocated_bytes")), _mib(measured.get("visible_bytes"))]
        else:
            cells = [_mib(measured.get("tracked_bytes")) if measured else "n/a"]
        held = {True: "yes", False: "**no**", None: "-"}[row["budget_held"]]
        median = row["median_step_s"]
        ratio = row["ratio_to_no_checkpointing"]
        fastest, fastest_ratio = row["min_step_s"], row["min_ratio_to_no_checkpointing"]
        actions = row["actions"]
        chunks = ", ".join(f"{name} x{k}" for name, k in actions.get("chunks", {}).items())
        lines.append(
            "| "
            + " | ".join(
                [
                    row["strategy"],
                    budget,
                    _mib(row["predicted_peak_bytes"]),
                    *cells,
                    held,
                    "-" if median is None else f"{median * 1e3:,.0f} ms",
                    "-" if ratio is None else f"{ratio:.2f}",
                    "-" if fastest is None else f"{fastest * 1e3:,.0f} ms",
                    "-" if fastest_ratio is None else f"{fastest_ratio:.2f}",
                    "-" if row["planning_s"] is None else f"{row['planning_s']:.1f} s",
                    f"{actions['num_recomputed']}/{actions['num_segments']}" if actions else "-",
                    (chunks or "-") if actions else "-",
                    str(actions["num_micro_batches"]) if actions else "-",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def machine_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def source_version() -> str:
    """The checkout's commit, and whether files differ from it (numbers depend on the code)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "autockpt", "tft"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{commit} with uncommitted changes" if changed else commit


def report(
    args: argparse.Namespace,
    work: Workload,
    strategies: list[Strategy],
    reference: autockpt.Plan,
    unplanned: int,
    planning_wall_s: float,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
    batch_search: list[str],
) -> dict[str, Any]:
    rows = [row_of(s, unplanned, strategies[0]) for s in strategies]
    meta = {
        "preset": args.preset,
        "batch_size": work.config.batch_size,
        "device": str(work.device),
        "machine": machine_name() if work.device.type == "cpu" else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "dropout": work.config.dropout,
        "unplanned_peak_bytes": unplanned,
        "unplanned_tensor_peak_bytes": reference.unplanned_peak_bytes
        - reference.breakdown.context_bytes
        - reference.breakdown.headroom_bytes,
        "planning_wall_s_all_strategies": planning_wall_s,
        "load_average_before": loads[0],
        "load_average_after": loads[1],
        "batch_search": batch_search,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "source": source_version(),
    }
    return {"meta": meta, "rows": rows}


def print_report(result: dict[str, Any]) -> None:
    meta = result["meta"]
    print(
        f"{meta['preset']}, batch {meta['batch_size']}, dropout {meta['dropout']}, "
        f"{meta['device']} ({meta['machine']}), {meta['threads']} threads, torch {meta['torch']}, "
        f"{meta['steps']} timed steps per strategy"
    )
    print(f"source: {meta['source']}")
    print(
        f"unplanned peak: {_mib(meta['unplanned_peak_bytes'])}; load average "
        f"{'/'.join(f'{x:.1f}' for x in meta['load_average_before'])} before, "
        f"{'/'.join(f'{x:.1f}' for x in meta['load_average_after'])} after"
    )
    for line in meta["batch_search"]:
        print(f"batch search: {line}")
    print()
    print(markdown_table(result["rows"], torch.device(meta["device"])))
    print()
    for row in result["rows"]:
        for note in row["notes"]:
            print(f"- {row['strategy']}: {note}")
        if row["failed"]:
            print(f"- {row['strategy']}: failed: {row['failed']}")
