"""Column roles of a Parquet file of bars, and reading and checking its columns.

:class:`ColumnRoles` says which column plays which part (timestamp, symbol, target, known,
observed). The helpers here check a file's schema against the roles (filling in the automatic
symbol and observed columns), read the needed columns into arrays, give each row its symbol
index, and enforce the row order and the NaN policy; every problem is a
:class:`~tft.errors.DataError` that names the file, the column or row, and the fix. How
the rows become windows is NOTE [Rows, windows and splits] in :mod:`tft.data.windows`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from tft.data.sources.data_source import DataSource
from tft.data.sources.parquet_folder import folder_schema, footer, read_folder
from tft.errors import DataError, first_line

__all__ = ["NO_SYMBOL", "ColumnRoles"]

NO_SYMBOL = "default"
"""Symbol name used when the file has no symbol column."""


#: The command line's flag for each role (``autockpt train/plan/predict``), named first in every
#: message about a role, the library's ``ColumnRoles`` argument after it.
ROLE_FLAGS = {
    "timestamp": "--timestamp-column",
    "symbol": "--symbol-column",
    "target": "--target",
    "known": "--known-columns",
    "observed": "--observed-columns",
    "static": "--static-columns",
    "categorical": "--categorical-columns",
    "ignore": "--ignore-columns",
    "timezone": "--timezone",
    "timestamp_unit": "--timestamp-unit",
}


def how_to_name(option: str, value: str = "...") -> str:
    """The flag and the library argument that set a role: ``--target COLUMN
    (ColumnRoles(target=...))``."""
    metavar = (
        "A,B" if option in ("known", "observed", "static", "categorical", "ignore") else "COLUMN"
    )
    return f"{ROLE_FLAGS[option]} {metavar} (ColumnRoles({option}={value}))"


class ColumnRoles(BaseModel):
    """Which column of the file plays which part; see NOTE [Rows, windows and splits] (tft.data.windows).

    A column is *real* (scaled and fed as a number) or *categorical* (fitted categories, each
    embedded): string, dictionary and boolean columns are always categorical, integer columns
    when listed in ``categorical``, every other number real.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    timestamp: str = "timestamp"
    """Timestamp column: a Parquet timestamp, ISO 8601 text or integer epochs (NOTE
    [Timestamps as exports store them] in tft.data.timestamps)."""
    timezone: str | None = None
    """Whose clock times written without a zone are on (``America/Chicago``); None reads a
    Parquet timestamp without one as UTC and refuses text without one."""
    timestamp_unit: Literal["s", "ms", "us", "ns"] | None = None
    """The unit of integer epochs; None infers it from their size."""
    symbol: str | None = None
    """Symbol column (string, dictionary or integer); None uses a column named "symbol" if any."""
    target: str = "close"
    """Numeric column to forecast (not boolean)."""
    target_transform: Literal["log_return", "diff", "none"] = "log_return"
    """What the model forecasts: log returns of the target, differences or the value itself."""
    known: list[str] = Field(default_factory=list)
    """Columns whose future values are known when forecasting (a holiday flag, the session)."""
    observed: list[str] | None = None
    """Past-only columns; None takes every real or categorical column given no other role."""
    static: list[str] | None = None
    """Categorical columns constant within each symbol (the exchange, the asset class); None
    takes every string column that is constant within every symbol and named nowhere else."""
    categorical: list[str] = Field(default_factory=list)
    """Integer-coded columns to treat as categories (string, dictionary and boolean columns
    always are)."""
    ignore: list[str] = Field(default_factory=list)
    """Columns to leave out."""
    scaling: Literal["per_symbol", "global"] = "per_symbol"
    """Scale the target and the real inputs with each symbol's own statistics, or with one
    mean and standard deviation over all symbols."""

    def real_columns(self, names: list[str]) -> list[str]:
        """The real columns among ``names`` (resolved roles), in order."""
        return [name for name in names if name not in self.categorical]

    def categorical_columns(self, names: list[str]) -> list[str]:
        """The categorical columns among ``names`` (resolved roles), in order."""
        return [name for name in names if name in self.categorical]


