"""A trader's own file of two futures, written the way such files come: the test data of the
categorical and per-instrument scaling tests and of the command line's.

Crude oil (``CLZ6``, near 80) and gold (``GCZ6``, near 2400, exactly 30x crude's level) with the
same one-minute log returns, and the columns a user's export has: ``ts`` (UTC), ``ticker``,
``px_last``, ``vol`` (int), ``bid``, ``ask``, ``session`` (``RTH``/``ETH`` by the clock),
``is_roll`` (bool), ``imb`` (float), ``exchange`` (constant per ticker) and ``raw`` (bytes,
which no model can read).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MINUTES = 1500
START = np.datetime64("2026-11-02T00:00", "ns")


def futures_table(
    *, minutes: int = MINUTES, seed: int = 0, session_override: dict[int, str] | None = None
) -> pa.Table:
    """Both tickers, ticker by ticker; ``session_override`` replaces the session at those minutes."""
    rng = np.random.default_rng(seed)
    returns = rng.normal(0.0, 4e-4, minutes)
    crude = 80.0 * np.exp(np.cumsum(returns))
    times = START + np.arange(minutes) * np.timedelta64(1, "m")
    minute_of_day = np.arange(minutes) % 1440
    session = np.where((minute_of_day >= 810) & (minute_of_day < 1200), "RTH", "ETH").astype(object)
    for minute, value in (session_override or {}).items():
        session[minute] = value
    volume = rng.integers(1, 500, minutes)
    imbalance = rng.normal(0.0, 1.0, minutes)
    roll = np.arange(minutes) % 97 == 0
    columns: dict[str, list[np.ndarray]] = {
        name: []
        for name in (
            "ts",
            "ticker",
            "px_last",
            "vol",
            "bid",
            "ask",
            "session",
            "is_roll",
            "imb",
            "exchange",
            "raw",
        )
    }
    for ticker, level, exchange in (("CLZ6", 1.0, "NYMEX"), ("GCZ6", 30.0, "COMEX")):
        price = crude * level
        spread = price * 1e-4
        columns["ts"].append(times)
        columns["ticker"].append(np.full(minutes, ticker, dtype=object))
        columns["px_last"].append(price)
        columns["vol"].append(volume)
        columns["bid"].append(price - spread)
        columns["ask"].append(price + spread)
        columns["session"].append(session)
        columns["is_roll"].append(roll)
        columns["imb"].append(imbalance)
        columns["exchange"].append(np.full(minutes, exchange, dtype=object))
        columns["raw"].append(np.full(minutes, b"\x00", dtype=object))
    joined = {name: np.concatenate(parts) for name, parts in columns.items()}
    return pa.table(
        {
            "ts": pa.array(joined["ts"], type=pa.timestamp("ns", tz="UTC")),
            "ticker": pa.array(joined["ticker"], type=pa.string()),
            "px_last": joined["px_last"],
            "vol": pa.array(joined["vol"], type=pa.int64()),
            "bid": joined["bid"],
            "ask": joined["ask"],
            "session": pa.array(joined["session"], type=pa.string()),
            "is_roll": pa.array(joined["is_roll"], type=pa.bool_()),
            "imb": joined["imb"],
            "exchange": pa.array(joined["exchange"], type=pa.string()).dictionary_encode(),
            "raw": pa.array(joined["raw"], type=pa.binary()),
        }
    )


def write_futures(path: Path, **options: object) -> Path:
    """Write :func:`futures_table` to ``path`` and return it."""
    pq.write_table(futures_table(**options), path)  # type: ignore[arg-type]
    return path


#: The options that point autockpt at this file's columns.
FUTURES_ROLES = {"target": "px_last", "symbol": "ticker", "timestamp": "ts"}
