"""Splits by time and the windows inside them (NOTE [Rows, windows and splits] in :mod:`tft.data.windows`).

The splits cut the sorted distinct timestamps of a file at global points, so the test period
is the same calendar span for every symbol; a window lies wholly inside one symbol and one
split. Both the in-memory and the streamed path (:mod:`tft.data.streamed.streamed_windows`) cut with these.

NOTE [A split by shares or by dates]
A split is given either as three shares of the distinct timestamps (``split_fractions``,
``--split 0.7,0.15,0.15``) or as the two times where validation and then test begin
(``split_times``, ``--split 2024-03-01,2024-03-15``): a desk tests on "everything since the
first of March", not on 15% of its rows. A time is ISO 8601 text or a ``datetime``; one
written without a zone is on the clock of ``ColumnRoles.timezone`` (the clock the file's own
naive times are read on), else UTC. A time splits at the first bar at or after it. Each date
must leave every part some time in the file (after the first bar, before or at the last, the
second after the first): a date outside the file is a typo far more often than a wish for an
empty part, and shares say "no test part" plainly (``0.85,0.15,0``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np

from tft.data.columns import _error
from tft.data.sources.data_source import DataSource
from tft.errors import ConfigError, DataError

__all__ = [
    "NO_CUT",
    "SPLIT_NAMES",
    "SplitTimes",
    "StartRuns",
    "check_window_options",
    "cut_points",
    "part_windows",
    "split_cuts",
    "split_labels",
    "split_starts_ns",
    "split_windows",
    "time_text",
    "too_short",
    "window_runs",
]

SPLIT_NAMES = ("train", "validation", "test")
NO_CUT = int(np.iinfo(np.int64).max)
"""The cut point of a part that does not start: past every time (:func:`split_cuts`)."""

SplitTimes = Sequence[str | datetime]
"""Where validation and then test begin: two ISO 8601 times or ``datetime`` values."""

_SPLIT_FLAG = "--split VALIDATION_START,TEST_START; split_times in load_windows"


def check_window_options(
    encoder_length: int,
    horizon: int,
    split_fractions: Sequence[float] | None,
    split_times: SplitTimes | None = None,
) -> None:
    """Refuse a window length or a split that cannot be cut, naming the value and the fix
    (the split times' text is read here, before any data; their zone in
    :func:`split_starts_ns`).

    Raises:
        ConfigError: encoder_length or horizon < 1, bad split fractions or split times.
    """
    for name, value in (("encoder_length", encoder_length), ("horizon", horizon)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a whole number >= 1; pass e.g. 10")
    if split_times is not None:
        split_starts_ns(split_times, None)
        return
    if split_fractions is None:
        return
    fractions = list(split_fractions)
    if (
        len(fractions) != 3
        or not all(isinstance(f, int | float) and 0 <= f <= 1 for f in fractions)
        or fractions[0] <= 0
        or not math.isclose(sum(fractions), 1.0, abs_tol=1e-6)
    ):
        raise ConfigError(
            f"split_fractions={split_fractions!r} must be three numbers >= 0 (train > 0) that "
            "add up to 1; pass e.g. (0.7, 0.15, 0.15)"
        )


def split_starts_ns(split_times: SplitTimes, timezone: str | None) -> tuple[int, int]:
    """The start of validation and of test as nanoseconds since the epoch in UTC; a time
    without a zone is on ``timezone``'s clock, else UTC (NOTE [A split by shares or by dates]).

    Raises:
        ConfigError: not two times, one that is not ISO 8601, or the second not after the first.
    """
    if isinstance(split_times, str) or len(split_times) != 2:
        raise ConfigError(
            f"split_times={split_times!r} must be two times, where validation and then test "
            "begin; pass e.g. ('2024-03-01', '2024-03-15')"
        )
    try:
        zone = ZoneInfo(timezone) if timezone else UTC
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"--timezone {timezone!r} is not a time zone name; write it like UTC or America/Chicago"
        ) from None
    starts = []
    for given in split_times:
        try:
            moment = given if isinstance(given, datetime) else datetime.fromisoformat(str(given))
        except ValueError:
            raise ConfigError(
                f"split time {given!r} is not an ISO 8601 date or time; write it like "
                "2024-03-01 or 2024-03-01T14:30"
            ) from None
        moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=zone)
        starts.append(_nanoseconds(moment))
    if starts[1] <= starts[0]:
        raise ConfigError(
            f"split times {_shown(split_times[0])} and {_shown(split_times[1])}: test must begin "
            "after validation; give the validation start first"
        )
    return starts[0], starts[1]


def _nanoseconds(moment: datetime) -> int:
    since = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (since.days * 86_400 + since.seconds) * 10**9 + since.microseconds * 1000


def _shown(given: str | datetime) -> str:
    return given.isoformat() if isinstance(given, datetime) else str(given)


def time_text(time_ns: int) -> str:
    """A time in nanoseconds since the epoch as ISO 8601 text in UTC, to the minute."""
    return np.datetime_as_string(np.datetime64(time_ns, "ns"), unit="m") + " UTC"


def cut_points(
    path: DataSource,
    distinct_times: np.ndarray,
    fractions: Sequence[float] | None,
    starts_ns: tuple[int, int] | None,
) -> tuple[int, int]:
    """The first time of validation and of test, by dates where ``starts_ns`` is given
    (:func:`split_starts_ns`), else by shares (:func:`split_cuts`)."""
    if starts_ns is None:
        return split_cuts(distinct_times, fractions)
    return _dated_cuts(path, distinct_times, starts_ns)


def _dated_cuts(
    path: DataSource, distinct_times: np.ndarray, starts_ns: tuple[int, int]
) -> tuple[int, int]:
    """The cut points of a split by dates, checked to leave each part some of the file's time
    (NOTE [A split by shares or by dates]).

    Raises:
        DataError: a date at or before the file's first bar, or after its last.
    """
    first, last = int(distinct_times[0]), int(distinct_times[-1])
    for name, start in zip(SPLIT_NAMES[1:], starts_ns, strict=True):
        if not first < start <= last:
            raise _error(
                path,
                f"the {name} start {time_text(start)} is outside the file's bars "
                f"({time_text(first)} to {time_text(last)}), leaving a part of the split empty; "
                f"give dates inside that span ({_SPLIT_FLAG}) or shares (--split 0.85,0.15,0)",
            )
    return starts_ns


def split_cuts(distinct_times: np.ndarray, fractions: Sequence[float] | None) -> tuple[int, int]:
    """The first time of validation and of test: global cut points on the sorted distinct
    times. Where a part is empty at the end, its cut is just after the file's last time (so a
    later file's bars are past every cut: ``predict`` counts them never seen); the largest
    int64 where there is no split."""
    if fractions is None or len(distinct_times) == 0:
        return NO_CUT, NO_CUT
    after_the_file = int(distinct_times[-1]) + 1
    cuts = []
    for fraction in (fractions[0], fractions[0] + fractions[1]):
        index = round(fraction * len(distinct_times))
        cuts.append(int(distinct_times[index]) if index < len(distinct_times) else after_the_file)
    return cuts[0], cuts[1]


def split_labels(time_ns: np.ndarray, cuts: tuple[int, int]) -> np.ndarray:
    """0/1/2 (train/validation/test) per row from the cut points of :func:`split_cuts`."""
    return (time_ns >= cuts[0]).astype(np.int8) + (time_ns >= cuts[1]).astype(np.int8)


class StartRuns:
    """The first rows of a part's windows, held as runs of consecutive rows (one a symbol).

    NOTE [Window starts without a per-window array]
    A window starts at every row of its symbol's part that leaves room for it, so a part's
    starts are, symbol by symbol, one run of consecutive rows ``[first, first + count)``. They
    are held as those runs, two integers a symbol, not as an array of every start: that was 8
    bytes a window for each part and again for the whole file (960 MB at 60M bars), which a
    file streamed past the host's memory cannot hold. A position among the part's windows
    becomes its first row by a binary search over the runs' cumulative counts, a batch at a
    time. ``np.asarray`` gives the array of every start, for a look (tests, a small file).
    """

    def __init__(self, firsts: np.ndarray, counts: np.ndarray) -> None:
        self._firsts = np.asarray(firsts, dtype=np.int64)
        self._counts = np.asarray(counts, dtype=np.int64)
        self._ends = np.cumsum(self._counts)  # each run's end among the part's positions

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def counts(self) -> np.ndarray:
        """Each run's windows, in the part's order (one run a symbol, in time order)."""
        return self._counts

    def __getitem__(self, positions: np.ndarray | Sequence[int]) -> np.ndarray:
        """The first rows of the windows at ``positions`` (0 to ``len - 1``)."""
        positions = np.asarray(positions, dtype=np.int64)
        run = np.searchsorted(self._ends, positions, side="right")
        return self._firsts[run] + positions - (self._ends[run] - self._counts[run])

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        pieces = [
            np.arange(f, f + c, dtype=np.int64)
            for f, c in zip(self._firsts, self._counts, strict=True)
        ]
        every = np.concatenate([np.empty(0, dtype=np.int64), *pieces])
        return every.astype(dtype) if dtype is not None else every


def window_runs(
    time_ns: np.ndarray, symbol_bounds: np.ndarray, span: tuple[int, int] | None, length: int
) -> tuple[StartRuns, int]:
    """(the windows of ``length`` rows wholly inside times ``[span[0], span[1])``, or anywhere
    for None, the longest run of such rows); ``time_ns`` rises within each symbol's rows, so
    each symbol's rows in the span are one run, found by binary search (a mapped array is
    read a few pages a symbol)."""
    firsts, counts = [], []
    longest = 0
    for begin, end in zip(symbol_bounds[:-1].tolist(), symbol_bounds[1:].tolist(), strict=True):
        first, stop = begin, end
        if span is not None:
            times = time_ns[begin:end]
            first = begin + int(np.searchsorted(times, span[0], side="left"))
            stop = begin + int(np.searchsorted(times, span[1], side="left"))
        longest = max(longest, stop - first)
        if stop - first >= length:
            firsts.append(first)
            counts.append(stop - first - length + 1)
    return StartRuns(np.asarray(firsts), np.asarray(counts)), longest


def too_short(
    path: DataSource,
    split: str | None,
    longest: int,
    encoder_length: int,
    horizon: int,
    dated: bool = False,
) -> DataError:
    where = "the file" if split is None else f"the {split} split"
    if split is None:
        way_out = ""
    elif dated:
        way_out = f", give the {split} split a longer span ({_SPLIT_FLAG})"
    else:
        way_out = (
            f", give the {split} split a larger share (--split TRAIN,VAL,TEST; "
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
    path: DataSource,
    time_ns: np.ndarray,
    symbol_bounds: np.ndarray,
    cuts: tuple[int, int],
    fractions: Sequence[float] | None,
    window: tuple[int, int],
) -> list[StartRuns]:
    """The train, validation and test windows (rows before ``cuts[0]``, from it to
    ``cuts[1]``, from it on); ``window`` is (encoder length, horizon); ``fractions`` None for
    a split by dates (every part has time).

    Raises:
        DataError: a split with a share of the time has no full window.
    """
    before_every = int(np.iinfo(np.int64).min)
    spans = ((before_every, cuts[0]), (cuts[0], max(cuts)), (max(cuts), NO_CUT))
    starts_of_splits = []
    shares = fractions if fractions is not None else (1.0, 1.0, 1.0)
    for span, name, fraction in zip(spans, SPLIT_NAMES, shares, strict=True):
        starts, longest = window_runs(time_ns, symbol_bounds, span, sum(window))
        if len(starts) == 0 and fraction > 0:
            raise too_short(path, name, longest, *window, dated=fractions is None)
        starts_of_splits.append(starts)
    return starts_of_splits


def part_windows(
    path: DataSource,
    time_ns: np.ndarray,
    symbol_bounds: np.ndarray,
    distinct_times: np.ndarray,
    split: tuple[Sequence[float] | None, tuple[int, int] | None],
    window: tuple[int, int],
) -> tuple[list[StartRuns], tuple[int, int] | None]:
    """The windows of train, validation, test and the whole file, and the split's cut points
    (None without a split), for both the in-memory and the streamed path.

    Args:
        time_ns: each kept row's time, rows grouped by symbol in time order (a mapped array
            is read a few pages a symbol).
        distinct_times: the sorted distinct times of the rows (the shares' cut points).
        split: (shares, starts in ns of a split by dates): the dates when given, else the
            shares; neither keeps the file whole.

    Raises:
        DataError: the file or a part with a share of the time has no full window.
    """
    fractions, starts_ns = split
    whole, longest = window_runs(time_ns, symbol_bounds, None, sum(window))
    if len(whole) == 0:
        raise too_short(path, None, longest, *window)
    if fractions is None and starts_ns is None:
        none = StartRuns(np.empty(0), np.empty(0))
        return [none, none, none, whole], None
    shares = None if starts_ns is not None else fractions
    cuts = cut_points(path, distinct_times, shares, starts_ns)
    return [*split_windows(path, time_ns, symbol_bounds, cuts, shares, window), whole], cuts
