"""A folder's row cache grown by the folder's new files: only their rows are read and encoded.

NOTE [A cache grown by new files]
A trader's folder gains a file a day; rebuilding its row cache would read and encode years of
bars for one day of them. So where every file the cache was made from is still there as it
was, the folder's columns are the same, and the cache was encoded the way asked, only the new
files are read, twice (each symbol's new rows counted, then encoded), the cache's rows are
copied to their new places by the kernel (each symbol's block moves down by the new rows of
the symbols before it; no byte passes through this process), and the new rows are encoded
after each symbol's block. The result is the build's: the same rows, windows and scales.

The scales are the cache's own, fitted on its build's training rows. With the run's normaliser
(``predict``, a resumed run) that is what a build uses anyway. A run fitting its scales on a
split by dates grows only when every new bar is at or after the first date: its training rows,
and so its scales, are unchanged. A split by shares moves with every new bar, so that run
rebuilds, as does one fitted on every row (no split). The new rows continue each symbol's
series: the first one's target transform is taken against the symbol's last bar, which the
cache keeps (``RowCacheMeta.last_bars``), and every symbol's inputs are past their warm-up (a
symbol whose rows were all warm-up so far rebuilds). Files changed or removed re-encode the
symbols they held, under the same conditions (NOTE [A cache re-encoded where its files
changed] in :mod:`tft.data.streamed.updates.cache_reencode`). Anything else rebuilds the whole cache:
a new column, a new symbol, a static column whose value changes, a new bar not after its
symbol's last; the build then says what is wrong, if anything is.
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
    add_counts,
    counts_by_symbol,
)
from tft.data.streamed.distinct_times import DistinctTimes, merge_time_files
from tft.data.streamed.file_scan import RowWalker
from tft.data.streamed.read_order import ReadOrder, read_order
from tft.data.streamed.row_writer import RoleFiles, encode_rows
from tft.data.streamed.updates.cache_rewrite import (
    copy_symbol_blocks,
    count_kept_rows,
    rewrite_cache,
)
from tft.data.warmup import RunningWarmup, real_inputs

__all__ = ["grow_cache"]


def grow_cache(
    path: DataSource,
    folder: Path,
    meta: RowCacheMeta,
    source: SourceFile,
    floor_ns: int,
    reading: tuple[int, BuildProgress | None],
    grown_from: Path | None = None,
) -> tuple[RowCacheMeta, str] | None:
    """The cache in ``folder`` grown by the files ``source`` has and ``meta``'s lacks, and a
    line of what it reused; None where it must be rebuilt instead (NOTE [A cache grown by
    new files]).

    Args:
        meta: the description of the cache grown, encoded the way the run asks.
        source: the folder as it is now.
        floor_ns: the earliest time a new bar may have with the cache's scales kept
            (:data:`NO_FLOOR` with the run's own normaliser; the first date of a split by
            dates the scales were fitted on).
        reading: rows per chunk, and who hears how far the build is.
        grown_from: the cache folder whose rows are reused, where it is not ``folder`` (the
            cache of fewer of the same files: NOTE [A cache grown from another]); ``folder``
            when None.
    """
    if not meta.source.unchanged_in(source):
        return None
    before, own = meta.source.files(), path.files_by_resolved()
    added = [own[name] for name in sorted(source.files()) if name not in before]
    if not added:
        return None
    counts = np.diff(np.asarray(meta.symbol_bounds, dtype=np.int64))
    normalizer = Normalizer.from_dict(meta.normalizer)
    if (
        meta.columns != str(_read_schema(path))
        or sorted(meta.last_bars) != sorted(normalizer.symbols)
        or not counts.all()
    ):
        return None
    reused = grown_from if grown_from is not None else folder
    grown = rewrite_cache(
        folder,
        source,
        floor_ns,
        lambda partial: _grown(path, reused, partial, meta, normalizer, added, floor_ns, reading),
    )
    if grown is None:
        return None
    new_rows = grown.num_rows - meta.num_rows
    whose = "its" if grown_from is None else f"the row cache {grown_from.name}'s"
    return grown, (
        f"reused the encoded rows of {whose} {len(before):,} "
        f"{'file' if len(before) == 1 else 'files'} and encoded the {new_rows:,} "
        f"rows of {len(added):,} new {'file' if len(added) == 1 else 'files'}"
    )


def _walker(path: DataSource, normalizer: Normalizer, meta: RowCacheMeta) -> RowWalker:
    """A walker over the new files that carries on from the cache's last bars, every input
    past its warm-up."""
    roles = normalizer.roles
    warmup = RunningWarmup(real_inputs(roles))
    walker = RowWalker(path, roles, roles.symbol, normalizer.symbols, warmup)
    for code, symbol in enumerate(normalizer.symbols):
        time_ns, value = meta.last_bars[symbol]
        walker.carry[code] = (time_ns, value, -1)
        warmup.seen[code] = np.ones(len(warmup.names), dtype=bool)
    return walker


def _grown(
    path: DataSource,
    reused: Path,
    partial: Path,
    meta: RowCacheMeta,
    normalizer: Normalizer,
    added: Sequence[Path],
    floor_ns: int,
    reading: tuple[int, BuildProgress | None],
) -> RowCacheMeta | None:
    """The cache in ``reused`` grown, written to ``partial`` (no description yet), or None."""
    chunk_rows, progress = reading
    roles = normalizer.roles
    order = read_order(path, roles, roles.symbol, chunk_rows, progress, files=list(added))
    new_file = partial / "new_times.bin"
    new_counts, new_times = _count_new_rows(
        path, order, normalizer, meta, new_file, (chunk_rows, progress)
    )
    if len(new_times) == 0 or new_times[0] < floor_ns:
        return None
    bounds = np.asarray(meta.symbol_bounds, dtype=np.int64)
    grown_bounds = np.concatenate([[0], np.cumsum(np.diff(bounds) + new_counts)])
    num_rows = int(grown_bounds[-1])
    files = RoleFiles(partial, meta.widths, num_rows)
    try:
        copy_symbol_blocks(files, reused, bounds, grown_bounds, range(len(normalizer.symbols)))
        written = grown_bounds[:-1] + np.diff(bounds)
        walker = _walker(path, normalizer, meta)
        unknown = encode_rows(order, files, walker, written, normalizer, reading)
    finally:
        files.close()
    if not _statics_kept(partial, meta, bounds, grown_bounds):
        return None
    distinct = merge_time_files(
        reused / DISTINCT_TIMES_FILE, new_file, partial / DISTINCT_TIMES_FILE
    )
    new_file.unlink()
    return meta.model_copy(
        update={
            "num_rows": num_rows,
            "symbol_bounds": grown_bounds.tolist(),
            "unknown_rows": add_counts(
                meta.unknown_rows, counts_by_symbol(normalizer.symbols, unknown)
            ),
            "file_symbols": {**meta.file_symbols, **order.file_symbols()},
            "distinct_times": distinct,
            "last_bars": {
                symbol: walker.carry[code][:2] for code, symbol in enumerate(normalizer.symbols)
            },
        }
    )


def _count_new_rows(
    path: DataSource,
    order: ReadOrder,
    normalizer: Normalizer,
    meta: RowCacheMeta,
    times_file: Path,
    reading: tuple[int, BuildProgress | None],
) -> tuple[np.ndarray, np.ndarray]:
    """Each symbol's kept rows in the new files, and their sorted distinct times, written to
    ``times_file`` (NOTE [Distinct times on disk])."""
    chunk_rows, progress = reading
    times = DistinctTimes(times_file.parent)
    read = rows_line(progress, "counting the new files' rows")
    counts = count_kept_rows(order, _walker(path, normalizer, meta), chunk_rows, read, times)
    return counts, times.finish(times_file)


def _statics_kept(
    partial: Path, meta: RowCacheMeta, bounds: np.ndarray, grown_bounds: np.ndarray
) -> bool:
    """Whether every symbol's static codes in its new rows are those of its old rows (a static
    column whose value changes is the build's to resolve or refuse)."""
    width = meta.widths.get("static", 0)
    if width == 0:
        return True
    static = np.memmap(partial / "static.bin", dtype=np.int64, mode="r").reshape(-1, width)
    for code in range(len(bounds) - 1):
        old = static[grown_bounds[code]]
        new = static[grown_bounds[code] + bounds[code + 1] - bounds[code] : grown_bounds[code + 1]]
        if (new != old).any():
            return False
    return True
