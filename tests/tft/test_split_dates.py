"""A split by dates (NOTE [A split by shares or by dates] in :mod:`tft.data.splits`): validation
and test begin at the first bar at or after each date, on the file's clock, in memory and
streamed alike; dates that leave a part empty, or are not dates, are refused in one line."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from tests.tft.test_streamed_windows import WINDOW, _assert_same
from tft.data.columns import ColumnRoles
from tft.data.splits import split_starts_ns
from tft.data.streamed.streamed_windows import stream_windows
from tft.data.windows import WindowedData, load_windows
from tft.errors import ConfigError, DataError

# The sample's bars run from 2024-01-01 23:00 to 2024-01-22 21:59 UTC.
DATES = ("2024-01-15", "2024-01-19T12:00")


def _ns(text: str) -> int:
    return int(np.datetime64(text, "ns").astype(np.int64))


def _window_times(data: WindowedData, part: str) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last bar time of every window of ``part``."""
    dataset = getattr(data, part)
    times = dataset.rows.time_ns
    length = data.encoder_length + data.horizon
    return times[dataset.starts], times[dataset.starts + length - 1]


def test_each_part_begins_at_the_first_bar_at_or_after_its_date(sample_parquet: Path) -> None:
    data = load_windows(sample_parquet, split_times=DATES, **WINDOW)
    validation_from, test_from = _ns("2024-01-15T00:00"), _ns("2024-01-19T12:00")
    times = np.unique(data.whole.rows.time_ns)
    assert data.split_cuts_ns == (validation_from, test_from)
    assert validation_from in times and test_from in times  # the sample has both minutes
    first, last = _window_times(data, "train")
    assert last.max() < validation_from
    first, last = _window_times(data, "validation")
    assert first.min() >= validation_from and last.max() < test_from
    first, last = _window_times(data, "test")
    assert first.min() >= test_from
    # Every window that fits inside a part is there: the whole file's, sorted into parts.
    whole_first, whole_last = _window_times(data, "whole")
    inside = [
        (whole_last < validation_from),
        (whole_first >= validation_from) & (whole_last < test_from),
        (whole_first >= test_from),
    ]
    counts = [len(data.train), len(data.validation), len(data.test)]
    assert counts == [int(mask.sum()) for mask in inside]
    # A datetime is the same split as its text; shares are another.
    same = load_windows(
        sample_parquet, split_times=[datetime(2024, 1, 15, tzinfo=UTC), DATES[1]], **WINDOW
    )
    np.testing.assert_array_equal(same.validation.starts, data.validation.starts)
    assert load_windows(sample_parquet, **WINDOW).split_cuts_ns != data.split_cuts_ns


def test_dates_without_a_zone_are_on_the_files_clock(sample_parquet: Path) -> None:
    chicago = load_windows(
        sample_parquet, roles=ColumnRoles(timezone="America/Chicago"), split_times=DATES, **WINDOW
    )
    # January in Chicago is UTC-6; a date with an offset needs no zone.
    six_hours = 6 * 3600 * 10**9
    assert chicago.split_cuts_ns == (_ns("2024-01-15T00:00") + six_hours, _ns("2024-01-19T18:00"))
    offset = load_windows(
        sample_parquet, split_times=("2024-01-15T00:00-06:00", DATES[1]), **WINDOW
    )
    assert offset.split_cuts_ns is not None
    assert offset.split_cuts_ns[0] == chicago.split_cuts_ns[0]


def test_the_normalizer_is_fitted_on_the_rows_before_the_validation_date(
    sample_parquet: Path,
) -> None:
    by_date = load_windows(sample_parquet, split_times=DATES, **WINDOW)
    times = np.unique(by_date.whole.rows.time_ns)
    share = float(np.mean(times < _ns("2024-01-15T00:00")))
    rest = (1 - share) / 2
    by_share = load_windows(sample_parquet, split_fractions=(share, rest, rest), **WINDOW)
    assert by_share.split_cuts_ns is not None and by_date.split_cuts_ns is not None
    assert by_share.split_cuts_ns[0] == by_date.split_cuts_ns[0]  # the same training rows
    for name, scale in by_date.normalizer.reals.items():
        np.testing.assert_array_equal(scale.mean, by_share.normalizer.reals[name].mean)
    np.testing.assert_array_equal(by_date.normalizer.target.std, by_share.normalizer.target.std)


def test_a_split_by_dates_streams_like_memory_and_a_new_date_rebuilds_the_cache(
    sample_parquet: Path, tmp_path: Path
) -> None:
    memory = load_windows(sample_parquet, split_times=DATES, **WINDOW)
    cache = tmp_path / "cache"
    streamed = stream_windows(
        sample_parquet, cache, max_host_bytes=1 << 30, split_times=DATES, chunk_rows=4999, **WINDOW
    )
    _assert_same(memory, streamed)
    assert streamed.split_cuts_ns == memory.split_cuts_ns
    written = (cache / "rows.json").stat().st_mtime_ns
    stream_windows(sample_parquet, cache, max_host_bytes=1 << 30, split_times=DATES, **WINDOW)
    assert (cache / "rows.json").stat().st_mtime_ns == written  # the same split: reused
    later = ("2024-01-16", DATES[1])  # other training rows: other scales
    again = stream_windows(
        sample_parquet, cache, max_host_bytes=1 << 30, split_times=later, **WINDOW
    )
    assert (cache / "rows.json").stat().st_mtime_ns != written
    _assert_same(load_windows(sample_parquet, split_times=later, **WINDOW), again)


@pytest.mark.parametrize(
    ("dates", "error", "words"),
    [
        (("2024-01-15", "2024-02-01"), DataError, "the test start 2024-02-01T00:00 UTC is outside"),
        (("2023-12-01", "2024-01-15"), DataError, "the validation start 2023-12-01T00:00 UTC"),
        (("2024-01-19", "2024-01-15"), ConfigError, "test must begin after validation"),
        (("15/01/2024", "2024-01-19"), ConfigError, "'15/01/2024' is not an ISO 8601 date"),
        (("2024-01-15",), ConfigError, "must be two times"),
        # Ten minutes of test bars: no window of 12 + 3 bars fits in them.
        (("2024-01-15", "2024-01-22T21:50"), DataError, "give the test split a longer span"),
    ],
)
def test_dates_that_cannot_split_the_file_are_refused_in_one_line(
    sample_parquet: Path, dates: tuple[str, ...], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as raised:
        load_windows(sample_parquet, split_times=dates, **WINDOW)
    message = str(raised.value)
    assert words in message and "\n" not in message
    assert "--split" in message or error is ConfigError


def test_a_zone_that_does_not_exist_is_named() -> None:
    with pytest.raises(ConfigError, match="--timezone 'Mars/Olympus' is not a time zone name"):
        split_starts_ns(DATES, "Mars/Olympus")
