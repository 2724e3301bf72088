"""A trader's Parquet file of bars -> normalised TFT windows, and batches of them.

This module cuts the rows into windows (:func:`load_windows`, :class:`WindowDataset`) and
gathers batches (:class:`Batch`, :func:`iterate_batches`); the column roles and the reading and
checking of the file are in :mod:`tft.data.columns`, the target transform and the scales in
:mod:`tft.data.normalize`, the categories in :mod:`tft.data.categories`, the row arrays in
:mod:`tft.data.rows`, and the table of what the model reads in :mod:`tft.data.column_table`.

NOTE [Rows, windows and splits]
Rows are grouped by symbol (file order kept within a symbol; timestamps must strictly increase
there) and every input role lives in ONE contiguous array over all kept rows:
``observed`` (N, num_observed) and ``known`` (N, num_known) float32 for the real inputs,
``categorical`` (N, Co + Ck) and ``static`` (N, num_static) int64 codes, ``target`` (N,). A
window is just its
first row ``s``: encoder rows ``s .. s+Te-1``, decoder rows ``s+Te .. s+Te+Td-1``, so the target
at decoder step ``h`` (0-based) is the row ``h + 1`` steps after the last encoder row.
:meth:`WindowDataset.batch` gathers rows with fancy indexing; no window is ever stored.

* Inputs. Observed real column 0 is the transformed target's own history (scaled like the
  target), then the real observed columns. Known real columns are the user's real known-future
  columns, then four calendar features computed from the timestamp in UTC: sin/cos of the
  minute of the day and sin/cos of the day of the week (Monday = 0); these are not scaled.
  Categorical columns (text, dictionary, boolean, and integers named categorical) are coded
  (NOTE [Categories] in :mod:`tft.data.categories`): observed then known ones per row, static ones
  (constant within a symbol) read at a window's first row after the symbol's own index. By
  default the observed columns are every real or categorical column with no other role (the
  target enters through its transformed history) and the static ones every text column
  constant within each symbol; :attr:`WindowedData.columns` says of each column which it is.
* Target. ``log_return`` (default): ``log(p[t]) - log(p[t-1])``, prices must be > 0; ``diff``:
  ``p[t] - p[t-1]``; ``none``: ``p[t]``. For ``log_return`` and ``diff`` the first row of each
  symbol has no previous price and is dropped (from every role).
* NaN policy. Nothing is filled in: a null, NaN or infinite value in the target (any row) or in
  a real observed or known column (any kept row) raises :class:`DataError` naming the column
  and the first bad row (0-based, in file order); a column with no finite value at all is
  reported as such. A null in a categorical column is its "unknown" category.
* Splits. Global time cut points (so the test period is the same calendar span for every
  symbol): the sorted distinct timestamps are cut at the split fractions or at two dates (NOTE
  [A split by shares or by dates] in :mod:`tft.data.splits`); rows before the first cut are
  training, then validation, then test. A window lies wholly inside one symbol and one split. The normaliser (a mean and standard deviation per column and symbol, NOTE
  [Per-symbol scaling] in :mod:`tft.data.normalize`; the categories of each categorical column) is
  fitted on the training rows only.
* Whole file. :attr:`WindowedData.whole` always holds every window of the file, ignoring the
  splits (for prediction). ``split_fractions=None`` leaves train/validation/test empty and fits
  the normaliser (when none is given) on all rows.
* Gaps (the daily break, weekends) are not filled: windows run across them, in bar order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from tft.data.batch import Batch, WindowOrder
from tft.data.categories import category_text, constant_within_groups
from tft.data.column_table import CALENDAR_INPUTS, ColumnUse, column_table
from tft.data.columns import (
    ColumnRoles,
    ConstantWithinSymbols,
    _check_order,
    _error,
    _float_column,
    _read_schema,
    _read_table,
    _resolve_roles,
    _roles_difference,
    _symbol_codes,
    _usable,
)
from tft.data.normalize import Normalizer, _transform_target
from tft.data.role_inference import infer_roles, symbol_hint
from tft.data.row_files import RowFiles
from tft.data.rows import InputEncoder, Rows
from tft.data.sources.data_source import DataPaths, DataSource
from tft.data.sources.parquet_folder import bar_order
from tft.data.splits import (
    SplitTimes,
    StartRuns,
    check_window_options,
    part_windows,
    split_starts_ns,
)
from tft.data.timestamps import read_times
from tft.data.warmup import real_inputs, warmup_rows
from tft.errors import ConfigError

__all__ = [
    "CALENDAR_COLUMNS",
    "Batch",
    "WindowDataset",
    "WindowedData",
    "iterate_batches",
    "load_windows",
]

CALENDAR_COLUMNS = CALENDAR_INPUTS
"""Known features derived from the timestamp (UTC), always the last known columns."""


class WindowDataset:
    """Windows of one split: the start rows of its windows into the shared row arrays, as runs
    (NOTE [Window starts without a per-window array] in :mod:`tft.data.splits`)."""

    def __init__(self, rows: Rows, starts: StartRuns, *, encoder_length: int, horizon: int):
        self._rows = rows
        self._starts = starts
        self.encoder_length = encoder_length
        self.horizon = horizon
        self._encoder_offsets = np.arange(encoder_length, dtype=np.int64)
        self._decoder_offsets = np.arange(encoder_length, encoder_length + horizon, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def run_counts(self) -> np.ndarray:
        """The windows of each run of consecutive starts, in this dataset's order: one run a
        symbol, its windows in time order (NOTE [Window starts without a per-window array])."""
        return self._starts.counts

    @property
    def rows(self) -> Rows:
        """The row arrays this dataset's windows index (shared by every split of the file)."""
        return self._rows

    @property
    def starts(self) -> np.ndarray:
        """(num_windows,) int64 first row of each window in the row arrays: an array made on
        each call, 8 bytes a window (for a look; batches index the runs)."""
        return np.asarray(self._starts)

    def targets(self, positions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every window's (or the windows at ``positions``') normalised targets ``(N, H)`` and
        symbol index ``(N,)``, without gathering its inputs."""
        if positions is None:
            positions = np.arange(len(self), dtype=np.int64)
        starts = self._starts[positions]
        files = self._rows.files
        if files is not None:
            # Positioned reads, as batches are read: windows spread over a mapped file would
            # fault most of its pages into the process first (NOTE [Reading windows from
            # the cache]).
            target = files.windows("target", starts + self.encoder_length, self.horizon)
            return target, files.windows("symbol_index", starts, 1)[:, 0]
        decoder_rows = starts[:, None] + self._decoder_offsets
        return self._rows.target[decoder_rows], self._rows.symbol_index[starts]

    def batch(self, indices: np.ndarray | Sequence[int]) -> Batch:
        """Gather the windows at ``indices`` (positions in this dataset) into tensors."""
        starts = self._starts[np.asarray(indices, dtype=np.int64)]  # (B,)
        if self._rows.files is not None:
            return self._read_batch(starts, self._rows.files)
        encoder_rows = starts[:, None] + self._encoder_offsets  # (B, Te)
        decoder_rows = starts[:, None] + self._decoder_offsets  # (B, Td)
        rows = self._rows
        symbol_index = torch.from_numpy(rows.symbol_index[starts])
        categorical = np.take(rows.categorical, encoder_rows, axis=0)  # (B, Te, Co + Ck)
        known_categorical = rows.categorical[
            :, rows.categorical.shape[1] - rows.num_known_categorical :
        ]
        return Batch(
            static_ids=torch.cat(
                [symbol_index[:, None], torch.from_numpy(rows.static[starts])], dim=1
            ),
            encoder_observed=torch.from_numpy(np.take(rows.observed, encoder_rows, axis=0)),
            encoder_known=torch.from_numpy(np.take(rows.known, encoder_rows, axis=0)),
            decoder_known=torch.from_numpy(np.take(rows.known, decoder_rows, axis=0)),
            encoder_categorical=torch.from_numpy(categorical),
            decoder_categorical=torch.from_numpy(np.take(known_categorical, decoder_rows, axis=0)),
            target=torch.from_numpy(rows.target[decoder_rows]),
            decoder_time_ns=torch.from_numpy(rows.time_ns[decoder_rows]),
            symbol_index=symbol_index,
        )

    def _read_batch(self, starts: np.ndarray, files: RowFiles) -> Batch:
        """:meth:`batch` from a row cache's files, a read per window and role (NOTE [Reading
        windows from the cache]); the same tensors as gathering from arrays in memory."""
        te, td = self.encoder_length, self.horizon
        known = files.windows("known", starts, te + td)  # (B, Te + Td, K)
        categorical = files.windows("categorical", starts, te + td)  # (B, Te + Td, Co + Ck)
        first_known = categorical.shape[2] - self._rows.num_known_categorical
        symbol_index = torch.from_numpy(files.windows("symbol_index", starts, 1)[:, 0])
        static = files.windows("static", starts, 1)[:, 0]  # (B, num_static)
        return Batch(
            static_ids=torch.cat([symbol_index[:, None], torch.from_numpy(static)], dim=1),
            encoder_observed=torch.from_numpy(files.windows("observed", starts, te)),
            encoder_known=torch.from_numpy(np.ascontiguousarray(known[:, :te])),
            decoder_known=torch.from_numpy(np.ascontiguousarray(known[:, te:])),
            encoder_categorical=torch.from_numpy(np.ascontiguousarray(categorical[:, :te])),
            decoder_categorical=torch.from_numpy(
                np.ascontiguousarray(categorical[:, te:, first_known:])
            ),
            target=torch.from_numpy(files.windows("target", starts + te, td)),
            decoder_time_ns=torch.from_numpy(files.windows("time_ns", starts + te, td)),
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
    """Real observed inputs; the first is the target's transformed history, e.g.
    ``close_log_return``."""
    known_columns: list[str]
    """Real known inputs: the file's, then :data:`CALENDAR_COLUMNS`."""
    encoder_length: int
    horizon: int
    columns: list[ColumnUse]
    """Every column of the file and how the model uses it (:mod:`tft.data.column_table`)."""
    split_cuts_ns: tuple[int, int] | None = None
    """The first time of validation and of test (ns since the epoch, UTC; the largest int64
    where a part is empty); None: the file was read without a split (prediction)."""
    cache_use: str | None = None
    """What a streamed file's row cache did: built, reused, or grown (what it reused)."""

    @property
    def num_observed(self) -> int:
        return len(self.observed_columns)

    @property
    def num_known(self) -> int:
        return len(self.known_columns)

    def _cardinalities(self, names: list[str]) -> list[int]:
        # Code 0 is "unknown" (NOTE [Categories]), so n categories need n + 1 embeddings.
        return [len(self.normalizer.categories[name]) + 1 for name in names]

    @property
    def static_cardinalities(self) -> list[int]:
        """The symbol's, then each static column's."""
        return [len(self.symbols), *self._cardinalities(self.normalizer.roles.static or [])]

    @property
    def observed_categorical_cardinalities(self) -> list[int]:
        roles = self.normalizer.roles
        return self._cardinalities(roles.categorical_columns(roles.observed or []))

    @property
    def known_categorical_cardinalities(self) -> list[int]:
        roles = self.normalizer.roles
        return self._cardinalities(roles.categorical_columns(roles.known))


