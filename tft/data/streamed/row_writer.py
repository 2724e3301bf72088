"""A row cache's role files, and the pass that encodes chunks of bars into them.

Each role (NOTE [Row cache] in :mod:`tft.data.streamed.row_cache`) is one raw file of fixed-size
rows grouped by symbol; :func:`encode_rows` reads chunks of the data, encodes their kept rows
with a fitted normaliser and writes each symbol's rows at that symbol's write cursor. A fresh
build starts the cursors at each symbol's first row; a cache grown by new files
(:mod:`tft.data.streamed.updates.cache_growth`) starts them after each symbol's rows already there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tft.data.categories import encode_categories
from tft.data.column_table import CALENDAR_INPUTS
from tft.data.columns import ColumnRoles, _check_finite
from tft.data.normalize import Normalizer
from tft.data.rows import _calendar
from tft.data.streamed.build_progress import BuildProgress, build_pass
from tft.data.streamed.file_scan import RowWalker, read_chunks
from tft.data.streamed.read_order import ReadOrder

__all__ = ["ROLE_FILES", "RoleFiles", "encode_rows", "role_widths"]

ROLE_FILES = {
    "observed": np.float32,
    "known": np.float32,
    "categorical": np.int64,
    "static": np.int64,
    "target": np.float32,
    "time_ns": np.int64,
    "symbol_index": np.int64,
}
"""Each role file's element type."""


def role_widths(roles: ColumnRoles) -> dict[str, int]:
    """Columns of each 2-D role file (observed, known, categorical, static) for ``roles``."""
    time_varying = [
        *roles.categorical_columns(roles.observed or []),
        *roles.categorical_columns(roles.known),
    ]
    return {
        "observed": 1 + len(roles.real_columns(roles.observed or [])),
        "known": len(roles.real_columns(roles.known)) + len(CALENDAR_INPUTS),
        "categorical": len(time_varying),
        "static": len(roles.static or []),
    }


class RoleFiles:
    """A cache folder's role files open for writing, each ``num_rows`` rows long."""

    def __init__(self, folder: Path, widths: dict[str, int], num_rows: int) -> None:
        self.files: dict[str, tuple[BinaryIO, int]] = {}
        for name, dtype in ROLE_FILES.items():
            row_bytes = np.dtype(dtype).itemsize * widths.get(name, 1)
            file = open(folder / f"{name}.bin", "wb")  # noqa: SIM115 - closed by close()
            file.truncate(num_rows * row_bytes)
            self.files[name] = (file, row_bytes)

    def write(self, name: str, rows: np.ndarray, first_row: int) -> None:
        """Write ``rows`` of role ``name`` from row ``first_row`` on."""
        file, row_bytes = self.files[name]
        if row_bytes and len(rows):
            part = np.ascontiguousarray(rows)
            os.pwrite(file.fileno(), part.tobytes(), first_row * row_bytes)

    def copy_rows(self, name: str, source: Path, rows: tuple[int, int], first_row: int) -> None:
        """Copy rows ``[rows[0], rows[1])`` of role ``name`` from the role file ``source`` to
        row ``first_row`` on, in the kernel where it can (no bytes through this process)."""
        file, row_bytes = self.files[name]
        left, offset, at = (
            (rows[1] - rows[0]) * row_bytes,
            rows[0] * row_bytes,
            first_row * row_bytes,
        )
        if not left:
            return
        with open(source, "rb") as old:
            while left:
                if hasattr(os, "copy_file_range"):  # Linux: the kernel copies (or shares) them
                    done = os.copy_file_range(old.fileno(), file.fileno(), left, offset, at)
                else:  # elsewhere a block at a time through this process
                    done = os.pwrite(
                        file.fileno(), os.pread(old.fileno(), min(left, 1 << 24), offset), at
                    )
                if done == 0:
                    raise OSError(f"{source} ended {left} bytes early")
                left, offset, at = left - done, offset + done, at + done

    def close(self) -> None:
        for file, _ in self.files.values():
            file.close()


def encode_rows(
    order: ReadOrder,
    files: RoleFiles,
    walker: RowWalker,
    written: np.ndarray,
    normalizer: Normalizer,
    reading: tuple[int, BuildProgress | None],
) -> dict[str, np.ndarray]:
    """Encode every chunk of ``order``'s files and write its rows at their symbols' cursors.

    Args:
        walker: walks the chunks (the normaliser's symbols; carrying each symbol's last bar
            and warm-up from whatever came before these files).
        written: each symbol's next row in the role files; advanced as rows are written.
        reading: rows per chunk, and who hears how far the pass is.

    Returns:
        The rows of each categorical and static column whose category was unknown, an array
        over the symbol codes.

    Raises:
        DataError: a value that cannot be encoded (naming its file and row).
    """
    chunk_rows, progress = reading
    roles = normalizer.roles
    observed_reals = roles.real_columns(roles.observed or [])
    known_reals = roles.real_columns(roles.known)
    time_varying = [
        *roles.categorical_columns(roles.observed or []),
        *roles.categorical_columns(roles.known),
    ]
    static = roles.static or []
    widths = role_widths(roles)
    num_symbols = len(normalizer.symbols)
    unknown_rows = {name: np.zeros(num_symbols, np.int64) for name in [*time_varying, *static]}
    columns = list(
        dict.fromkeys([*walker.columns(), *observed_reals, *known_reals, *time_varying, *static])
    )
    read = build_pass(progress, 3, "encoding the rows")
    for chunk in read_chunks(order, columns, chunk_rows, read):
        table = chunk.table
        rows = walker.rows(chunk)
        index = rows.symbol_index
        n = len(index)
        if n == 0:  # every row of the chunk warm-up (or a first bar): nothing to write
            continue
        observed = np.empty((n, widths["observed"]), dtype=np.float32)
        observed[:, 0] = normalizer.target.apply(rows.target, index)
        known = np.empty((n, widths["known"]), dtype=np.float32)
        for out, names in ((observed[:, 1:], observed_reals), (known, known_reals)):
            for j, name in enumerate(names):
                values = rows.take(table, name)
                _check_finite(chunk.file, name, values, rows.file_rows, whole=False)
                out[:, j] = normalizer.reals[name].apply(values, index)
        known[:, len(known_reals) :] = _calendar(rows.time_ns)
        codes = {}
        for name in [*time_varying, *static]:
            codes[name], unknown = encode_categories(
                rows.text(table, name), normalizer.categories[name]
            )
            if unknown:
                unknown_rows[name] += np.bincount(index[codes[name] == 0], minlength=num_symbols)
        arrays = {
            "observed": observed,
            "known": known,
            "categorical": _stack(codes, time_varying, n),
            "static": _stack(codes, static, n),
            "target": observed[:, 0].copy(),
            "time_ns": rows.time_ns,
            "symbol_index": index,
        }
        group_starts = np.flatnonzero(np.concatenate([[True], index[1:] != index[:-1]]))
        group_ends = [*group_starts[1:].tolist(), n]
        for begin, end in zip(group_starts.tolist(), group_ends, strict=True):
            code = int(index[begin])
            for name in ROLE_FILES:
                files.write(name, arrays[name][begin:end], int(written[code]))
            written[code] += end - begin
    return unknown_rows


def _stack(codes: dict[str, np.ndarray], names: list[str], n: int) -> np.ndarray:
    if not names:
        return np.zeros((n, 0), dtype=np.int64)
    return np.stack([codes[name] for name in names], axis=1)
