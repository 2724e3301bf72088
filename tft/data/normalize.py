"""Normalisation of the window inputs: the target transform, scales and categories.

The target becomes log returns, differences or stays a level (``ColumnRoles.target_transform``);
each real observed and known column, and the transformed target, is then scaled by a mean and a
population standard deviation (1.0 for a constant column), fitted on the training rows or taken
from a saved :class:`Normalizer`: each symbol's own by default (NOTE [Per-symbol scaling]), or
one over all symbols. Categorical columns keep their fitted categories here (NOTE [Categories]
in :mod:`tft.data.categories`). See NOTE [Rows, windows and splits] in :mod:`tft.data.windows`.

NOTE [Per-symbol scaling]
Two instruments at different price levels (crude oil near 80, gold near 2400) standardised
with one mean and deviation map to two narrow bands far apart: the input then says which
instrument it is and little about where the price sits in its own range. Scaled with its own
symbol's statistics, each instrument's input is centred and of unit spread, so two symbols with
the same moves at levels 30x apart give the same inputs. A symbol without training rows (it
starts after the training period) gets the statistics of all training rows.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import torch
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from tft.data.columns import ColumnRoles, _check_finite, _error, _float_column
from tft.data.sources.data_source import DataSource
from tft.errors import DataError

__all__ = ["Normalizer", "Scale"]

_ArrayOrTensor = TypeVar("_ArrayOrTensor", np.ndarray, torch.Tensor)


class Scale(BaseModel):
    """Mean and standard deviation of one column, one of each per symbol (in symbol order)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: list[float]
    std: list[float]

    def apply(self, values: np.ndarray, symbol_index: np.ndarray) -> np.ndarray:
        """``(values - mean) / std`` with each row's symbol's statistics."""
        mean, std = np.asarray(self.mean), np.asarray(self.std)
        return (values - mean[symbol_index]) / std[symbol_index]


class Normalizer(BaseModel):
    """The scales and categories of every input, and the roles and symbols they were fitted for.

    ``roles`` is fully resolved (every role listed, ``symbol`` filled in when the file had a
    symbol column), so that passing this normalizer to :func:`tft.data.windows.load_windows` for another
    file reads the same columns, gives each symbol the same index and each category the same
    code.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    roles: ColumnRoles
    symbols: list[str]
    target: Scale
    """The transformed target's scale."""
    reals: dict[str, Scale]
    """The scale of each real observed and known column."""
    categories: dict[str, list[str]]
    """The fitted categories of each categorical column (code 0 is unknown, NOTE [Categories])."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade_one_scale(cls, data: Any) -> Any:
        # Normalizers saved before per-symbol scaling hold one mean and deviation per column.
        if not isinstance(data, dict) or "target_mean" not in data:
            return data
        symbols = data.get("symbols", [])
        roles = {"scaling": "global", "static": [], **data.get("roles", {})}

        def scale(mean: Any, std: Any) -> dict[str, Any]:
            return {"mean": [mean] * len(symbols), "std": [std] * len(symbols)}

        reals = {}
        for role in ("observed", "known"):
            names = roles.get(role) or []
            means, stds = data.get(f"{role}_mean", []), data.get(f"{role}_std", [])
            reals.update({n: scale(m, s) for n, m, s in zip(names, means, stds, strict=False)})
        return {
            "roles": roles,
            "symbols": symbols,
            "target": scale(data["target_mean"], data.get("target_std")),
            "reals": reals,
            "categories": {},
        }

    @model_validator(mode="after")
    def _check_complete(self) -> Normalizer:
        roles = self.roles
        reals = roles.real_columns([*roles.known, *(roles.observed or [])])
        if sorted(self.reals) != sorted(reals):
            raise ValueError(f"reals need a scale for each of {reals}")
        if sorted(self.categories) != sorted(roles.categorical):
            raise ValueError(f"categories need a list for each of {roles.categorical}")
        for scale in [self.target, *self.reals.values()]:
            if not len(scale.mean) == len(scale.std) == len(self.symbols):
                raise ValueError(f"scales need {len(self.symbols)} values each, one per symbol")
            if not all(math.isfinite(std) and std > 0 for std in scale.std):
                raise ValueError("standard deviations must be finite and > 0")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (strings, floats, lists); :meth:`from_dict` reads it back."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Normalizer:
        """Rebuild a normalizer from :meth:`to_dict` output (or an older one-scale layout).

        Raises:
            DataError: the dict is not a saved normalizer.
        """
        try:
            return cls.model_validate(data)
        except (ValidationError, KeyError) as error:
            if isinstance(error, KeyError):
                where, message = "the dict", f"{error} is missing"
            else:
                first = error.errors()[0]
                where = ".".join(str(part) for part in first["loc"]) or "the dict"
                message = first["msg"]
            raise DataError(
                f"normalizer dict is not valid at {where}: {message}; "
                "pass the dict written by Normalizer.to_dict()"
            ) from None

    def denormalize_target(
        self, values: _ArrayOrTensor, symbol_index: np.ndarray | torch.Tensor
    ) -> _ArrayOrTensor:
        """Normalised target values -> target-transform units.

        Args:
            values: ``(B, ...)``, an array or a tensor.
            symbol_index: ``(B,)`` each row's symbol (``Batch.symbol_index``).
        """
        index = np.asarray(symbol_index, dtype=np.int64).reshape(-1)
        shape = (len(index),) + (1,) * (values.ndim - 1)
        mean = np.asarray(self.target.mean)[index].reshape(shape)
        std = np.asarray(self.target.std)[index].reshape(shape)
        if isinstance(values, torch.Tensor):
            return values * torch.from_numpy(std).to(values) + torch.from_numpy(mean).to(values)
        return values * std + mean


def _transform_target(
    path: DataSource,
    name: str,
    transform: str,
    values: np.ndarray,
    first_of_symbol: np.ndarray,
    file_rows: np.ndarray,
    *,
    whole: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(transformed target for the kept rows, kept-row mask); ``whole``: the file's rows, not
    one chunk of them."""
    _check_finite(path, name, values, file_rows, whole=whole)
    if transform == "none":
        return values, np.ones(len(values), dtype=bool)
    if transform == "log_return":
        bad = np.flatnonzero(values <= 0)
        if len(bad):
            raise _error(
                path,
                f"target column '{name}' is {values[bad[0]]} at row {file_rows[bad[0]]}; "
                "log returns need prices > 0: fix the row or use target_transform='diff'",
            )
        values = np.log(values)
    keep = ~first_of_symbol
    return (values[1:] - values[:-1])[keep[1:]], keep


