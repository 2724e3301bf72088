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
finds the same rows a chunk at a time (:class:`RunningWarmup`): a symbol's row is warm-up
exactly when some real input has had no finite value in that symbol's rows up to it, so each
symbol only needs to carry, from chunk to chunk, which inputs it has seen a value of.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tft.data.columns import ColumnRoles, _float_column

__all__ = ["RunningWarmup", "real_inputs", "warmup_rows"]


def real_inputs(roles: ColumnRoles) -> list[str]:
    """The real (scaled number) inputs of resolved roles, known then observed."""
    return roles.real_columns([*roles.known, *(roles.observed or [])])


def warmup_rows(
    table: pa.Table, names: list[str], file_rows: np.ndarray, codes: np.ndarray
) -> tuple[np.ndarray, dict[str, int]]:
    """Which rows of the whole file are some real input's warm-up (NOTE [Warm-up rows]), and
    each column's warm-up rows; a column with no finite value at all is left to the finite
    check, which refuses it as such.

    Args:
        file_rows: the file row of each row, rows grouped by symbol in time order.
        codes: each row's symbol index (grouped: non-decreasing).
    """
    some = [n for n in names if np.isfinite(_float_column(table, n)[file_rows]).any()]
    running = RunningWarmup(some)
    return running.warm(table, file_rows, codes), running.warmup_counts()


class RunningWarmup:
    """The warm-up rows of a file read a chunk at a time, the same rows :func:`warmup_rows`
    finds in the whole file (NOTE [Warm-up rows]).

    Args:
        names: the real inputs (:func:`real_inputs` of the resolved roles).
    """

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.counts = dict.fromkeys(names, 0)
        """Each column's warm-up rows so far (rows before its first value in their symbol)."""
        self.symbol_counts: dict[int, np.ndarray] = {}
        """The same counts, each symbol's apart (by symbol code, in ``names``' order)."""
        # Per symbol code: which inputs have had a finite value in its rows so far.
        self.seen: dict[int, np.ndarray] = {}

    def warm(self, table: pa.Table, local: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Which of a chunk's kept rows are warm-up; ``local`` is each row's place in the
        chunk's ``table``, ``codes`` its symbol, rows grouped by symbol in time order."""
        if not self.names or len(codes) == 0:
            return np.zeros(len(codes), dtype=bool)
        finite = np.stack(
            [np.isfinite(_float_column(table, name)[local]) for name in self.names], axis=1
        )
        new_group = np.concatenate([[True], codes[1:] != codes[:-1]])
        group = np.cumsum(new_group) - 1
        starts = np.flatnonzero(new_group)
        total = np.cumsum(finite, axis=0)
        before = total[starts] - finite[starts]  # each group's count before its first row
        none = np.zeros(len(self.names), dtype=bool)
        carried = np.stack([self.seen.get(int(code), none) for code in codes[starts]])
        seen = (total - before[group] > 0) | carried[group]
        ends = np.concatenate([starts[1:], [len(codes)]]) - 1
        per_group = np.add.reduceat((~seen).astype(np.int64), starts, axis=0)
        for code, last, counts in zip(
            codes[starts].tolist(), ends.tolist(), per_group, strict=True
        ):
            self.seen[code] = seen[last]
            self.symbol_counts[code] = self.symbol_counts.get(code, 0) + counts
        for name, count in zip(self.names, (~seen).sum(axis=0).tolist(), strict=True):
            self.counts[name] += count
        return ~seen.all(axis=1)

    def never_seen(self) -> str | None:
        """A real input with no finite value in any symbol's rows (not a warm-up: refused),
        or None."""
        for index, name in enumerate(self.names):
            if not any(seen[index] for seen in self.seen.values()):
                return name
        return None

    def warmup_counts(self) -> dict[str, int]:
        """The column table's warm-up rows of each column that has any."""
        return {name: count for name, count in self.counts.items() if count}

    def warmup_counts_by_symbol(self, symbols: list[str]) -> dict[str, dict[str, int]]:
        """:meth:`warmup_counts` of each symbol that has any (``symbols`` names the codes)."""
        return {
            symbols[code]: counted
            for code, counts in sorted(self.symbol_counts.items())
            if (counted := {n: int(c) for n, c in zip(self.names, counts, strict=True) if c})
        }
