"""How far a row cache's build is: a line after each chunk of each of its three passes over
the file (NOTE [Row cache] in :mod:`tft.data.streamed.row_cache`), and of the pass that puts a
folder's files in order before them, for whoever waits on it."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["BuildProgress", "RowsRead", "build_pass", "rows_line"]

RowsRead = Callable[[int, int], None]
"""Called after each chunk with (rows read so far, rows in the file)."""

BuildProgress = Callable[[str], None]
"""Called with a line of what a row cache's build is doing."""


def build_pass(progress: BuildProgress | None, number: int, what: str) -> RowsRead | None:
    """The rows-read callback of pass ``number`` of a build (None where nobody listens), for
    :func:`tft.data.streamed.file_scan.read_chunks`."""
    return rows_line(progress, f"pass {number} of 3 ({what})")


def rows_line(progress: BuildProgress | None, what: str) -> RowsRead | None:
    """The rows-read callback of a build's step ``what`` (None where nobody listens)."""
    if progress is None:
        return None
    return lambda done, total: progress(
        f"building the row cache, {what}: {done:,} of {total:,} rows"
    )
