"""A Parquet file of bars read in chunks of rows: its rows in window order, and its layout.

:func:`read_chunks` gives the file a bounded number of rows at a time; :class:`RowWalker`
turns each chunk into its kept rows grouped by symbol (the order of NOTE [Rows, windows and
splits] in :mod:`tft.data.windows`), carrying each symbol's last bar from one chunk to the next so that
the target transform and the order checks see the file as a whole. :func:`scan_layout` is the first
pass, finding what :func:`tft.data.windows.load_windows` finds by holding the file: the
symbols, their row counts and the distinct timestamps (for the splits), which text columns are
constant within a symbol, the column roles; :mod:`tft.data.streamed.fitted_scales` is the
second (the scales and categories of the training rows), and
:mod:`tft.data.streamed.row_cache` writes the encoded rows.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tft.data.categories import category_text
from tft.data.columns import (
    ColumnRoles,
    _check_finite,
    _check_order,
    _error,
    _float_column,
    _is_symbol_type,
    _read_schema,
    _resolve_roles,
    _symbol_codes,
    check_symbols_known,
)
from tft.data.normalize import _transform_target
from tft.data.role_inference import symbol_hint
from tft.data.sources.data_source import DataSource
from tft.data.sources.parquet_folder import file_batches, footer
from tft.data.streamed.build_progress import BuildProgress, RowsRead, build_pass
from tft.data.streamed.distinct_times import DistinctTimes
from tft.data.streamed.read_order import ReadOrder, read_order
from tft.data.timestamps import read_times
from tft.data.warmup import RunningWarmup, real_inputs
from tft.errors import first_line

__all__ = [
    "Chunk",
    "ChunkRows",
    "FileLayout",
    "RowWalker",
    "read_chunks",
    "scan_layout",
]


class Chunk(NamedTuple):
    """A bounded number of consecutive rows of one file."""

    file: DataSource
    """The Parquet file the rows are in (one of a folder's), for the rows errors name."""
    first_row: int
    """The file row of the chunk's first row."""
    table: pa.Table


def read_chunks(
    order: ReadOrder, columns: list[str], chunk_rows: int, rows_read: RowsRead | None = None
) -> Iterator[Chunk]:
    """Chunks of at most ``chunk_rows`` rows of ``order``'s files, one file after another (a
    chunk never spans two); ``rows_read`` is told how far the reading is after each chunk.

    Raises:
        DataError: a file cannot be read as Parquet, or there are no rows.
    """
    done = 0
    for file in order.files:
        try:
            if order.schema is None:
                # Pre-buffering reads ahead whole row groups and keeps them: 450 MB on a 0.47 GB
                # file read in 20 chunks, against 3 MB without (measured).
                reader = pq.ParquetFile(file, pre_buffer=False, metadata=footer(file))
                total = reader.metadata.num_rows
                batches = reader.iter_batches(batch_size=chunk_rows, columns=columns)
            else:
                total = sum(order.rows_per_file or ())
                batches = file_batches(order.root, file, order.schema, columns, chunk_rows)
            first = 0
            for batch in batches:
                if batch.num_rows == 0:
                    continue  # a dataset can yield an empty batch; the walker wants rows
                yield Chunk(DataSource.of(file), first, pa.Table.from_batches([batch]))
                first += batch.num_rows
                done += batch.num_rows
                if rows_read is not None:
                    rows_read(done, total)
        except (pa.ArrowException, OSError) as error:
            reason = first_line(error)
            raise _error(
                DataSource.of(file),
                f"cannot be read as Parquet ({reason}); pass a Parquet file of bars",
            ) from None
    hand_back_freed_memory()
    if done == 0:
        raise _error(order.root, "has no rows; pass a file with bars in it")


def hand_back_freed_memory() -> None:
    """Return the memory freed during a pass to the system.

    A pass allocates and frees a chunk's columns hundreds of times; Arrow's allocator and the
    C library's keep the freed memory for reuse, about half a gigabyte after a pass over a
    2M-row file (measured: 0.85 GiB resident after the build, 0.37 GiB after this), which
    would otherwise stay resident through training.
    """
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim so
        ctypes.CDLL(None).malloc_trim(0)


@dataclass(frozen=True)
class ChunkRows:
    """The kept rows of one chunk, grouped by symbol (file order within a symbol)."""

    local: np.ndarray  # (n,) int64 row in the chunk
    file_rows: np.ndarray  # (n,) int64 row in the file
    symbol_index: np.ndarray  # (n,) int64
    time_ns: np.ndarray  # (n,) int64
    target: np.ndarray  # (n,) float64, transformed

    def take(self, table: pa.Table, name: str) -> np.ndarray:
        """Column ``name`` of these rows as float64 (NaN for nulls)."""
        return _float_column(table, name)[self.local]

    def text(self, table: pa.Table, name: str) -> pa.ChunkedArray:
        """Column ``name`` of these rows as text (categories are fitted and coded as text)."""
        return category_text(table, name).take(pa.array(self.local))


class RowWalker:
    """Walks a file's chunks in order, carrying each symbol's last bar between them.

    Args:
        symbols: the symbol names rows are coded by; None discovers them (first pass), in the
            order they appear.
        warmup: drops each symbol's warm-up rows of these real inputs (NOTE [Warm-up rows]
            in :mod:`tft.data.warmup`), carrying what each symbol has seen between chunks.
        only: keep the rows of these symbol codes alone (a mask over ``symbols``; NOTE [A
            cache re-encoded where its files changed]); every symbol's rows are still checked.
    """

    def __init__(
        self,
        path: DataSource,
        roles: ColumnRoles,
        symbol: str | None,
        symbols: list[str] | None,
        warmup: RunningWarmup | None = None,
        only: np.ndarray | None = None,
    ) -> None:
        self.path, self.roles, self.symbol, self.only = path, roles, symbol, only
        self.warmup = warmup if warmup is not None else RunningWarmup([])
        self.hint = symbol_hint(_read_schema(path), roles.model_copy(update={"symbol": symbol}))
        self.discover = symbols is None
        self.symbols: list[str] = [] if symbols is None else list(symbols)
        # Per symbol code: (last time, last raw target value, its file row); absent before.
        self.carry: dict[int, tuple[int, float, int]] = {}

    def columns(self) -> list[str]:
        """The columns every walk reads."""
        named = [self.roles.timestamp, self.symbol, self.roles.target, *self.warmup.names]
        return list(dict.fromkeys(name for name in named if name is not None))

    def _codes(self, path: DataSource, table: pa.Table) -> np.ndarray:
        if not self.discover or self.symbol is None:
            known = self.symbols if (self.symbols or self.symbol is not None) else None
            codes, symbols = _symbol_codes(path, table, self.symbol, known)
            self.symbols = symbols
            return codes
        column = table[self.symbol].cast(pa.string())
        if column.null_count:
            _symbol_codes(path, table, self.symbol, None)  # raises naming the empty row
        seen = set(self.symbols)
        self.symbols += [s for s in pc.unique(column).to_pylist() if s not in seen]
        codes = pc.index_in(column, value_set=pa.array(self.symbols, type=pa.string()))
        return codes.to_numpy().astype(np.int64)

    def rows(self, chunk: Chunk) -> ChunkRows:
        """The chunk's kept rows; raises DataError for bad order or a bad target value (naming
        the chunk's file and its row there)."""
        path, first_row, table = chunk
        roles = self.roles
        time_ns = read_times(path, table[roles.timestamp], roles, first_row)
        codes = self._codes(path, table)
        price = _float_column(table, roles.target)
        n = table.num_rows
        local = np.arange(n, dtype=np.int64)
        # Each symbol's last bar of the earlier chunks goes first in its group, as a row that
        # is never kept: the order check and the differences then run across the chunk edge.
        carried = [code for code in np.unique(codes).tolist() if code in self.carry]
        differenced = roles.target_transform != "none"
        ext_codes = np.concatenate([np.asarray(carried, dtype=np.int64), codes])
        ext_time = np.concatenate([[self.carry[c][0] for c in carried], time_ns]).astype(np.int64)
        ext_price = np.concatenate([[self.carry[c][1] for c in carried], price])
        ext_file = np.concatenate([[self.carry[c][2] for c in carried], first_row + local])
        ext_local = np.concatenate([np.full(len(carried), -1, dtype=np.int64), local])
        order = np.argsort(ext_codes, kind="stable")
        ext_codes, ext_time, ext_price = ext_codes[order], ext_time[order], ext_price[order]
        ext_file, ext_local = ext_file[order].astype(np.int64), ext_local[order]
        _check_order(path, ext_time, ext_codes, ext_file, self.symbols, self.hint)
        real = ext_local >= 0
        if differenced:
            first_of_symbol = np.concatenate([[True], ext_codes[1:] != ext_codes[:-1]])
            target, keep = _transform_target(
                path,
                roles.target,
                roles.target_transform,
                ext_price,
                first_of_symbol,
                ext_file,
                whole=False,
            )
            # Only a carried row can be a kept row's predecessor, never kept itself.
            target = target[real[keep]]
            keep &= real
        else:
            target, keep = _transform_target(
                path,
                roles.target,
                roles.target_transform,
                ext_price[real],
                np.zeros(int(real.sum()), dtype=bool),
                ext_file[real],
                whole=False,
            )
            keep = real.copy()
        last = np.flatnonzero(np.concatenate([ext_codes[1:] != ext_codes[:-1], [True]]))
        for i in last.tolist():
            self.carry[int(ext_codes[i])] = (
                int(ext_time[i]),
                float(ext_price[i]),
                int(ext_file[i]),
            )
        # Warm-up rows go after the transform, as in memory (NOTE [Warm-up rows]).
        cold = ~self.warmup.warm(table, ext_local[keep], ext_codes[keep])
        if self.only is not None:
            cold &= self.only[ext_codes[keep]]
        return ChunkRows(
            local=ext_local[keep][cold],
            file_rows=ext_file[keep][cold],
            symbol_index=ext_codes[keep][cold],
            time_ns=ext_time[keep][cold],
            target=np.asarray(target, dtype=np.float64)[cold],
        )


def _grouping_symbol(schema: pa.Schema, roles: ColumnRoles) -> str | None:
    """The symbol column the roles resolve to (``_resolve_roles``'s rule)."""
    if roles.symbol is not None:
        return roles.symbol
    if "symbol" in schema.names and _is_symbol_type(schema.field("symbol").type):
        return "symbol"
    return None


@dataclass
class FileLayout:
    """What the first pass learns: roles, symbols, kept rows per symbol, distinct times."""

    roles: ColumnRoles
    """Resolved against the file (every role listed)."""
    symbols: list[str]
    kept_per_symbol: np.ndarray  # (S,) int64 kept rows of each symbol, in symbol order
    distinct_times: np.ndarray  # sorted int64 ns of the kept rows, mapped from their file
    num_file_rows: int
    order: ReadOrder
    """The files the passes read, in order (NOTE [Streaming a folder in time order])."""


def scan_layout(
    path: DataSource,
    schema: pa.Schema,
    roles: ColumnRoles,
    known_symbols: list[str] | None,
    chunk_rows: int,
    candidate_columns: list[str],
    times_file: Path,
    progress: BuildProgress | None = None,
) -> FileLayout:
    """The first pass: row order and target checks, symbols, counts, times and constancy.

    ``candidate_columns`` are the columns read; those that are not real numbers are checked
    for being constant within a symbol (what roles resolution asks of static columns). The
    sorted distinct times are written to ``times_file``, its folder the scratch space of their
    merges (NOTE [Distinct times on disk]).
    """
    symbol = _grouping_symbol(schema, roles)
    if symbol is not None and symbol not in schema.names:
        symbol = None  # _resolve_roles below names the missing column
    lookup = roles.model_copy(update={"symbol": symbol})
    # Every role error that needs no pass over the rows is raised before the pass. Which text
    # columns are constant changes no real input, so the warm-up's columns are known now.
    early = _resolve_roles(path, schema, roles, lambda name, grouping: True)
    order = read_order(path, early, symbol, chunk_rows, progress)
    walker = RowWalker(path, lookup, symbol, None, RunningWarmup(real_inputs(early)))
    textual = [
        name
        for name in candidate_columns
        if name not in walker.columns()
        and not pa.types.is_floating(schema.field(name).type)
        and not pa.types.is_timestamp(schema.field(name).type)
    ]
    varying: set[str] = set()
    first_value: dict[str, dict[str, str]] = {name: {} for name in textual}
    kept: dict[str, int] = {}
    times = DistinctTimes(times_file.parent)
    num_rows = 0
    read = build_pass(progress, 1, "the symbols, times and checks")
    for chunk in read_chunks(order, [*walker.columns(), *textual], chunk_rows, read):
        table = chunk.table
        num_rows += table.num_rows
        rows = walker.rows(chunk)
        names = np.asarray(walker.symbols, dtype=object)
        counts = np.bincount(rows.symbol_index, minlength=len(walker.symbols))
        for code in np.flatnonzero(counts).tolist():
            kept[names[code]] = kept.get(names[code], 0) + int(counts[code])
        times.add(rows.time_ns)
        all_codes = _all_codes(walker, table)
        for name in textual:
            if name not in varying and not _constant_in_chunk(
                category_text(table, name), all_codes, names, first_value[name]
            ):
                varying.add(name)
    distinct_times = times.finish(times_file)
    never = walker.warmup.never_seen()
    if never is not None:  # refused as the in-memory finite check refuses it
        _check_finite(path, never, np.array([np.nan]), np.zeros(1, dtype=np.int64))
    present = sorted(walker.symbols)
    symbols = present if known_symbols is None else known_symbols
    check_symbols_known(path, symbol, present, symbols)

    def is_constant(name: str, grouping: str | None) -> bool:
        return name not in varying

    resolved = _resolve_roles(path, schema, roles, is_constant)
    return FileLayout(
        roles=resolved,
        symbols=symbols,
        kept_per_symbol=np.asarray([kept.get(s, 0) for s in symbols], dtype=np.int64),
        distinct_times=distinct_times,
        num_file_rows=num_rows,
        order=order,
    )


def _all_codes(walker: RowWalker, table: pa.Table) -> np.ndarray:
    """Every row's symbol code in file order (the walker keeps only the kept rows)."""
    if walker.symbol is None:
        return np.zeros(table.num_rows, dtype=np.int64)
    column = table[walker.symbol].cast(pa.string())
    codes = pc.index_in(column, value_set=pa.array(walker.symbols, type=pa.string()))
    return codes.to_numpy().astype(np.int64)


def _constant_in_chunk(
    text: pa.ChunkedArray, codes: np.ndarray, names: np.ndarray, first: dict[str, str]
) -> bool:
    """Whether ``text`` keeps one non-null value per symbol here and as in earlier chunks."""
    if text.null_count:
        return False
    encoded = pc.dictionary_encode(text).combine_chunks()
    values, dictionary = encoded.indices.to_numpy(), encoded.dictionary.to_pylist()
    for code in np.unique(codes).tolist():
        mine = values[codes == code]
        if mine.min() != mine.max():
            return False
        value = dictionary[int(mine[0])]
        if first.setdefault(str(names[code]), value) != value:
            return False
    return True
