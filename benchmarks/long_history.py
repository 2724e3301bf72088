"""A short run on a long history: where its time goes, before and after scores in proportion
(NOTE [Scores in proportion]), and its expected time against the measured (NOTE [The run's
expected time]).

A hive folder of one-minute bars is made with the project's generator, one file a contract and
year (``symbol=ES/2024.parquet``; 40 contracts and 32 features by default), then a 20-step run
of the ``tiny`` preset trains on it three times, each in its own process:

1. cold: the row cache is built (its seconds are the run's data time), the scores at the
   defaults (validation as many windows as the epoch trains on, at least 4,096; the test
   16,384), both spread evenly;
2. warm: the same, reusing the cache;
3. before: the same with the scores as they were before (validation the epoch's first
   ``steps x batch`` windows, the test every window: ``--val-windows N --test-windows all``;
   the old validation took the first batches, this one spreads the same count).

Each row gives the run's parts measured (the expected in brackets), the windows scored and the
process's peak resident memory.

    python3 benchmarks/long_history.py                      # 60M bars: about 3 GB of Parquet
    python3 benchmarks/long_history.py --million-rows 12 --contracts 20
    python3 benchmarks/long_history.py --skip-before        # leave out the before run
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from streaming_data import MEASURED_CLI

from tft.synthetic.bars import generate_bars

ROWS_PER_DAY = 1380
STEPS = 20
PRESET_BATCH = 64  # the tiny preset's batch: the windows the old validation took per step


def make_folder(root: Path, *, contracts: int, days: int, features: int) -> Path:
    """``root/bars``: one Parquet file a contract and year, the contract in the folder name."""
    folder = root / "bars"
    if folder.exists():
        return folder
    partial = root / "bars.partial"
    shutil.rmtree(partial, ignore_errors=True)
    for index in range(contracts):
        symbol = f"C{index:02d}"
        table = generate_bars(days=days, num_features=features, symbols=[symbol], seed=index)
        table = table.drop_columns(["symbol"])
        year = pc.strftime(table["timestamp"], format="%Y")
        for name in sorted(set(year.to_pylist())):
            path = partial / f"symbol={symbol}" / f"{name}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.filter(pc.equal(year, name)), path, compression="zstd")
        del table, year
    partial.rename(folder)
    return folder


def train(folder: Path, out: Path, cache: Path, extra: list[str]) -> dict[str, Any]:
    """One 20-step run in its own process: its expected line, summary and peak memory."""
    command = ["train", str(folder), "--preset", "tiny", "--epochs", "1", "--quiet"]
    command += ["--max-steps-per-epoch", str(STEPS), "--out", str(out)]
    command += ["--data-cache", str(cache), *extra]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MEASURED_CLI, *command], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    expected = next(r for r in records if "expected" in r)
    summary = next(r for r in records if r.get("kind") == "summary")
    rusage = next(r for r in records if r.get("kind") == "rusage")
    progress = sum(r.get("kind") == "progress" for r in records)
    return {
        "wall_s": time.perf_counter() - started,
        "expected": expected["expected"],
        "measured": summary["run_time"]["measured"],
        "summary": summary,
        "peak_gib": rusage["peak_kib"] / 2**20,
        "progress_lines": progress,
    }


def _part(result: dict[str, Any], key: str) -> str:
    return f"{result['measured'][key]:.1f} s ({result['expected'][key]:.1f} s)"


def _windows(summary: dict[str, Any], part: str) -> str:
    count, total = summary.get(f"{part}_windows"), summary.get(f"{part}_windows_of")
    return f"{count:,} of {total:,}" if total else f"{count:,}"


def _loss(summary: dict[str, Any]) -> str:
    """The test loss and its standard error: the sample's against the whole part's."""
    se = summary.get("test_loss_se")
    return f"{summary['test_loss']:.5f}" + ("" if se is None else f" ± {se:.5f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--million-rows", type=float, default=60.0)
    parser.add_argument("--contracts", type=int, default=40)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--work", type=Path, default=None, help="folder for the data and runs")
    parser.add_argument("--skip-before", action="store_true", help="leave out the before run")
    parser.add_argument("--remove", action="store_true", help="remove the data when done")
    args = parser.parse_args()
    days = max(round(args.million_rows * 1e6 / (args.contracts * ROWS_PER_DAY)), 2)
    work = args.work or Path(tempfile.mkdtemp(prefix="long-history-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    folder = make_folder(work, contracts=args.contracts, days=days, features=args.features)
    files = list(folder.rglob("*.parquet"))
    size = sum(p.stat().st_size for p in files) / 1e9
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    print(
        f"<!-- {rows / 1e6:.1f}M bars, {args.contracts} contracts x {days} days, "
        f"{args.features} features, {len(files)} files, {size:.2f} GB; made in "
        f"{time.perf_counter() - started:.0f} s -->",
        flush=True,
    )
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    runs = [
        ("after, cold (builds the cache)", []),
        ("after, warm", []),
    ]
    if not args.skip_before:
        before = ["--val-windows", str(STEPS * PRESET_BATCH), "--test-windows", "all"]
        runs.append(("before: the test part whole", before))
    print(
        "| run | data | steps | validation | test | total | validation windows | "
        "test windows | test loss | progress lines | peak resident |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for index, (label, extra) in enumerate(runs):
            result = train(folder, work / "runs" / f"run{index}", cache, extra)
            summary = result["summary"]
            print(
                f"| {label} | {_part(result, 'data_s')} | {_part(result, 'train_s')} | "
                f"{_part(result, 'validation_s')} | {_part(result, 'test_s')} | "
                f"{_part(result, 'total_s')} | {_windows(summary, 'val')} | "
                f"{_windows(summary, 'test')} | {_loss(summary)} | {result['progress_lines']} | "
                f"{result['peak_gib']:.2f} GiB |",
                flush=True,
            )
    finally:
        if args.remove:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
