"""The encoded rows of a Parquet file, written once to a folder and mapped back into memory.

:func:`cached_rows` gives the :class:`~tft.data.rows.Rows` of a file larger than memory: the first
time, three passes over the file in chunks (:mod:`tft.data.streamed.file_scan`) write every role's array
to its own file in the cache folder; after that (a resumed run, ``predict`` on the same file)
the folder is mapped as it is. NOTE [Row cache] says why this design.

NOTE [Row cache]
Windows overlap (a window of 30 rows starts at every row), so the rows are stored once and a
window is its first row, as in memory (NOTE [Rows, windows and splits] in :mod:`tft.data.windows`).
The cache holds exactly the in-memory arrays (scaled float32 reals, int64 codes), row-major,
grouped by symbol, one raw file per role. A window's rows of one role are then one contiguous
run of bytes, which ``WindowDataset.batch`` reads with one positioned read (NOTE [Reading
windows from the cache] in :mod:`tft.data.row_files`): shuffling stays a permutation of every
window (no shuffle buffer), a batch reads only its own rows, and what it reads is copied from
the kernel's page cache, which is not the process's memory. The files are also mapped
read-only, as :class:`~tft.data.rows.Rows` arrays, for the few reads of a whole role. The
alternatives were worse here: Arrow IPC would store the file's columns, so every batch would
redo the scaling and coding; reading row groups into a shuffle buffer makes the order depend
on the buffer size and is not the in-memory path's order for a small file.

The cache is keyed by the source file's resolved path, size and modification time (a
folder's: each of its files'). It is reused when those match and it was encoded the same way
(the same normaliser, or fitted with the same roles and split); a folder that has only gained
files grows by their rows (NOTE [A cache grown by new files] in
:mod:`tft.data.streamed.updates.cache_growth`), one whose files changed or went re-encodes the symbols
they held (NOTE [A cache re-encoded where its files changed] in
:mod:`tft.data.streamed.updates.cache_reencode`); otherwise it is rebuilt. It is written into a sibling folder and
renamed into place, so a failed or interrupted build leaves nothing behind, except where the
process is killed outright (``kill -9``, the machine's out-of-memory killer): then the sibling
``<name>.partial-<pid>`` stays, possibly gigabytes of it, and :func:`remove_stale_builds`
removes it on the next run, once no process of that id is running.
"""

from __future__ import annotations

import glob
import hashlib
import mmap
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tft.data.columns import (
    ColumnRoles,
    _error,
    _read_schema,
    _roles_difference,
    _usable,
)
from tft.data.normalize import Normalizer
from tft.data.role_inference import infer_roles
from tft.data.row_files import RowFiles
from tft.data.rows import Rows
from tft.data.sources.data_source import DataPaths, DataSource
from tft.data.splits import cut_points
from tft.data.streamed.build_folder import building_beside, put_in_place
from tft.data.streamed.build_progress import BuildProgress
from tft.data.streamed.cache_meta import (
    DISTINCT_TIMES_FILE,
    META_FILE,
    META_VERSION,
    FittedOn,
    RowCacheMeta,
    SourceFile,
    counts_by_symbol,
    read_meta,
)
from tft.data.streamed.distinct_times import read_time_file
from tft.data.streamed.file_scan import FileLayout, RowWalker, scan_layout
from tft.data.streamed.fitted_scales import fit_statistics
from tft.data.streamed.row_writer import ROLE_FILES, RoleFiles, encode_rows, role_widths
from tft.data.streamed.updates.cache_growth import grow_cache
from tft.data.streamed.updates.cache_reencode import reencode_touched
from tft.data.streamed.updates.cache_rewrite import NO_FLOOR
from tft.data.warmup import RunningWarmup, real_inputs
from tft.errors import DataError

__all__ = ["CachedRows", "RowCacheMeta", "cache_folder", "cached_rows", "remove_stale_builds"]

_PAGE = mmap.PAGESIZE


