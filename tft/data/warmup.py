"""Indicators' warm-up rows: the leading nulls and NaNs of each symbol's rows in a real input.

NOTE [Warm-up rows]
An indicator computed per contract (a 14-bar RSI, a 20-bar moving average) has no value for
its first bars: an export writes them as null or NaN, contract by contract. Those rows are not
bad data and filling them would invent values, so where a real input's values are not finite
at the start of a symbol's rows (in time order), those rows are dropped, with every window
that would touch them: a symbol loses its first ``w`` rows, ``w`` the longest such run over its
real inputs. The column table counts each column's warm-up rows. A null, NaN or infinity
anywhere else is still refused, with the count and the first row
(:func:`tft.data.columns._check_finite`): a gap in the middle of a series is not a warm-up.

Rows are dropped after the target's transform, so the first kept row's log return is taken
against the bar before it, which is real. The streamed path (a file past ``max_host_bytes``)
does not drop warm-up rows yet: it refuses them as it refuses any NaN, and says so.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tft.data.columns import ColumnRoles, _float_column

__all__ = ["real_inputs", "warmup_rows"]


def real_inputs(roles: ColumnRoles) -> list[str]:
    """The real (scaled number) inputs of resolved roles, known then observed."""
    return roles.real_columns([*roles.known, *(roles.observed or [])])


def warmup_rows(
    table: pa.Table, names: list[str], file_rows: np.ndarray, codes: np.ndarray, num_symbols: int
) -> tuple[np.ndarray, dict[str, int]]:
    """Which rows are some real input's warm-up (NOTE [Warm-up rows]), and each column's
    warm-up rows.

    Args:
        file_rows: the file row of each row, rows grouped by symbol in time order.
        codes: each row's symbol index (grouped: non-decreasing).
    """
    bounds = np.searchsorted(codes, np.arange(num_symbols + 1))
    starts, ends = bounds[:-1], bounds[1:]
    longest = np.zeros(num_symbols, dtype=np.int64)
    counts: dict[str, int] = {}
    for name in names:
        finite = np.flatnonzero(np.isfinite(_float_column(table, name)[file_rows]))
        if len(finite) == 0:
            continue  # no value at all: not a warm-up, refused as such by the finite check
        # Each symbol's first finite row: the first finite index at or after its start.
        at = np.searchsorted(finite, starts)
        first = np.where(at < len(finite), finite[np.minimum(at, len(finite) - 1)], len(codes))
        lead = np.minimum(first, ends) - starts  # (S,) leading non-finite rows
        if lead.any():
            counts[name] = int(lead.sum())
            longest = np.maximum(longest, lead)
    position = np.arange(len(codes)) - starts[codes]  # each row's place within its symbol
    return position < longest[codes], counts
