"""What a new day costs a streamed history: the row cache grown by a day's files against built
again (NOTE [A cache grown by new files], NOTE [A cache grown from another]).

The history is a hive folder of monthly files per contract (``history/symbol=ES/2024-01.parquet``,
6 contracts, 8 features), made a contract at a time like ``make-data`` makes bars; the next day
of each contract is held back as ``today/symbol=ES/<day>.parquet``. Each step runs in a process
of its own, reading the windows as ``train`` streams them (a split by dates, whose scales a new
day past its first date keeps) and printing the read's wall time (the windows from the paths,
imports left out), its peak resident memory (``VmHWM``) and what the cache did:

1. the history, its cache built (cold);
2. the history again (the cache reused);
3. the history and today's folder as two paths, a cache of their own grown from the history's
   (what ``predict run history/ today/`` does);
4. today's files moved into the history's folder, its own cache grown by them;
5. a late fix: one contract's last full month written again without its last bar, the cache
   re-encoding that contract alone (NOTE [A cache re-encoded where its files changed]);
6. the history as it is now built again in a cache elsewhere (what a new day or a fix cost
   before).

    python3 benchmarks/new_day.py [--million-rows 10] [--work DIR] [--remove]
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

import pyarrow.compute as pc
import pyarrow.parquet as pq

from tft.synthetic.bars import generate_bars

SYMBOLS = ("CL", "ES", "GC", "NQ", "RTY", "ZN")
FEATURES = 8
ROWS_PER_DAY = 1380  # generate_bars' bars per contract and day
SPLIT = ("2024-06-03", "2024-09-02")  # validation and test begin: the new day is past both

# One step: the windows of the paths given, streamed through the cache folder given.
_STEP = """
import json, sys, time
from pathlib import Path
def peak_kib():
    # VmHWM, this process's own high-water mark: ru_maxrss keeps the parent's across exec.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0
from tft.data.streamed.streamed_windows import stream_windows
started = time.perf_counter()
paths, cache, split = json.loads(sys.argv[1])
data = stream_windows(
    [Path(p) for p in paths], Path(cache), max_host_bytes=1 << 30, encoder_length=60,
    horizon=10, split_fractions=None, split_times=tuple(split),
)
print(json.dumps({
    "wall_s": time.perf_counter() - started,
    "peak_gib": peak_kib() / 2**20,
    "rows": int(len(data.whole.rows.time_ns)),
    "cache": data.cache_use,
}))
"""


def make_history(root: Path, days: int) -> tuple[Path, Path]:
    """``root/history`` (monthly files per contract) and ``root/today`` (each contract's day
    after the history)."""
    history, today = root / "history", root / "today"
    for symbol in SYMBOLS:
        table = generate_bars(days=days + 1, num_features=FEATURES, symbols=[symbol], seed=0)
        table = table.drop_columns(["symbol"])  # the symbol lives in the folders' names
        day = pc.strftime(table["timestamp"], format="%Y-%m-%d")
        last = pc.max(day).as_py()
        kept, held = table.filter(pc.not_equal(day, last)), table.filter(pc.equal(day, last))
        month = pc.strftime(kept["timestamp"], format="%Y-%m")
        for name in sorted(set(month.to_pylist())):
            path = history / f"symbol={symbol}" / f"{name}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(kept.filter(pc.equal(month, name)), path, compression="zstd")
        path = today / f"symbol={symbol}" / f"{last}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(held, path, compression="zstd")
        del table, kept, held
    return history, today


def step(paths: list[Path], cache: Path) -> dict[str, object]:
    """One step in a process of its own: its wall time, peak memory, rows and cache line."""
    argument = json.dumps([[str(p) for p in paths], str(cache), list(SPLIT)])
    result = subprocess.run(
        [sys.executable, "-c", _STEP, argument], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"step on {paths} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def folder_gib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--million-rows", type=float, default=10.0)
    parser.add_argument("--work", type=Path, default=None, help="folder for the data and caches")
    parser.add_argument("--remove", action="store_true", help="remove the data when done")
    args = parser.parse_args()
    days = max(int(args.million_rows * 1e6 / (len(SYMBOLS) * ROWS_PER_DAY)), 2)
    work = Path(tempfile.mkdtemp(dir=args.work, prefix="new-day-"))
    try:
        started = time.perf_counter()
        history, today = make_history(work, days)
        print(
            f"history: {days} days x {len(SYMBOLS)} contracts, "
            f"{len(list(history.rglob('*.parquet')))} files, {folder_gib(history):.2f} GiB on "
            f"disk, made in {time.perf_counter() - started:.0f} s; today: "
            f"{len(list(today.rglob('*.parquet')))} files",
            flush=True,
        )
        caches = work / "data-cache"
        rows = [
            ("history, cache built", step([history], caches / "history")),
            ("history, cache reused", step([history], caches / "history")),
            ("history/ today/ (two paths)", step([history, today], caches / "both")),
        ]
        for path in today.rglob("*.parquet"):
            moved = history / path.relative_to(today)
            path.rename(moved)
        rows.append(("today moved into history/", step([history], caches / "history")))
        months = sorted((history / f"symbol={SYMBOLS[1]}").glob("????-??.parquet"))
        fixed = months[-2]  # a whole month, past the split's dates
        month = pq.read_table(fixed)
        pq.write_table(month.slice(0, month.num_rows - 1), fixed, compression="zstd")
        label = f"{SYMBOLS[1]}'s {fixed.stem} fixed (a bar dropped)"
        rows.append((label, step([history], caches / "history")))
        rows.append(("history built again", step([history], work / "elsewhere" / "fresh")))
        print("| step | wall | peak resident | rows | cache |")
        print("|---|---|---|---|---|")
        for label, row in rows:
            print(
                f"| {label} | {row['wall_s']:.1f} s | {row['peak_gib']:.2f} GiB | "
                f"{row['rows']:,} | {row['cache']} |"
            )
        print(f"cache on disk: {folder_gib(caches / 'history'):.2f} GiB")
    finally:
        if args.remove:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
