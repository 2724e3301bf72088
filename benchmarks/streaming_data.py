"""Host memory and time to the first step of ``train`` (and of ``predict``) on files of bars
larger than memory would allow, streamed from a row cache (NOTE [Row cache] in tft/data/streamed/row_cache.py).

Each file is made like ``make-data`` makes one (6 symbols, 64 features; ``--contracts`` and
``--features`` for others), written a symbol at a time so that making it does not need the
memory the benchmark is about. Every command runs in its own process; its peak resident memory
is the kernel's high-water mark (``VmHWM``, which the process prints as it ends), its time to
the first step is measured from the launch to the first step record on stdout.
A run goes to its end (validation and the test part scored, in proportion: NOTE [Scores in
proportion]); ``--stop-at-last-step`` stops it at its last step record and reads the kernel's
high-water mark there, for code whose end scores every test window (an hour at 60M bars).

    python3 benchmarks/streaming_data.py --days 250 750 --work /path/with/space
    python3 benchmarks/streaming_data.py --days 250 --in-memory   # the in-memory path too
    python3 benchmarks/streaming_data.py --days 2700 --predict-seconds 180
    python3 benchmarks/streaming_data.py --million-rows 10 60 150 --features 8 --remove
    python3 benchmarks/streaming_data.py --million-rows 16.8 --contracts 40 --features 32

Prints one markdown row per file and run: the cold run builds the cache, the warm run reuses it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from tft.synthetic.bars import _column_encodings, generate_bars

SYMBOLS = ("CL", "ES", "GC", "NQ", "RTY", "ZN")
FEATURES = 64
STEPS = 100


def make_file(
    path: Path, days: int, features: int = FEATURES, symbols: tuple[str, ...] = SYMBOLS
) -> Path:
    """The make-data file of ``days`` days, one symbol at a time into one Parquet file."""
    if path.exists():
        return path
    partial = path.with_suffix(".partial")
    writer = None
    for seed, symbol in enumerate(symbols):
        # One seed a contract past make-data's six, so that contracts differ.
        seed = 0 if symbols == SYMBOLS else seed
        table = generate_bars(days=days, num_features=features, symbols=[symbol], seed=seed)
        if writer is None:
            writer = pq.ParquetWriter(
                partial,
                table.schema,
                compression="zstd",
                use_dictionary=["symbol"],
                column_encoding=_column_encodings(table.schema),
            )
        writer.write_table(table)
        del table
    assert writer is not None
    writer.close()
    os.replace(partial, path)
    return path


# The command line in a process that prints its own peak resident memory when it ends (also
# long_history.py). The peak is the kernel's high-water mark of the process's own memory
# (VmHWM): ru_maxrss is not, on Linux it keeps the parent's high-water mark across fork and
# exec, so a run launched by this script after it made a large file reported the making's peak.
MEASURED_CLI = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from autockpt.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "status = Path('/proc/self/status').read_text().splitlines()\n"
    "peak = next(int(line.split()[1]) for line in status if line.startswith('VmHWM:'))\n"
    "print(json.dumps({'kind': 'rusage', 'peak_kib': peak}), flush=True)\n"
    "sys.exit(code)\n"
)


def run(command: list[str], stop_at_last_step: bool = False) -> dict[str, float | None]:
    """Wall time to the first step record (when there is one), to the last and to the end;
    the peak resident memory of the whole run (``VmHWM``, which the process prints).

    With ``stop_at_last_step`` the run is stopped at its last step record and the peak is the
    kernel's high-water mark (``VmHWM``) read just before: for code whose end scores every
    test window (an hour at 60M bars on 2 cores).
    """
    started = time.perf_counter()
    first_step = last_step = None
    waits: list[float] = []
    steps: list[float] = []
    peak_kib = 0
    launch = [sys.executable, "-c", MEASURED_CLI, *command]
    with subprocess.Popen(launch, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        status = Path(f"/proc/{process.pid}/status")
        for line in process.stdout:
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record.get("kind") == "step":
                first_step = first_step or time.perf_counter() - started
                waits.append(record["data_wait_s"])
                steps.append(record["step_s"])
                if len(steps) == STEPS:
                    last_step = time.perf_counter() - started
                    if stop_at_last_step:
                        peak_kib = _high_water_kib(status)
                        process.kill()
                        break
            if record.get("kind") == "rusage":
                peak_kib = int(record["peak_kib"])
        process.wait()
    ended = time.perf_counter() - started
    if not stop_at_last_step and process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed with {process.returncode}")
    step_time = sum(steps) + sum(waits)
    return {
        "first_step_s": first_step,
        "last_step_s": last_step,
        "end_s": None if stop_at_last_step else ended,
        "peak_gib": peak_kib / 2**20,
        "data_wait_share": sum(waits) / step_time if step_time else None,
        # The first batch waits for the epoch's first draw (NOTE [Prefetching batches]).
        "first_wait_s": waits[0] if waits else None,
        "later_wait_share": sum(waits[1:]) / (sum(waits[1:]) + sum(steps[1:])) if waits else None,
    }


def _high_water_kib(status: Path) -> int:
    """The process's peak resident memory so far (``VmHWM``, KiB)."""
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, nargs="+", default=[250, 750, 2700])
    parser.add_argument(
        "--million-rows",
        type=float,
        nargs="+",
        default=None,
        help="files of about these many million bars instead of --days (1,380 a symbol a day)",
    )
    parser.add_argument("--features", type=int, default=FEATURES, help="feature columns")
    parser.add_argument(
        "--contracts",
        type=int,
        default=len(SYMBOLS),
        help="contracts in each file (make-data's six, or C00, C01, ... for another count)",
    )
    parser.add_argument(
        "--stop-at-last-step",
        action="store_true",
        help="stop each run at its last step (for code whose end scores every test window)",
    )
    parser.add_argument(
        "--remove",
        action="store_true",
        help="delete each file, its row cache and its runs once measured (the largest need "
        "not stay on disk)",
    )
    parser.add_argument("--work", type=Path, default=None, help="folder for files and runs")
    parser.add_argument("--max-host-memory", default="1GB")
    parser.add_argument(
        "--in-memory",
        action="store_true",
        help="also train the smallest file in memory (about 4x its size: not the larger ones)",
    )
    parser.add_argument(
        "--predict-seconds",
        type=float,
        default=0.0,
        help="also predict on each file for this long (its peak resident memory)",
    )
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="streaming-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        "| file | rows x columns | run | peak resident | time to the first step | to the last "
        "step | end | data wait: all steps | first batch | later steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    symbols = SYMBOLS
    if args.contracts != len(SYMBOLS):
        symbols = tuple(f"C{index:02d}" for index in range(args.contracts))
    if args.million_rows:
        args.days = [round(m * 1e6 / (len(symbols) * 1380)) for m in args.million_rows]
    for days in sorted(args.days):
        made = time.perf_counter()
        name = f"bars-{days}d-{args.features}f-{len(symbols)}c.parquet"
        path = make_file(work / name, days, args.features, symbols)
        made_s = time.perf_counter() - made
        meta = pq.ParquetFile(path).metadata
        size = f"{path.stat().st_size / 1e9:.2f} GB"
        shape = f"{meta.num_rows / 1e6:.2f}M x {meta.num_columns}"
        print(f"<!-- {path.name}: made in {made_s:.0f} s -->", flush=True)
        train = ["train", str(path), "--preset", "tiny", "--epochs", "1"]
        train += ["--max-steps-per-epoch", str(STEPS), "--quiet"]
        runs = [("cold (builds the cache)", "streamed-1"), ("warm (reuses it)", "streamed-2")]
        if args.in_memory and days == min(args.days):
            runs.insert(0, ("in memory", "memory"))
        shutil.rmtree(work / "runs" / "data-cache", ignore_errors=True)  # the cold run builds it
        for label, name in runs:
            limit = "1000GB" if name == "memory" else args.max_host_memory
            out = work / "runs" / f"{days}d-{name}"
            shutil.rmtree(out, ignore_errors=True)  # a run of an earlier invocation
            command = [*train, "--out", str(out), "--max-host-memory", limit]
            result = run(command, args.stop_at_last_step)
            wait = result["data_wait_share"]
            end = "" if result["end_s"] is None else f"{result['end_s']:.1f} s"
            print(
                f"| {size} | {shape} | train, {label} | {result['peak_gib']:.2f} GiB | "
                f"{result['first_step_s']:.1f} s | {result['last_step_s']:.1f} s | {end} | "
                f"{'' if wait is None else f'{wait:.1%}'} | {result['first_wait_s']:.2f} s | "
                f"{result['later_wait_share']:.2%} |",
                flush=True,
            )
        if args.predict_seconds:
            run_dir = work / "runs" / f"{days}d-streamed-2"
            forecasts = work / f"forecasts-{days}d.parquet"
            command = ["predict", str(run_dir), str(path), "-o", str(forecasts)]
            peak_gib, finished = run_bounded(command, args.predict_seconds)
            how = "every window" if finished else f"its first {args.predict_seconds} s"
            print(f"| {size} | {shape} | predict, {how} | {peak_gib:.2f} GiB |  |  |  |  |  |  |")
        if args.remove:
            path.unlink()
            shutil.rmtree(work / "runs", ignore_errors=True)


def run_bounded(command: list[str], seconds: float) -> tuple[float, bool]:
    """(peak resident GiB, whether it finished) of a command stopped after ``seconds``.

    Predicting every window of a large file takes hours on 2 cores (about 1,300 windows a
    second for ``tiny``); its memory is steady once the first row groups are written, so
    the peak of the first minutes, read from the kernel's high-water mark, is the run's.
    """
    process = subprocess.Popen(
        # Its progress lines (stderr, off a terminal) are not the table's.
        [sys.executable, "-m", "autockpt", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    status = Path(f"/proc/{process.pid}/status")
    peak_kib = 0
    deadline = time.perf_counter() + seconds
    while process.poll() is None and time.perf_counter() < deadline:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak_kib = max(peak_kib, int(line.split()[1]))
        time.sleep(0.2)
    finished = process.poll() is not None
    if not finished:
        # Interrupted, predict removes its half-written output (an atomic write).
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return peak_kib / 2**20, finished


if __name__ == "__main__":
    main()
