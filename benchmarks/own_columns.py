"""A file with categorical columns, trained as ``autockpt train`` trains it: what the model
sees, what the planner plans, and the validation error with and without each addition.

The bundled sample gains the columns a trader's export has beyond prices and features: a
``session`` (``RTH`` 14:30-21:00 UTC on weekdays, else ``ETH``; known in advance, since the
clock says it) and an ``exchange`` (text, constant per symbol, so a static input). Each row
of the table is one run on that file:

* ``one scale``: every real input scaled over both symbols at once, session and exchange left
  out (what autockpt did before per-symbol scaling and categoricals);
* ``per symbol``: each symbol's own scales, session and exchange still left out;
* ``+ session, exchange``: per-symbol scales, the session a known categorical input and the
  exchange a static one.

Each run plans for half its own unplanned peak and trains under it; the trainer's tracked
peak (measured, NOTE [Enforcing the budget]) is printed beside the prediction. The validation
errors are in log-return units, the same for every row (the pinball loss is in each run's
normalised units, which per-symbol scaling changes: compare it only between the rows scaled
alike), from the best epoch.

    python benchmarks/own_columns.py [--preset tiny] [--epochs 3] [--max-steps-per-epoch N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from autockpt.planner.core.units import format_bytes
from autockpt.training.host.distributed import SilentReporter
from autockpt.training.loop.train import train
from autockpt.training.options.config import load_train_config
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.prepare import prepare
from autockpt.training.setup.runs import RunFolder, start_run

RUNS: dict[str, dict[str, Any]] = {
    "one scale": {"scaling": "global", "ignore_columns": ("session", "exchange")},
    "per symbol": {"ignore_columns": ("session", "exchange")},
    "+ session, exchange": {"known_columns": ("session",), "static_columns": ("exchange",)},
}


def write_sample_with_categoricals(path: Path) -> Path:
    """The bundled sample plus ``session`` and ``exchange`` (module docstring)."""
    table = pq.read_table(SAMPLE_DATA)
    times = table["timestamp"].cast(pa.int64()).to_numpy()
    minute = (times // 60_000_000_000) % 1440
    weekday = (times // 86_400_000_000_000 + 3) % 7  # 1970-01-01 was a Thursday
    regular = (minute >= 870) & (minute < 1260) & (weekday < 5)
    session = np.where(regular, "RTH", "ETH")
    symbols = table["symbol"].to_numpy(zero_copy_only=False)
    exchange = np.where(symbols == symbols[0], "CME", "CBOT")
    table = table.append_column("session", pa.array(session, type=pa.string()))
    table = table.append_column("exchange", pa.array(exchange, type=pa.string()))
    pq.write_table(table, path)
    share = float(pc.mean(pa.array(regular.astype(np.float64))).as_py())
    print(f"wrote {path}: the sample with session ({share:.0%} RTH) and exchange")
    return path


def one_run(name: str, data: Path, options: dict[str, Any], args: argparse.Namespace) -> None:
    base = {
        "data": data,
        "preset": args.preset,
        "epochs": args.epochs,
        "max_steps_per_epoch": args.max_steps_per_epoch,
        "quiet": True,
        **options,
    }
    unplanned = prepare(load_train_config(None, base)).plan.unplanned_peak_bytes
    budget = unplanned // 2
    out = Path(tempfile.mkdtemp(prefix="own-columns-")) / "run"
    config = load_train_config(None, {**base, "vram_budget": str(budget), "out": out})
    started = time.perf_counter()
    setup, run = start_run(config)
    summary = train(setup, run, SilentReporter())
    elapsed = time.perf_counter() - started
    epochs = [r for r in RunFolder(out).read_metrics() if r["kind"] == "epoch"]
    best = min(epochs, key=lambda record: record["val_loss"])
    data_inputs = setup.data
    inputs = (
        f"{data_inputs.num_observed}+{data_inputs.num_known} real, "
        f"{len(data_inputs.static_cardinalities)} static, "
        f"{len(data_inputs.observed_categorical_cardinalities) + len(data_inputs.known_categorical_cardinalities)} time-varying categorical"
    )
    print(
        f"| {name} | {inputs} | {format_bytes(unplanned)} | {format_bytes(budget)} | "
        f"{format_bytes(setup.plan.predicted_peak_bytes)} | {format_bytes(summary['peak_bytes'])} | "
        f"{'yes' if summary['within_budget'] else 'NO'} | {best['val_loss']:.4f} | "
        f"{best['val_mae'] * 1e4:.3f} | "
        f"{best['val_rmse'] * 1e4:.3f} | {best['val_coverage']:.3f} | {best['epoch']} | "
        f"{elapsed:.0f} s |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps-per-epoch", type=int, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="own-columns-data-"))
    data = write_sample_with_categoricals(folder / "sample_with_session.parquet")
    print(
        f"preset {args.preset}, {args.epochs} epochs, budget half the unplanned peak; "
        "errors x 1e-4 log return, of the best validation epoch"
    )
    print(
        "| run | inputs | unplanned peak | budget | predicted peak | measured peak (tracked) | "
        "held | val loss | val MAE | val RMSE | coverage 10-90 | best epoch | wall |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, options in RUNS.items():
        one_run(name, data, options, args)


if __name__ == "__main__":
    main()