# ---------------------------------------------------------------------------- reading


def _error(path: DataSource, text: str) -> DataError:
    return DataError(f"{path}: {' '.join(text.split())}")


def _columns_hint(schema: pa.Schema) -> str:
    names = schema.names
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    return f"the file has {shown}"


def _read_schema(path: DataSource) -> pa.Schema:
    if path.many:  # NOTE [A folder of files as one dataset]
        return folder_schema(path)
    if not path.file.exists():
        raise _error(path, "no such file; check the path or write one with `autockpt make-data`")
    try:
        return footer(path.file).schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as error:
        reason = first_line(error)
        raise _error(
            path, f"cannot be read as Parquet ({reason}); pass a Parquet file of bars"
        ) from None


def _is_numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_symbol_type(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)


def _always_categorical(kind: pa.DataType) -> bool:
    """Text, dictionary and boolean columns can only be categories."""
    return _is_text(kind) or pa.types.is_dictionary(kind) or pa.types.is_boolean(kind)


def _usable(kind: pa.DataType) -> bool:
    return _is_numeric(kind) or _always_categorical(kind)


def unusable_reason(kind: pa.DataType) -> str:
    """Why a column of this type is left out when no role names it."""
    return f"type {kind} is neither a number nor a category"


ConstantWithinSymbols = Callable[[str, "str | None"], bool]
"""``(column, symbol column) -> whether the column holds one value within each symbol``."""


def _resolve_roles(
    path: DataSource, schema: pa.Schema, roles: ColumnRoles, is_constant: ConstantWithinSymbols
) -> ColumnRoles:
    """Check the roles against the file and fill in every automatic role.

    The result lists every column of every role (``observed``, ``static`` and ``categorical``
    included), so resolving it again against the same file gives it back unchanged.
    """

    def field(name: str, role: str, option: str) -> pa.Field:
        if name not in schema.names:
            raise _error(
                path,
                f"no {role} column '{name}' ({_columns_hint(schema)}); "
                f"name the right column with {how_to_name(option)}",
            )
        return schema.field(name)

    def usable(name: str, role: str, option: str) -> None:
        kind = field(name, role, option).type
        if not _usable(kind):
            raise _error(
                path,
                f"{role} column '{name}' has type {kind}, neither a number nor a category; "
                f"convert it or leave it out of {how_to_name(option)}",
            )

    field(roles.timestamp, "timestamp", "timestamp")  # its type: tft.data.timestamps
    symbol = roles.symbol
    if symbol is not None and not _is_symbol_type(field(symbol, "symbol", "symbol").type):
        raise _error(
            path,
            f"symbol column '{symbol}' has type {schema.field(symbol).type}, not text or integer; "
            "store symbols as strings, or name another column with "
            f"{how_to_name('symbol')}",
        )
    if symbol is None and "symbol" in schema.names:
        symbol = "symbol" if _is_symbol_type(schema.field("symbol").type) else None
    target_type = field(roles.target, "target", "target").type
    if not _is_numeric(target_type):
        raise _error(
            path,
            f"target column '{roles.target}' has type {target_type}, not a number; forecast a "
            f"numeric column (a price) with {how_to_name('target')}",
        )
    for name in roles.ignore:
        field(name, "ignored", "ignore")
    for name in roles.categorical:
        kind = field(name, "categorical", "categorical").type
        # A static column is a category whatever its type (the model has no static reals).
        if not _usable(kind) or (pa.types.is_floating(kind) and name not in (roles.static or [])):
            raise _error(
                path,
                f"categorical column '{name}' has type {kind}; only integer columns need naming "
                "as categorical (text and booleans always are, and a float is a real input): "
                f"leave it out of {how_to_name('categorical')}",
            )
    reserved = {roles.timestamp, symbol, roles.target}
    for name in roles.known:
        usable(name, "known", "known")
    named = reserved | set(roles.known) | set(roles.ignore) | set(roles.observed or [])
    if roles.static is None:
        free = [f.name for f in schema if f.name not in named and _is_text(f.type)]
        static = [name for name in free if is_constant(name, symbol)]
    else:
        static = list(roles.static)
        for name in static:
            usable(name, "static", "static")
    if roles.observed is None:
        taken = named | set(static)
        observed = [f.name for f in schema if f.name not in taken and _usable(f.type)]
    else:
        observed = list(roles.observed)
        for name in observed:
            usable(name, "observed", "observed")
    _check_one_role_each(path, roles, symbol, observed, static)
    # Inferred static columns were found constant above; named ones are checked here.
    for name in roles.static or []:
        if not is_constant(name, symbol):
            raise _error(
                path,
                f"static column '{name}' takes more than one value within a symbol; name it "
                f"known or observed instead of static ({how_to_name('static')})",
            )
    categorical = _categorical_columns(
        path, schema, roles, [*roles.known, *observed, *static], static
    )
    return roles.model_copy(
        update={
            "symbol": symbol,
            "observed": observed,
            "static": static,
            "categorical": categorical,
        }
    )


