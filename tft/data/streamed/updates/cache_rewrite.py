"""A row cache written again from itself: grown by new files, or re-encoded where files
changed (NOTE [A cache grown by new files], NOTE [A cache re-encoded where its files
changed]), beside its folder and put in its place."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from tft.data.streamed.build_folder import building_beside, put_in_place
from tft.data.streamed.build_progress import RowsRead
from tft.data.streamed.cache_meta import META_FILE, RowCacheMeta, SourceFile
from tft.data.streamed.distinct_times import DistinctTimes
from tft.data.streamed.file_scan import RowWalker, read_chunks
from tft.data.streamed.read_order import ReadOrder
from tft.data.streamed.row_writer import ROLE_FILES, RoleFiles
from tft.errors import DataError

__all__ = ["NO_FLOOR", "copy_symbol_blocks", "count_kept_rows", "rewrite_cache"]

NO_FLOOR = -(2**63)
"""The floor of new bars' times where any new bar keeps the scales (a given normaliser)."""


def rewrite_cache(
    folder: Path,
    source: SourceFile,
    floor_ns: int,
    write: Callable[[Path], RowCacheMeta | None],
) -> RowCacheMeta | None:
    """The cache ``write`` writes into a fresh folder beside ``folder`` and describes, put in
    ``folder``'s place as the cache of ``source``; None, and ``folder`` left as it was, where
    ``write`` gives None or finds the data wrong (what is wrong is for a build to say, in
    the words it says it in).

    ``floor_ns`` is the earliest time a bar read may have with the cache's scales kept
    (:data:`NO_FLOOR` with the run's own normaliser; the first date of a split by dates the
    scales were fitted on).
    """
    try:
        with building_beside(folder) as partial:
            written = write(partial)
            if written is None:
                return None
            fitted_here = floor_ns != NO_FLOOR  # a run's own fit by dates still describes it
            written = written.model_copy(
                update={
                    "source": source,
                    "given_roles": written.given_roles if fitted_here else None,
                    "fitted_on": written.fitted_on if fitted_here else None,
                }
            )
            (partial / META_FILE).write_text(written.model_dump_json(indent=1), encoding="utf-8")
            put_in_place(partial, folder)
    except DataError:
        return None
    return written


def copy_symbol_blocks(
    files: RoleFiles, reused: Path, bounds: np.ndarray, new_bounds: np.ndarray, codes: Iterable[int]
) -> None:
    """Copy the rows of the symbols ``codes`` of every role file from the cache folder
    ``reused`` (each symbol's rows from ``bounds``) to their new places (from ``new_bounds``),
    in the kernel where it can."""
    codes = list(codes)
    for name in ROLE_FILES:
        for code in codes:
            span = (int(bounds[code]), int(bounds[code + 1]))
            files.copy_rows(name, reused / f"{name}.bin", span, int(new_bounds[code]))


def count_kept_rows(
    order: ReadOrder,
    walker: RowWalker,
    chunk_rows: int,
    read: RowsRead | None,
    times: DistinctTimes | None = None,
) -> np.ndarray:
    """Each of the walker's symbols' kept rows in ``order``'s files, their times added to
    ``times`` where given."""
    counts = np.zeros(len(walker.symbols), dtype=np.int64)
    for chunk in read_chunks(order, walker.columns(), chunk_rows, read):
        rows = walker.rows(chunk)
        counts += np.bincount(rows.symbol_index, minlength=len(counts))
        if times is not None:
            times.add(rows.time_ns)
    return counts