def cache_folder(root: Path, path: DataPaths) -> Path:
    """The cache folder of data path ``path`` under ``root``: its (first path's) stem and a
    hash of its paths (a pattern's wildcards left out of the name, kept in the hash)."""
    source = DataSource.of(path)
    digest = hashlib.sha256(source.identity.encode()).hexdigest()[:12]
    stem = re.sub(r"[^\w.=-]+", "_", source.resolved().paths[0].stem).strip("_") or "data"
    return root / f"{stem}-{digest}"


def remove_stale_builds(folder: Path, *, any_name: bool = False) -> list[tuple[Path, int]]:
    """Remove the partial builds beside ``folder`` whose process is gone (NOTE [Row cache]):
    ``<folder name>.partial-<pid>``, or every ``*.partial-<pid>`` in its parent with
    ``any_name`` (a folder of caches that only builds write to). Returns each removed folder
    with the bytes it held."""
    removed = []
    pattern = "*" if any_name else glob.escape(folder.name)
    for partial in sorted(folder.parent.glob(f"{pattern}.partial-*")):
        pid = partial.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not partial.is_dir() or _running(int(pid)):
            continue
        held = sum(file.stat().st_size for file in partial.rglob("*") if file.is_file())
        shutil.rmtree(partial, ignore_errors=True)
        removed.append((partial, held))
    return removed


def _running(pid: int) -> bool:
    """Whether a process with this id runs on this machine (signal 0 checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or an id no process can have: keep it
    return True


def _same_encoding(
    meta: RowCacheMeta, roles: ColumnRoles | None, normalizer: Normalizer | None, split: _Split
) -> bool:
    """Whether the cache was encoded as asked: with this normaliser, or fitted with these
    roles on this split."""
    if normalizer is not None:
        return meta.normalizer == normalizer.to_dict()
    given = (roles or ColumnRoles()).model_dump(mode="json")
    return meta.given_roles == given and meta.fitted_on == _fitted_on(split)


_Split = tuple[Sequence[float] | None, tuple[int, int] | None]
"""(split fractions, split starts in ns): the split of a run, by shares or by dates."""


def _fitted_on(split: _Split) -> FittedOn:
    fractions, starts_ns = split
    if starts_ns is not None:
        return FittedOn(starts_ns=list(starts_ns))
    return FittedOn(shares=list(fractions) if fractions is not None else None)


def _growth_floor(normalizer: Normalizer | None, split: _Split) -> int | None:
    """The earliest time a new file's bar may have for the cache to grow with its scales
    kept (NOTE [A cache grown by new files]); None where any new bar moves them."""
    if normalizer is not None:
        return NO_FLOOR
    return split[1][0] if split[1] is not None else None


class CachedRows(NamedTuple):
    """A data path's rows mapped from its cache folder."""

    rows: Rows
    meta: RowCacheMeta
    distinct_times: np.ndarray
    """The sorted distinct times of the rows (ns)."""
    use: str
    """What was done with the cache: ``built``, ``reused``, or the line of a growth (NOTE
    [A cache grown by new files])."""


