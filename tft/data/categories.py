"""Categorical columns: categories fitted on the training rows, codes with an "unknown" index.

NOTE [Categories]
A categorical column is read as text: a dictionary column decoded, booleans as ``true`` and
``false``, integers as their digits. Its categories are the distinct values of the training
rows, sorted; code 0 means "unknown" (a null, or a value the training rows never had) and
category ``i`` has code ``i + 1``, so the embedding of a column with ``n`` categories has
``n + 1`` rows. A value seen only in validation, test or prediction rows maps to 0 and is
counted (the column table shows the count), never an error: markets add sessions, venues and
contract months that a model trained last month has not seen. Above
:data:`MAX_CATEGORIES` a column is refused: an identifier (a trade id, a timestamp as text)
is not a category, and its embedding would dwarf the model.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tft.data.columns import _error, how_to_name
from tft.data.sources.data_source import DataSource

__all__ = [
    "MAX_CATEGORIES",
    "category_text",
    "constant_within_groups",
    "encode_categories",
    "fit_categories",
]

MAX_CATEGORIES = 10_000
"""Most categories a column may have in its training rows."""


def category_text(table: pa.Table, name: str) -> pa.ChunkedArray:
    """The column's values as text (nulls kept), the form categories are fitted and matched in."""
    column = table[name]
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return column.cast(pa.string())


def fit_categories(path: DataSource, name: str, text: pa.ChunkedArray | pa.Array) -> list[str]:
    """The sorted distinct non-null values of ``text`` (a column's training rows).

    Raises:
        DataError: more than :data:`MAX_CATEGORIES` values.
    """
    categories = sorted(value for value in pc.unique(text).to_pylist() if value is not None)
    if len(categories) > MAX_CATEGORIES:
        raise _error(
            path,
            f"column '{name}' has {len(categories):,} distinct values in the training rows, "
            f"too many for a categorical input (at most {MAX_CATEGORIES:,}); leave it out with "
            f"{how_to_name('ignore', f'[{name!r}]')}, or store it as numbers to use it as a "
            "real input",
        )
    return categories


def encode_categories(
    text: pa.ChunkedArray | pa.Array, categories: list[str]
) -> tuple[np.ndarray, int]:
    """(int64 code per row, 0 for unknown; number of rows that are unknown)."""
    index = pc.index_in(text, value_set=pa.array(categories, type=pa.string()))
    codes = index.fill_null(-1).to_numpy().astype(np.int64) + 1
    return codes, int(np.count_nonzero(codes == 0))


def constant_within_groups(text: pa.ChunkedArray, groups: np.ndarray) -> bool:
    """Whether ``text`` holds one non-null value within each group of rows (int labels)."""
    if text.null_count:
        return False
    values = pc.dictionary_encode(text).combine_chunks().indices.to_numpy()
    order = np.argsort(groups, kind="stable")
    values, groups = values[order], groups[order]
    same_group = groups[1:] == groups[:-1]
    return not np.any(same_group & (values[1:] != values[:-1]))
