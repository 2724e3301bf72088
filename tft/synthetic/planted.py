"""The predictable part of the synthetic bars: an order-flow column that leads the returns.

NOTE [Planted order flow]
Volatility that follows the clock is all a forecaster could learn from returns that are pure
GARCH noise: their mean is zero, so a validation loss says nothing about whether a model found
anything. The generator therefore plants one documented, realistic source of skill in the
returns' *mean*, the way order-flow imbalance moves intraday prices:

- each symbol has a latent order flow ``z``, a unit-variance AR(1) series with persistence
  :data:`FLOW_PERSISTENCE` per bar (buying pressure comes in runs);
- the file carries what a trader sees of it, ``order_flow = tanh(FLOW_SQUASH * z)``: a signed
  volume imbalance in (-1, 1), computed from the bar itself, so it is an ordinary observed
  column;
- the bar's log return is ``sigma * (FLOW_IMPACT * z[t-1] + sqrt(1 - FLOW_IMPACT**2) * shock)``:
  the price follows the flow one bar later, with the same variance as before (``shock`` is the
  GARCH-scaled Student-t shock of the module :mod:`tft.synthetic.bars`).

So at a forecast made after bar ``t``, the return ``h`` bars ahead has mean
``FLOW_IMPACT * FLOW_PERSISTENCE**(h-1) * sigma[t+h] * z[t]``: a correlation of 0.45 with the
latent flow at the first step, four fifths of that one step further, and so on (the observed,
squashed and tick-rounded column correlates about 0.4 with the next bar's return). That is far
stronger than real order flow (a few percent of a minute's variance), so that a small model
finds it in a few hundred steps. Past returns carry a little of it, since the flow moved them
(consecutive returns correlate about 0.16); the volume and the other symbols carry none.

:func:`oracle_quantiles` is the best forecast of that structure: it knows the generator's own
volatility of every bar and the latent flow, and forecasts each step's planted mean plus the
quantiles of what is left. No model can do better on average; the README gives its skill over
the naive forecasts on the bundled sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "FLOW_IMPACT",
    "FLOW_PERSISTENCE",
    "FLOW_SQUASH",
    "PlantedTruth",
    "latent_flow",
    "oracle_quantiles",
    "returns_with_flow",
]

FLOW_PERSISTENCE = 0.8
"""AR(1) coefficient of the latent order flow, per bar."""
FLOW_IMPACT = 0.45
"""Correlation of a bar's return with the latent flow of the bar before."""
FLOW_SQUASH = 0.8
"""How sharply the observed imbalance saturates: ``order_flow = tanh(FLOW_SQUASH * z)``."""


def latent_flow(innovations: np.ndarray) -> np.ndarray:
    """The unit-variance AR(1) flow driven by standard normal ``innovations``."""
    # Sequential like the GARCH recurrence; a plain-float loop is fast enough for 250 k bars.
    keep = FLOW_PERSISTENCE
    fresh = math.sqrt(1.0 - keep * keep)
    flow = np.empty(len(innovations))
    z = 0.0
    for t, e in enumerate(innovations.tolist()):
        z = keep * z + fresh * e if t else e
        flow[t] = z
    return flow


def returns_with_flow(sigma: np.ndarray, shocks: np.ndarray, flow: np.ndarray) -> np.ndarray:
    """Log returns whose mean follows the previous bar's flow (NOTE [Planted order flow])."""
    previous = np.concatenate([[0.0], flow[:-1]])
    return sigma * (FLOW_IMPACT * previous + math.sqrt(1.0 - FLOW_IMPACT**2) * shocks)


def observed_flow(flow: np.ndarray) -> np.ndarray:
    """The ``order_flow`` column a trader sees: a signed imbalance in (-1, 1)."""
    return np.tanh(FLOW_SQUASH * flow).astype(np.float32)


@dataclass(frozen=True)
class PlantedTruth:
    """What the generator knows of every bar and a forecaster does not see, in the table's row
    order (by symbol, then time)."""

    volatility: np.ndarray
    """(N,) each bar's standard deviation of log return (GARCH and the intraday profile)."""
    flow: np.ndarray
    """(N,) the latent order flow ``z``."""

    def planted_mean(self, origin: np.ndarray, steps: int) -> np.ndarray:
        """(B, steps) the mean log return of the ``steps`` bars after each row of ``origin``,
        given the flow at the origin."""
        ahead = origin[:, None] + np.arange(1, steps + 1)[None, :]
        decay = FLOW_PERSISTENCE ** np.arange(steps)[None, :]
        return FLOW_IMPACT * decay * self.volatility[ahead] * self.flow[origin][:, None]


def oracle_quantiles(
    truth: PlantedTruth,
    log_returns: np.ndarray,
    fit_origins: np.ndarray,
    origins: np.ndarray,
    steps: int,
    levels: np.ndarray,
) -> np.ndarray:
    """The oracle's forecast of the log returns after each of ``origins``: ``(B, steps, Q)``.

    Each step's forecast is the planted mean plus the bar's true volatility times the
    quantiles of the standardised residual, fitted on the returns after ``fit_origins`` (the
    training windows; rows index ``log_returns`` and ``truth`` alike).
    """
    ahead = fit_origins[:, None] + np.arange(1, steps + 1)[None, :]
    residual = (log_returns[ahead] - truth.planted_mean(fit_origins, steps)) / truth.volatility[
        ahead
    ]
    spread = np.quantile(residual, levels, axis=0).T  # (steps, Q)
    ahead = origins[:, None] + np.arange(1, steps + 1)[None, :]
    mean = truth.planted_mean(origins, steps)
    return mean[:, :, None] + truth.volatility[ahead][:, :, None] * spread[None]
