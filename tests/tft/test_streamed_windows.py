"""Windows streamed from a row cache are the in-memory path's, and hold the host's memory down.

The in-memory :func:`tft.data.windows.load_windows` is the reference: the streamed path
(:func:`tft.data.streamed.streamed_windows.stream_windows`) reads the file in chunks of a few rows, so every
chunk edge (a symbol's previous bar, its order, its first row) is crossed many times.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from autockpt.training.loop.prefetch import Prefetch
from tests.tft.futures import FUTURES_ROLES, futures_table
from tft.data.columns import ColumnRoles
from tft.data.streamed.streamed_windows import stream_windows
from tft.data.windows import WindowedData, iterate_batches, load_windows
from tft.errors import DataError

WINDOW = {"encoder_length": 12, "horizon": 3}
ROLE_ARRAYS = ("observed", "known", "categorical", "static", "target", "time_ns", "symbol_index")


def _interleaved(path: Path, minutes: int = 1000) -> Path:
    """The futures file with its two tickers' bars interleaved by time, as exports often are."""
    table = futures_table(minutes=minutes)
    order = pc.sort_indices(table, sort_keys=[("ts", "ascending"), ("ticker", "ascending")])
    pq.write_table(table.take(order), path)
    return path


def _assert_same(memory: WindowedData, streamed: WindowedData) -> None:
    for split in ("train", "validation", "test", "whole"):
        np.testing.assert_array_equal(
            getattr(memory, split).starts, getattr(streamed, split).starts
        )
    for name in ROLE_ARRAYS:
        expected, got = getattr(memory.whole.rows, name), getattr(streamed.whole.rows, name)
        assert expected.shape == got.shape and expected.dtype == got.dtype, name
        # NOTE [Streaming statistics]: the scales agree to ~1e-12, the float32 inputs to a bit.
        np.testing.assert_allclose(got, expected, rtol=2e-7, atol=1e-7, err_msg=name)
    assert streamed.columns == memory.columns
    assert streamed.symbols == memory.symbols
    assert streamed.observed_columns == memory.observed_columns
    assert streamed.known_columns == memory.known_columns
    assert streamed.normalizer.categories == memory.normalizer.categories
    assert streamed.normalizer.roles == memory.normalizer.roles
    for name, scale in [("target", memory.normalizer.target), *memory.normalizer.reals.items()]:
        other = streamed.normalizer.target if name == "target" else streamed.normalizer.reals[name]
        np.testing.assert_allclose(other.mean, scale.mean, rtol=1e-9, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(other.std, scale.std, rtol=1e-9, err_msg=name)


def test_the_sample_streamed_in_small_chunks_gives_the_in_memory_windows_and_batches(
    sample_parquet: Path, tmp_path: Path
) -> None:
    memory = load_windows(sample_parquet, **WINDOW)
    streamed = stream_windows(
        sample_parquet, tmp_path / "cache", max_host_bytes=1 << 30, chunk_rows=4999, **WINDOW
    )
    _assert_same(memory, streamed)
    for expected, got in zip(
        iterate_batches(memory.train, 64, shuffle=True, seed=3, drop_last=True),
        iterate_batches(streamed.train, 64, shuffle=True, seed=3, drop_last=True),
        strict=True,
    ):
        for a, b in zip(expected, got, strict=True):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=2e-7, atol=1e-7)


@pytest.mark.parametrize("transform", ["log_return", "diff", "none"])
def test_interleaved_symbols_categories_and_statics_stream_like_memory(
    tmp_path: Path, transform: str
) -> None:
    path = _interleaved(tmp_path / "mine.parquet")
    roles = ColumnRoles(**FUTURES_ROLES, target_transform=transform)
    memory = load_windows(path, roles=roles, **WINDOW)
    assert memory.normalizer.roles.static == ["exchange"]  # found constant across chunks
    streamed = stream_windows(
        path, tmp_path / "cache", max_host_bytes=1 << 30, roles=roles, chunk_rows=7, **WINDOW
    )
    _assert_same(memory, streamed)


def test_a_saved_normalizer_streams_the_whole_file_like_memory(tmp_path: Path) -> None:
    path = _interleaved(tmp_path / "mine.parquet")
    fitted = load_windows(path, roles=ColumnRoles(**FUTURES_ROLES), **WINDOW).normalizer
    memory = load_windows(path, normalizer=fitted, split_fractions=None, **WINDOW)
    streamed = stream_windows(
        path,
        tmp_path / "cache",
        max_host_bytes=1 << 30,
        normalizer=fitted,
        split_fractions=None,
        chunk_rows=50,
        **WINDOW,
    )
    _assert_same(memory, streamed)
    assert streamed.normalizer == fitted


def test_the_cache_is_reused_and_rebuilt_when_the_file_changes(
    sample_parquet: Path, tmp_path: Path
) -> None:
    path = tmp_path / "bars.parquet"
    path.write_bytes(sample_parquet.read_bytes())
    cache = tmp_path / "cache"
    stream_windows(path, cache, max_host_bytes=1 << 30, **WINDOW)
    written = (cache / "rows.json").stat().st_mtime_ns
    stream_windows(path, cache, max_host_bytes=1 << 30, **WINDOW)
    assert (cache / "rows.json").stat().st_mtime_ns == written  # reused
    half = pq.read_table(path).slice(0, 20_000)
    pq.write_table(half, path)
    data = stream_windows(path, cache, max_host_bytes=1 << 30, **WINDOW)
    assert (cache / "rows.json").stat().st_mtime_ns != written
    assert len(data.whole.rows.target) < 20_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bars.parquet", "cache"]


