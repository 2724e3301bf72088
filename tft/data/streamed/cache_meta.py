"""What a row cache folder holds and what it was made from (its ``rows.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from tft.data.sources.data_source import DataSource

__all__ = [
    "DISTINCT_TIMES_FILE",
    "FittedOn",
    "META_FILE",
    "META_VERSION",
    "RowCacheMeta",
    "SourceFile",
    "SymbolCounts",
    "add_counts",
    "counts_by_symbol",
    "with_symbols",
    "read_meta",
]

META_VERSION = 3
"""2: the split the scales were fitted on is one field (:class:`FittedOn`); 3: the counts of
unknown categories and warm-up rows are each symbol's, and a folder's files list their
symbols (NOTE [A cache re-encoded where its files changed])."""
META_FILE = "rows.json"
#: The sorted distinct times of the rows, int64 ns (NOTE [Distinct times on disk]).
DISTINCT_TIMES_FILE = "distinct_times.bin"


class SourceFile(BaseModel):
    """Which file or folder a cache was made from, as it was then."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    size_bytes: int
    mtime_ns: int
    """The file's; a folder's latest file's."""
    parts: list[SourceFile] = []
    """A folder's files, each as it was (NOTE [A folder of files as one dataset]); none for a
    file."""

    @classmethod
    def of(cls, source: DataSource) -> SourceFile:
        """The source as it is now: its files' sizes and times (NOTE [Several data paths]:
        several paths are named by their JSON list)."""
        resolved = source.resolved()
        if resolved.many:
            parts = [cls.of(DataSource.of(file)) for file in resolved.files()]
            return cls(
                path=resolved.identity,
                size_bytes=sum(part.size_bytes for part in parts),
                mtime_ns=max(part.mtime_ns for part in parts),
                parts=parts,
            )
        stat = resolved.file.stat()
        return cls(path=resolved.identity, size_bytes=stat.st_size, mtime_ns=stat.st_mtime_ns)

    def files(self) -> dict[str, SourceFile]:
        """Each Parquet file of the source as it was, by resolved path: a folder's parts, or
        the one file itself."""
        return {part.path: part for part in self.parts} if self.parts else {self.path: self}

    def unchanged_in(self, now: SourceFile) -> bool:
        """Whether every file of this source is among ``now``'s files as it was."""
        current = now.files()
        return all(current.get(name) == part for name, part in self.files().items())


class FittedOn(BaseModel):
    """The split a cache's scales were fitted on: its training rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shares: list[float] | None = None
    """The shares of the distinct times (train, validation, test), for a split by shares."""
    starts_ns: list[int] | None = None
    """Where validation and test begin (ns), for a split by dates; with ``shares``, None for
    scales fitted on every row (no split)."""


SymbolCounts = dict[str, dict[str, int]]
"""Rows by symbol, then by column; symbols and columns with none left out."""


def counts_by_symbol(symbols: list[str], by_column: dict[str, np.ndarray]) -> SymbolCounts:
    """``by_column``'s per-symbol-code counts (each an array over ``symbols``) by symbol."""
    counts: SymbolCounts = {}
    for name, per_code in by_column.items():
        for code in np.flatnonzero(per_code).tolist():
            counts.setdefault(symbols[code], {})[name] = int(per_code[code])
    return dict(sorted(counts.items()))


def with_symbols(counts: SymbolCounts, new: SymbolCounts, symbols: set[str]) -> SymbolCounts:
    """``counts`` with ``symbols``' counts those of ``new`` (which counted them again)."""
    kept = {s: c for s, c in counts.items() if s not in symbols}
    return dict(sorted({**kept, **{s: c for s, c in new.items() if s in symbols}}.items()))


def add_counts(counts: SymbolCounts, more: SymbolCounts) -> SymbolCounts:
    """Both counts added, symbol by symbol and column by column."""
    added = {symbol: dict(columns) for symbol, columns in counts.items()}
    for symbol, columns in more.items():
        mine = added.setdefault(symbol, {})
        for name, rows in columns.items():
            mine[name] = mine.get(name, 0) + rows
    return dict(sorted(added.items()))


def _totals(counts: SymbolCounts) -> dict[str, int]:
    totals: dict[str, int] = {}
    for columns in counts.values():
        for name, rows in columns.items():
            totals[name] = totals.get(name, 0) + rows
    return totals


class RowCacheMeta(BaseModel):
    """What a cache folder holds and how it was encoded (``rows.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int
    source: SourceFile
    given_roles: dict[str, Any] | None
    """The roles asked for when the normaliser was fitted; None when one was given."""
    fitted_on: FittedOn | None
    """The split the normaliser was fitted on; None when one was given."""
    normalizer: dict[str, Any]
    num_rows: int
    widths: dict[str, int]
    """Columns of each 2-D role file (observed, known, categorical, static)."""
    num_known_categorical: int
    symbol_bounds: list[int]
    unknown_rows: SymbolCounts
    """Each symbol's rows of each categorical and static column whose category was unknown."""
    warmup_rows: SymbolCounts = {}
    """Each symbol's warm-up rows dropped, by real input (NOTE [Warm-up rows])."""
    distinct_times: int
    columns: str = ""
    """The source's columns and their types, as read (a folder's unified schema)."""
    last_bars: dict[str, tuple[int, float]] = {}
    """Each symbol's last bar read: its time (ns) and raw target value, which the first new
    row of a grown cache is transformed against (NOTE [A cache grown by new files])."""
    file_symbols: dict[str, dict[str, int]] = {}
    """Each of a folder's files (by resolved path): the first bar (ns) of each symbol it holds,
    which says what its change touches (NOTE [A cache re-encoded where its files changed]);
    none for one file."""

    def unknown_totals(self) -> dict[str, int]:
        """The rows of each column whose category was unknown, every symbol's."""
        return _totals(self.unknown_rows)

    def warmup_totals(self) -> dict[str, int]:
        """The warm-up rows of each real input that has any, every symbol's."""
        return _totals(self.warmup_rows)


def read_meta(folder: Path) -> RowCacheMeta | None:
    """The description of the cache in ``folder``; None where there is none of this version."""
    try:
        meta = RowCacheMeta.model_validate_json((folder / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if meta.version == META_VERSION else None
