"""NOTE [Chunks sized by what is left]: a row cache's chunks are sized from the host memory
allowed less what the process already holds, so the build's passes stay within the budget."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tft.data.sources.data_source import DataSource
from tft.data.streamed import streamed_windows
from tft.data.streamed.streamed_windows import chunk_rows_for, resident_bytes

_BYTES_PER_VALUE = 8 * 4 * 4  # what the sizing allows a value of a chunk


@pytest.fixture
def ten_columns(tmp_path: Path) -> DataSource:
    path = tmp_path / "bars.parquet"
    pq.write_table(pa.table({f"c{i}": [1.0, 2.0] for i in range(10)}), path)
    return DataSource.of(path)


def test_the_chunks_take_what_the_process_has_not_taken(
    ten_columns: DataSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = 10**9
    monkeypatch.setattr(streamed_windows, "resident_bytes", lambda: 450_000_000)
    assert chunk_rows_for(ten_columns, budget) == 550_000_000 // (10 * _BYTES_PER_VALUE)
    # A process already past three quarters of its budget reads a quarter's worth at a time.
    monkeypatch.setattr(streamed_windows, "resident_bytes", lambda: 2 * budget)
    assert chunk_rows_for(ten_columns, budget) == budget // 4 // (10 * _BYTES_PER_VALUE)


def test_the_resident_memory_is_this_processs() -> None:
    held = bytearray(64 * 2**20)  # touched: resident
    held[::4096] = b"\x01" * len(held[::4096])
    assert resident_bytes() > 64 * 2**20
