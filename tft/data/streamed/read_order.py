"""The order a row cache's passes read a data path in: a file as it is, a folder's files so
that each symbol's bars follow one another in time.

NOTE [Streaming a folder in time order]
The row cache's passes read the data in chunks, and its walker holds each symbol's bars to
time order from one chunk to the next (:class:`tft.data.streamed.file_scan.RowWalker`), as it
holds one file. A folder's files come in any order (NOTE [A folder of files as one dataset] in
:mod:`tft.data.sources.parquet_folder`), and its rows cannot be sorted in memory when they do
not fit there. So before the first pass each file's timestamp and symbol columns are read, a
chunk at a time, for the first and last bar of each symbol in it, and the files are read in
an order where every file comes after each file holding an earlier stretch of one of its
symbols (a topological order; of the files free to go next, the one with the earliest bar, so
files of a day, a month or a contract go in calendar order). Such an order exists exactly when
no symbol's stretches in two files overlap in time and no two files each hold the earlier
stretch of a different symbol; a folder where one does is refused in one line naming both
files and the symbol, with the two ways out: write those bars in one file, or let the folder be
read into memory (``--max-host-memory``), where its rows are sorted. Within one file a symbol's
bars must be in time order, as in a single file streamed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tft.data.columns import ColumnRoles, _error, _iso
from tft.data.sources.data_source import DataSource
from tft.data.sources.parquet_folder import (
    file_batches,
    folder_schema,
    footer,
    shared_bar,
)
from tft.data.streamed.build_progress import BuildProgress, rows_line
from tft.data.timestamps import read_times

__all__ = ["ReadOrder", "read_order"]

# What a refusal says to do, after naming the files.
_WAYS_OUT = (
    "write those bars in one file, or let the folder be read and sorted in memory (a "
    "--max-host-memory above its rows' size, no --data-cache)"
)


@dataclass(frozen=True)
class ReadOrder:
    """Which Parquet files a data path's rows are read from, in reading order."""

    root: DataSource
    """The data path (or paths) named."""
    files: tuple[Path, ...]
    """The file itself, or the folder's files in the order of NOTE [Streaming a folder in
    time order]."""
    rows_per_file: tuple[int, ...] | None
    """Each file's rows (a folder's, counted while ordering); None for one file, whose footer
    says."""
    schema: pa.Schema | None
    """The folder's unified columns and hive keys the files are read with; None for one file."""
    first_bars: tuple[dict[str, int], ...] | None = None
    """Each file's symbols, each with its first bar there (ns; the symbol ``""`` for one
    series); None for one file."""

    @classmethod
    def of_file(cls, path: DataSource) -> ReadOrder:
        """One file, read as it is."""
        return cls(root=path, files=(path.file,), rows_per_file=None, schema=None)

    def file_symbols(self) -> dict[str, dict[str, int]]:
        """:attr:`first_bars` by each file's resolved path (a cache's ``file_symbols``)."""
        if self.first_bars is None:
            return {}
        pairs = zip(self.files, self.first_bars, strict=True)
        return {str(file.resolve()): dict(sorted(bars.items())) for file, bars in pairs}


@dataclass
class _Stretch:
    """A symbol's bars in one file: the file's index, its first and last bar time (ns)."""

    file: int
    first_ns: int
    last_ns: int


_Edge = tuple[int, int, str]
"""(file before, file after, the symbol whose bars order them)."""


def read_order(
    path: DataSource,
    roles: ColumnRoles,
    symbol: str | None,
    chunk_rows: int,
    progress: BuildProgress | None = None,
    files: list[Path] | None = None,
) -> ReadOrder:
    """The order to read ``path`` in (NOTE [Streaming a folder in time order]).

    Args:
        roles: the roles asked for, the timestamp column (and its clock) settled.
        symbol: the symbol column, or None for one series.
        chunk_rows: rows per chunk read while finding each file's stretches.
        progress: told how far the reading is, a line after each chunk.
        files: these files of the folder only (its new files, NOTE [A cache grown by new
            files]); every file when None.

    Raises:
        DataError: a symbol's bars in two files overlap in time, or the files' stretches
            cross (naming the files and the symbols); a timestamp that cannot be read.
    """
    if not path.many:
        return ReadOrder.of_file(path)
    files = path.files() if files is None else files
    schema = folder_schema(path)
    columns = [name for name in (roles.timestamp, symbol) if name is not None]
    stretches: dict[str, list[_Stretch]] = {}
    rows_per_file: list[int] = []
    total = sum(footer(file).num_rows for file in files)
    rows_read = rows_line(progress, "putting the folder's files in time order")
    for index, file in enumerate(files):
        mine: dict[str, _Stretch] = {}
        first_row = 0
        for batch in file_batches(path, file, schema, columns, chunk_rows):
            table = pa.Table.from_batches([batch])
            times = read_times(DataSource.of(file), table[roles.timestamp], roles, first_row)
            _widen(mine, index, table[symbol] if symbol is not None else None, times)
            first_row += table.num_rows
            if rows_read is not None:
                rows_read(sum(rows_per_file) + first_row, total)
        rows_per_file.append(first_row)
        for name, stretch in mine.items():
            stretches.setdefault(name, []).append(stretch)
    first_bar = [2**63 - 1] * len(files)  # a file with no rows goes last
    first_bars: list[dict[str, int]] = [{} for _ in files]
    for name, group in stretches.items():
        for stretch in group:
            first_bar[stretch.file] = min(first_bar[stretch.file], stretch.first_ns)
            first_bars[stretch.file][name] = stretch.first_ns
    order = _topological(path, files, _edges(path, files, stretches), first_bar)
    return ReadOrder(
        root=path,
        files=tuple(files[i] for i in order),
        rows_per_file=tuple(rows_per_file[i] for i in order),
        schema=schema,
        first_bars=tuple(first_bars[i] for i in order),
    )


