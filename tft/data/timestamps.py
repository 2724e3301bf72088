"""Bar times as exports store them: Parquet timestamps, ISO 8601 text or integer epochs, read
as nanoseconds since the epoch in UTC.

NOTE [Timestamps as exports store them]
- A Parquet timestamp is read as it is; one without a time zone is in ``ColumnRoles.timezone``
  when that is given, else in UTC (the calendar inputs are UTC minutes and weekdays).
- Text is read as ISO 8601 (``2024-03-04T22:00:00``, a space for the ``T``, fractions of a
  second, ``Z`` or an offset such as ``+01:00``). Text with an offset needs nothing more; text
  without one is refused unless ``timezone`` says whose clock it is (an export from a desk in
  Chicago is not in UTC, and guessing would shift every calendar input by hours). A column
  that mixes the two is refused, naming the first row of the minority kind.
- Integers are epochs: seconds, milliseconds, microseconds or nanoseconds since 1970-01-01
  UTC, as ``ColumnRoles.timestamp_unit`` says, else inferred from their size. The four units
  put the years 1973 to 2286 in four ranges that do not overlap (1e8 to 1e10 seconds, times
  1000 for each finer unit), so a column whose first and last values fall in one range has
  that unit; anything else is refused, asking for the unit.
A local time that a daylight-saving change skips or repeats is refused, naming the row: which
of two bars an ambiguous minute was is not in the file.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tft.data.columns import ColumnRoles, _error, _is_text, how_to_name
from tft.data.sources.data_source import DataSource

__all__ = ["EPOCH_UNITS", "epoch_unit", "read_times", "timestamp_type_problem"]

EpochUnit = Literal["s", "ms", "us", "ns"]

#: Nanoseconds in one of each epoch unit.
EPOCH_UNITS: dict[EpochUnit, int] = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
# Seconds from 1e8 (1973) to 1e10 (2286): each unit's range is this times its count per second.
_SECONDS_RANGE = (10**8, 10**10)


def timestamp_type_problem(name: str, kind: pa.DataType) -> str | None:
    """Why a column of this type cannot hold bar times, or None when it can."""
    if pa.types.is_timestamp(kind) or pa.types.is_integer(kind) or _is_text(kind):
        return None
    return (
        f"timestamp column '{name}' has type {kind}: store times as a Parquet timestamp, ISO "
        f"8601 text or integer epochs, or name another column with {how_to_name('timestamp')}"
    )


def read_times(
    path: DataSource, column: pa.ChunkedArray, roles: ColumnRoles, first_row: int = 0
) -> np.ndarray:
    """The column's times as int64 nanoseconds since the epoch in UTC (NOTE [Timestamps as
    exports store them]); a null is refused naming its row. ``first_row``: the file row of the
    column's first value (a chunk of the file), for the rows errors name."""
    name = roles.timestamp
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise _error(
            path, f"timestamp column '{name}' is empty at row {first_row + row}; drop that row"
        )
    if pa.types.is_integer(column.type):
        unit = roles.timestamp_unit or epoch_unit(path, column, name)
        return column.cast(pa.int64()).to_numpy() * EPOCH_UNITS[unit]
    if _is_text(column.type):
        text = column.cast(pa.string())
        column = _parsed_text(path, text, name, first_row)
        if column.type.tz is None and roles.timezone is None:
            raise _error(
                path,
                f"timestamp column '{name}' is text with no time zone (row {first_row}: "
                f"'{text[0].as_py()}'); say whose clock it is with --timezone ZONE "
                "(ColumnRoles(timezone=...)), e.g. UTC or America/Chicago",
            )
    if column.type.tz is None and roles.timezone is not None:
        column = _in_zone(path, column, roles)
    try:
        as_ns = column.cast(pa.timestamp("ns", tz=column.type.tz))
    except pa.ArrowInvalid:
        raise _error(
            path, f"timestamp column '{name}' has times outside 1678-2261; drop those rows"
        ) from None
    return as_ns.cast(pa.int64()).to_numpy()


