"""The second pass over a streamed file: the scales and categories of its training rows, the
statistics :func:`tft.data.windows.load_windows` fits on the rows it holds.

NOTE [Streaming statistics]
The in-memory path fits a mean per symbol, then the spread about it (two passes over the
values it holds). Streaming keeps, per symbol and column, the count and the sums of
``x - s`` and ``(x - s)**2`` about a shift ``s``, the symbol's first training value; the
variance is ``E[(x-s)^2] - E[x-s]^2``. With the shift near the values, a price near 2400 with
moves of 0.1 keeps its variance (the cancellation the unshifted ``E[x^2] - E[x]^2`` suffers is
that of the spread around the first price, not around zero). The sums are in float64 and
grouped differently from the in-memory ones, so scales agree to about 1e-12 relative; the
float32 inputs are then equal but for a rare last bit (``tests/tft/test_streamed_windows.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tft.data.categories import category_text, fit_categories
from tft.data.columns import _check_finite
from tft.data.normalize import Scale
from tft.data.sources.data_source import DataSource
from tft.data.streamed.build_progress import BuildProgress, build_pass
from tft.data.streamed.file_scan import FileLayout, RowWalker, read_chunks
from tft.data.warmup import RunningWarmup, real_inputs

__all__ = ["FittedStatistics", "fit_statistics"]


@dataclass
class _Moments:
    """Shifted sums of one column's training values, per symbol and over all symbols."""

    num_symbols: int
    count: np.ndarray = field(init=False)
    shift: np.ndarray = field(init=False)
    sum1: np.ndarray = field(init=False)
    sum2: np.ndarray = field(init=False)
    overall: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # n, sum1, sum2
    overall_shift: float | None = None

    def __post_init__(self) -> None:
        self.count = np.zeros(self.num_symbols, dtype=np.int64)
        self.shift = np.full(self.num_symbols, math.nan)
        self.sum1 = np.zeros(self.num_symbols)
        self.sum2 = np.zeros(self.num_symbols)

    def add(self, values: np.ndarray, index: np.ndarray) -> None:
        if len(values) == 0:
            return
        new = np.isnan(self.shift)
        codes, first = np.unique(index, return_index=True)
        fresh = new[codes]
        self.shift[codes[fresh]] = values[first[fresh]]
        deviations = values - self.shift[index]
        size = self.num_symbols
        self.count += np.bincount(index, minlength=size)
        self.sum1 += np.bincount(index, weights=deviations, minlength=size)
        self.sum2 += np.bincount(index, weights=deviations * deviations, minlength=size)
        if self.overall_shift is None:
            self.overall_shift = float(values[0])
        overall = values - self.overall_shift
        self.overall[0] += len(values)
        self.overall[1] += float(overall.sum())
        self.overall[2] += float((overall * overall).sum())

    def scale(self, *, per_symbol: bool) -> Scale:
        """The scale ``fit_scale`` gives (NOTE [Streaming statistics])."""
        n, s1, s2 = self.overall
        overall_mean = (self.overall_shift or 0.0) + s1 / max(n, 1)
        overall_std = math.sqrt(max(s2 / max(n, 1) - (s1 / max(n, 1)) ** 2, 0.0))
        if not (overall_std > 0 and math.isfinite(overall_std)):
            overall_std = 1.0
        if not per_symbol:
            return Scale(
                mean=[overall_mean] * self.num_symbols, std=[overall_std] * self.num_symbols
            )
        seen = self.count > 0
        counts = np.maximum(self.count, 1)
        centre = self.sum1 / counts
        means = np.where(seen, np.nan_to_num(self.shift) + centre, overall_mean)
        stds = np.sqrt(np.maximum(self.sum2 / counts - centre * centre, 0.0))
        stds = np.where(
            seen & (stds > 0) & np.isfinite(stds), stds, np.where(seen, 1.0, overall_std)
        )
        return Scale(mean=means.tolist(), std=stds.tolist())


@dataclass(frozen=True)
class FittedStatistics:
    """The target's and each real column's scale, and each categorical column's categories."""

    target: Scale
    reals: dict[str, Scale]
    categories: dict[str, list[str]]


def fit_statistics(
    path: DataSource,
    layout: FileLayout,
    cuts: tuple[int, int],
    chunk_rows: int,
    progress: BuildProgress | None = None,
) -> FittedStatistics:
    """The second pass: scales and categories of the training rows (times before ``cuts[0]``)."""
    roles, symbols = layout.roles, layout.symbols
    reals = roles.real_columns([*(roles.observed or []), *roles.known])
    categorical = [
        *roles.categorical_columns(roles.observed or []),
        *roles.categorical_columns(roles.known),
        *(roles.static or []),
    ]
    walker = RowWalker(path, roles, roles.symbol, symbols, RunningWarmup(real_inputs(roles)))
    target = _Moments(len(symbols))
    moments = {name: _Moments(len(symbols)) for name in reals}
    seen: dict[str, set[str]] = {name: set() for name in categorical}
    columns = list(dict.fromkeys([*walker.columns(), *reals, *categorical]))
    read = build_pass(progress, 2, "the training rows' scales")
    for chunk in read_chunks(layout.order, columns, chunk_rows, read):
        table = chunk.table
        rows = walker.rows(chunk)
        training = rows.time_ns < cuts[0]
        index = rows.symbol_index[training]
        target.add(rows.target[training], index)
        for name in reals:
            values = rows.take(table, name)
            _check_finite(chunk.file, name, values, rows.file_rows, whole=False)
            moments[name].add(values[training], index)
        if categorical and training.any():
            picked = pa.array(rows.local[training])
            for name in categorical:
                text = category_text(table, name).take(picked)
                seen[name].update(v for v in pc.unique(text).to_pylist() if v is not None)
    per_symbol = roles.scaling == "per_symbol"
    return FittedStatistics(
        target=target.scale(per_symbol=per_symbol),
        reals={name: m.scale(per_symbol=per_symbol) for name, m in moments.items()},
        categories={
            name: fit_categories(path, name, pa.array(sorted(seen[name]), type=pa.string()))
            for name in categorical
        },
    )
