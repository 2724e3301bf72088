"""The feature columns of the synthetic bars: causal, per symbol, never NaN.

Each feature is computed from the current and past bars of one symbol: log returns at lags,
rolling volatility, high-low range, close location, volume z-scores, momentum and the gap to a
moving average, over the windows below. Warm-up rows, where a window is not yet full, hold 0.0
(NOTE in :mod:`tft.synthetic.bars`'s docstring, "Features").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["feature_names", "features"]

_WINDOWS: tuple[int, ...] = (
    *(3, 5, 8, 10, 13, 15, 20, 25, 30, 40, 45, 50, 60, 75, 90, 100),
    *(120, 150, 180, 200, 240, 300, 360, 420, 480, 600, 720, 900, 1080, 1380, 2070, 2760),
)


def _rolling_sum(values: np.ndarray, window: int) -> np.ndarray:
    """Sum over the last ``window`` values (current included); NaN unless all are numbers."""
    missing = np.isnan(values)
    cumulative = np.concatenate([[0.0], np.cumsum(np.where(missing, 0.0, values))])
    cumulative_missing = np.concatenate([[0], np.cumsum(missing)])
    result = np.full(len(values), np.nan)
    if window <= len(values):
        sums = cumulative[window:] - cumulative[:-window]
        complete = cumulative_missing[window:] == cumulative_missing[:-window]
        result[window - 1 :] = np.where(complete, sums, np.nan)
    return result


def _rolling_mean_std(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    # Shifting by the first value keeps the running sums small, so the variance does not lose
    # digits; the first value is known at every bar, so nothing from the future leaks in.
    origin = float(np.nan_to_num(values[0]))
    shifted = values - origin
    mean = _rolling_sum(shifted, window) / window
    square = _rolling_sum(shifted * shifted, window) / window
    std = np.sqrt(np.maximum(square - mean * mean, 0.0))
    return mean + origin, std


def _lagged(values: np.ndarray, lag: int) -> np.ndarray:
    result = np.full(len(values), np.nan)
    if lag < len(values):
        result[lag:] = values[: len(values) - lag]
    return result


def _safe_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), 0)


_Feature = tuple[str, Callable[[dict[str, np.ndarray]], np.ndarray]]


def _window_features(window: int) -> list[_Feature]:
    def volatility(b: dict[str, np.ndarray]) -> np.ndarray:
        return _rolling_mean_std(b["log_return"], window)[1]

    def price_range(b: dict[str, np.ndarray]) -> np.ndarray:
        return _rolling_sum(b["log_range"], window) / window

    def close_location(b: dict[str, np.ndarray]) -> np.ndarray:
        return _rolling_sum(b["close_location"], window) / window

    def volume_z(b: dict[str, np.ndarray]) -> np.ndarray:
        mean, std = _rolling_mean_std(b["volume"], window)
        return _safe_ratio(b["volume"] - mean, std)

    def momentum(b: dict[str, np.ndarray]) -> np.ndarray:
        return b["log_close"] - _lagged(b["log_close"], window)

    def ma_gap(b: dict[str, np.ndarray]) -> np.ndarray:
        return b["log_close"] - np.log(_rolling_mean_std(b["close"], window)[0])

    return [
        (f"volatility_{window}", volatility),
        (f"range_{window}", price_range),
        (f"close_location_{window}", close_location),
        (f"volume_z_{window}", volume_z),
        (f"momentum_{window}", momentum),
        (f"ma_gap_{window}", ma_gap),
    ]


def _lag_feature(lag: int) -> _Feature:
    def lagged_return(b: dict[str, np.ndarray]) -> np.ndarray:
        return _lagged(b["log_return"], lag)

    return (f"log_return_lag{lag}", lagged_return)


def _catalogue(num_features: int) -> list[_Feature]:
    features: list[_Feature] = []
    for i, window in enumerate(_WINDOWS):
        features.append(_lag_feature(i))
        features.extend(_window_features(window))
    lag = len(_WINDOWS)
    while len(features) < num_features:
        features.append(_lag_feature(lag))
        lag += 1
    return features[:num_features]


def feature_names(num_features: int) -> list[str]:
    """Names of the first ``num_features`` feature columns, in table order.

    Example:
        >>> feature_names(3)
        ['log_return_lag0', 'volatility_3', 'range_3']
    """
    return [name for name, _ in _catalogue(num_features)]


def features(bars: dict[str, np.ndarray], num_features: int) -> dict[str, np.ndarray]:
    close = bars["close"]
    high, low = bars["high"], bars["low"]
    log_close = np.log(close)
    log_return = np.concatenate([[np.nan], np.diff(log_close)])
    inputs = {
        "close": close,
        "log_close": log_close,
        "log_return": log_return,
        "log_range": np.log(high / low),
        "close_location": _safe_ratio(2.0 * close - high - low, high - low),
        "volume": bars["volume"].astype(np.float64),
    }
    columns = {}
    for name, compute in _catalogue(num_features):
        values = compute(inputs)
        columns[name] = np.nan_to_num(values, nan=0.0).astype(np.float32)
    return columns


# ---------------------------------------------------------------------------- public API