def fit_scale(
    values: np.ndarray, symbol_index: np.ndarray, num_symbols: int, *, per_symbol: bool
) -> Scale:
    """The scale of ``values`` (training rows) by symbol, or one for all (NOTE [Per-symbol scaling]).

    Population standard deviation; 1.0 where it is 0 (a constant column).
    """
    overall_mean, overall_std = _mean_std(values)
    if not per_symbol:
        return Scale(mean=[overall_mean] * num_symbols, std=[overall_std] * num_symbols)
    counts = np.bincount(symbol_index, minlength=num_symbols)
    seen = counts > 0
    sums = np.bincount(symbol_index, weights=values, minlength=num_symbols)
    means = np.where(seen, sums / np.maximum(counts, 1), overall_mean)
    # Two passes: prices near 2400 with moves of 0.1 lose their variance to E[x^2] - E[x]^2.
    deviations = values - means[symbol_index]
    squares = np.bincount(symbol_index, weights=deviations * deviations, minlength=num_symbols)
    stds = np.sqrt(squares / np.maximum(counts, 1))
    stds = np.where(seen & (stds > 0) & np.isfinite(stds), stds, np.where(seen, 1.0, overall_std))
    return Scale(mean=means.tolist(), std=stds.tolist())


def _mean_std(values: np.ndarray) -> tuple[float, float]:
    mean = float(values.mean())
    std = float(values.std())
    return mean, std if std > 0 and math.isfinite(std) else 1.0


def _scale_columns(
    path: DataSource,
    table: pa.Table,
    names: list[str],
    rows: tuple[np.ndarray, np.ndarray, np.ndarray],
    fit: tuple[int, bool] | None,
    scales: dict[str, Scale],
    out: np.ndarray,
) -> None:
    """Write the scaled real columns ``names`` into ``out`` (N, len(names)).

    Args:
        rows: (file row of each kept row, its symbol index, training-row mask).
        fit: (number of symbols, per symbol) to fit each scale on the training rows into
            ``scales``; None applies the scales already there.
    """
    file_rows, symbol_index, train_rows = rows
    for j, name in enumerate(names):
        values = _float_column(table, name)[file_rows]
        _check_finite(path, name, values, file_rows)
        if fit is not None:
            scales[name] = fit_scale(
                values[train_rows], symbol_index[train_rows], fit[0], per_symbol=fit[1]
            )
        out[:, j] = scales[name].apply(values, symbol_index)
