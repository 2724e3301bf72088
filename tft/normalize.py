"""Normalisation of the window inputs: the target transform and per-column statistics.

The target becomes log returns, differences or stays a level (``ColumnRoles.target_transform``);
each observed and known column, and the transformed target, is then normalised by its mean and
population standard deviation (1.0 for a constant column), fitted on the training rows or taken
from a saved :class:`Normalizer`. See NOTE [Rows, windows and splits] in :mod:`tft.data`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import torch
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from autockpt.errors import DataError
from tft.columns import ColumnRoles, _check_finite, _error, _float_column

__all__ = ["Normalizer"]

_ArrayOrTensor = TypeVar("_ArrayOrTensor", np.ndarray, torch.Tensor)


class Normalizer(BaseModel):
    """Per-column mean and standard deviation, and the roles and symbols they were fitted for.

    ``roles`` is fully resolved (``observed`` listed, ``symbol`` filled in when the file had a
    symbol column), so that passing this normalizer to :func:`tft.data.load_windows` for another
    file reads the same columns and gives each symbol the same index.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    roles: ColumnRoles
    symbols: list[str]
    target_mean: float
    target_std: float
    observed_mean: list[float]
    observed_std: list[float]
    known_mean: list[float]
    known_std: list[float]

    @model_validator(mode="after")
    def _check_lengths(self) -> Normalizer:
        for role, names, means, stds in (
            ("observed", self.roles.observed or [], self.observed_mean, self.observed_std),
            ("known", self.roles.known, self.known_mean, self.known_std),
        ):
            if not len(names) == len(means) == len(stds):
                raise ValueError(f"{role} statistics need {len(names)} values each")
        stds = [self.target_std, *self.observed_std, *self.known_std]
        if not all(math.isfinite(std) and std > 0 for std in stds):
            raise ValueError("standard deviations must be finite and > 0")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (strings, floats, lists); :meth:`from_dict` reads it back."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Normalizer:
        """Rebuild a normalizer from :meth:`to_dict` output.

        Raises:
            DataError: the dict is not a saved normalizer.
        """
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the dict"
            raise DataError(
                f"normalizer dict is not valid at {where}: {first['msg']}; "
                "pass the dict written by Normalizer.to_dict()"
            ) from None

    def denormalize_target(self, values: _ArrayOrTensor) -> _ArrayOrTensor:
        """Normalised target values (array or tensor) -> target-transform units."""
        return values * self.target_std + self.target_mean


def _transform_target(
    path: Path,
    name: str,
    transform: str,
    values: np.ndarray,
    first_of_symbol: np.ndarray,
    file_rows: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(transformed target for the kept rows, kept-row mask)."""
    _check_finite(path, name, values, file_rows)
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


def _mean_std(values: np.ndarray) -> tuple[float, float]:
    mean = float(values.mean())
    std = float(values.std())
    return mean, std if std > 0 and math.isfinite(std) else 1.0


def _normalise_columns(
    path: Path,
    table: pa.Table,
    names: list[str],
    file_rows: np.ndarray,
    train_rows: np.ndarray,
    stats: tuple[list[float], list[float]] | None,
    out: np.ndarray,
) -> tuple[list[float], list[float]]:
    """Write the normalised columns into ``out`` (N, len(names)); return (means, stds).

    The statistics are fitted on ``train_rows`` unless ``stats`` gives them.
    """
    means: list[float] = []
    stds: list[float] = []
    for j, name in enumerate(names):
        values = _float_column(table, name)[file_rows]
        _check_finite(path, name, values, file_rows)
        mean, std = _mean_std(values[train_rows]) if stats is None else (stats[0][j], stats[1][j])
        means.append(mean)
        stds.append(std)
        out[:, j] = (values - mean) / std
    return means, stds
