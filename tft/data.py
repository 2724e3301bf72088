"""A trader's Parquet file of bars -> normalised TFT windows.

NOTE [Rows, windows and splits]
Rows are grouped by symbol (file order kept within a symbol; timestamps must strictly increase
there) and every input role lives in ONE contiguous float32 array over all kept rows:
``observed`` (N, num_observed), ``known`` (N, num_known), ``target`` (N,). A window is just its
first row ``s``: encoder rows ``s .. s+Te-1``, decoder rows ``s+Te .. s+Te+Td-1``, so the target
at decoder step ``h`` (0-based) is the row ``h + 1`` steps after the last encoder row.
:meth:`WindowDataset.batch` gathers rows with fancy indexing; no window is ever stored.

* Inputs. Observed column 0 is the transformed target's own history (normalised like the
  target), then the observed columns. Known columns are the user's known-future columns, then
  four calendar features computed from the timestamp in UTC: sin/cos of the minute of the day
  and sin/cos of the day of the week (Monday = 0); these are not normalised. By default the
  observed columns are every numeric column except the timestamp, the symbol, the target and the
  known columns (the target enters through its transformed history).
* Target. ``log_return`` (default): ``log(p[t]) - log(p[t-1])``, prices must be > 0; ``diff``:
  ``p[t] - p[t-1]``; ``none``: ``p[t]``. For ``log_return`` and ``diff`` the first row of each
  symbol has no previous price and is dropped (from every role).
* NaN policy. Nothing is filled in: a null, NaN or infinite value in the target (any row) or in
  an observed or known column (any kept row) raises :class:`DataError` naming the column and the
  first bad row (0-based, in file order); a column with no finite value at all is reported as such.
* Splits. Global time cut points (so the test period is the same calendar span for every
  symbol): the sorted distinct timestamps are cut at the split fractions; rows before the first
  cut are training, then validation, then test. A window lies wholly inside one symbol and one
  split. The normaliser (mean and standard deviation per column, population std, 1.0 for a
  constant column) is fitted on the training rows only.
* Whole file. :attr:`WindowedData.whole` always holds every window of the file, ignoring the
  splits (for prediction). ``split_fractions=None`` leaves train/validation/test empty and fits
  the normaliser (when none is given) on all rows.
* Gaps (the daily break, weekends) are not filled: windows run across them, in bar order.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autockpt.errors import ConfigError, DataError

__all__ = [
    "CALENDAR_COLUMNS",
    "NO_SYMBOL",
    "Batch",
    "ColumnRoles",
    "Normalizer",
    "WindowDataset",
    "WindowedData",
    "iterate_batches",
    "load_windows",
]

CALENDAR_COLUMNS = ("minute_of_day_sin", "minute_of_day_cos", "day_of_week_sin", "day_of_week_cos")
"""Known features derived from the timestamp (UTC), always the last known columns."""

NO_SYMBOL = "default"
"""Symbol name used when the file has no symbol column."""

_NS_PER_MINUTE = 60 * 1_000_000_000
_NS_PER_DAY = 1440 * _NS_PER_MINUTE
_SPLIT_NAMES = ("train", "validation", "test")
_ArrayOrTensor = TypeVar("_ArrayOrTensor", np.ndarray, torch.Tensor)


class ColumnRoles(BaseModel):
    """Which column of the file plays which part; see NOTE [Rows, windows and splits]."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    timestamp: str = "timestamp"
    """Timestamp column (a Parquet timestamp; naive times are read as UTC)."""
    symbol: str | None = None
    """Symbol column (string, dictionary or integer); None uses a column named "symbol" if any."""
    target: str = "close"
    """Numeric column to forecast."""
    target_transform: Literal["log_return", "diff", "none"] = "log_return"
    """What the model forecasts: log returns of the target, differences, or the value itself."""
    known: list[str] = Field(default_factory=list)
    """Numeric columns whose future values are known when forecasting (e.g. a holiday flag)."""
    observed: list[str] | None = None
    """Numeric past-only columns; None takes every numeric column not otherwise used."""


