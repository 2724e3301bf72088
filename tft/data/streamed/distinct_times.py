"""The sorted distinct times of a file's rows, gathered chunk by chunk on disk in bounded memory.

NOTE [Distinct times on disk]
A split by shares cuts the sorted distinct times of the rows (NOTE [A split by shares or by
dates] in :mod:`tft.data.splits`), so a row cache's first pass gathers them. One symbol's minute
bars have as many distinct times as rows, and held in memory, merged there, they were what a
build's memory grew with: 8 bytes a time, about four times that while merged (the old times,
their concatenation with a chunk's, the sort's buffer and the deduplicated result), so that a
cold build peaked at 0.95 GiB at 60M bars and 1.34 GiB at 150M where training held 0.49 GiB.
So they live in files in the build's own folder:

- *Runs.* Each chunk's distinct times are held until there are ``BLOCK_TIMES`` of them, then
  written as one sorted run of distinct times.
- *Merges.* A run is merged with the run before it once that one is at most twice its size
  (as a merge sort's passes), so there are about log2(times / ``BLOCK_TIMES``) runs at any time
  and each time is copied about as many times. Two runs merge a block of each at a time: all of
  both blocks up to the smaller of their last times is merged and written, so nothing written
  later can come before it or repeat it. The blocks are read with ``np.fromfile``, into the
  process's own buffers: a mapping would leave each page it read resident in the process (it
  counts in its resident memory) until unmapped, the very growth this avoids.
- *The result* is the cache's ``distinct_times.bin``, mapped read-only, where the cuts read a
  few of its times.

Memory is then a few blocks (8 MiB each) at any number of rows; the price is writing each time
about log2(times / ``BLOCK_TIMES``) times (10M times: a few seconds, against minutes of build).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["BLOCK_TIMES", "DistinctTimes", "merge_time_files", "read_time_file", "sorted_distinct"]

#: Times held in memory before they are written as a run, and read a block at a time in a merge.
BLOCK_TIMES = 1 << 20


class DistinctTimes:
    """Times added chunk by chunk, kept sorted and distinct in files under ``scratch``
    (NOTE [Distinct times on disk])."""

    def __init__(self, scratch: Path, block_times: int = BLOCK_TIMES) -> None:
        self.scratch = scratch
        self.block_times = block_times
        self._held: list[np.ndarray] = []
        self._held_times = 0
        self._runs: list[tuple[Path, int]] = []  # (file, times), oldest first
        self._files_made = 0

    def add(self, times: np.ndarray) -> None:
        """Add ``times`` (int64 ns, any order, repeats allowed)."""
        distinct = sorted_distinct([times.astype(np.int64, copy=False)])
        self._held.append(distinct)
        self._held_times += len(distinct)
        if self._held_times >= self.block_times:
            self._write_run()

    def finish(self, target: Path) -> np.ndarray:
        """Write every time added, sorted and distinct, to ``target``; its times, mapped."""
        self._write_run()
        while len(self._runs) > 1:
            self._merge_last_two()
        if self._runs:
            os.replace(self._runs[0][0], target)
        else:
            target.write_bytes(b"")
        self._runs = []
        return read_time_file(target)

    def _write_run(self) -> None:
        if not self._held:
            return
        run = sorted_distinct(self._held)
        self._held, self._held_times = [], 0
        path = self._new_file()
        run.tofile(path)
        self._runs.append((path, len(run)))
        while len(self._runs) > 1 and self._runs[-2][1] <= 2 * self._runs[-1][1]:
            self._merge_last_two()

    def _merge_last_two(self) -> None:
        (older, _), (newer, _) = self._runs[-2:]
        merged = self._new_file()
        count = merge_time_files(older, newer, merged, self.block_times)
        older.unlink()
        newer.unlink()
        self._runs[-2:] = [(merged, count)]

    def _new_file(self) -> Path:
        self._files_made += 1
        return self.scratch / f"times-{self._files_made}.bin"


def merge_time_files(
    first: Path, second: Path, target: Path, block_times: int = BLOCK_TIMES
) -> int:
    """Merge two files of sorted distinct int64 times into ``target``, sorted and distinct, a
    block of each at a time (NOTE [Distinct times on disk]); how many times ``target`` holds."""
    written = 0
    with open(first, "rb") as one, open(second, "rb") as other, open(target, "wb") as out:
        a = np.fromfile(one, dtype=np.int64, count=block_times)
        b = np.fromfile(other, dtype=np.int64, count=block_times)
        while len(a) or len(b):
            if len(a) and len(b):
                # Everything up to the smaller last time: what comes later in either file is
                # past it. The block ending there is taken whole, so each round takes one.
                limit = min(a[-1], b[-1])
                take_a = int(np.searchsorted(a, limit, side="right"))
                take_b = int(np.searchsorted(b, limit, side="right"))
            else:
                take_a, take_b = len(a), len(b)
            piece = sorted_distinct([a[:take_a], b[:take_b]])
            piece.tofile(out)
            written += len(piece)
            a, b = a[take_a:], b[take_b:]
            if not len(a):
                a = np.fromfile(one, dtype=np.int64, count=block_times)
            if not len(b):
                b = np.fromfile(other, dtype=np.int64, count=block_times)
    return written


def sorted_distinct(runs: list[np.ndarray]) -> np.ndarray:
    """The distinct values of ``runs``, sorted. Stable sorting (timsort for int64) finds sorted
    runs and merges them, linear in their length where a sort from scratch is not: a chunk's
    times are sorted within each symbol, and the blocks merged are sorted."""
    every = np.concatenate(runs)
    every.sort(kind="stable")
    if len(every) == 0:
        return every
    return every[np.concatenate([[True], every[1:] != every[:-1]])]


def read_time_file(path: Path) -> np.ndarray:
    """A file of int64 times, mapped read-only (an empty array for an empty file, which cannot
    be mapped): only the pages read become resident."""
    if path.stat().st_size == 0:
        return np.empty(0, dtype=np.int64)
    return np.memmap(path, dtype=np.int64, mode="r")
