"""The role files of a row cache, read a window at a time: what a batch from the cache reads.

NOTE [Reading windows from the cache]
A batch reads each of its windows' rows from each role's file with one positioned read
(``os.preadv`` into the batch's own array): a copy from the kernel's page cache, which is not
this process's memory, with the GIL released while it copies. Gathering through the mapping
instead would fault the pages in, and a fault maps far more than the window (the kernel maps
whole folios and the pages around a fault): measured on a 5 GB file, 1.2 GB resident after
about 250 MB of windows, and 9.4 ms a batch of 64 windows with the pages dropped after each,
against 4 to 5 ms read.
The mappings stay for what reads a whole role at once (every target, the timestamps), and
:meth:`RowFiles.release` drops their pages after such a read.
"""

from __future__ import annotations

import mmap
import os
import weakref
from pathlib import Path

import numpy as np

__all__ = ["RowFiles"]


class RowFiles:
    """Open role files of a row cache (``<role>.bin``, row-major) and their mappings.

    Args:
        folder: the cache folder.
        layout: each role's (dtype, columns per row; None for a 1-D role).
        maps: the read-only mappings of the same files (dropped by :meth:`release`).
    """

    def __init__(
        self, folder: Path, layout: dict[str, tuple[np.dtype, int | None]], maps: list[mmap.mmap]
    ) -> None:
        self._layout = layout
        self._maps = maps
        self._fds = {role: os.open(folder / f"{role}.bin", os.O_RDONLY) for role in layout}
        weakref.finalize(self, _close_all, list(self._fds.values()))

    def windows(self, role: str, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows ``start .. start + length - 1`` of ``role`` for each start: ``(B, length)``
        for a 1-D role, ``(B, length, columns)`` for a 2-D one."""
        dtype, width = self._layout[role]
        shape = (len(starts), length) if width is None else (len(starts), length, width)
        out = np.empty(shape, dtype=dtype)
        row_bytes = dtype.itemsize * (1 if width is None else width)
        if out.size == 0:
            return out
        window_bytes = length * row_bytes
        view = out.data.cast("B")
        fd = self._fds[role]
        for i, start in enumerate(starts.tolist()):
            part = view[i * window_bytes : (i + 1) * window_bytes]
            if os.preadv(fd, [part], start * row_bytes) != window_bytes:
                raise OSError(f"row cache file {role}.bin is shorter than its rows.json says")
        return out

    def release(self) -> None:
        """Drop the pages a whole-role read faulted into the mappings (NOTE [Reading windows
        from the cache])."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        for mapping in self._maps:
            mapping.madvise(mmap.MADV_DONTNEED)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
