"""Naive forecasts scored beside the model, and the model's skill over them.

NOTE [Naive forecasts]
A validation loss alone says nothing about whether the model learned anything: intraday returns
are mostly noise, and a pinball loss of 0.17 may be what a forecast that knows nothing gets. So
every validation scores two naive forecasts on the same windows, with the same metrics:

- *no change*: every quantile at the target's "nothing happens": a return or difference of 0,
  or, for a level target (``target_transform="none"``), the last value of the encoder window
  (persistence);
- *quantiles*: each symbol's unconditional quantiles of the target, per horizon step, from the
  training windows' targets (the quantiles the model is asked for, of what it is asked to
  forecast; a symbol without training windows takes every symbol's).

The model's *skill* is ``1 - model / naive`` on the pinball loss, against the better of the two
(the lower loss), overall and per horizon step: 0 is no better than knowing nothing, 1 is
perfect, below 0 worse than the naive forecast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tft.data.windows import Batch, WindowedData

#: Training windows the quantiles are fitted on at most (a deterministic, even subsample).
MAX_FITTED_WINDOWS = 200_000

NAIVE_NAMES = ("no_change", "quantiles")
"""The naive forecasts, in the order they are reported."""


@dataclass(frozen=True)
class NaiveForecasts:
    """The naive forecasts of one file's windows (NOTE [Naive forecasts]), in normalised
    target units, as ``(B, H, Q)`` predictions for any batch."""

    no_change: torch.Tensor
    """(S,) each symbol's normalised "no change" (returns and differences)."""
    quantiles: torch.Tensor
    """(S, H, Q) each symbol's unconditional quantiles per horizon step."""
    persistence: bool
    """A level target: "no change" is the encoder window's last value (observed input 0, the
    target's history, scaled like the target)."""

    @classmethod
    def fit(cls, data: WindowedData, quantile_levels: list[float]) -> NaiveForecasts:
        """Fit on ``data``'s training windows."""
        normalizer = data.normalizer
        mean = np.asarray(normalizer.target.mean, dtype=np.float64)
        std = np.asarray(normalizer.target.std, dtype=np.float64)
        levels = np.asarray(quantile_levels, dtype=np.float64)
        num_windows = len(data.train)
        keep = None
        if num_windows > MAX_FITTED_WINDOWS:
            # Only the kept windows are gathered: a streamed file's training windows may not
            # fit in memory as (N, H) targets.
            keep = np.linspace(0, num_windows - 1, MAX_FITTED_WINDOWS).astype(np.int64)
        targets, symbols = data.train.targets(keep)
        everyone = (
            np.quantile(targets, levels, axis=0).T  # (H, Q)
            if len(targets)
            else np.zeros((data.horizon, len(levels)))
        )
        by_symbol = np.stack(
            [
                np.quantile(targets[symbols == s], levels, axis=0).T
                if np.any(symbols == s)
                else everyone
                for s in range(len(data.symbols))
            ]
        )
        return cls(
            no_change=torch.tensor((0.0 - mean) / std, dtype=torch.float32),
            quantiles=torch.tensor(by_symbol, dtype=torch.float32),
            persistence=normalizer.roles.target_transform == "none",
        )

    def to_dict(self) -> dict[str, Any]:
        """The forecasts as the run folder keeps them (``naive.json``), for ``predict``."""
        return {
            "no_change": self.no_change.tolist(),
            "quantiles": self.quantiles.tolist(),
            "persistence": self.persistence,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NaiveForecasts:
        return cls(
            no_change=torch.tensor(data["no_change"], dtype=torch.float32),
            quantiles=torch.tensor(data["quantiles"], dtype=torch.float32),
            persistence=bool(data["persistence"]),
        )

    def predictions(self, batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
        """Each naive forecast of ``batch`` as a ``(B, H, Q)`` prediction, by name."""
        symbol = batch.symbol_index.to(device)
        quantiles = self.quantiles.to(device)[symbol]  # (B, H, Q)
        if self.persistence:
            value = batch.encoder_observed[:, -1, 0].to(device)[:, None, None]  # (B, 1, 1)
        else:
            value = self.no_change.to(device)[symbol][:, None, None]
        return {"no_change": value.expand_as(quantiles), "quantiles": quantiles}


def skill(model_loss: float, naive_losses: dict[str, float]) -> float | None:
    """``1 - model / naive`` over the naive forecast with the lower loss (None when it is 0)."""
    best = min(naive_losses.values())
    return 1.0 - model_loss / best if best > 0 else None
