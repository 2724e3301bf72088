"""The windows of a file and their shuffle hold nothing per window (NOTE [Window starts without a
per-window array], NOTE [A shuffle with no per-window array]): the host memory of a streamed
file's windows does not grow with its rows."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tft.data.batch import WindowOrder
from tft.data.splits import StartRuns, part_windows, window_runs

ROWS = 10_000_000
WINDOW = (48, 12)


def _rising_times(path: Path, bounds: np.ndarray) -> np.ndarray:
    """A mapped file of each symbol's minute bars from one start, written a block at a time
    (the file is the kernel's page cache, not the process's memory)."""
    with open(path, "wb") as file:
        for begin, end in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            for block in range(begin, end, 1 << 20):
                stop = min(block + (1 << 20), end)
                minutes = np.arange(block - begin, stop - begin, dtype=np.int64)
                file.write((1_700_000_000 * 10**9 + minutes * 60 * 10**9).tobytes())
    return np.memmap(path, dtype=np.int64, mode="r")


def test_ten_million_rows_split_into_windows_allocate_no_per_window_array(
    tmp_path: Path,
) -> None:
    bounds = np.array([0, 3_000_000, 7_500_000, ROWS], dtype=np.int64)
    time_ns = _rising_times(tmp_path / "time_ns.bin", bounds)
    # The distinct times of three symbols starting together: the longest symbol's.
    distinct = time_ns[bounds[2] : bounds[3]]
    length = sum(WINDOW)
    tracemalloc.start()
    try:
        starts, cuts = part_windows(
            tmp_path, time_ns, bounds, distinct, ((0.7, 0.15, 0.15), None), WINDOW
        )
        order = WindowOrder(len(starts[0]), seed=5)
        first_batch = starts[0][order[0:256]]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 8 bytes a window would be 80 MB for the whole file alone.
    assert peak < 1 << 20, f"{peak:,} bytes allocated"
    assert cuts is not None
    assert len(starts[3]) == ROWS - 3 * (length - 1)
    for part, runs in enumerate(starts[:3]):
        lo = (np.iinfo(np.int64).min, *cuts)[part]
        hi = (*cuts, np.iinfo(np.int64).max)[part]
        # Each symbol's rows in the part, less a window's length: counted from the times.
        expected = 0
        for begin, end in zip(bounds[:-1], bounds[1:], strict=True):
            inside = int(np.count_nonzero((time_ns[begin:end] >= lo) & (time_ns[begin:end] < hi)))
            expected += max(inside - length + 1, 0)
        assert len(runs) == expected, part
    window_rows = first_batch[:, None] + np.arange(length)
    assert (time_ns[window_rows[:, -1]] < cuts[0]).all()  # training windows end before the cut
    assert (np.diff(time_ns[window_rows], axis=1) == 60 * 10**9).all()  # one symbol each


def test_start_runs_index_as_the_array_of_every_start() -> None:
    runs, longest = window_runs(
        np.array([1, 2, 3, 4, 5, 1, 2, 1, 2, 3, 4], dtype=np.int64),
        np.array([0, 5, 7, 11]),
        None,
        3,
    )
    every = np.asarray(runs)
    np.testing.assert_array_equal(every, [0, 1, 2, 7, 8])
    assert longest == 5 and len(runs) == 5
    positions = np.array([4, 0, 3, 2, 1, 2])
    np.testing.assert_array_equal(runs[positions], every[positions])
    assert len(StartRuns(np.empty(0), np.empty(0))) == 0


@pytest.mark.parametrize("count", [0, 1, 2, 3, 64, 1000, 65_537])
def test_a_shuffle_draws_every_window_once_and_depends_on_its_seed(count: int) -> None:
    drawn = WindowOrder(count, seed=11)[0:count]
    assert sorted(drawn.tolist()) == list(range(count))
    np.testing.assert_array_equal(
        np.concatenate([WindowOrder(count, seed=11)[a : a + 100] for a in range(0, count, 100)])
        if count
        else np.empty(0, dtype=np.int64),
        drawn,
    )
    np.testing.assert_array_equal(WindowOrder(count, seed=None)[0:count], np.arange(count))
    if count >= 64:
        assert (WindowOrder(count, seed=12)[0:count] != drawn).mean() > 0.9
        # Spread, not a rotation: neighbours land far apart.
        assert np.median(np.abs(np.diff(drawn))) > count / 20