def _check_one_role_each(
    path: DataSource, roles: ColumnRoles, symbol: str | None, observed: list[str], static: list[str]
) -> None:
    """No column listed twice in one role, nor given two roles."""
    for role, names in (("known", roles.known), ("observed", observed), ("static", static)):
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise _error(path, f"column '{repeated[0]}' is listed twice as {role}; list it once")
    roles_of: dict[str, list[str]] = {}
    for role, names in (
        ("timestamp", [roles.timestamp]),
        ("symbol", [symbol] if symbol is not None else []),
        ("target", [roles.target]),
        ("known", roles.known),
        ("observed", observed),
        ("static", static),
        ("ignore", roles.ignore),
    ):
        for name in names:
            roles_of.setdefault(name, []).append(role)
    clashes = [name for name, held in roles_of.items() if len(held) > 1]
    if clashes:
        held = roles_of[clashes[0]]
        raise _error(
            path,
            f"column '{clashes[0]}' has two roles ({', '.join(held)}); give each column one "
            "role (the data columns flags, or ColumnRoles)",
        )


def _categorical_columns(
    path: DataSource, schema: pa.Schema, roles: ColumnRoles, used: list[str], static: list[str]
) -> list[str]:
    """The used columns embedded as categories: those named so, the static ones, and every
    text and boolean column; an integer column named categorical must have a role."""
    unused_integers = [name for name in roles.categorical if name not in used]
    if unused_integers:
        raise _error(
            path,
            f"categorical column '{unused_integers[0]}' has no role (it is ignored or not "
            "listed as known, observed or static); give it one or leave it out of "
            f"{how_to_name('categorical')}",
        )
    return [
        name
        for name in used
        if name in roles.categorical
        or name in static
        or _always_categorical(schema.field(name).type)
    ]


def _roles_difference(file_roles: ColumnRoles, fitted: ColumnRoles) -> str:
    for key in ColumnRoles.model_fields:
        here, there = getattr(file_roles, key), getattr(fitted, key)
        if here == there:
            continue
        if isinstance(here, list) and isinstance(there, list):
            extra = [name for name in here if name not in there]
            lacking = [name for name in there if name not in here]
            here = f"{len(here)} columns" + (f" with '{extra[0]}'" if extra else "")
            there = f"{len(there)} columns" + (f" with '{lacking[0]}'" if lacking else "")
        return (
            f"roles differ from the normalizer's: {key} is {here} here but {there} when it was "
            "fitted; load the file with the roles used for training"
        )
    raise AssertionError("roles differ in no field")


def _read_table(path: DataSource, columns: list[str]) -> pa.Table:
    """The columns of a file, or of a folder's files with a column naming each row's file
    (NOTE [A folder of files as one dataset])."""
    if path.many:
        return read_folder(path, columns)
    try:
        table = pq.read_table(path.file, columns=columns)
    except (pa.ArrowException, OSError) as error:
        reason = first_line(error)
        raise _error(
            path, f"cannot be read as Parquet ({reason}); pass a Parquet file of bars"
        ) from None
    if table.num_rows == 0:
        raise _error(path, "has no rows; pass a file with bars in it")
    return table


