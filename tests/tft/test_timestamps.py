"""Bar times as exports store them (NOTE [Timestamps as exports store them]): ISO 8601 text
with or without a zone, epochs in four units, read as the same instants as a Parquet timestamp;
what cannot be read is refused in one line naming the row and the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.tft.test_data import _load, _minute_table
from tft.data.columns import ColumnRoles
from tft.data.streamed.streamed_windows import stream_windows
from tft.errors import DataError

# The reference: two symbols a minute apart from 2024-01-02 14:30 UTC (a Tuesday in winter).
MINUTES = np.repeat(np.arange(30), 2)
UTC_NS = (np.datetime64("2024-01-02T14:30", "ns") + MINUTES * np.timedelta64(1, "m")).astype(
    np.int64
)


def _iso(offset_minutes: int, suffix: str, separator: str = "T") -> list[str]:
    shifted = UTC_NS.astype("datetime64[ns]") + np.timedelta64(offset_minutes, "m")
    return [str(t.astype("datetime64[s]")).replace("T", separator) + suffix for t in shifted]


STORED: dict[str, tuple[Any, dict[str, Any]]] = {
    "text with Z": (_iso(0, "Z"), {}),
    "text with an offset": (_iso(60, "+01:00"), {}),
    "text with a space, on New York's clock": (
        _iso(-300, "", separator=" "),
        {"timezone": "America/New_York"},
    ),
    "text without a zone, said to be UTC": (_iso(0, ""), {"timezone": "UTC"}),
    "epoch seconds": (UTC_NS // 10**9, {}),
    "epoch milliseconds": (UTC_NS // 10**6, {}),
    "epoch microseconds": (UTC_NS // 10**3, {}),
    "epoch nanoseconds": (UTC_NS, {}),
    "epoch seconds, unit given": (UTC_NS // 10**9, {"timestamp_unit": "s"}),
}


def _write(tmp_path: Path, times: Any) -> Path:
    path = tmp_path / "bars.parquet"
    pq.write_table(_minute_table(timestamp=pa.array(times)), path)
    return path


@pytest.mark.parametrize("stored", list(STORED))
def test_times_as_exports_store_them_are_the_same_instants(tmp_path: Path, stored: str) -> None:
    times, roles = STORED[stored]
    loaded = _load(_write(tmp_path, times), roles=ColumnRoles(**roles))
    reference = _load(_write(tmp_path, UTC_NS.astype("datetime64[ns]")))
    np.testing.assert_array_equal(loaded.whole.rows.time_ns, reference.whole.rows.time_ns)
    # The calendar inputs come from the instants: the same too.
    np.testing.assert_array_equal(loaded.whole.rows.known, reference.whole.rows.known)
    note = next(c.note for c in loaded.columns if c.role == "timestamp")
    if stored.startswith("epoch"):
        assert note is not None and note.startswith(f"epoch {stored.split()[1].rstrip(',')}")


REFUSED: dict[str, tuple[Any, dict[str, Any], str]] = {
    "text without a zone": (
        _iso(0, ""),
        {},
        r"is text with no time zone \(row 0: '2024-01-02T14:30:00'\); say whose clock it is "
        r"with --timezone ZONE",
    ),
    "text mixing zones": (
        _iso(0, "Z")[:-1] + ["2024-01-02T14:59:00"],
        {},
        r"mixes times with and without a time zone \(row 59: '2024-01-02T14:59:00'\)",
    ),
    "text that is no time": (
        _iso(0, "Z")[:7] + ["soon"] + _iso(0, "Z")[8:],
        {},
        r"has 'soon' at row 7, not an ISO 8601 time",
    ),
    "an unknown zone": (_iso(0, ""), {"timezone": "Mars/Olympus"}, "time zone 'Mars/Olympus'"),
    "a time the clock skips": (
        ["2024-03-10 02:30:00"] * 60,
        {"timezone": "America/Chicago"},
        "a time that America/Chicago skips or repeats at a daylight-saving change",
    ),
    "integers of no unit": (
        np.arange(60) * 1000,
        {},
        r"holds integers \(0 ... 59000\) that are no epoch .* --timestamp-unit s\|ms\|us\|ns",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_times_that_cannot_be_read_are_refused_in_one_line(tmp_path: Path, case: str) -> None:
    times, roles, words = REFUSED[case]
    with pytest.raises(DataError, match=words) as refused:
        _load(_write(tmp_path, times), roles=ColumnRoles(**roles))
    assert "\n" not in str(refused.value)


def test_the_streamed_path_reads_text_times_alike_and_names_file_rows(tmp_path: Path) -> None:
    # Chunks of 7 rows: each chunk's times are read on their own, rows named as the file's.
    times = _iso(60, "+01:00")
    path = _write(tmp_path, times)
    options: dict[str, Any] = {"encoder_length": 3, "horizon": 2, "split_fractions": None}
    streamed = stream_windows(
        path, tmp_path / "cache", max_host_bytes=1 << 30, chunk_rows=7, **options
    )
    np.testing.assert_array_equal(streamed.whole.rows.time_ns, _load(path).whole.rows.time_ns)
    broken = _write(tmp_path, [*times[:40], "later", *times[41:]])
    with pytest.raises(DataError, match="has 'later' at row 40, not an ISO 8601 time"):
        stream_windows(broken, tmp_path / "cache2", max_host_bytes=1 << 30, chunk_rows=7, **options)
