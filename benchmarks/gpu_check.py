"""The GPU check: one command that shows, on one NVIDIA GPU, that the planner's promises hold.

    python benchmarks/gpu_check.py --out gpu-check        # on a machine with a GPU
    python benchmarks/gpu_check.py --cpu --out cpu-check  # the same flow on the CPU, small shapes

It needs no network: torch, pyarrow, rich, pydantic and autockpt installed (pytest too, for the
first step). Steps, each a subprocess with its log in ``--out``; a step that fails is reported
and the next one runs:

1. ``pytest -m gpu`` on the test files that use the ``gpu`` marker.
2. ``memory_time.py`` for the preset at its batch, and at the largest batch that the planner says
   fits the emulated card (``--batch-size-for``; there autockpt runs at the card's budget).
3. ``python -m autockpt make-data``, then a few steps of ``python -m autockpt train`` on it with
   ``--vram-budget`` set to the card, twice at the same batch: planned by autockpt, and with
   ``--no-gradient-checkpointing``. On CUDA the process is limited to the card's memory with
   ``torch.cuda.set_per_process_memory_fraction`` (the card less the CUDA context the process
   measured): no checkpointing must run out of memory where autockpt's plan trains, and the
   CUDA context plus the allocator's reserved peak (what nvidia-smi shows) must stay under the
   card. On the CPU (``--cpu``) the budget is on tracked tensor bytes: the unplanned run must go
   over it and the planned run must stay under it. Either way a planned run that re-planned
   (a step over the budget, or an out-of-memory retry) fails the check: its plan
   under-predicted a step, whatever the run ended with.
4. Everything goes to ``--out``; ``summary.json`` and ``summary.md`` there, and the summary
   table is printed last.

The CLI runs as ``python -m autockpt``; while the package has no ``__main__`` module the check
calls ``autockpt.cli.main`` directly and says so in the step's detail.

The steps are in ``gpu_check_steps.py`` and the subprocesses (with the ``_cli`` role) in
``gpu_check_subprocess.py``; this script is the command line and the order of the steps. Run it
as a script (or through ``gpu_check.sh``), so that its folder is on ``sys.path`` for those
modules.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpu_check_steps import CPU, GPU, Check, Settings, StepResult
from gpu_check_subprocess import cli_main


def summary_table(results: list[StepResult]) -> str:
    lines = ["| step | status | seconds | detail |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.detail} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_cli"]:
        return cli_main(argv[1:])
    parser = argparse.ArgumentParser(description="Check autockpt's memory promises on one GPU.")
    parser.add_argument("--out", type=Path, required=True, help="folder for logs and results")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run the same flow on the CPU with small shapes (tiny preset)",
    )
    parser.add_argument("--card", help="emulated card / budget (default: 4GiB, 3MiB with --cpu)")
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="seconds allowed to each step (default: 240)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time torch.compile in the batch run (minutes of compiling)",
    )
    args = parser.parse_args(argv)

    settings = CPU if args.cpu else GPU
    if args.card:
        settings = Settings(**{**asdict(settings), "card": args.card})
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    check = Check(settings, args.out.resolve(), args.timeout, args.compile)
    environment = _environment(settings)
    (check.out / "environment.json").write_text(json.dumps(environment, indent=2) + "\n")
    print(
        f"gpu_check ({'CPU' if args.cpu else 'GPU'} mode): {environment['device_name']}, "
        f"torch {environment['torch']}, card {settings.card}",
        flush=True,
    )
    if settings.device == "cuda" and not environment["cuda"]:
        print("no CUDA device: run with --cpu to check the flow on the CPU", file=sys.stderr)
        return 2
    from autockpt import parse_budget

    check.card_bytes = parse_budget(settings.card).bytes

    check.gpu_tests()
    check.memory_time(largest=False)
    check.memory_time(largest=True)
    data = check.make_data()
    if data is not None:
        check.train_pair(data)
    total_s = time.perf_counter() - started
    failed = [r for r in check.results if r.status in ("failed", "missing")]
    summary = {
        "settings": asdict(settings),
        "environment": environment,
        "total_s": total_s,
        "steps": [asdict(r) for r in check.results],
    }
    (check.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = summary_table(check.results)
    (check.out / "summary.md").write_text(table + "\n")
    print()
    print(
        f"gpu_check finished in {total_s:.0f} s; {len(failed)} of {len(check.results)} steps "
        f"failed or missing; everything is in {check.out}"
    )
    print(table)
    return 1 if failed else 0


def _environment(settings: Settings) -> dict[str, Any]:
    import platform

    import torch

    cuda = torch.cuda.is_available()
    name = (
        torch.cuda.get_device_name()
        if cuda and settings.device == "cuda"
        else (f"{platform.processor() or platform.machine()} CPU")
    )
    if not cuda or settings.device != "cuda":
        cpuinfo = Path("/proc/cpuinfo")
        if cpuinfo.exists():
            for line in cpuinfo.read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    on_card = cuda and settings.device == "cuda"
    return {
        "cuda": cuda,
        "device_name": name,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version() if on_card else None,
        "driver_version": _driver_version() if on_card else None,
        "card_total_bytes": torch.cuda.get_device_properties(0).total_memory if on_card else None,
    }


def _driver_version() -> str | None:
    """The NVIDIA driver's version, as ``nvidia-smi`` gives it; None where it cannot."""
    import subprocess

    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


if __name__ == "__main__":
    sys.exit(main())