def iterate_batches(
    dataset: WindowDataset,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    share: tuple[int, int] = (0, 1),
) -> Iterator[Batch]:
    """Yield batches of ``dataset``, in order or in a permutation fixed by ``seed`` (a
    :class:`~tft.data.batch.WindowOrder`).

    ``share=(rank, num_ranks)`` gathers only that rank's contiguous share of each batch (the
    windows ``batch_size * rank // num_ranks`` up to the next rank's), so that a rank reads only
    its own windows.

    Raises:
        ConfigError: batch_size < 1.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be at least 1; pass e.g. 32")
    # NOTE [A shuffle with no per-window array]
    order = WindowOrder(len(dataset), seed if shuffle else None)
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    rank, num_ranks = share
    for begin in range(0, stop, batch_size):
        indices = order[begin : min(begin + batch_size, stop)]
        size = len(indices)
        yield dataset.batch(indices[size * rank // num_ranks : size * (rank + 1) // num_ranks])


# ---------------------------------------------------------------------------- public API


def load_windows(
    path: DataPaths,
    *,
    roles: ColumnRoles | None = None,
    encoder_length: int,
    horizon: int,
    split_fractions: Sequence[float] | None = (0.7, 0.15, 0.15),
    split_times: SplitTimes | None = None,
    normalizer: Normalizer | None = None,
) -> WindowedData:
    """Read a Parquet file of bars and cut it into normalised TFT windows.

    See NOTE [Rows, windows and splits] (module docstring) for the layout, the NaN policy and the
    split rule.

    Args:
        path: Parquet file, a folder of them, a quoted pattern or several of these (NOTE
            [Several data paths]); only the columns the roles need are read.
        roles: column roles; None uses the defaults, or the normalizer's roles when one is given.
        encoder_length: past rows the model sees (Te).
        horizon: rows forecast after them (Td).
        split_fractions: (train, validation, test) shares of the distinct timestamps; None keeps
            the file whole (only :attr:`WindowedData.whole` has windows).
        split_times: where validation and then test begin (ISO 8601 text or ``datetime``; on
            ``roles.timezone``'s clock when written without a zone, else UTC), instead of
            ``split_fractions`` (NOTE [A split by shares or by dates] in :mod:`tft.data.splits`).
        normalizer: statistics to apply instead of fitting new ones (e.g. for prediction); its
            roles and symbols must match the file.

    Returns:
        The windows and the normalizer.

    Raises:
        DataError: a file that cannot be used (missing, not Parquet, empty, missing or
            non-numeric columns, NaN/inf values, duplicate or unsorted timestamps, non-positive
            prices for log returns, too few rows for one window in a split); the message names
            the file, the column or row, and the fix.
        ConfigError: encoder_length or horizon < 1, or bad split fractions or times.

    Example::

        data = load_windows("bars.parquet", encoder_length=120, horizon=10)
        batch = data.train.batch([0, 1, 2])
        batch.encoder_observed.shape  # (3, 120, data.num_observed)
        prediction = model(*batch.inputs())
    """
    path = DataSource.of(path)
    check_window_options(encoder_length, horizon, split_fractions, split_times)
    schema = _read_schema(path)
    roles = roles if roles is not None else normalizer.roles if normalizer else ColumnRoles()
    starts_ns = split_starts_ns(split_times, roles.timezone) if split_times is not None else None
    roles = infer_roles(path, schema, roles)
    table = _read_table(path, _columns_to_read(schema, roles))
    roles = _resolve_roles(path, schema, roles, _constancy_check(table))
    if normalizer is not None and roles != normalizer.roles:
        raise _error(path, _roles_difference(roles, normalizer.roles))

    time_ns = read_times(path, table[roles.timestamp], roles)
    codes, symbols = _symbol_codes(
        path, table, roles.symbol, normalizer.symbols if normalizer else None
    )
    file_rows = bar_order(path, table, time_ns, codes, symbols)
    time_ns, codes = time_ns[file_rows], codes[file_rows]
    _check_order(path, time_ns, codes, file_rows, symbols, symbol_hint(schema, roles))
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
    warm, warmup_counts = warmup_rows(table, real_inputs(roles), file_rows, codes)
    if warm.any():  # NOTE [Warm-up rows]
        time_ns, codes, file_rows, target = (a[~warm] for a in (time_ns, codes, file_rows, target))
    symbol_bounds = np.searchsorted(codes, np.arange(len(symbols) + 1))

    window = (encoder_length, horizon)
    split = (None if starts_ns is not None else split_fractions, starts_ns)
    # The distinct times cut a split by shares (a sort of every row's time: none without one).
    distinct = np.unique(time_ns) if split != (None, None) else time_ns[:0]
    starts, cuts = part_windows(path, time_ns, symbol_bounds, distinct, split, window)
    training = time_ns < cuts[0] if cuts is not None else np.ones(len(time_ns), dtype=bool)

    encoded = InputEncoder(path, table, roles, symbols, (file_rows, codes, training))
    rows, normalizer, unknown_rows = encoded.encode(target, time_ns, normalizer)

    return windowed_data(
        rows, starts, normalizer, schema, unknown_rows, window, warmup_counts, cuts
    )


def windowed_data(
    rows: Rows,
    starts: list[StartRuns],
    normalizer: Normalizer,
    schema: pa.Schema,
    unknown_rows: dict[str, int],
    window: tuple[int, int],
    warmup_counts: dict[str, int] | None = None,
    split_cuts_ns: tuple[int, int] | None = None,
) -> WindowedData:
    """The windows of a file from its rows and the start rows of train, validation, test and
    the whole file; ``window`` is (encoder length, horizon)."""
    encoder_length, horizon = window
    roles = normalizer.roles
    train, validation, test, whole = (
        WindowDataset(rows, first, encoder_length=encoder_length, horizon=horizon)
        for first in starts
    )
    return WindowedData(
        train=train,
        validation=validation,
        test=test,
        whole=whole,
        normalizer=normalizer,
        symbols=normalizer.symbols,
        observed_columns=[target_input_name(roles), *roles.real_columns(roles.observed or [])],
        known_columns=[*roles.real_columns(roles.known), *CALENDAR_COLUMNS],
        encoder_length=encoder_length,
        horizon=horizon,
        columns=column_table(schema, roles, normalizer, unknown_rows, warmup_counts),
        split_cuts_ns=split_cuts_ns,
    )


def target_input_name(roles: ColumnRoles) -> str:
    """The name of the target's transformed history, the first observed input."""
    suffix = {"log_return": "log_return", "diff": "diff", "none": "level"}[roles.target_transform]
    return f"{roles.target}_{suffix}"


def _columns_to_read(schema: pa.Schema, roles: ColumnRoles) -> list[str]:
    """Every column a role may take: all usable ones unless every role is named."""
    if roles.observed is not None and roles.static is not None:
        symbol = roles.symbol or ("symbol" if "symbol" in schema.names else None)
        named = [roles.timestamp, symbol, roles.target, *roles.known, *roles.observed]
        wanted = [*named, *roles.static]
    else:
        wanted = [
            name
            for name in schema.names
            if name == roles.timestamp
            or (name not in roles.ignore and _usable(schema.field(name).type))
        ]
    return list(dict.fromkeys(name for name in wanted if name is not None and name in schema.names))


def _constancy_check(table: pa.Table) -> ConstantWithinSymbols:
    @functools.cache
    def groups_of(symbol: str | None) -> np.ndarray:
        """Each row's symbol as an int label, coded once for every column checked."""
        if symbol is None:
            return np.zeros(table.num_rows, dtype=np.int64)
        encoded = pc.dictionary_encode(category_text(table, symbol)).combine_chunks()
        return encoded.indices.fill_null(-1).to_numpy().astype(np.int64)

    def is_constant(name: str, symbol: str | None) -> bool:
        return constant_within_groups(category_text(table, name), groups_of(symbol))

    return is_constant
