"""The GPU check's subprocesses: a logged command, and the autockpt CLI on an emulated card.

:func:`run_logged` runs one step's command in the repository with its output in a log.
:func:`cli_command` builds the command line of ``gpu_check.py _cli``, whose :func:`cli_main`
runs ``python -m autockpt ARGS`` (on CUDA limited to the emulated card) and writes a JSON report
of the exit code, the entry point reached and the allocator's peaks.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import runpy
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = Path(__file__).resolve().parent


def run_logged(command: Sequence[str], log: Path, timeout_s: float) -> tuple[int | None, float]:
    """Run ``command`` in the repository, output to ``log``; (exit code or None on timeout, s)."""
    started = time.perf_counter()
    with log.open("w") as stream:
        stream.write("$ " + " ".join(command) + "\n\n")
        stream.flush()
        try:
            completed = subprocess.run(
                list(command),
                cwd=REPO,
                stdout=stream,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
            code: int | None = completed.returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, time.perf_counter() - started


def tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " / ".join(line.strip() for line in text[-lines:])


def cli_command(cli_args: Sequence[str], *, card_bytes: int | None, report: Path) -> list[str]:
    """``gpu_check.py`` in its ``_cli`` role (see :func:`cli_main`), running the autockpt CLI."""
    script = str(BENCHMARKS / "gpu_check.py")
    command = [sys.executable, script, "_cli", "--report", str(report)]
    if card_bytes is not None:
        command += ["--card-bytes", str(card_bytes)]
    return [*command, "--", *cli_args]


def cli_main(argv: Sequence[str]) -> int:
    """Run ``python -m autockpt ARGS``, on CUDA limited to an emulated card; write a report.

    The report (JSON) holds the exit code, how the CLI was reached, an uncaught error if any,
    and on CUDA the context, the fraction set and the allocator's peaks.
    """
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="gpu_check.py _cli")
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--card-bytes", type=int)
    args = parser.parse_args(argv[:split])
    cli_args = argv[split + 1 :]
    record: dict[str, Any] = {"cli_args": cli_args}
    emulate = args.card_bytes is not None
    import torch

    if emulate:
        torch.zeros(1, device="cuda")  # creates the context
        free, total = torch.cuda.mem_get_info()
        context = total - free - torch.cuda.memory_reserved()
        fraction = (args.card_bytes - context) / total
        torch.cuda.set_per_process_memory_fraction(fraction)
        record.update(
            card_bytes=args.card_bytes,
            context_bytes=context,
            total_bytes=total,
            memory_fraction=fraction,
        )
    code = 1
    try:
        code, record["entry"] = _call_cli(cli_args)
    except BaseException as error:  # noqa: BLE001 - whatever ended the run goes in the report
        record["error"] = f"{type(error).__name__}: {error}"
        record["out_of_memory"] = isinstance(error, torch.OutOfMemoryError) or (
            "out of memory" in str(error).lower()
        )
        if isinstance(error, KeyboardInterrupt):
            raise
    finally:
        record["exit_code"] = code
        if emulate:
            reserved = torch.cuda.max_memory_reserved()
            record.update(
                max_reserved_bytes=reserved,
                max_allocated_bytes=torch.cuda.max_memory_allocated(),
                visible_peak_bytes=reserved + record["context_bytes"],
            )
        args.report.write_text(json.dumps(record, indent=2) + "\n")
    return code


def _call_cli(cli_args: list[str]) -> tuple[int, str]:
    sys.argv = ["autockpt", *cli_args]
    if importlib.util.find_spec("autockpt.__main__") is not None:
        try:
            runpy.run_module("autockpt", run_name="__main__", alter_sys=True)
        except SystemExit as exit_:
            return _exit_code(exit_.code), "python -m autockpt"
        return 0, "python -m autockpt"
    from autockpt.cli import main

    entry = "autockpt.cli.main (python -m autockpt fails: the package has no __main__ module)"
    try:
        return _exit_code(main(cli_args)), entry
    except SystemExit as exit_:
        return _exit_code(exit_.code), entry


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
