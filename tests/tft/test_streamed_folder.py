"""A folder of Parquet files past the host's memory is streamed through the row cache a file at
a time, in an order that keeps each symbol's bars in time (NOTE [Streaming a folder in time
order]), and gives the windows of the same rows in one file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.tft.test_parquet_folder import write_folder
from tests.tft.test_streamed_windows import _assert_same
from tft.data.streamed.streamed_windows import stream_windows
from tft.data.windows import load_windows
from tft.errors import DataError

WINDOW = {"encoder_length": 12, "horizon": 3}
MEMORY = 1 << 30


def _shuffled_names(folder: Path, seed: int = 3) -> Path:
    """Rename every day file ``part-<k>.parquet``, ``k`` drawn so that the files' path order
    is not their time order (a later day often has the smaller name)."""
    files = sorted(folder.rglob("*.parquet"))
    numbers = np.random.default_rng(seed).permutation(len(files))
    for file, number in zip(files, numbers.tolist(), strict=True):
        file.rename(file.with_name(f"part-{number:03d}.parquet"))
    return folder


def test_a_folder_streamed_gives_the_one_files_windows(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = _shuffled_names(write_folder(sample_parquet, tmp_path / "bars"))
    lines: list[str] = []
    cache = tmp_path / "cache"
    streamed = stream_windows(
        folder, cache, max_host_bytes=MEMORY, chunk_rows=700, progress=lines.append, **WINDOW
    )
    # The folder in memory gives the one file's rows (test_parquet_folder.py); its columns
    # list the folders' key last.
    _assert_same(load_windows(folder, **WINDOW), streamed)
    np.testing.assert_array_equal(
        load_windows(sample_parquet, **WINDOW).whole.starts, streamed.whole.starts
    )
    assert any("putting the folder's files in time order" in line for line in lines)


def _interleaved_files(folder: Path, *, symbols: dict[str, tuple[slice, slice]]) -> Path:
    """Two files ``a`` and ``b``, each symbol's minutes ``symbols[name]`` in them."""
    folder.mkdir()
    times = np.datetime64("2026-03-02T14:30", "ns") + np.arange(400) * np.timedelta64(1, "m")
    close = 100 * np.exp(np.cumsum(np.random.default_rng(0).normal(0, 1e-3, 400)))
    for index, name in enumerate(("a.parquet", "b.parquet")):
        parts = [
            pa.table(
                {
                    "timestamp": times[span[index]],
                    "symbol": [symbol] * len(times[span[index]]),
                    "close": close[span[index]],
                }
            )
            for symbol, span in symbols.items()
        ]
        pq.write_table(pa.concat_tables(parts), folder / name)
    return folder


def _refused_streaming(folder: Path, cache: Path) -> str:
    with pytest.raises(DataError) as refused:
        stream_windows(folder, cache, max_host_bytes=MEMORY, split_fractions=None, **WINDOW)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{folder}: ")
    assert not cache.exists() and not list(cache.parent.glob(f"{cache.name}.partial-*"))
    return message


def test_a_symbols_bars_overlapping_in_two_files_are_refused_naming_both(
    tmp_path: Path,
) -> None:
    # Even minutes in one file, odd in the other: fine in memory, where rows are sorted.
    folder = _interleaved_files(
        tmp_path / "halves", symbols={"ES": (slice(0, 400, 2), slice(1, 400, 2))}
    )
    assert len(load_windows(folder, split_fractions=None, **WINDOW).whole) > 0
    message = _refused_streaming(folder, tmp_path / "cache")
    assert "the bars of ES in a.parquet (2026-03-02T14:30" in message
    assert "and in b.parquet (2026-03-02T14:31" in message and "overlap in time" in message
    assert "--max-host-memory" in message


def test_files_whose_symbols_cross_in_time_are_refused_naming_both(tmp_path: Path) -> None:
    # ES goes a then b; NQ goes b then a: no order of the two files keeps both in time.
    folder = _interleaved_files(
        tmp_path / "crossed",
        symbols={"ES": (slice(0, 100), slice(100, 200)), "NQ": (slice(300, 400), slice(0, 100))},
    )
    message = _refused_streaming(folder, tmp_path / "cache")
    assert "cannot be read in one order that keeps every symbol's bars in time" in message
    assert "the bars of ES in a.parquet come before those in b.parquet" in message
    assert "the bars of NQ in b.parquet come before those in a.parquet" in message


def test_a_bad_value_names_its_own_file_and_row(sample_parquet: Path, tmp_path: Path) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    day = sorted((folder / "symbol=NQ").iterdir())[4]
    table = pq.read_table(day)
    column = table["volatility_3"].to_numpy().copy()
    column[37] = np.nan
    pq.write_table(
        table.set_column(
            table.schema.get_field_index("volatility_3"), "volatility_3", pa.array(column)
        ),
        day,
    )
    with pytest.raises(DataError) as refused:
        stream_windows(folder, tmp_path / "cache", max_host_bytes=MEMORY, chunk_rows=500, **WINDOW)
    message = str(refused.value)
    assert message.startswith(f"{day}: column 'volatility_3' is null/NaN")
    assert "the first row 37 (null/NaN)" in message


def test_a_folder_cache_is_reused_and_rebuilt_when_a_file_is_added(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    last_day = sorted((folder / "symbol=ES").iterdir())[-1]
    held_back = pq.read_table(last_day)
    last_day.unlink()
    built: list[str] = []
    first = stream_windows(
        folder, tmp_path / "cache", max_host_bytes=MEMORY, progress=built.append, **WINDOW
    )
    reused: list[str] = []
    again = stream_windows(
        folder, tmp_path / "cache", max_host_bytes=MEMORY, progress=reused.append, **WINDOW
    )
    assert built and not reused
    assert len(again.whole) == len(first.whole)
    pq.write_table(held_back, last_day)
    grown = stream_windows(folder, tmp_path / "cache", max_host_bytes=MEMORY, **WINDOW)
    assert len(grown.whole) == len(first.whole) + held_back.num_rows
    assert int(pc.max(pq.read_table(last_day)["timestamp"]).value) == int(
        grown.whole.rows.time_ns[grown.whole.rows.symbol_index == 0].max()
    )


def test_each_files_footer_is_read_once_a_load(
    sample_parquet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    reads: Counter[str] = Counter()
    read_metadata = pq.read_metadata

    def counted(path: str, *args: object, **kwargs: object) -> pq.FileMetaData:
        reads[str(path)] += 1
        return read_metadata(path, *args, **kwargs)

    monkeypatch.setattr(pq, "read_metadata", counted)
    load_windows(folder, **WINDOW)
    stream_windows(folder, tmp_path / "cache", max_host_bytes=MEMORY, **WINDOW)
    files = list(folder.rglob("*.parquet"))
    assert sum(reads.values()) == len(files) and max(reads.values()) == 1


def test_one_bar_in_two_streamed_files_is_named_as_in_memory(tmp_path: Path) -> None:
    folder = _interleaved_files(
        tmp_path / "shared", symbols={"ES": (slice(0, 101), slice(100, 200))}
    )
    message = _refused_streaming(folder, tmp_path / "cache")
    assert "the bar of ES at 2026-03-02T16:10" in message
    assert "is in both a.parquet and b.parquet; keep it in one file" in message
