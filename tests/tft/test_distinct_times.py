"""The distinct times a row cache's build gathers are those of the rows, sorted, and held on disk
in bounded memory (NOTE [Distinct times on disk])."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tft.data.streamed.distinct_times import DistinctTimes, merge_time_files


@pytest.mark.parametrize("block_times", [1, 7, 1000, 1 << 20])
def test_times_added_in_chunks_come_out_sorted_and_distinct(
    tmp_path: Path, block_times: int
) -> None:
    generator = np.random.default_rng(3)
    # Repeats within a chunk and across chunks, negative times, chunks sorted within symbols.
    chunks = [generator.integers(-500, 5_000, size=n) for n in (0, 1, 30, 400, 1, 999, 57)]
    chunks.append(np.concatenate([np.arange(100, 200), np.arange(150, 300)]))
    times = DistinctTimes(tmp_path, block_times)
    for chunk in chunks:
        times.add(chunk)
    got = times.finish(tmp_path / "distinct.bin")
    np.testing.assert_array_equal(np.asarray(got), np.unique(np.concatenate(chunks)))
    # Only the result is left: the runs merged into it are gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["distinct.bin"]


def test_no_times_give_an_empty_file(tmp_path: Path) -> None:
    times = DistinctTimes(tmp_path, 4)
    times.add(np.empty(0, dtype=np.int64))
    got = times.finish(tmp_path / "distinct.bin")
    assert len(got) == 0
    assert (tmp_path / "distinct.bin").stat().st_size == 0


@pytest.mark.parametrize("block_times", [1, 2, 5, 64])
def test_two_files_merge_into_their_sorted_distinct_union(tmp_path: Path, block_times: int) -> None:
    generator = np.random.default_rng(11)
    for trial in range(20):
        one = np.unique(generator.integers(0, 200, size=generator.integers(0, 80)))
        other = np.unique(generator.integers(0, 200, size=generator.integers(0, 80)))
        one.tofile(tmp_path / "one.bin")
        other.tofile(tmp_path / "other.bin")
        count = merge_time_files(
            tmp_path / "one.bin", tmp_path / "other.bin", tmp_path / "both.bin", block_times
        )
        both = np.fromfile(tmp_path / "both.bin", dtype=np.int64)
        np.testing.assert_array_equal(both, np.union1d(one, other), err_msg=f"trial {trial}")
        assert count == len(both)


def test_eight_million_distinct_times_are_gathered_in_a_few_blocks_of_memory(
    tmp_path: Path,
) -> None:
    """A file written a symbol at a time: every chunk's times are new ones, 64 MB of them in
    all, in the order of a walk of one symbol's bars after another's."""
    total, chunk, block_times = 8_000_000, 250_000, 1 << 17
    times = DistinctTimes(tmp_path, block_times)
    tracemalloc.start()
    try:
        for start in range(0, total, chunk):
            # Two symbols' bars each chunk: every other minute, and the ones between.
            minutes = np.arange(start, start + chunk, dtype=np.int64)
            times.add(np.concatenate([minutes[::2], minutes[1::2]]) * 60_000_000_000)
        got = times.finish(tmp_path / "distinct.bin")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A chunk and its copies (2 MB each), and a few blocks (1 MB each): not the 64 MB of times.
    assert peak < 16 << 20, f"{peak:,} bytes allocated"
    assert len(got) == total
    assert got[0] == 0 and got[-1] == (total - 1) * 60_000_000_000
    assert bool((np.diff(got[:: total // 1000]) > 0).all())