class Normalizer(BaseModel):
    """Per-column mean and standard deviation, and the roles and symbols they were fitted for.

    ``roles`` is fully resolved (``observed`` listed, ``symbol`` filled in when the file had a
    symbol column), so that passing this normalizer to :func:`load_windows` for another file
    reads the same columns and gives each symbol the same index.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    roles: ColumnRoles
    symbols: list[str]
    target_mean: float
    target_std: float
    observed_mean: list[float]
    observed_std: list[float]
    known_mean: list[float]
    known_std: list[float]

    @model_validator(mode="after")
    def _check_lengths(self) -> Normalizer:
        for role, names, means, stds in (
            ("observed", self.roles.observed or [], self.observed_mean, self.observed_std),
            ("known", self.roles.known, self.known_mean, self.known_std),
        ):
            if not len(names) == len(means) == len(stds):
                raise ValueError(f"{role} statistics need {len(names)} values each")
        stds = [self.target_std, *self.observed_std, *self.known_std]
        if not all(math.isfinite(std) and std > 0 for std in stds):
            raise ValueError("standard deviations must be finite and > 0")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (strings, floats, lists); :meth:`from_dict` reads it back."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Normalizer:
        """Rebuild a normalizer from :meth:`to_dict` output.

        Raises:
            DataError: the dict is not a saved normalizer.
        """
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the dict"
            raise DataError(
                f"normalizer dict is not valid at {where}: {first['msg']}; "
                "pass the dict written by Normalizer.to_dict()"
            ) from None

    def denormalize_target(self, values: _ArrayOrTensor) -> _ArrayOrTensor:
        """Normalised target values (array or tensor) -> target-transform units."""
        return values * self.target_std + self.target_mean


class Batch(NamedTuple):
    """One batch of windows; B windows, Te encoder steps, Td = horizon decoder steps."""

    static_ids: torch.Tensor  # (B, 1) int64, the symbol index
    encoder_observed: torch.Tensor  # (B, Te, num_observed) float32
    encoder_known: torch.Tensor  # (B, Te, num_known) float32
    decoder_known: torch.Tensor  # (B, Td, num_known) float32
    target: torch.Tensor  # (B, Td) float32, normalised
    decoder_time_ns: torch.Tensor  # (B, Td) int64, UTC nanoseconds of the forecast rows
    symbol_index: torch.Tensor  # (B,) int64

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The model's four inputs: static ids, encoder observed, encoder known, decoder known."""
        return self.static_ids, self.encoder_observed, self.encoder_known, self.decoder_known

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """The same batch with every tensor moved to ``device``."""
        return Batch(*(tensor.to(device, non_blocking=non_blocking) for tensor in self))


@dataclass(frozen=True)
class _Rows:
    """The contiguous per-row arrays every dataset of one file indexes into."""

    observed: np.ndarray  # (N, num_observed) float32
    known: np.ndarray  # (N, num_known) float32
    target: np.ndarray  # (N,) float32
    time_ns: np.ndarray  # (N,) int64
    symbol_index: np.ndarray  # (N,) int64


