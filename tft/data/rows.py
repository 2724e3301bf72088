"""The kept rows of a file as the arrays windows index into: reals scaled, categories coded.

:class:`InputEncoder` turns the columns of every input role into :class:`Rows`, one contiguous
array per role (NOTE [Rows, windows and splits] in :mod:`tft.data.windows`), fitting the scales
(NOTE [Per-symbol scaling] in :mod:`tft.data.normalize`) and the categories (NOTE [Categories] in
:mod:`tft.data.categories`) on the training rows, or applying a saved :class:`Normalizer`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from tft.data.categories import category_text, encode_categories, fit_categories
from tft.data.column_table import CALENDAR_INPUTS
from tft.data.columns import ColumnRoles
from tft.data.normalize import Normalizer, Scale, _scale_columns, fit_scale
from tft.data.row_files import RowFiles
from tft.data.sources.data_source import DataSource

__all__ = ["InputEncoder", "Rows"]

_NS_PER_MINUTE = 60 * 1_000_000_000
_NS_PER_DAY = 1440 * _NS_PER_MINUTE


@dataclass(frozen=True)
class Rows:
    """The contiguous per-row arrays every dataset of one file indexes into."""

    observed: np.ndarray  # (N, num_observed) float32
    known: np.ndarray  # (N, num_known) float32
    categorical: np.ndarray  # (N, Co + Ck) int64, observed then known codes
    num_known_categorical: int  # Ck
    static: np.ndarray  # (N, num_static) int64
    target: np.ndarray  # (N,) float32
    time_ns: np.ndarray  # (N,) int64
    symbol_index: np.ndarray  # (N,) int64
    files: RowFiles | None = field(default=None, compare=False)
    """The row cache files the arrays are mapped from (batches read windows from them, NOTE
    [Reading windows from the cache]); None for arrays in memory."""


def _calendar(time_ns: np.ndarray) -> np.ndarray:
    """(N, 4) float32: sin/cos of the UTC minute of the day and of the day of the week."""
    minute = (time_ns // _NS_PER_MINUTE) % 1440
    weekday = (time_ns // _NS_PER_DAY + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    minute_angle = 2 * np.pi * minute / 1440
    weekday_angle = 2 * np.pi * weekday / 7
    parts = [np.sin(minute_angle), np.cos(minute_angle), np.sin(weekday_angle)]
    parts.append(np.cos(weekday_angle))
    return np.stack(parts, axis=1).astype(np.float32)


class InputEncoder:
    """The kept rows of every input role as arrays: reals scaled, categories coded.

    With a normalizer, its scales and categories are applied; without one, they are fitted
    on the training rows.
    """

    def __init__(
        self,
        path: DataSource,
        table: pa.Table,
        roles: ColumnRoles,
        symbols: list[str],
        rows: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        self.path, self.table, self.roles, self.symbols = path, table, roles, symbols
        self.file_rows, self.symbol_index, self.train_rows = rows

    def encode(
        self, target: np.ndarray, time_ns: np.ndarray, normalizer: Normalizer | None
    ) -> tuple[Rows, Normalizer, dict[str, int]]:
        """(row arrays, the normalizer used, rows coded unknown per categorical column)."""
        roles, index, train = self.roles, self.symbol_index, self.train_rows
        per_symbol = roles.scaling == "per_symbol"
        if normalizer is None:
            target_scale = fit_scale(
                target[train], index[train], len(self.symbols), per_symbol=per_symbol
            )
            reals: dict[str, Scale] = {}
            categories: dict[str, list[str]] = {}
        else:
            target_scale = normalizer.target
            reals, categories = dict(normalizer.reals), dict(normalizer.categories)
        fit = (len(self.symbols), per_symbol) if normalizer is None else None
        kept = (self.file_rows, index, train)

        observed_reals = roles.real_columns(roles.observed or [])
        observed = np.empty((len(index), 1 + len(observed_reals)), dtype=np.float32)
        observed[:, 0] = target_scale.apply(target, index)
        _scale_columns(self.path, self.table, observed_reals, kept, fit, reals, observed[:, 1:])
        known_reals = roles.real_columns(roles.known)
        known = np.empty((len(index), len(known_reals) + len(CALENDAR_INPUTS)), dtype=np.float32)
        _scale_columns(self.path, self.table, known_reals, kept, fit, reals, known)
        known[:, len(known_reals) :] = _calendar(time_ns)

        unknown_rows: dict[str, int] = {}
        time_varying = [
            *roles.categorical_columns(roles.observed or []),
            *roles.categorical_columns(roles.known),
        ]
        static = roles.static or []
        coded = {
            name: self._codes(name, categories, unknown_rows) for name in [*time_varying, *static]
        }
        normalizer = normalizer or Normalizer(
            roles=roles,
            symbols=self.symbols,
            target=target_scale,
            reals=reals,
            categories=categories,
        )
        rows = Rows(
            observed=observed,
            known=known,
            categorical=_stack_codes([coded[name] for name in time_varying], len(index)),
            num_known_categorical=len(roles.categorical_columns(roles.known)),
            static=_stack_codes([coded[name] for name in static], len(index)),
            target=observed[:, 0].copy(),
            time_ns=time_ns,
            symbol_index=index,
        )
        return rows, normalizer, unknown_rows

    def _codes(
        self, name: str, categories: dict[str, list[str]], unknown_rows: dict[str, int]
    ) -> np.ndarray:
        text = category_text(self.table, name).take(pa.array(self.file_rows))
        if name not in categories:
            training = text.take(pa.array(np.flatnonzero(self.train_rows)))
            categories[name] = fit_categories(self.path, name, training)
        codes, unknown_rows[name] = encode_categories(text, categories[name])
        return codes


def _stack_codes(columns: list[np.ndarray], num_rows: int) -> np.ndarray:
    if not columns:
        return np.zeros((num_rows, 0), dtype=np.int64)
    return np.stack(columns, axis=1)