def _one_line(error: DataError) -> str:
    text = str(error)
    assert "\n" not in text
    return text


def test_bad_input_ends_in_one_line_and_leaves_no_cache(tmp_path: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(DataError) as caught:
        stream_windows(junk, tmp_path / "c1", max_host_bytes=1 << 30, **WINDOW)
    assert "cannot be read as Parquet" in _one_line(caught.value)

    path = _interleaved(tmp_path / "mine.parquet")
    with pytest.raises(DataError) as caught:
        stream_windows(
            path,
            tmp_path / "c2",
            max_host_bytes=1 << 30,
            roles=ColumnRoles(**{**FUTURES_ROLES, "target": "close"}),
            **WINDOW,
        )
    assert "no target column 'close'" in _one_line(caught.value)

    # An unsorted bar far from the first chunk: found across chunk edges, named by its row.
    table = futures_table(minutes=300)
    times = table["ts"].to_numpy().copy()
    times[[250, 251]] = times[[251, 250]]
    swapped = table.set_column(0, "ts", pa.array(times, type=table.schema.field("ts").type))
    bad = tmp_path / "unsorted.parquet"
    pq.write_table(swapped, bad)
    roles = ColumnRoles(**FUTURES_ROLES)
    with pytest.raises(DataError) as expected:
        load_windows(bad, roles=roles, **WINDOW)
    with pytest.raises(DataError) as caught:
        stream_windows(
            bad, tmp_path / "c3", max_host_bytes=1 << 30, roles=roles, chunk_rows=16, **WINDOW
        )
    assert _one_line(caught.value) == str(expected.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "junk.parquet",
        "mine.parquet",
        "unsorted.parquet",
    ]


def test_a_named_cache_of_another_file_is_refused(sample_parquet: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    stream_windows(sample_parquet, cache, max_host_bytes=1 << 30, **WINDOW)
    other = _interleaved(tmp_path / "mine.parquet")
    with pytest.raises(DataError) as caught:
        stream_windows(
            other,
            cache,
            max_host_bytes=1 << 30,
            roles=ColumnRoles(**FUTURES_ROLES),
            check_source=True,
            **WINDOW,
        )
    assert re.search(r"holds the row cache of .*sample\.parquet", _one_line(caught.value))


def _resident_file_bytes() -> int:
    """This process's resident file-backed memory (RssFile), read from the kernel."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_reading_every_batch_of_a_cache_keeps_the_file_out_of_resident_memory(
    sample_parquet: Path, tmp_path: Path
) -> None:
    """Counted by the kernel, not by the cache: gathering the same windows through the
    mapping makes most of the cache resident, reading them does not."""
    data = stream_windows(sample_parquet, tmp_path / "cache", max_host_bytes=1 << 30, **WINDOW)
    rows = data.whole.rows
    assert rows.files is not None
    cache_bytes = sum(p.stat().st_size for p in (tmp_path / "cache").glob("*.bin"))
    growth = {}
    for way in ("read", "mapped"):
        rows.files.release()
        before = _resident_file_bytes()
        peak = 0
        for indices in np.array_split(np.random.default_rng(0).permutation(len(data.whole)), 80):
            if way == "read":
                data.whole.batch(indices)
            else:
                first = data.whole.starts[indices]
                np.take(rows.observed, first[:, None] + np.arange(15), axis=0)
            peak = max(peak, _resident_file_bytes() - before)
        growth[way] = peak
    assert growth["mapped"] > cache_bytes // 4  # the window through the mapping: resident
    assert growth["read"] < (1 << 20)  # read into the batch: a copy from the page cache


def test_prefetch_yields_the_source_in_order_and_raises_its_error() -> None:
    with Prefetch(iter(range(50)), depth=3) as prefetch:
        got = []
        while (item := prefetch.next()) is not None:
            got.append(item)
    assert got == list(range(50))

    def failing():
        yield 1
        raise DataError("bad row 7")

    with Prefetch(failing()) as prefetch:
        assert prefetch.next() == 1
        with pytest.raises(DataError, match="bad row 7"):
            prefetch.next()
    # A consumer that stops early stops the thread (close() returns).
    with Prefetch(iter(range(10**6)), depth=2) as prefetch:
        assert prefetch.next() == 0
    assert os.getpid()  # reached: the thread was joined


def test_a_cache_build_says_how_far_each_pass_is_and_a_reuse_says_nothing(
    sample_parquet: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    cache = tmp_path / "cache"
    stream_windows(
        sample_parquet,
        cache,
        max_host_bytes=1 << 30,
        chunk_rows=10_000,
        progress=lines.append,
        **WINDOW,
    )
    rows = pq.ParquetFile(sample_parquet).metadata.num_rows  # 41,400: five chunks a pass
    for number in (1, 2, 3):
        done = [line for line in lines if f"pass {number} of 3" in line]
        assert len(done) == 5, lines
        assert done[-1].endswith(f"{rows:,} of {rows:,} rows")
        assert done[0].endswith(f"10,000 of {rows:,} rows")
    lines.clear()
    stream_windows(sample_parquet, cache, max_host_bytes=1 << 30, progress=lines.append, **WINDOW)
    assert lines == []