def _widen(
    mine: dict[str, _Stretch], index: int, symbols: pa.ChunkedArray | None, times: np.ndarray
) -> None:
    """Widen each symbol's stretch in file ``index`` by a chunk's bars."""
    if len(times) == 0:
        return
    if symbols is None:
        spans = [("", int(times.min()), int(times.max()))]
    else:
        grouped = (
            pa.table({"symbol": symbols.cast(pa.string()), "time": times})
            .group_by("symbol")
            .aggregate([("time", "min"), ("time", "max")])
        )
        spans = zip(  # type: ignore[assignment]
            grouped["symbol"].to_pylist(),
            grouped["time_min"].to_pylist(),
            grouped["time_max"].to_pylist(),
            strict=True,
        )
    for name, first, last in spans:
        if name is None:
            continue  # an empty symbol: the first pass refuses it, naming its row
        stretch = mine.setdefault(name, _Stretch(index, first, last))
        stretch.first_ns, stretch.last_ns = min(stretch.first_ns, first), max(stretch.last_ns, last)


def _bars_of(name: str) -> str:
    return f"the bars of {name}" if name else "the bars"


def _edges(
    path: DataSource, files: list[Path], stretches: dict[str, list[_Stretch]]
) -> list[_Edge]:
    """Each symbol's files in time order, as edges; refuses two stretches that overlap."""
    edges = []
    for name, group in stretches.items():
        group.sort(key=lambda stretch: (stretch.first_ns, stretch.last_ns))
        for before, after in zip(group, group[1:], strict=False):
            if before.last_ns >= after.first_ns:
                if before.last_ns == after.first_ns:  # one shared bar: as in memory
                    pair = (files[before.file], files[after.file])
                    raise shared_bar(path, name or "the series", after.first_ns, pair)
                a, b = (path.name_of(files[s.file]) for s in (before, after))
                raise _error(
                    path,
                    f"{_bars_of(name)} in {a} ({_iso(before.first_ns)} to "
                    f"{_iso(before.last_ns)}) and in {b} ({_iso(after.first_ns)} to "
                    f"{_iso(after.last_ns)}) overlap in time, so the folder cannot be "
                    f"streamed a file at a time; {_WAYS_OUT}",
                )
            edges.append((before.file, after.file, name))
    return edges


def _topological(
    path: DataSource, files: list[Path], edges: list[_Edge], first_bar: list[int]
) -> list[int]:
    """The files' indices with every edge's first before its second; of the files free to
    go, the one with the earliest bar first."""
    after: dict[int, list[int]] = {}
    waiting = [0] * len(files)
    for before, later, _ in edges:
        after.setdefault(before, []).append(later)
        waiting[later] += 1
    ready = [(first_bar[i], i) for i in range(len(files)) if waiting[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, index = heapq.heappop(ready)
        order.append(index)
        for later in after.get(index, []):
            waiting[later] -= 1
            if waiting[later] == 0:
                heapq.heappush(ready, (first_bar[later], later))
    if len(order) < len(files):
        raise _crossing(path, files, edges, set(range(len(files))) - set(order))
    return order


def _crossing(path: DataSource, files: list[Path], edges: list[_Edge], left: set[int]) -> Exception:
    """The refusal of files whose stretches cross: a cycle of edges among the files left.

    Every file left waits on another file left, so walking back from any of them along its
    edges comes round to a file seen before: the files from there on are a cycle.
    """
    into = {later: (before, later, name) for before, later, name in edges if before in left}
    walk = [min(left)]
    while walk.count(walk[-1]) < 2:
        walk.append(into[walk[-1]][0])
    cycle = walk[walk.index(walk[-1]) : -1]
    said = "; ".join(
        f"{_bars_of(into[file][2])} in {path.name_of(files[into[file][0]])} come before "
        f"those in {path.name_of(files[file])}"
        for file in reversed(cycle)
    )
    return _error(
        path,
        f"its files cannot be read in one order that keeps every symbol's bars in time "
        f"({said}), so the folder cannot be streamed a file at a time; {_WAYS_OUT}",
    )
