"""Indicators' warm-up rows (NOTE [Warm-up rows]): the leading NaNs of each symbol's rows in a
real input are dropped with the windows that touch them and counted in the column table; a NaN
anywhere else is refused with the count and the first row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.tft.test_streamed_windows import _assert_same
from tft.data.streamed.streamed_windows import stream_windows
from tft.data.windows import load_windows
from tft.errors import DataError

MINUTES, SYMBOLS = 200, ("ES", "NQ", "CL")
WINDOW = {"encoder_length": 8, "horizon": 2, "split_fractions": None}


def _bars(rsi_lead: tuple[int, ...], gap_at: int | None = None) -> pa.Table:
    """Three symbols interleaved by minute: ``rsi`` is NaN for each symbol's first
    ``rsi_lead[s]`` minutes (an RSI's warm-up), ``ma`` for the first 5 of the second symbol."""
    rng = np.random.default_rng(0)
    times = np.datetime64("2026-03-02T14:30", "ns") + np.arange(MINUTES) * np.timedelta64(1, "m")
    tables = []
    for number, symbol in enumerate(SYMBOLS):
        rsi = rng.uniform(20, 80, MINUTES)
        rsi[: rsi_lead[number]] = np.nan
        if gap_at is not None and number == 2:
            rsi[gap_at] = np.nan
        moving = rng.normal(0, 1, MINUTES)
        if number == 1:
            moving[:5] = np.nan
        tables.append(
            pa.table(
                {
                    "timestamp": pa.array(times),
                    "symbol": [symbol] * MINUTES,
                    "close": (100.0 + number) * np.exp(np.cumsum(rng.normal(0, 1e-3, MINUTES))),
                    "rsi": rsi,
                    "ma": moving,
                }
            )
        )
    table = pa.concat_tables(tables)
    order = np.lexsort((np.arange(table.num_rows) // MINUTES, np.tile(np.arange(MINUTES), 3)))
    return table.take(pa.array(order))


def _write(tmp_path: Path, table: pa.Table, name: str = "bars.parquet") -> Path:
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def test_each_symbol_loses_its_warm_up_rows_and_the_table_counts_them(tmp_path: Path) -> None:
    leads = (13, 13, 20)
    data = load_windows(_write(tmp_path, _bars(leads)), **WINDOW)
    filled = _bars((0, 0, 0)).set_column(4, "ma", pa.array(np.zeros(3 * MINUTES)))
    reference = load_windows(_write(tmp_path, filled, "filled.parquet"), **WINDOW)
    rows, all_rows = data.whole.rows, reference.whole.rows
    # Each symbol's first rows go: the longest warm-up over its columns (ES 13, NQ 13 > 5,
    # CL 20), counted from its first kept row (the first bar has no log return, and is
    # dropped whatever the warm-up).
    for code, symbol in enumerate(data.symbols):
        lead = leads[SYMBOLS.index(symbol)] - 1
        expected = all_rows.time_ns[all_rows.symbol_index == code][lead:]
        np.testing.assert_array_equal(rows.time_ns[rows.symbol_index == code], expected)
    assert len(data.whole) == len(reference.whole) - sum(lead - 1 for lead in leads)
    notes = {column.name: column.note for column in data.columns}
    assert notes["rsi"] is not None and notes["rsi"].startswith(f"{sum(leads) - 3:,} warm-up rows")
    assert notes["ma"] is not None and notes["ma"].startswith("4 warm-up rows")
    assert np.isfinite(rows.observed).all()


def test_a_nan_after_the_warm_up_is_refused_with_the_count_and_first_row(tmp_path: Path) -> None:
    path = _write(tmp_path, _bars((13, 13, 13), gap_at=100))
    with pytest.raises(
        DataError, match=r"column 'rsi' is null/NaN or infinite at 1 rows, the first row 302 "
    ):
        load_windows(path, **WINDOW)


@pytest.mark.parametrize("chunk_rows", [7, 50, 10_000])
def test_the_streamed_path_drops_the_same_rows_across_chunk_edges(
    tmp_path: Path, chunk_rows: int
) -> None:
    # Chunks of 7 rows cut each 20-row warm-up (60 file rows, interleaved) many times over.
    path = _write(tmp_path, _bars((13, 13, 20)))
    split = {**WINDOW, "split_fractions": (0.7, 0.15, 0.15)}
    memory = load_windows(path, **split)
    streamed = stream_windows(
        path, tmp_path / "cache", max_host_bytes=1 << 30, chunk_rows=chunk_rows, **split
    )
    _assert_same(memory, streamed)  # the rows, the windows, the scales, the column table
    assert str({c.name: c.note for c in streamed.columns}["ma"]).startswith("4 warm-up rows")
    # Reading the cache back gives the table's counts without building it again.
    again = stream_windows(path, tmp_path / "cache", max_host_bytes=1 << 30, **split)
    assert again.columns == memory.columns


def test_the_streamed_path_refuses_a_gap_and_a_column_with_no_value(tmp_path: Path) -> None:
    path = _write(tmp_path, _bars((13, 13, 13), gap_at=100))
    stream = {"max_host_bytes": 1 << 30, "chunk_rows": 50, **WINDOW}
    with pytest.raises(DataError, match=r"column 'rsi' is null/NaN or infinite at 1 rows of the"):
        stream_windows(path, tmp_path / "c1", **stream)
    empty = _bars((0, 0, 0)).set_column(4, "ma", pa.array(np.full(3 * MINUTES, np.nan)))
    path = _write(tmp_path, empty, "empty.parquet")
    with pytest.raises(DataError, match=r"column 'ma' has no finite value") as memory:
        load_windows(path, **WINDOW)
    with pytest.raises(DataError) as streamed:
        stream_windows(path, tmp_path / "c2", **stream)
    assert str(streamed.value) == str(memory.value)
    assert not (tmp_path / "c1").exists() and not (tmp_path / "c2").exists()
