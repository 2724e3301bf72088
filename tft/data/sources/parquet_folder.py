"""A folder of Parquet files read as one table of bars: exports a file per day, month or
contract, often in hive-style folders (``symbol=ES/year=2024/part-0.parquet``).

NOTE [A folder of files as one dataset]
Every file under the folder whose name does not start with ``.`` or ``_`` (what Spark and
pandas write beside the data: ``_SUCCESS``, ``.crc``) is one part of the dataset, in any order.
The reading is ``pyarrow.dataset``'s, with the checks a trader's folder needs put in front of
it, because the dataset API alone gets three things wrong for bars:
- Schemas. It takes the first file's schema and fails, or reads nulls, on a later file that
  adds a column or stores ``volume`` as a float. Here every file's footer is read (the schemas
  only, no rows) and unified: a column missing from some files is null there, integers and
  floats of one column are read as float64; anything else (text in one file, numbers in
  another) is refused in one line naming both files and the column.
- Partitions. Hive keys become columns (a symbol that lives only in the folder's name can be
  the symbol column); a key that is also a column inside the files is refused, naming both.
- Order. Files come in any order, so the rows are put in time order within each symbol after
  reading (:func:`tft.data.windows.load_windows`); the same bar (symbol and time) in two
  files is refused naming both files (:func:`duplicate_bars`), where one file with a repeated
  bar keeps the single file's message. A file that is not Parquet among good ones is named.
A glob pattern (``'data/*.parquet'``, ``'bars/symbol=*/2024-*.parquet'``: quoted, so the shell
leaves it alone) is a folder too: the files it matches, named from its leading folder without
wildcards, whose hive keys are read as a folder's are
(:func:`tft.data.sources.data_source.pattern_base`). A path that exists as written is never a
pattern, whatever characters its name holds. Several paths given together are one dataset
too (NOTE [Several data paths] in :mod:`tft.data.sources.data_source`).
A folder whose rows fit ``--max-host-memory`` is read into memory and sorted there; a larger
one is streamed through the row cache a file at a time (:func:`file_batches`), in an order
where each symbol's bars follow one another in time (NOTE [Streaming a folder in time order]
in :mod:`tft.data.streamed.read_order`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from tft.data.sources.data_source import DataSource
from tft.errors import DataError, first_line

__all__ = [
    "FILE_COLUMN",
    "bar_order",
    "duplicate_bars",
    "file_batches",
    "first_rows",
    "folder_bytes",
    "folder_schema",
    "footer",
    "read_folder",
    "shared_bar",
]

FILE_COLUMN = "__file"
"""The column :func:`read_folder` adds: the index, in ``DataSource.files()``, of each row's
file."""


def footer(path: Path) -> pq.FileMetaData:
    """A Parquet file's footer (its schema, rows and row groups), read once while the file is
    unchanged: a load asks for a folder's schemas and row counts several times, and each read
    of a footer is a seek and a read per file (thousands of files a year of daily exports).

    Raises:
        pyarrow.ArrowException, OSError: the file cannot be read as Parquet.
    """
    stat = path.stat()
    return _footer_of(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8192)
def _footer_of(path: str, size_bytes: int, mtime_ns: int) -> pq.FileMetaData:
    # The size and time are the key: a file rewritten in place is read again.
    return pq.read_metadata(path)


def _error(path: object, text: str) -> DataError:
    return DataError(f"{path}: {' '.join(text.split())}")


def _partitioning() -> ds.Partitioning | ds.PartitioningFactory:
    # Keys as plain strings and integers: a dictionary type would make each file's symbols
    # a different category set.
    return ds.HivePartitioning.discover(infer_dictionary=False)


def _dataset(source: DataSource, files: list[Path], schema: pa.Schema) -> ds.Dataset:
    """``files`` of ``source`` read with its unified ``schema`` and its hive keys."""
    return ds.dataset(
        [str(path) for path in files],
        schema=schema,
        format="parquet",
        partitioning=_partitioning(),
        partition_base_dir=str(source.base),
    )


def _file_schemas(source: DataSource, files: list[Path]) -> list[pa.Schema]:
    schemas = []
    for path in files:
        try:
            schemas.append(footer(path).schema.to_arrow_schema())
        except (pa.ArrowException, OSError) as error:
            reason = first_line(error)
            raise _error(
                source,
                f"{source.name_of(path)} cannot be read as Parquet ({reason}); move it out "
                "of the folder or replace it with the Parquet file it should be",
            ) from None
    return schemas


def folder_schema(source: DataSource) -> pa.Schema:
    """The columns of every file of ``source`` unified, with its hive keys as columns.

    Raises:
        DataError: a file that is not Parquet, a column whose types cannot be unified (naming
            both files), a hive key that is also a column in the files.
    """
    files = source.files()
    schemas = _file_schemas(source, files)
    unified = schemas[0]
    first_with: dict[str, Path] = {field.name: files[0] for field in schemas[0]}
    for path, schema in zip(files[1:], schemas[1:], strict=True):
        for field in schema:
            if field.name in unified.names:
                try:
                    pa.unify_schemas(
                        [pa.schema([unified.field(field.name)]), pa.schema([field])],
                        promote_options="permissive",
                    )
                except (pa.ArrowTypeError, pa.ArrowInvalid):
                    before = first_with[field.name]
                    raise _error(
                        source,
                        f"column '{field.name}' is {unified.field(field.name).type} in "
                        f"{source.name_of(before)} and {field.type} in "
                        f"{source.name_of(path)}; write it with one type in every file",
                    ) from None
            else:
                first_with[field.name] = path
        unified = pa.unify_schemas([unified, schema], promote_options="permissive")
    keys = _partition_keys(source, files)
    for key in keys:
        if key.name in unified.names:
            raise _error(
                source,
                f"the folders' key '{key.name}' ({key.name}=... in their names) is also a column "
                f"in {source.name_of(first_with[key.name])}; rename the folders or the "
                "column",
            )
    return pa.unify_schemas([unified, keys])


def _partition_keys(source: DataSource, files: list[Path]) -> pa.Schema:
    """The hive keys of the folders the files are in (``key=value``), their types inferred;
    no fields where there are none."""
    names = {
        part.split("=", 1)[0]
        for path in files
        for part in source.name_of(path).parts[:-1]
        if "=" in part
    }
    if not names:
        # Discovery with no key to find reports the files' own columns as keys: ask it not.
        return pa.schema([])
    dataset = ds.dataset(
        [str(path) for path in files],
        format="parquet",
        partitioning=_partitioning(),
        partition_base_dir=str(source.base),
    )
    return pa.schema([field for field in dataset.partitioning.schema if field.name in names])


def read_folder(source: DataSource, columns: list[str]) -> pa.Table:
    """``columns`` of every file of ``source`` in one table (files in path order, rows in
    file order), with :data:`FILE_COLUMN`.

    Raises:
        DataError: as :func:`folder_schema`, or a folder with no rows.
    """
    files = source.files()
    schema = folder_schema(source)
    tables = []
    for index, path in enumerate(files):
        table = _dataset(source, [path], schema).to_table(columns=columns)
        tables.append(table.append_column(FILE_COLUMN, pa.array(np.full(table.num_rows, index))))
    table = pa.concat_tables(tables)
    if table.num_rows == 0:
        raise _error(source, "has no rows in any of its files; pass a folder with bars in it")
    return table


def file_batches(
    source: DataSource, path: Path, schema: pa.Schema, columns: list[str], batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """``columns`` of one file of ``source`` as the source reads it (``schema``, its unified
    columns and hive keys: :func:`folder_schema`), at most ``batch_rows`` rows at a time."""
    dataset = _dataset(source, [path], schema)
    # No read-ahead: a streamed folder holds one batch at a time, as one file read in chunks
    # does (pre-buffering whole row groups held 450 MB on a 0.47 GB file).
    yield from dataset.to_batches(
        columns=columns,
        batch_size=batch_rows,
        batch_readahead=0,
        fragment_readahead=0,
        fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False),
        use_threads=False,
    )


def first_rows(source: DataSource, columns: list[str], rows: int) -> pa.Table:
    """The first ``rows`` rows of ``columns`` of a file or of several (the first files'), for
    a look at what the columns hold; an empty table where there are none."""
    if not source.many:
        reader = pq.ParquetFile(source.file, metadata=footer(source.file))
        batch = next(reader.iter_batches(batch_size=rows, columns=columns), None)
        return pa.Table.from_batches([batch]) if batch is not None else pa.table({})
    return _dataset(source, source.files(), folder_schema(source)).head(rows, columns=columns)


def folder_bytes(source: DataSource) -> int:
    """The bytes of ``source``'s data files on disk."""
    return sum(path.stat().st_size for path in source.files())


def duplicate_bars(
    source: DataSource,
    files: np.ndarray,
    time_ns: np.ndarray,
    codes: np.ndarray,
    symbols: list[str],
) -> None:
    """Refuse the same bar in two files: rows sorted by symbol then time, ``files`` each
    row's :data:`FILE_COLUMN`.

    Raises:
        DataError: naming the symbol, the time and both files.
    """
    same = (codes[1:] == codes[:-1]) & (time_ns[1:] == time_ns[:-1]) & (files[1:] != files[:-1])
    if not same.any():
        return
    at = int(np.flatnonzero(same)[0])
    names = source.files()
    first, second = (names[int(files[i])] for i in (at, at + 1))
    raise shared_bar(source, symbols[int(codes[at])], int(time_ns[at]), (first, second))


def shared_bar(
    source: DataSource, symbol: str, time_ns: int, files: tuple[Path, Path]
) -> DataError:
    """The error for one bar (``symbol`` at ``time_ns``) in two files of ``source``, read in
    memory or streamed."""
    first, second = (source.name_of(file) for file in files)
    return _error(
        source,
        f"the bar of {symbol} at {np.datetime64(time_ns, 'ns')} is in both {first} and "
        f"{second}; keep it in one file",
    )


def bar_order(
    source: DataSource, table: pa.Table, time_ns: np.ndarray, codes: np.ndarray, symbols: list[str]
) -> np.ndarray:
    """The table's rows grouped by symbol: in file order for one file (whose order the
    checks hold it to), in time order for a folder's files, which come in any order, the
    same bar in two of them refused (:func:`duplicate_bars`)."""
    if FILE_COLUMN not in table.column_names:
        return np.argsort(codes, kind="stable") if len(symbols) > 1 else np.arange(len(codes))
    order = np.lexsort((time_ns, codes))
    files = table[FILE_COLUMN].to_numpy()[order]
    duplicate_bars(source, files, time_ns[order], codes[order], symbols)
    return order