def cached_rows(
    path: DataSource,
    folder: Path,
    *,
    roles: ColumnRoles | None,
    normalizer: Normalizer | None,
    split_fractions: Sequence[float] | None,
    split_starts_ns: tuple[int, int] | None = None,
    chunk_rows: int,
    check_source: bool = True,
    progress: BuildProgress | None = None,
    grow_from: Sequence[Path] = (),
) -> CachedRows:
    """The rows of ``path`` from the cache ``folder``, building or growing it first when needed.

    Args:
        folder: the cache folder (:func:`cache_folder`); created, grown by a folder's new
            files, or replaced when it holds the same data encoded another way.
        roles, normalizer, split_fractions: as :func:`tft.data.windows.load_windows` takes them.
        split_starts_ns: a split by dates (:func:`tft.data.splits.split_starts_ns`), which
            replaces ``split_fractions``.
        chunk_rows: rows per chunk read from the file while building.
        check_source: refuse a folder made from another file (a folder the user named)
            instead of replacing it.
        progress: told what a build is doing, a line after each chunk of each pass.
        grow_from: cache folders to grow ``folder`` from where it holds none, beside the
            folders next to it (NOTE [A cache grown from another]).

    Raises:
        DataError: the file cannot be used (as load_windows), or ``folder`` holds the cache of
            another file and ``check_source`` is set.
    """
    source = SourceFile.of(path)
    meta = read_meta(folder)
    if meta is not None and check_source and meta.source.path != source.path:
        raise DataError(
            f"{folder} holds the row cache of {meta.source.path}, not of {source.path}; pass "
            "another --data-cache folder or delete that one"
        )
    split = (split_fractions, split_starts_ns)
    reading = (chunk_rows, progress)
    use = "reused"
    encoded_as_asked = meta is not None and _same_encoding(meta, roles, normalizer, split)
    if meta is None or meta.source != source or not encoded_as_asked:
        floor = _growth_floor(normalizer, split)
        grown = None
        if meta is not None and encoded_as_asked and floor is not None:
            grown = grow_cache(path, folder, meta, source, floor, reading) or reencode_touched(
                path, folder, meta, source, floor, reading
            )
        elif meta is None and floor is not None:
            nearest = _nearest_cache(folder, source, roles, normalizer, split, grow_from)
            if nearest is not None:
                other, other_meta = nearest
                grown = grow_cache(path, folder, other_meta, source, floor, reading, other)
        if grown is not None:
            meta, use = grown
        else:
            meta, use = _build(path, folder, source, roles, normalizer, split, reading), "built"
    rows = _open(folder, meta)
    # Mapped, not read: one symbol's minute bars have as many distinct times as rows.
    return CachedRows(rows, meta, read_time_file(folder / DISTINCT_TIMES_FILE), use)


def _nearest_cache(
    folder: Path,
    source: SourceFile,
    roles: ColumnRoles | None,
    normalizer: Normalizer | None,
    split: _Split,
    also: Sequence[Path],
) -> tuple[Path, RowCacheMeta] | None:
    """The cache of the most of ``source``'s files, each unchanged and no other, encoded as
    asked, among the folders beside ``folder`` and ``also``; None where there is none.

    NOTE [A cache grown from another]
    ``predict`` on yesterday's folder and today's file (two paths: NOTE [Several data paths])
    is another dataset than the folder alone, so its cache is another folder, and would be
    built from every row. But the folder's own cache, the run's or one a ``predict`` of
    yesterday built beside it, holds every row but today's, encoded with the same scales. So a
    source with no cache of its own grows from the cache beside it (or the run's named one)
    whose files are all among its own, unchanged, encoded the way asked, the one with the most
    files: its rows are copied (it stays what it is: another dataset may still read it) and
    only the new files are read, as a cache grows by a folder's new files (NOTE [A cache
    grown by new files]), under the same conditions.
    """
    candidates = sorted(folder.parent.iterdir()) if folder.parent.is_dir() else []
    best: tuple[Path, RowCacheMeta] | None = None
    for other in dict.fromkeys([*candidates, *also]):
        if other == folder or ".partial-" in other.name or not other.is_dir():
            continue
        meta = read_meta(other)
        if meta is None or not _same_encoding(meta, roles, normalizer, split):
            continue
        files = len(meta.source.files())
        if files >= len(source.files()) or not meta.source.unchanged_in(source):
            continue
        if best is None or files > len(best[1].source.files()):
            best = (other, meta)
    return best


def _open(folder: Path, meta: RowCacheMeta) -> Rows:
    maps: list[mmap.mmap] = []
    arrays: dict[str, np.ndarray] = {}
    layout: dict[str, tuple[np.dtype, int | None]] = {}
    for name, dtype in ROLE_FILES.items():
        width = meta.widths.get(name)
        layout[name] = (np.dtype(dtype), width)
        shape = (meta.num_rows,) if width is None else (meta.num_rows, width)
        if int(np.prod(shape)) == 0:
            arrays[name] = np.zeros(shape, dtype=dtype)
            continue
        with open(folder / f"{name}.bin", "rb") as file:
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        maps.append(mapping)
        arrays[name] = np.frombuffer(mapping, dtype=dtype).reshape(shape)
    return Rows(
        observed=arrays["observed"],
        known=arrays["known"],
        categorical=arrays["categorical"],
        num_known_categorical=meta.num_known_categorical,
        static=arrays["static"],
        target=arrays["target"],
        time_ns=arrays["time_ns"],
        symbol_index=arrays["symbol_index"],
        files=RowFiles(folder, layout, maps),
    )


