"""A folder's row cache re-encoded where its files changed or went: only the symbols they held.

NOTE [A cache re-encoded where its files changed]
A late fix to one contract's month, a file replaced by a corrected export, a contract's oldest
month archived away: each can change every later row of that contract (the next file's first
log return, its warm-up rows), but no row of another contract. So the cache keeps, for each of
a folder's files, the symbols it holds and each one's first bar there
(``RowCacheMeta.file_symbols``), and each symbol's own counts of warm-up rows and unknown
categories. Where files changed or went, the symbols they held, before and now, and those of
any new file, are touched: the files holding a touched symbol are read again, twice (counted,
then encoded), keeping those symbols' rows alone, each symbol from its first bar as a build
reads it; every other symbol's block is copied by the kernel to its new place (no byte through
this process); the distinct times are counted again from the cache's times. The result is the
build's: the same rows, windows and scales (a test compares them array by array).

The scales stay the cache's under the conditions a growth keeps them (NOTE [A cache grown by
new files] in :mod:`tft.data.streamed.updates.cache_growth`): the run's own normaliser, or a split by
dates where every bar the changed and removed files held, and every bar of the changed and new
files now, is at or after the first date, so the training rows are those the scales were
fitted on. Anything else rebuilds the whole cache: a split by shares, a changed training row,
a symbol that comes or goes, a changed column, one series (no symbol column: every file holds
it), a static column whose code changes within a touched symbol, a cache made before it kept
its files' symbols. The build then says what is wrong, if anything is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tft.data.columns import _read_schema
from tft.data.normalize import Normalizer
from tft.data.sources.data_source import DataSource
from tft.data.streamed.build_progress import BuildProgress, rows_line
from tft.data.streamed.cache_meta import (
    DISTINCT_TIMES_FILE,
    RowCacheMeta,
    SourceFile,
    counts_by_symbol,
    with_symbols,
)
from tft.data.streamed.distinct_times import DistinctTimes
from tft.data.streamed.file_scan import RowWalker
from tft.data.streamed.read_order import read_order
from tft.data.streamed.row_writer import RoleFiles, encode_rows
from tft.data.streamed.updates.cache_rewrite import (
    copy_symbol_blocks,
    count_kept_rows,
    rewrite_cache,
)
from tft.data.warmup import RunningWarmup, real_inputs
from tft.errors import DataError

__all__ = ["reencode_touched"]


def reencode_touched(
    path: DataSource,
    folder: Path,
    meta: RowCacheMeta,
    source: SourceFile,
    floor_ns: int,
    reading: tuple[int, BuildProgress | None],
) -> tuple[RowCacheMeta, str] | None:
    """The cache in ``folder`` with the symbols of the files changed, removed or added since
    ``meta`` encoded again, and a line of what it did; None where nothing changed or went,
    or it must be rebuilt instead (NOTE [A cache re-encoded where its files changed]).

    Args:
        meta: the description of the cache, encoded the way the run asks.
        source: the folder as it is now.
        floor_ns: the earliest time a bar read may have with the cache's scales kept (as
            :func:`tft.data.streamed.updates.cache_growth.grow_cache` takes it).
        reading: rows per chunk, and who hears how far the re-encoding is.
    """
    before, now = meta.source.files(), source.files()
    changed = [name for name, part in before.items() if name in now and now[name] != part]
    removed = [name for name in before if name not in now]
    normalizer = Normalizer.from_dict(meta.normalizer)
    roles = normalizer.roles
    if (
        not (changed or removed)
        or not path.many
        or roles.symbol is None
        or any(name not in meta.file_symbols for name in before)
        or meta.columns != str(_read_schema(path))
    ):
        return None
    chunk_rows, progress = reading
    own = path.files_by_resolved()
    fresh = [own[name] for name in sorted(now) if name in changed or name not in before]
    try:
        fresh_bars = (
            read_order(path, roles, roles.symbol, chunk_rows, progress, files=fresh).file_symbols()
            if fresh
            else {}
        )
    except DataError:
        return None  # the build says what is wrong
    read_again = [*(meta.file_symbols[name] for name in [*changed, *removed]), *fresh_bars.values()]
    if any(first < floor_ns for bars in read_again for first in bars.values()):
        return None  # the training rows, and so the scales, would move
    touched = sorted({symbol for bars in read_again for symbol in bars})
    if not set(touched) <= set(normalizer.symbols):
        return None
    kept = {name: meta.file_symbols[name] for name in now if name in before and name not in changed}
    file_symbols = dict(sorted({**kept, **fresh_bars}.items()))
    holding = [own[name] for name, bars in file_symbols.items() if set(bars) & set(touched)]
    described = meta.model_copy(update={"file_symbols": file_symbols})
    written = rewrite_cache(
        folder,
        source,
        floor_ns,
        lambda partial: _reencoded(path, partial, folder, described, holding, touched, reading),
    )
    if written is None:
        return None
    return written, _said(written, touched, holding, (len(changed), len(removed)))


def _walker(path: DataSource, normalizer: Normalizer, touched: np.ndarray) -> RowWalker:
    """A walker from each symbol's first bar, keeping the touched symbols' rows alone."""
    roles = normalizer.roles
    warmup = RunningWarmup(real_inputs(roles))
    return RowWalker(path, roles, roles.symbol, normalizer.symbols, warmup, only=touched)


def _reencoded(
    path: DataSource,
    partial: Path,
    folder: Path,
    meta: RowCacheMeta,
    holding: Sequence[Path],
    touched_symbols: list[str],
    reading: tuple[int, BuildProgress | None],
) -> RowCacheMeta | None:
    """The cache in ``folder`` (``meta`` its description but for the files' symbols, those of
    the folder now) with the touched symbols encoded again from the files ``holding`` them,
    written to ``partial`` (no source yet), or None."""
    chunk_rows, progress = reading
    normalizer = Normalizer.from_dict(meta.normalizer)
    roles, symbols = normalizer.roles, normalizer.symbols
    touched = np.isin(np.asarray(symbols, dtype=object), touched_symbols)
    order = read_order(path, roles, roles.symbol, chunk_rows, progress, files=list(holding))
    bounds = np.asarray(meta.symbol_bounds, dtype=np.int64)
    counts = np.diff(bounds)
    read = rows_line(progress, "counting the touched symbols' rows")
    counter = _walker(path, normalizer, touched)
    counts[touched] = count_kept_rows(order, counter, chunk_rows, read)[touched]
    if not counts.all():
        return None  # a symbol left with no rows: its symbols are the build's to find
    new_bounds = np.concatenate([[0], np.cumsum(counts)])
    num_rows = int(new_bounds[-1])
    files = RoleFiles(partial, meta.widths, num_rows)
    walker = _walker(path, normalizer, touched)
    try:
        copy_symbol_blocks(files, folder, bounds, new_bounds, np.flatnonzero(~touched).tolist())
        unknown = encode_rows(order, files, walker, new_bounds[:-1].copy(), normalizer, reading)
    finally:
        files.close()
    width = meta.widths.get("static", 0)
    if not _statics_constant(partial, width, new_bounds, touched, chunk_rows):
        return None
    distinct = _count_distinct_times(partial, num_rows, chunk_rows)
    again = set(touched_symbols)
    return meta.model_copy(
        update={
            "num_rows": num_rows,
            "symbol_bounds": new_bounds.tolist(),
            "unknown_rows": with_symbols(
                meta.unknown_rows, counts_by_symbol(symbols, unknown), again
            ),
            "warmup_rows": with_symbols(
                meta.warmup_rows, walker.warmup.warmup_counts_by_symbol(symbols), again
            ),
            "distinct_times": distinct,
            "last_bars": {
                symbol: walker.carry[code][:2] if touched[code] else meta.last_bars[symbol]
                for code, symbol in enumerate(symbols)
            },
        }
    )


def _statics_constant(
    partial: Path, width: int, bounds: np.ndarray, touched: np.ndarray, chunk_rows: int
) -> bool:
    """Whether every touched symbol's static codes are one from its first row to its last (a
    static column whose value changes is the build's to resolve or refuse); read a chunk at
    a time (NOTE [Counting times read, not mapped])."""
    if width == 0:
        return True
    row_bytes = width * np.dtype(np.int64).itemsize
    with open(partial / "static.bin", "rb") as static:
        for code in np.flatnonzero(touched).tolist():
            begin, end = int(bounds[code]), int(bounds[code + 1])
            static.seek(begin * row_bytes)
            first = np.fromfile(static, dtype=np.int64, count=width)
            static.seek(begin * row_bytes)
            for at in range(begin, end, chunk_rows):
                rows = min(chunk_rows, end - at)
                block = np.fromfile(static, dtype=np.int64, count=rows * width)
                if (block.reshape(rows, width) != first).any():
                    return False
    return True


def _count_distinct_times(partial: Path, num_rows: int, chunk_rows: int) -> int:
    """The distinct times of the rows written to ``partial``, counted a chunk at a time and
    written to its distinct-times file (NOTE [Distinct times on disk]).

    NOTE [Counting times read, not mapped]
    The cache's files are read here a chunk at a time, not mapped: the pages of a mapping stay
    the process's resident memory once read (0.91 GiB at the peak of re-encoding one contract
    of a 60M-bar history, against 0.53 GiB for its build), a chunk read is freed."""
    distinct = DistinctTimes(partial)
    with open(partial / "time_ns.bin", "rb") as times:
        for _ in range(0, num_rows, chunk_rows):
            distinct.add(np.fromfile(times, dtype=np.int64, count=chunk_rows))
    return len(distinct.finish(partial / DISTINCT_TIMES_FILE))


def _said(
    written: RowCacheMeta,
    touched: list[str],
    holding: Sequence[Path],
    changed_removed: tuple[int, int],
) -> str:
    """The line of what a re-encoding reused and did."""
    bounds = np.asarray(written.symbol_bounds, dtype=np.int64)
    symbols = Normalizer.from_dict(written.normalizer).symbols
    rows = sum(int(bounds[symbols.index(s) + 1] - bounds[symbols.index(s)]) for s in touched)
    why = " and ".join(
        f"{count:,} {what} {'file' if count == 1 else 'files'}"
        for count, what in zip(changed_removed, ("changed", "removed"), strict=True)
        if count
    )
    others = len(symbols) - len(touched)
    return (
        f"reused the encoded rows of {others:,} of {len(symbols):,} symbols and encoded "
        f"again the {rows:,} rows of {', '.join(touched)} from {len(holding):,} "
        f"{'file' if len(holding) == 1 else 'files'} ({why} held them)"
    )