class WindowDataset:
    """Windows of one split: the start rows of its windows into the shared row arrays."""

    def __init__(self, rows: _Rows, starts: np.ndarray, *, encoder_length: int, horizon: int):
        self._rows = rows
        self._starts = starts
        self._starts.setflags(write=False)
        self.encoder_length = encoder_length
        self.horizon = horizon
        self._encoder_offsets = np.arange(encoder_length, dtype=np.int64)
        self._decoder_offsets = np.arange(encoder_length, encoder_length + horizon, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def starts(self) -> np.ndarray:
        """Read-only (num_windows,) int64 first row of each window in the row arrays."""
        return self._starts

    def batch(self, indices: np.ndarray | Sequence[int]) -> Batch:
        """Gather the windows at ``indices`` (positions in this dataset) into tensors."""
        starts = self._starts[np.asarray(indices, dtype=np.int64)]  # (B,)
        encoder_rows = starts[:, None] + self._encoder_offsets  # (B, Te)
        decoder_rows = starts[:, None] + self._decoder_offsets  # (B, Td)
        rows = self._rows
        symbol_index = torch.from_numpy(rows.symbol_index[starts])
        return Batch(
            static_ids=symbol_index[:, None],
            encoder_observed=torch.from_numpy(np.take(rows.observed, encoder_rows, axis=0)),
            encoder_known=torch.from_numpy(np.take(rows.known, encoder_rows, axis=0)),
            decoder_known=torch.from_numpy(np.take(rows.known, decoder_rows, axis=0)),
            target=torch.from_numpy(rows.target[decoder_rows]),
            decoder_time_ns=torch.from_numpy(rows.time_ns[decoder_rows]),
            symbol_index=symbol_index,
        )


@dataclass(frozen=True)
class WindowedData:
    """Windows of one file, split by time, with the normaliser fitted on the training rows."""

    train: WindowDataset
    validation: WindowDataset
    test: WindowDataset
    whole: WindowDataset
    """Every window of the file, across split boundaries (for prediction)."""
    normalizer: Normalizer
    symbols: list[str]
    observed_columns: list[str]
    """Input names; the first is the target's transformed history, e.g. ``close_log_return``."""
    known_columns: list[str]
    encoder_length: int
    horizon: int

    @property
    def num_observed(self) -> int:
        return len(self.observed_columns)

    @property
    def num_known(self) -> int:
        return len(self.known_columns)

    @property
    def static_cardinalities(self) -> list[int]:
        return [len(self.symbols)]


def iterate_batches(
    dataset: WindowDataset, batch_size: int, *, shuffle: bool, seed: int, drop_last: bool
) -> Iterator[Batch]:
    """Yield batches of ``dataset``, in order or in a permutation fixed by ``seed``.

    Raises:
        ConfigError: batch_size < 1.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be at least 1; pass e.g. 32")
    order = np.arange(len(dataset), dtype=np.int64)
    if shuffle:
        order = np.random.default_rng(seed).permutation(order)
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    for begin in range(0, stop, batch_size):
        yield dataset.batch(order[begin : begin + batch_size])


# ---------------------------------------------------------------------------- reading


def _error(path: Path, text: str) -> DataError:
    return DataError(f"{path}: {' '.join(text.split())}")


def _columns_hint(schema: pa.Schema) -> str:
    names = schema.names
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    return f"the file has {shown}"


def _read_schema(path: Path) -> pa.Schema:
    if not path.exists():
        raise _error(path, "no such file; check the path or write one with `autockpt make-data`")
    if path.is_dir():
        raise _error(path, "is a folder, not a Parquet file; pass the path of a .parquet file")
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise _error(
            path, f"cannot be read as Parquet ({reason}); pass a Parquet file of bars"
        ) from None


def _is_numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _is_symbol_type(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)


def _resolve_roles(path: Path, schema: pa.Schema, roles: ColumnRoles) -> ColumnRoles:
    """Check the roles against the file and fill in the automatic symbol and observed columns."""

    def field(name: str, role: str, option: str) -> pa.Field:
        if name not in schema.names:
            raise _error(
                path,
                f"no {role} column '{name}' ({_columns_hint(schema)}); "
                f"name the right column with ColumnRoles({option}=...)",
            )
        return schema.field(name)

    def numeric(name: str, role: str, option: str) -> None:
        kind = field(name, role, option).type
        if not _is_numeric(kind):
            raise _error(
                path,
                f"{role} column '{name}' has type {kind}, not a number; "
                f"convert it to numbers or leave it out of ColumnRoles({option}=...)",
            )

    if not pa.types.is_timestamp(field(roles.timestamp, "timestamp", "timestamp").type):
        kind = schema.field(roles.timestamp).type
        raise _error(
            path,
            f"timestamp column '{roles.timestamp}' has type {kind}, not a timestamp; "
            "store it as a Parquet timestamp or name another column with ColumnRoles(timestamp=...)",
        )
    symbol = roles.symbol
    if symbol is not None and not _is_symbol_type(field(symbol, "symbol", "symbol").type):
        raise _error(
            path,
            f"symbol column '{symbol}' has type {schema.field(symbol).type}, not text or integer; "
            "store symbols as strings or set ColumnRoles(symbol=None)",
        )
    if symbol is None and "symbol" in schema.names:
        symbol = "symbol" if _is_symbol_type(schema.field("symbol").type) else None
    numeric(roles.target, "target", "target")
    reserved = {roles.timestamp, symbol}
    for name in roles.known:
        numeric(name, "known", "known")
    if roles.observed is None:
        taken = reserved | {roles.target, *roles.known}
        observed = [f.name for f in schema if f.name not in taken and _is_numeric(f.type)]
    else:
        observed = list(roles.observed)
        for name in observed:
            numeric(name, "observed", "observed")
    for role, names in (("known", roles.known), ("observed", observed)):
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise _error(path, f"column '{repeated[0]}' is listed twice as {role}; list it once")
    clashes = [name for name in roles.known if name in observed or name in reserved]
    clashes += [name for name in observed if name in reserved]
    if roles.target in roles.known:
        clashes.append(roles.target)
    if clashes:
        raise _error(
            path,
            f"column '{clashes[0]}' has two roles (timestamp, symbol, target, known, observed); "
            "give each column one role in ColumnRoles",
        )
    return roles.model_copy(update={"symbol": symbol, "observed": observed})


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


def _read_table(path: Path, columns: list[str]) -> pa.Table:
    try:
        table = pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
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


def _timestamps(path: Path, table: pa.Table, name: str) -> np.ndarray:
    column = table[name]
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise _error(path, f"timestamp column '{name}' is empty at row {row}; drop that row")
    try:
        as_ns = column.cast(pa.timestamp("ns", tz=column.type.tz))
    except pa.ArrowInvalid:
        raise _error(
            path, f"timestamp column '{name}' has times outside 1678-2261; drop those rows"
        ) from None
    return as_ns.cast(pa.int64()).to_numpy()


def _symbol_codes(
    path: Path, table: pa.Table, name: str | None, known_symbols: list[str] | None
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
    unknown = [symbol for symbol in present if symbol not in symbols]
    if unknown:
        raise _error(
            path,
            f"symbol '{unknown[0]}' in column '{name}' was not in the training data "
            f"(which had {', '.join(symbols)}); keep only those symbols",
        )
    codes = pc.index_in(column, value_set=pa.array(symbols, type=pa.string()))
    return codes.to_numpy().astype(np.int64), symbols


def _check_order(
    path: Path, time_ns: np.ndarray, codes: np.ndarray, file_rows: np.ndarray, symbols: list[str]
) -> None:
    same_symbol = codes[1:] == codes[:-1]
    bad = np.flatnonzero(same_symbol & (time_ns[1:] <= time_ns[:-1]))
    if len(bad) == 0:
        return
    i = int(bad[0])
    row, previous = int(file_rows[i + 1]), int(file_rows[i])
    symbol = symbols[int(codes[i])]
    if time_ns[i + 1] == time_ns[i]:
        raise _error(
            path,
            f"row {row} repeats the timestamp {_iso(time_ns[i])} of row {previous} for symbol "
            f"'{symbol}'; drop duplicate bars",
        )
    raise _error(
        path,
        f"row {row} ({_iso(time_ns[i + 1])}) is earlier than row {previous} "
        f"({_iso(time_ns[i])}) for symbol '{symbol}'; sort the file by symbol and timestamp",
    )


def _check_finite(path: Path, name: str, values: np.ndarray, file_rows: np.ndarray) -> None:
    finite = np.isfinite(values)
    if finite.all():
        return
    if not finite.any():
        raise _error(
            path,
            f"column '{name}' has no finite value (all null/NaN); drop the column or list the "
            "columns to use in ColumnRoles(observed=...)",
        )
    row = int(file_rows[np.argmin(finite)])
    value = values[np.argmin(finite)]
    raise _error(
        path,
        f"column '{name}' is {'null/NaN' if np.isnan(value) else value} at row {row}; "
        "fill or drop that row (NaN and inf are not accepted)",
    )


def _transform_target(
    path: Path,
    name: str,
    transform: str,
    values: np.ndarray,
    first_of_symbol: np.ndarray,
    file_rows: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(transformed target for the kept rows, kept-row mask)."""
    _check_finite(path, name, values, file_rows)
    if transform == "none":
        return values, np.ones(len(values), dtype=bool)
    if transform == "log_return":
        bad = np.flatnonzero(values <= 0)
        if len(bad):
            raise _error(
                path,
                f"target column '{name}' is {values[bad[0]]} at row {file_rows[bad[0]]}; "
                "log returns need prices > 0: fix the row or use target_transform='diff'",
            )
        values = np.log(values)
    keep = ~first_of_symbol
    return (values[1:] - values[:-1])[keep[1:]], keep


# ---------------------------------------------------------------------------- splitting


def _check_options(
    encoder_length: int, horizon: int, split_fractions: Sequence[float] | None
) -> None:
    for name, value in (("encoder_length", encoder_length), ("horizon", horizon)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a whole number >= 1; pass e.g. 10")
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


def _split_labels(time_ns: np.ndarray, fractions: Sequence[float]) -> np.ndarray:
    """0/1/2 (train/validation/test) per row, from global cut points on the distinct times."""
    distinct = np.unique(time_ns)
    cuts = []
    for fraction in (fractions[0], fractions[0] + fractions[1]):
        index = round(fraction * len(distinct))
        cuts.append(distinct[index] if index < len(distinct) else np.iinfo(np.int64).max)
    return (time_ns >= cuts[0]).astype(np.int8) + (time_ns >= cuts[1]).astype(np.int8)


def _window_starts(
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


def _too_short(
    path: Path, split: str | None, longest: int, encoder_length: int, horizon: int
) -> DataError:
    where = "the file" if split is None else f"the {split} split"
    way_out = "" if split is None else f", give the {split} split a larger fraction"
    return _error(
        path,
        f"{where} has no full window: one needs {encoder_length + horizon} consecutive rows of "
        f"one symbol (encoder length {encoder_length} + horizon {horizon}) but the longest run "
        f"there has {longest}; lower the encoder length or the horizon{way_out} or use a longer "
        "file",
    )


def _mean_std(values: np.ndarray) -> tuple[float, float]:
    mean = float(values.mean())
    std = float(values.std())
    return mean, std if std > 0 and math.isfinite(std) else 1.0


def _normalise_columns(
    path: Path,
    table: pa.Table,
    names: list[str],
    file_rows: np.ndarray,
    train_rows: np.ndarray,
    stats: tuple[list[float], list[float]] | None,
    out: np.ndarray,
) -> tuple[list[float], list[float]]:
    """Write the normalised columns into ``out`` (N, len(names)); return (means, stds).

    The statistics are fitted on ``train_rows`` unless ``stats`` gives them.
    """
    means: list[float] = []
    stds: list[float] = []
    for j, name in enumerate(names):
        values = _float_column(table, name)[file_rows]
        _check_finite(path, name, values, file_rows)
        mean, std = _mean_std(values[train_rows]) if stats is None else (stats[0][j], stats[1][j])
        means.append(mean)
        stds.append(std)
        out[:, j] = (values - mean) / std
    return means, stds


def _calendar(time_ns: np.ndarray) -> np.ndarray:
    """(N, 4) float32: sin/cos of the UTC minute of the day and of the day of the week."""
    minute = (time_ns // _NS_PER_MINUTE) % 1440
    weekday = (time_ns // _NS_PER_DAY + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    minute_angle = 2 * np.pi * minute / 1440
    weekday_angle = 2 * np.pi * weekday / 7
    parts = [np.sin(minute_angle), np.cos(minute_angle), np.sin(weekday_angle)]
    parts.append(np.cos(weekday_angle))
    return np.stack(parts, axis=1).astype(np.float32)


# ---------------------------------------------------------------------------- public API


def load_windows(
    path: str | os.PathLike[str],
    *,
    roles: ColumnRoles | None = None,
    encoder_length: int,
    horizon: int,
    split_fractions: Sequence[float] | None = (0.7, 0.15, 0.15),
    normalizer: Normalizer | None = None,
) -> WindowedData:
    """Read a Parquet file of bars and cut it into normalised TFT windows.

    See NOTE [Rows, windows and splits] (module docstring) for the layout, the NaN policy and the
    split rule.

    Args:
        path: Parquet file; only the columns the roles need are read.
        roles: column roles; None uses the defaults, or the normalizer's roles when one is given.
        encoder_length: past rows the model sees (Te).
        horizon: rows forecast after them (Td).
        split_fractions: (train, validation, test) shares of the distinct timestamps; None keeps
            the file whole (only :attr:`WindowedData.whole` has windows).
        normalizer: statistics to apply instead of fitting new ones (e.g. for prediction); its
            roles and symbols must match the file.

    Returns:
        The windows and the normalizer.

    Raises:
        DataError: a file that cannot be used (missing, not Parquet, empty, missing or
            non-numeric columns, NaN/inf values, duplicate or unsorted timestamps, non-positive
            prices for log returns, too few rows for one window in a split); the message names
            the file, the column or row, and the fix.
        ConfigError: encoder_length or horizon < 1, or bad split fractions.

    Example::

        data = load_windows("bars.parquet", encoder_length=120, horizon=10)
        batch = data.train.batch([0, 1, 2])
        batch.encoder_observed.shape  # (3, 120, data.num_observed)
        prediction = model(*batch.inputs())
    """
    path = Path(path)
    _check_options(encoder_length, horizon, split_fractions)
    schema = _read_schema(path)
    roles = roles if roles is not None else normalizer.roles if normalizer else ColumnRoles()
    roles = _resolve_roles(path, schema, roles)
    if normalizer is not None and roles != normalizer.roles:
        raise _error(path, _roles_difference(roles, normalizer.roles))
    observed_names = roles.observed or []
    wanted = [roles.timestamp, roles.symbol, roles.target, *roles.known, *observed_names]
    table = _read_table(path, list(dict.fromkeys(name for name in wanted if name is not None)))

    time_ns = _timestamps(path, table, roles.timestamp)
    codes, symbols = _symbol_codes(
        path, table, roles.symbol, normalizer.symbols if normalizer else None
    )
    file_rows = np.argsort(codes, kind="stable") if len(symbols) > 1 else np.arange(len(codes))
    time_ns, codes = time_ns[file_rows], codes[file_rows]
    _check_order(path, time_ns, codes, file_rows, symbols)
    first_of_symbol = np.concatenate([[True], codes[1:] != codes[:-1]])

    target, keep = _transform_target(
        path,
        roles.target,
        roles.target_transform,
        _float_column(table, roles.target)[file_rows],
        first_of_symbol,
        file_rows,
    )
    time_ns, codes, file_rows = time_ns[keep], codes[keep], file_rows[keep]
    symbol_bounds = np.searchsorted(codes, np.arange(len(symbols) + 1))

    length = encoder_length + horizon
    whole, longest = _window_starts(np.zeros(len(codes), np.int8), symbol_bounds, 0, length)
    if len(whole) == 0:
        raise _too_short(path, None, longest, encoder_length, horizon)
    if split_fractions is None:
        labels = np.zeros(len(codes), dtype=np.int8)
        split_starts = [np.empty(0, dtype=np.int64)] * 3
    else:
        labels = _split_labels(time_ns, split_fractions)
        split_starts = []
        for label, (name, fraction) in enumerate(zip(_SPLIT_NAMES, split_fractions, strict=True)):
            starts, longest = _window_starts(labels, symbol_bounds, label, length)
            if len(starts) == 0 and fraction > 0:
                raise _too_short(path, name, longest, encoder_length, horizon)
            split_starts.append(starts)
    train_rows = labels == 0

    if normalizer is None:
        target_mean, target_std = _mean_std(target[train_rows])
    else:
        target_mean, target_std = normalizer.target_mean, normalizer.target_std
    observed = np.empty((len(codes), 1 + len(observed_names)), dtype=np.float32)
    observed[:, 0] = (target - target_mean) / target_std
    observed_stats = _normalise_columns(
        path,
        table,
        observed_names,
        file_rows,
        train_rows,
        (normalizer.observed_mean, normalizer.observed_std) if normalizer else None,
        observed[:, 1:],
    )
    known = np.empty((len(codes), len(roles.known) + len(CALENDAR_COLUMNS)), dtype=np.float32)
    known_stats = _normalise_columns(
        path,
        table,
        roles.known,
        file_rows,
        train_rows,
        (normalizer.known_mean, normalizer.known_std) if normalizer else None,
        known,
    )
    known[:, len(roles.known) :] = _calendar(time_ns)
    normalizer = normalizer or Normalizer(
        roles=roles,
        symbols=symbols,
        target_mean=target_mean,
        target_std=target_std,
        observed_mean=observed_stats[0],
        observed_std=observed_stats[1],
        known_mean=known_stats[0],
        known_std=known_stats[1],
    )

    rows = _Rows(observed, known, observed[:, 0].copy(), time_ns, codes)

    def dataset(starts: np.ndarray) -> WindowDataset:
        return WindowDataset(rows, starts, encoder_length=encoder_length, horizon=horizon)

    suffix = {"log_return": "log_return", "diff": "diff", "none": "level"}[roles.target_transform]
    return WindowedData(
        train=dataset(split_starts[0]),
        validation=dataset(split_starts[1]),
        test=dataset(split_starts[2]),
        whole=dataset(whole),
        normalizer=normalizer,
        symbols=symbols,
        observed_columns=[f"{roles.target}_{suffix}", *observed_names],
        known_columns=[*roles.known, *CALENDAR_COLUMNS],
        encoder_length=encoder_length,
        horizon=horizon,
    )
