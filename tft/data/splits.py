"""Splits by time and the windows inside them (NOTE [Rows, windows and splits] in :mod:`tft.data.windows`).

The splits cut the sorted distinct timestamps of a file at global points, so the test period
is the same calendar span for every symbol; a window lies wholly inside one symbol and one
split. Both the in-memory and the streamed path (:mod:`tft.data.streamed.streamed_windows`) cut with these.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tft.data.columns import _error
from tft.errors import DataError

__all__ = [
    "SPLIT_NAMES",
    "split_cuts",
    "split_labels",
    "split_windows",
    "too_short",
    "window_starts",
]

SPLIT_NAMES = ("train", "validation", "test")


def split_cuts(distinct_times: np.ndarray, fractions: Sequence[float] | None) -> tuple[int, int]:
    """The first time of validation and of test: global cut points on the sorted distinct
    times. Where a part is empty at the end, its cut is just after the file's last time (so a
    later file's bars are past every cut: ``predict`` counts them never seen); the largest
    int64 where there is no split."""
    never = int(np.iinfo(np.int64).max)
    if fractions is None or len(distinct_times) == 0:
        return never, never
    after_the_file = int(distinct_times[-1]) + 1
    cuts = []
    for fraction in (fractions[0], fractions[0] + fractions[1]):
        index = round(fraction * len(distinct_times))
        cuts.append(int(distinct_times[index]) if index < len(distinct_times) else after_the_file)
    return cuts[0], cuts[1]


def split_labels(time_ns: np.ndarray, cuts: tuple[int, int]) -> np.ndarray:
    """0/1/2 (train/validation/test) per row from the cut points of :func:`split_cuts`."""
    return (time_ns >= cuts[0]).astype(np.int8) + (time_ns >= cuts[1]).astype(np.int8)


def window_starts(
    labels: np.ndarray, symbol_bounds: np.ndarray, label: int, length: int
) -> tuple[np.ndarray, int]:
    """(start rows of windows of ``length`` rows wholly inside ``label``, longest run of rows)."""
    pieces = [np.empty(0, dtype=np.int64)]
    longest = 0
    for begin, end in zip(symbol_bounds[:-1], symbol_bounds[1:], strict=True):
        # Labels rise with time within a symbol, so each label is one run of rows.
        first = begin + int(np.searchsorted(labels[begin:end], label, side="left"))
        stop = begin + int(np.searchsorted(labels[begin:end], label, side="right"))
        longest = max(longest, stop - first)
        pieces.append(np.arange(first, stop - length + 1, dtype=np.int64))
    return np.concatenate(pieces), longest


def too_short(
    path: Path, split: str | None, longest: int, encoder_length: int, horizon: int
) -> DataError:
    where = "the file" if split is None else f"the {split} split"
    way_out = (
        ""
        if split is None
        else f", give the {split} split a larger share (--split TRAIN,VAL,TEST; "
        "split_fractions in load_windows)"
    )
    return _error(
        path,
        f"{where} has no full window: one needs {encoder_length + horizon} consecutive rows of "
        f"one symbol (encoder length {encoder_length} + horizon {horizon}) but the longest run "
        f"there has {longest}; lower the encoder length or the horizon{way_out} or use a longer "
        "file",
    )


def split_windows(
    path: Path,
    labels: np.ndarray,
    symbol_bounds: np.ndarray,
    fractions: Sequence[float],
    window: tuple[int, int],
) -> list[np.ndarray]:
    """The start rows of the train, validation and test windows; ``window`` is (encoder
    length, horizon).

    Raises:
        DataError: a split with a share of the time has no full window.
    """
    starts_of_splits = []
    for label, (name, fraction) in enumerate(zip(SPLIT_NAMES, fractions, strict=True)):
        starts, longest = window_starts(labels, symbol_bounds, label, sum(window))
        if len(starts) == 0 and fraction > 0:
            raise too_short(path, name, longest, *window)
        starts_of_splits.append(starts)
    return starts_of_splits