def _build(
    path: DataSource,
    folder: Path,
    source: SourceFile,
    roles: ColumnRoles | None,
    normalizer: Normalizer | None,
    split: _Split,
    reading: tuple[int, BuildProgress | None],
) -> RowCacheMeta:
    chunk_rows, progress = reading  # rows per chunk, and who hears how far each pass is
    schema = _read_schema(path)
    given_normalizer = normalizer is not None
    asked = roles if roles is not None else normalizer.roles if normalizer else ColumnRoles()
    asked = infer_roles(path, schema, asked)
    candidates = [
        name
        for name in schema.names
        if name == asked.timestamp
        or (name not in asked.ignore and _usable(schema.field(name).type))
    ]
    known_symbols = normalizer.symbols if normalizer else None
    with building_beside(folder) as partial:
        layout = scan_layout(
            path,
            schema,
            asked,
            known_symbols,
            chunk_rows,
            candidates,
            partial / DISTINCT_TIMES_FILE,
            progress,
        )
        if normalizer is not None and layout.roles != normalizer.roles:
            raise _error(path, _roles_difference(layout.roles, normalizer.roles))
        if normalizer is None:
            cuts = cut_points(path, layout.distinct_times, *split)
            fitted = fit_statistics(path, layout, cuts, chunk_rows, progress)
            normalizer = Normalizer(
                roles=layout.roles,
                symbols=layout.symbols,
                target=fitted.target,
                reals=fitted.reals,
                categories=fitted.categories,
            )
        meta = _write_rows(path, partial, source, layout, normalizer, reading)
        meta = meta.model_copy(
            update={
                "given_roles": None if given_normalizer else asked.model_dump(mode="json"),
                "fitted_on": None if given_normalizer else _fitted_on(split),
            }
        )
        (partial / META_FILE).write_text(meta.model_dump_json(indent=1), encoding="utf-8")
        put_in_place(partial, folder)
    return meta


def _write_rows(
    path: DataSource,
    folder: Path,
    source: SourceFile,
    layout: FileLayout,
    normalizer: Normalizer,
    reading: tuple[int, BuildProgress | None],
) -> RowCacheMeta:
    """The third pass: encode each chunk and write its rows at their symbols' places."""
    roles = layout.roles
    widths = role_widths(roles)
    bounds = np.concatenate([[0], np.cumsum(layout.kept_per_symbol)]).astype(np.int64)
    num_rows = int(bounds[-1])
    walker = RowWalker(path, roles, roles.symbol, layout.symbols, RunningWarmup(real_inputs(roles)))
    files = RoleFiles(folder, widths, num_rows)
    try:
        unknown_rows = encode_rows(
            layout.order, files, walker, bounds[:-1].copy(), normalizer, reading
        )
    finally:
        files.close()
    return RowCacheMeta(
        version=META_VERSION,
        source=source,
        given_roles=None,
        fitted_on=None,
        normalizer=normalizer.to_dict(),
        num_rows=num_rows,
        widths=widths,
        num_known_categorical=len(roles.categorical_columns(roles.known)),
        symbol_bounds=bounds.tolist(),
        unknown_rows=counts_by_symbol(layout.symbols, unknown_rows),
        warmup_rows=walker.warmup.warmup_counts_by_symbol(layout.symbols),
        distinct_times=len(layout.distinct_times),
        columns=str(_read_schema(path)),
        last_bars={
            symbol: walker.carry[code][:2]
            for code, symbol in enumerate(layout.symbols)
            if code in walker.carry
        },
        file_symbols=layout.order.file_symbols(),
    )
