"""The roles a file settles by itself, and every role it cannot settle reported at once.

NOTE [Roles the file settles]
A trader's export rarely uses this project's default names (``timestamp``, ``symbol``,
``close``). Three things can be read off the file without guessing:

- the timestamp: where no column has the default name and the user named none, the one
  column stored as a Parquet timestamp is it (two or more: the user must choose); where the
  file stores none, the one text column whose first ``TEXT_TIME_ROWS`` values all read as ISO
  8601 times of day (an export's ``"2026-03-02 08:30:00"``; a date alone is not one) is it;
  epoch integers are not guessed (any integer column could be a count);
- the unit of integer epochs (NOTE [Timestamps as exports store them]), from the smallest and
  largest times the file's statistics give;
- the symbol: where the user named none and no column is called ``symbol``, the timestamps of
  the first ``SAMPLE_ROWS`` rows repeat (several instruments interleaved by time), and exactly
  one text column has a value of its own on every row of a repeated timestamp, that column
  is the symbol. Several such columns that group the rows alike (a ticker and its exchange,
  one to one) give the first in the file; several that group them otherwise are reported, not
  picked.

The target and the known inputs cannot be read off a file (a column ``c`` might be a close or a
count), so they are asked for; but every column a role names that the file lacks, and every role
whose column has the wrong type, is reported in one line, each with its command-line flag first
and the library's ``ColumnRoles`` argument after, so that one try after the first error runs.
A role the user named is never replaced: only defaults are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tft.data.columns import (
    ColumnRoles,
    _columns_hint,
    _error,
    _is_numeric,
    _is_symbol_type,
    _is_text,
    _usable,
    how_to_name,
)
from tft.data.sources.data_source import DataSource
from tft.data.sources.parquet_folder import first_rows, footer
from tft.data.timestamps import epoch_unit, timestamp_type_problem
from tft.errors import DataError

__all__ = ["SAMPLE_ROWS", "infer_roles", "symbol_hint"]

#: Rows read from the start of the file to tell whether its timestamps repeat.
SAMPLE_ROWS = 200_000
#: Values read from the start of each text column to tell whether it holds times.
TEXT_TIME_ROWS = 1000


def infer_roles(path: DataSource, schema: pa.Schema, roles: ColumnRoles) -> ColumnRoles:
    """``roles`` with the timestamp and symbol the file settles filled in where the user named
    none (NOTE [Roles the file settles]).

    Raises:
        DataError: one line naming every role whose column the file lacks or cannot use, each
            with its flag and ``ColumnRoles`` argument; or timestamps that repeat with several
            text columns that could each be the symbol.
    """
    update: dict[str, Any] = {}
    named = roles.model_fields_set
    if "timestamp" not in named and roles.timestamp not in schema.names:
        stamped = [f.name for f in schema if pa.types.is_timestamp(f.type)]
        if not stamped:
            stamped = _text_times(path, schema)
        if len(stamped) == 1:
            update["timestamp"] = stamped[0]
    timestamp = update.get("timestamp", roles.timestamp)
    if (
        roles.timestamp_unit is None
        and timestamp in schema.names
        and pa.types.is_integer(schema.field(timestamp).type)
    ):
        update["timestamp_unit"] = epoch_unit(path, _first_and_last(path, timestamp), timestamp)
    has_symbol = "symbol" in schema.names and _is_symbol_type(schema.field("symbol").type)
    if "symbol" not in named and not has_symbol and timestamp in schema.names:
        symbol = _symbol_by_repeats(path, schema, timestamp, roles)
        if symbol is not None:
            update["symbol"] = symbol
    settled = roles.model_copy(update=update) if update else roles
    _check_named_columns(path, schema, settled)
    return settled


def symbol_hint(schema: pa.Schema, roles: ColumnRoles) -> str:
    """What to add to a duplicate or out-of-order timestamp error where no symbol column is
    used: the text columns that could hold the instruments, and how to name one."""
    if roles.symbol is not None:
        return ""
    texts = [f.name for f in schema if _is_text(f.type) and f.name not in roles.ignore]
    where = f" (the file's text columns: {', '.join(texts)})" if texts else ""
    return (
        f"; if the file holds several instruments, name their column{where} with "
        f"{how_to_name('symbol')}"
    )


def _symbol_by_repeats(
    path: DataSource, schema: pa.Schema, timestamp: str, roles: ColumnRoles
) -> str | None:
    texts = [
        f.name for f in schema if _is_text(f.type) and f.name not in (timestamp, *roles.ignore)
    ]
    if not texts:
        return None
    try:
        sample = first_rows(path, [timestamp, *texts], SAMPLE_ROWS)
    except (pa.ArrowException, OSError, DataError):
        return None  # an empty or unreadable file: loading says so in its own words
    if sample.num_rows == 0:
        return None
    times = _comparable(sample[timestamp])
    if len(np.unique(times)) == len(times):
        return None
    telling = [name for name in texts if _tells_rows_apart(sample, timestamp, name)]
    if len(telling) > 1 and not all(_same_groups(sample, telling[0], n) for n in telling[1:]):
        raise _error(
            path,
            f"timestamps repeat (several instruments?) and each of {', '.join(telling)} tells "
            f"the rows apart; name the instrument column with {how_to_name('symbol')}",
        )
    return telling[0] if telling else None


def _comparable(column: pa.ChunkedArray) -> np.ndarray:
    """Values equal where the column's values are equal (times as integers, text as text)."""
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.int64()).to_numpy()
    return np.asarray(column.to_pylist(), dtype=object)


