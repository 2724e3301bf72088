"""Windows of a Parquet file larger than memory: :func:`load_windows`'s result from a row cache.

:func:`stream_windows` takes what :func:`tft.data.windows.load_windows` takes, plus a cache folder and
the host memory to stay within; the rows come from :func:`tft.data.streamed.row_cache.cached_rows` (NOTE
[Row cache]) instead of a table held in memory. Windows, splits and the normaliser are those
of the in-memory path (the scales to the last bits of NOTE [Streaming statistics]).
:func:`chunk_rows_for` sizes the chunks the file is read in from the memory allowed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tft.data.columns import ColumnRoles, _read_schema
from tft.data.normalize import Normalizer
from tft.data.sources.data_source import DataPaths, DataSource
from tft.data.sources.parquet_folder import footer
from tft.data.splits import SplitTimes, check_window_options, part_windows, split_starts_ns
from tft.data.streamed.build_progress import BuildProgress
from tft.data.streamed.row_cache import cached_rows
from tft.data.windows import WindowedData, windowed_data

__all__ = ["chunk_rows_for", "in_memory_bytes", "stream_windows"]

# What the in-memory path holds per value of a column read, measured on make-data files
# (464 MB: 2.0 GB resident for 2.07M rows x 71 columns): the Arrow table (8 bytes), the
# float64 copies of a column at a time and the float32 arrays of every role.
_IN_MEMORY_BYTES_PER_VALUE = 14
# A chunk's Arrow columns (8 bytes a value), its float64 copies and its float32 rows, about
# four times the chunk's own size, in a quarter of the memory allowed.
_CHUNK_BYTES_PER_VALUE = 8 * 4 * 4


def in_memory_bytes(path: DataPaths) -> int:
    """About what :func:`tft.data.windows.load_windows` holds for ``path``, a file or
    several (from their footers alone)."""
    try:
        footers = [footer(file) for file in DataSource.of(path).files()]
    except Exception:  # noqa: BLE001 - load_windows reports a bad file in its own words
        return 0
    return sum(m.num_rows * m.num_columns for m in footers) * _IN_MEMORY_BYTES_PER_VALUE


def chunk_rows_for(path: DataSource, max_host_bytes: int) -> int:
    """Rows per chunk so that reading a chunk stays well within ``max_host_bytes`` with what
    the process holds already (NOTE [Chunks sized by what is left])."""
    num_columns = max(len(_read_schema(path).names), 1)
    left = max(max_host_bytes - resident_bytes(), max_host_bytes // 4)
    return int(np.clip(left // (num_columns * _CHUNK_BYTES_PER_VALUE), 1024, 1 << 20))


# NOTE [Chunks sized by what is left]
# --max-host-memory is the process's resident memory, and a training process holds about
# 0.45 GiB before it reads a row (torch's and Arrow's libraries, the interpreter). Chunks sized
# from the whole budget read 195,000 rows at a time from a 40-contract file of 32 features (39
# columns), and the row cache's three passes peaked at 0.90, 0.93 and 1.05 GiB resident for a
# 1 GB budget, where training then held 0.56 GiB. The chunks are now sized from the budget less
# what the process holds when the build starts (a quarter of the budget at least, so a process
# already past it still reads in chunks of a bounded size).


def resident_bytes() -> int:
    """The process's resident memory now (``/proc/self/statm``); 0 where there is no such
    file (not Linux): the chunks are then sized from the whole budget."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


def stream_windows(
    path: DataPaths,
    cache: Path,
    *,
    max_host_bytes: int,
    roles: ColumnRoles | None = None,
    encoder_length: int,
    horizon: int,
    split_fractions: Sequence[float] | None = (0.7, 0.15, 0.15),
    split_times: SplitTimes | None = None,
    normalizer: Normalizer | None = None,
    check_source: bool = False,
    chunk_rows: int | None = None,
    progress: BuildProgress | None = None,
    grow_from: Sequence[Path] = (),
) -> WindowedData:
    """Like :func:`tft.data.windows.load_windows`, with the rows in a cache folder instead of memory.

    Args:
        cache: the cache folder of this file (built on first use, NOTE [Row cache]).
        max_host_bytes: the host memory the data may hold: it sizes the chunks the file is
            read in and how much of the mapped cache stays resident between drops.
        check_source: refuse a cache folder made from another file instead of rebuilding it
            (a folder the user named).
        chunk_rows: rows per chunk instead of the size ``max_host_bytes`` gives.
        progress: told what the cache's build is doing, a line after each chunk it reads
            (``building the row cache, pass 2 of 3 (...): 1,200,000 of 4,000,000 rows``).
        grow_from: other cache folders the cache may grow from where it has none (NOTE [A
            cache grown from another] in :mod:`tft.data.streamed.row_cache`).

    Raises:
        DataError, ConfigError: as :func:`tft.data.windows.load_windows`, and a cache folder of
            another file when ``check_source`` is set.
    """
    path = DataSource.of(path)
    check_window_options(encoder_length, horizon, split_fractions, split_times)
    schema = _read_schema(path)
    timezone = (roles or (normalizer.roles if normalizer else None) or ColumnRoles()).timezone
    starts_ns = split_starts_ns(split_times, timezone) if split_times is not None else None
    rows, meta, distinct_times, cache_use = cached_rows(
        path,
        cache,
        roles=roles,
        normalizer=normalizer,
        split_fractions=split_fractions,
        split_starts_ns=starts_ns,
        chunk_rows=chunk_rows or chunk_rows_for(path, max_host_bytes),
        check_source=check_source,
        progress=progress,
        grow_from=grow_from,
    )
    # A cache is reused only with the normaliser asked for (or fitted as asked).
    fitted = Normalizer.from_dict(meta.normalizer)
    symbol_bounds = np.asarray(meta.symbol_bounds, dtype=np.int64)
    split = (None if starts_ns is not None else split_fractions, starts_ns)
    window = (encoder_length, horizon)
    starts, cuts = part_windows(path, rows.time_ns, symbol_bounds, distinct_times, split, window)
    if rows.files is not None:
        rows.files.release()
    unknown, warmup = meta.unknown_totals(), meta.warmup_totals()
    data = windowed_data(rows, starts, fitted, schema, unknown, window, warmup, cuts)
    return dataclasses.replace(data, cache_use=cache_use)