def _float_column(table: pa.Table, name: str) -> np.ndarray:
    return table[name].cast(pa.float64()).fill_null(math.nan).to_numpy()


def _iso(time_ns: int) -> str:
    return str(np.datetime64(int(time_ns), "ns"))


def _symbol_codes(
    path: DataSource, table: pa.Table, name: str | None, known_symbols: list[str] | None
) -> tuple[np.ndarray, list[str]]:
    """(per-row symbol index, symbol names); names are sorted unless given by a normalizer."""
    if name is None:
        return np.zeros(table.num_rows, dtype=np.int64), known_symbols or [NO_SYMBOL]
    column = table[name].cast(pa.string())
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise _error(path, f"symbol column '{name}' is empty at row {row}; fill it or drop it")
    present = sorted(pc.unique(column).to_pylist())
    symbols = present if known_symbols is None else known_symbols
    check_symbols_known(path, name, present, symbols)
    codes = pc.index_in(column, value_set=pa.array(symbols, type=pa.string()))
    return codes.to_numpy().astype(np.int64), symbols


def check_symbols_known(
    path: DataSource, name: str | None, present: list[str], known: list[str]
) -> None:
    """Raise naming the first symbol of ``present`` the training data (``known``) lacked."""
    unknown = [symbol for symbol in present if symbol not in known]
    if unknown:
        raise _error(
            path,
            f"symbol '{unknown[0]}' in column '{name}' was not in the training data "
            f"(which had {', '.join(known)}); keep only those symbols",
        )


def _check_order(
    path: DataSource,
    time_ns: np.ndarray,
    codes: np.ndarray,
    file_rows: np.ndarray,
    symbols: list[str],
    hint: str = "",
) -> None:
    """Each symbol's rows strictly later than the one before. ``hint``: where no symbol column
    is used, how to name one (:func:`tft.data.role_inference.symbol_hint`), said before the
    advice to drop or sort rows: the usual cause is several instruments in one file."""
    same_symbol = codes[1:] == codes[:-1]
    bad = np.flatnonzero(same_symbol & (time_ns[1:] <= time_ns[:-1]))
    if len(bad) == 0:
        return
    i = int(bad[0])
    row, previous = int(file_rows[i + 1]), int(file_rows[i])
    symbol = symbols[int(codes[i])]
    otherwise = "; otherwise" if hint else ";"
    if time_ns[i + 1] == time_ns[i]:
        raise _error(
            path,
            f"row {row} repeats the timestamp {_iso(time_ns[i])} of row {previous} for symbol "
            f"'{symbol}'{hint}{otherwise} drop duplicate bars",
        )
    raise _error(
        path,
        f"row {row} ({_iso(time_ns[i + 1])}) is earlier than row {previous} "
        f"({_iso(time_ns[i])}) for symbol '{symbol}'{hint}{otherwise} sort the file by symbol "
        "and timestamp",
    )


def _check_finite(
    path: DataSource, name: str, values: np.ndarray, file_rows: np.ndarray, *, whole: bool = True
) -> None:
    """Every value finite, else one line with how many are not and the first such row.
    ``whole``: ``values`` are the file's rows, not one chunk of them (the count says which)."""
    finite = np.isfinite(values)
    if finite.all():
        return
    if not finite.any() and whole:
        raise _error(
            path,
            f"column '{name}' has no finite value (all null/NaN); drop the column or list the "
            f"columns to use in {how_to_name('observed')}",
        )
    bad = np.flatnonzero(~finite)
    first = bad[np.argmin(file_rows[bad])]
    value = values[first]
    shown = "null/NaN" if np.isnan(value) else str(value)
    # NOTE [Warm-up rows]: each symbol's leading NaNs are dropped before this check.
    where = "rows" if whole else "rows of the chunk read with it"
    raise _error(
        path,
        f"column '{name}' is null/NaN or infinite at {len(bad):,} {where}, the first row "
        f"{int(file_rows[first])} ({shown}); fill or drop those rows (NaN and inf are not "
        "accepted)",
    )