def epoch_unit(path: DataSource, column: pa.ChunkedArray, name: str) -> EpochUnit:
    """The unit whose range of years holds the column's first and last values."""
    ends = [column[0].as_py(), column[-1].as_py()]
    low, high = _SECONDS_RANGE
    for unit, per_unit in EPOCH_UNITS.items():
        scale = 10**9 // per_unit  # units in a second
        if all(low * scale <= value < high * scale for value in ends):
            return unit
    raise _error(
        path,
        f"timestamp column '{name}' holds integers ({ends[0]} ... {ends[1]}) that are no epoch "
        "in seconds, milliseconds, microseconds or nanoseconds between 1973 and 2286; say which "
        "with --timestamp-unit s|ms|us|ns (ColumnRoles(timestamp_unit=...)) or store times",
    )


def _parsed_text(
    path: DataSource, text: pa.ChunkedArray, name: str, first_row: int
) -> pa.ChunkedArray:
    # Arrow reads ISO 8601 without an offset as a naive time and with one (Z, +01:00) as UTC;
    # each kind refuses the other, so each row is cast as the kind its text says.
    zoned = pc.match_substring_regex(text, r"(Z|[+-]\d\d:?\d\d)$").to_numpy(zero_copy_only=False)
    naive, utc = pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")
    for kind, rows in ((utc, zoned), (naive, ~zoned)):
        if rows.any():
            _refuse_unreadable(path, text, name, kind, np.flatnonzero(rows), first_row)
    if zoned.any() and not zoned.all():
        row = int(np.argmin(zoned) if zoned.mean() > 0.5 else np.argmax(zoned))
        raise _error(
            path,
            f"timestamp column '{name}' mixes times with and without a time zone (row "
            f"{first_row + row}: "
            f"'{text[row].as_py()}'); write every time the same way",
        )
    return text.cast(utc if zoned.all() else naive)


def _refuse_unreadable(
    path: DataSource,
    text: pa.ChunkedArray,
    name: str,
    kind: pa.DataType,
    rows: np.ndarray,
    first_row: int,
) -> None:
    """Raise naming the first of ``rows`` whose text does not cast to ``kind``."""
    picked = text.take(pa.array(rows))
    try:
        picked.cast(kind)
        return
    except pa.ArrowInvalid:
        pass
    bad = int(rows[_first_unreadable(picked, kind)])
    raise _error(
        path,
        f"timestamp column '{name}' has '{text[bad].as_py()}' at row {first_row + bad}, not an "
        "ISO 8601 time (2024-03-04T22:00:00, with Z or +01:00 where the zone is known); fix "
        "that row or store times as a Parquet timestamp",
    )


def _first_unreadable(text: pa.ChunkedArray, kind: pa.DataType) -> int:
    """The first row whose text does not cast (bisecting: each cast is one pass in Arrow)."""
    low, high = 0, len(text)
    while high - low > 1:
        middle = (low + high) // 2
        try:
            text[low:middle].cast(kind)
            low = middle
        except pa.ArrowInvalid:
            high = middle
    return low


def _in_zone(path: DataSource, column: pa.ChunkedArray, roles: ColumnRoles) -> pa.ChunkedArray:
    """Naive times read on the clock of ``roles.timezone``."""
    zone = roles.timezone
    try:
        return pc.assume_timezone(column, timezone=zone)
    except pa.ArrowInvalid as error:
        reason = str(error).splitlines()[0]
        if reason.startswith("Cannot locate or parse timezone"):
            raise _error(
                path,
                f"time zone '{zone}' is not known; name one such as UTC or America/Chicago with "
                "--timezone ZONE (ColumnRoles(timezone=...))",
            ) from None
        raise _error(
            path,
            f"timestamp column '{roles.timestamp}' has a time that {zone} skips or repeats at a "
            f"daylight-saving change ({reason}); store times with their offset",
        ) from None