def _tells_rows_apart(sample: pa.Table, timestamp: str, name: str) -> bool:
    """Whether ``name`` holds more than one value and no two rows share a timestamp and a
    value of it."""
    pairs = sample.select([timestamp, name]).group_by([timestamp, name]).aggregate([])
    return pairs.num_rows == sample.num_rows and pc.count_distinct(sample[name]).as_py() > 1


def _same_groups(sample: pa.Table, first: str, other: str) -> bool:
    """Whether two columns group the rows alike (a ticker and its exchange's code, one to one):
    then either is the symbol, and the first in the file is taken."""

    def groups(names: list[str]) -> int:
        return sample.select(names).group_by(names).aggregate([]).num_rows

    return groups([first]) == groups([other]) == groups([first, other])


def _text_times(path: DataSource, schema: pa.Schema) -> list[str]:
    """The text columns whose first values all read as ISO 8601 times (NOTE [Roles the file
    settles])."""
    texts = [field.name for field in schema if _is_text(field.type)]
    if not texts:
        return []
    first = first_rows(path, texts, TEXT_TIME_ROWS)
    if first.num_rows == 0:
        return []
    return [name for name in texts if _reads_as_times(first[name].combine_chunks().drop_null())]


def _reads_as_times(values: pa.Array) -> bool:
    # A time of day is required: a date alone (a session's date beside a time column) is not
    # a bar's time.
    if len(values) == 0 or not pc.all(pc.match_substring(values, ":")).as_py():
        return False
    # With a zone (Z, +01:00) they cast to UTC times, without one to naive times.
    for kind in (pa.timestamp("ns", tz="UTC"), pa.timestamp("ns")):
        try:
            pc.cast(values, kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return True
    return False


def _first_and_last(path: DataSource, name: str) -> pa.ChunkedArray:
    """The smallest and largest values of an integer column, from the file's statistics where
    it keeps them, else from its first rows."""
    ends: list[int] | None = []
    for file in path.files():  # a folder's files each keep their own statistics
        ends = _statistics_ends(pq.ParquetFile(file, metadata=footer(file)), name, ends)
        if ends is None:
            break
    if not ends:
        first = first_rows(path, [name], SAMPLE_ROWS)[name]
        ends = [v for v in (first[0].as_py(), first[-1].as_py()) if v is not None]
    return pa.chunked_array([pa.array([min(ends), max(ends)], pa.int64())])


def _statistics_ends(
    parquet: pq.ParquetFile, name: str, ends: list[int] | None
) -> list[int] | None:
    """``ends`` and the smallest and largest value of each row group, or None where a row
    group keeps no statistics (or the file lacks the column)."""
    index = parquet.schema_arrow.get_field_index(name)
    if index < 0 or ends is None:
        return None
    for group in range(parquet.metadata.num_row_groups):
        stats = parquet.metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        ends = [*ends, stats.min, stats.max]
    return ends


def _check_named_columns(path: DataSource, schema: pa.Schema, roles: ColumnRoles) -> None:
    problems: list[str] = []

    def lacking(name: str, role: str, option: str) -> bool:
        if name in schema.names:
            return False
        fix = "leave it out of" if option == "ignore" else "name it with"
        problems.append(f"no {role} column '{name}': {fix} {how_to_name(option)}")
        return True

    if not lacking(roles.timestamp, "timestamp", "timestamp"):
        problem = timestamp_type_problem(roles.timestamp, schema.field(roles.timestamp).type)
        if problem is not None:
            problems.append(problem)
    if roles.symbol is not None and not lacking(roles.symbol, "symbol", "symbol"):
        kind = schema.field(roles.symbol).type
        if not _is_symbol_type(kind):
            problems.append(
                f"symbol column '{roles.symbol}' has type {kind}, not text or integer: name "
                f"another with {how_to_name('symbol')}"
            )
    if not lacking(roles.target, "target", "target"):
        kind = schema.field(roles.target).type
        if not _is_numeric(kind):
            problems.append(
                f"target column '{roles.target}' has type {kind}, not a number: name a price "
                f"with {how_to_name('target')}"
            )
    for option in ("known", "observed", "static", "categorical", "ignore"):
        for name in getattr(roles, option) or []:
            role = "ignored" if option == "ignore" else option
            if lacking(name, role, option) or option == "ignore":
                continue
            if not _usable(schema.field(name).type):
                problems.append(
                    f"{option} column '{name}' has type {schema.field(name).type}, neither "
                    f"a number nor a category: leave it out of {how_to_name(option)}"
                )
    if problems:
        count = f"{len(problems)} problems with the column roles" if len(problems) > 1 else ""
        raise _error(
            path, "; ".join([*([count] if count else []), *problems, _columns_hint(schema)])
        )
