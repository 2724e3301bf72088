"""Synthetic 1-minute futures bars, shaped like CME Globex equity-index futures.

What the generator reproduces, and why each piece is there:

* **Sessions.** One session per trading day (Monday to Friday, no holidays): it opens at 17:00 US
  Central the evening before and closes at 16:00 Central, so a day has 1,380 one-minute bars and a
  60-minute daily break; Monday's session opens on Sunday at 17:00, so nothing trades on Saturday
  or on Sunday before the open. Timestamps are the bar's opening minute in UTC; Central time is
  UTC-5 from the second Sunday of March to the first Sunday of November and UTC-6 otherwise (the
  US rule since 2007; every switch happens on a Sunday at 02:00, inside the weekend gap, so a
  session never straddles one).
* **Prices.** Log returns follow GARCH(1,1) variance (volatility clusters) on Student-t shocks
  (fat tails), scaled by an intraday profile that is low overnight and U-shaped over the regular
  session (08:30-15:00 Central). Symbols share a common factor (equity indices move together),
  each with its own loading. Sessions open with a gap. Every price is on the 0.25 tick, and
  ``high >= max(open, close)``, ``low <= min(open, close)``.
* **Order flow (the predictable part).** ``order_flow`` is each bar's signed volume imbalance
  in (-1, 1); it follows a persistent latent flow, and the price follows the flow one bar
  later: the only information about the returns' mean in the file (NOTE [Planted order flow]
  in :mod:`tft.synthetic.planted`, which says how strong it is and gives the oracle's forecast).
* **Volume.** A non-negative ``int64`` count whose mean follows the same U shape (busiest at the
  regular-session open and close) and rises with volatility.
* **Features.** ``num_features`` causal columns (``float32``), each computed from the current and
  past bars of its own symbol only: log returns at lags 0, 1, 2, ..., rolling volatility,
  rolling high-low range, rolling close location, volume z-scores, momentum and the gap to a
  moving average, over windows from 3 to 2,760 bars. The families are interleaved, so any prefix
  of the catalogue is a mix; beyond the catalogue further return lags are appended, so any
  ``num_features`` works. **Warm-up rows, where a window is not yet full, hold 0.0**, as do
  z-scores of a constant window, so no feature is ever NaN.

Known symbols (ES, NQ, YM, RTY) have hand-picked price levels and volatilities; any other name
gets a level and volatility derived from a checksum of the name. Each symbol draws from its own
random stream (seeded by ``seed`` and the name) plus a common-factor stream seeded by ``seed``,
so a symbol's bars are the same whichever other symbols are generated with it.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tft.errors import DataError
from tft.synthetic.features import feature_names, features
from tft.synthetic.planted import PlantedTruth, latent_flow, observed_flow, returns_with_flow

__all__ = [
    "BARS_PER_SESSION",
    "TICK_SIZE",
    "feature_names",
    "generate_bars",
    "planted_truth",
    "write_bars",
]

BARS_PER_SESSION = 1380
"""One-minute bars in one Globex session (17:00 to 16:00 Central)."""
TICK_SIZE = 0.25
"""Price increment of every generated price."""

_NS_PER_MINUTE = 60 * 1_000_000_000
_NS_PER_DAY = 1440 * _NS_PER_MINUTE
_OPEN_MINUTE_CENTRAL = 17 * 60
_RTH_OPEN = 15 * 60 + 30  # 08:30 Central, in minutes after the 17:00 session open
_RTH_CLOSE = 22 * 60  # 15:00 Central
_GARCH_ALPHA = 0.05
_GARCH_BETA = 0.94
_T_DOF = 6.0


@dataclass(frozen=True)
class _SymbolSpec:
    price: float  # starting price level
    daily_vol: float  # unconditional standard deviation of one session's log return
    volume: float  # mean volume of one bar over a session
    loading: float  # correlation of the symbol's shocks with the common factor


_KNOWN_SYMBOLS = {
    "ES": _SymbolSpec(price=4750.0, daily_vol=0.010, volume=1500.0, loading=0.9),
    "NQ": _SymbolSpec(price=16800.0, daily_vol=0.013, volume=500.0, loading=0.85),
    "YM": _SymbolSpec(price=37500.0, daily_vol=0.009, volume=150.0, loading=0.85),
    "RTY": _SymbolSpec(price=2000.0, daily_vol=0.014, volume=200.0, loading=0.8),
}


def _spec(symbol: str) -> _SymbolSpec:
    if symbol in _KNOWN_SYMBOLS:
        return _KNOWN_SYMBOLS[symbol]
    check = zlib.crc32(symbol.encode())
    fractions = [((check >> shift) & 0xFF) / 255.0 for shift in (0, 8, 16, 24)]
    return _SymbolSpec(
        price=1000.0 + 19000.0 * fractions[0],
        daily_vol=0.008 + 0.008 * fractions[1],
        volume=100.0 + 900.0 * fractions[2],
        loading=0.5 + 0.4 * fractions[3],
    )


def _round_tick(prices: np.ndarray) -> np.ndarray:
    # Dividing by 0.25 and multiplying by it are exact in binary floating point, so the results
    # are exact multiples of the tick.
    return np.round(prices / TICK_SIZE) * TICK_SIZE


# ---------------------------------------------------------------------------- calendar


def _nth_sunday(year: int, month: int, n: int) -> dt.date:
    first = dt.date(year, month, 1)
    return first + dt.timedelta(days=(6 - first.weekday()) % 7 + 7 * (n - 1))


def _central_offset_hours(day: dt.date) -> int:
    """UTC offset of US Central time on ``day`` (after 02:00 local)."""
    dst_start = _nth_sunday(day.year, 3, 2)
    dst_end = _nth_sunday(day.year, 11, 1)
    return -5 if dst_start <= day < dst_end else -6


def _trading_days(start: dt.date, days: int) -> list[dt.date]:
    result: list[dt.date] = []
    day = start
    while len(result) < days:
        if day.weekday() < 5:
            result.append(day)
        day += dt.timedelta(days=1)
    return result


def _session_timestamps(trading_days: list[dt.date]) -> tuple[np.ndarray, np.ndarray]:
    """Bar timestamps (int64 ns, UTC) and, per session, the calendar days since the last one."""
    epoch = dt.date(1970, 1, 1)
    opens = np.empty(len(trading_days), dtype=np.int64)
    for i, day in enumerate(trading_days):
        eve_minutes = _OPEN_MINUTE_CENTRAL - 60 * _central_offset_hours(day)
        opens[i] = ((day - epoch).days - 1) * _NS_PER_DAY + eve_minutes * _NS_PER_MINUTE
    minutes = np.arange(BARS_PER_SESSION, dtype=np.int64) * _NS_PER_MINUTE
    timestamps = (opens[:, None] + minutes[None, :]).reshape(-1)
    gaps = np.diff([trading_days[0].toordinal() - 1] + [d.toordinal() for d in trading_days])
    return timestamps, gaps


def _intraday_profiles() -> tuple[np.ndarray, np.ndarray]:
    """(volume profile, volatility multiplier), one value per minute of the session, mean 1."""
    minute = np.arange(BARS_PER_SESSION, dtype=np.float64)
    profile = 0.12 + 0.25 * np.exp(-minute / 20.0)  # Globex open
    profile += 0.20 * np.exp(-0.5 * ((minute - 540.0) / 60.0) ** 2)  # European open, 02:00 CT
    in_rth = (minute >= _RTH_OPEN) & (minute < _RTH_CLOSE)
    x = (minute - _RTH_OPEN) / (_RTH_CLOSE - _RTH_OPEN)
    rth = 0.5 + 0.4 * (2.0 * x - 1.0) ** 2 + 2.0 * np.exp(-x / 0.05) + 1.2 * np.exp(-(1 - x) / 0.06)
    profile = np.where(in_rth, profile + rth, profile)
    after = minute >= _RTH_CLOSE
    profile = np.where(after, profile + 0.6 * np.exp(-(minute - _RTH_CLOSE) / 10.0), profile)
    profile /= profile.mean()
    volatility = np.sqrt(profile)
    return profile, volatility / np.sqrt(np.mean(volatility**2))


# ---------------------------------------------------------------------------- prices


def _student_t(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.standard_t(_T_DOF, size) / np.sqrt(_T_DOF / (_T_DOF - 2.0))


def _garch_variance(shocks: np.ndarray, unconditional: float) -> np.ndarray:
    """h[t] = omega + alpha * h[t-1] * z[t-1]**2 + beta * h[t-1], started at the mean."""
    # The recurrence is sequential. A plain-float loop takes a few hundredths of a second for
    # 180 days (250 k bars); a closed form through cumulative products under/overflows.
    omega = unconditional * (1.0 - _GARCH_ALPHA - _GARCH_BETA)
    variance = np.empty(len(shocks))
    h = unconditional
    for t, z in enumerate(shocks.tolist()):
        variance[t] = h
        h = omega + h * (_GARCH_ALPHA * z * z + _GARCH_BETA)
    return variance


def _bars(
    spec: _SymbolSpec,
    factor: np.ndarray,
    rng: np.random.Generator,
    flow_rng: np.random.Generator,
    gaps_days: np.ndarray,
) -> tuple[dict[str, np.ndarray], PlantedTruth]:
    num_bars = len(factor)
    volume_profile, vol_profile = _intraday_profiles()
    num_sessions = num_bars // BARS_PER_SESSION
    volume_profile = np.tile(volume_profile, num_sessions)
    vol_profile = np.tile(vol_profile, num_sessions)

    loading = spec.loading
    shocks = loading * factor + np.sqrt(1.0 - loading**2) * _student_t(rng, num_bars)
    unconditional = spec.daily_vol**2 / BARS_PER_SESSION
    variance = _garch_variance(shocks, unconditional)
    sigma = np.sqrt(variance) * vol_profile
    flow = latent_flow(flow_rng.standard_normal(num_bars))
    returns = returns_with_flow(sigma, shocks, flow)

    # Sessions open with a gap: as wide as 25 bars' moves after the daily break, twice that after
    # a weekend.
    session_start = np.zeros(num_bars, dtype=bool)
    session_start[::BARS_PER_SESSION] = True
    gap_scale = np.where(gaps_days > 1, 10.0, 5.0)
    gaps = np.zeros(num_bars)
    gaps[session_start] = (
        np.sqrt(variance[session_start]) * gap_scale * _student_t(rng, num_sessions)
    )

    log_start = np.log(spec.price) + 0.02 * rng.standard_normal()
    log_close = log_start + np.cumsum(returns + gaps)
    log_previous = np.concatenate([[log_start], log_close[:-1]])
    close = _round_tick(np.exp(log_close))
    open_ = _round_tick(np.exp(log_previous + gaps))
    reach = np.abs(rng.standard_normal((2, num_bars))) * 0.6 * sigma * close
    high = np.maximum(open_, close) + _round_tick(reach[0])
    low = np.minimum(open_, close) - _round_tick(reach[1])

    activity = (0.5 + 0.5 * np.sqrt(variance / unconditional)) * (0.7 + 0.3 * np.abs(shocks))
    mean_volume = spec.volume * volume_profile * activity * rng.gamma(4.0, 0.25, num_bars)
    volume = rng.poisson(mean_volume).astype(np.int64)
    bars = {"open": open_, "high": high, "low": low, "close": close, "volume": volume}
    bars["order_flow"] = observed_flow(flow)
    return bars, PlantedTruth(volatility=sigma, flow=flow)


# ---------------------------------------------------------------------------- generating and writing


def _check_arguments(days: int, num_features: int, symbols: Sequence[str], seed: int) -> None:
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise DataError(f"days={days!r} is not a positive whole number; pass days >= 1")
    if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 0:
        raise DataError(
            f"num_features={num_features!r} is not a whole number >= 0; pass 0 or more features"
        )
    if isinstance(symbols, str):
        raise DataError(
            f"symbols={symbols!r} is one string; pass a list of names such as ['ES', 'NQ']"
        )
    if len(symbols) == 0:
        raise DataError("symbols is empty; pass at least one symbol name, e.g. ['ES']")
    for symbol in symbols:
        if not isinstance(symbol, str) or not symbol.strip():
            raise DataError(f"symbol {symbol!r} is not a name; pass non-empty strings like 'ES'")
    if len(set(symbols)) != len(symbols):
        raise DataError(f"symbols {list(symbols)!r} repeat a name; list each symbol once")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DataError(f"seed={seed!r} is not a whole number >= 0; pass a seed such as 0")


def _parse_start(start: str) -> dt.date:
    try:
        return dt.date.fromisoformat(start)
    except (TypeError, ValueError):
        raise DataError(
            f"start={start!r} is not an ISO date; pass a date like '2024-01-02'"
        ) from None


def generate_bars(
    *,
    days: int,
    num_features: int,
    symbols: Sequence[str] = ("ES",),
    seed: int = 0,
    start: str = "2024-01-02",
) -> pa.Table:
    """Generate one-minute bars with engineered features (see the module docstring).

    Args:
        days: trading days (sessions) per symbol; weekends are skipped, so 5 days span a week.
        num_features: feature columns after the bar columns (0 for bars only).
        symbols: symbol names; each gets ``days * 1380`` rows.
        seed: random seed (>= 0); the same arguments always give the same table.
        start: first trading day, an ISO date; a weekend date starts on the next Monday.

    Returns:
        A table with columns ``timestamp`` (timestamp[ns, tz=UTC], bar open), ``symbol``
        (string), ``open``, ``high``, ``low``, ``close`` (float64), ``volume`` (int64) and then
        the features (float32, names from :func:`feature_names`), sorted by symbol then time.

    Raises:
        DataError: days < 1, num_features < 0, no or repeated symbols, a negative seed or a
            start that is not a date.

    Example:
        >>> table = generate_bars(days=2, num_features=8, symbols=["ES", "NQ"], seed=1)
        >>> table.num_rows
        5520
    """
    table, _ = _generate(days, num_features, symbols, seed, start)
    return table


def planted_truth(
    *,
    days: int,
    symbols: Sequence[str] = ("ES",),
    seed: int = 0,
    start: str = "2024-01-02",
) -> PlantedTruth:
    """What :func:`generate_bars` with these arguments planted and the table does not show:
    each bar's volatility and latent order flow, in the table's row order (NOTE [Planted order
    flow] in :mod:`tft.synthetic.planted`); the features play no part, so any ``num_features`` matches."""
    _, truths = _generate(days, 0, symbols, seed, start)
    return PlantedTruth(
        volatility=np.concatenate([t.volatility for t in truths]),
        flow=np.concatenate([t.flow for t in truths]),
    )


def _generate(
    days: int, num_features: int, symbols: Sequence[str], seed: int, start: str
) -> tuple[pa.Table, list[PlantedTruth]]:
    _check_arguments(days, num_features, symbols, seed)
    trading_days = _trading_days(_parse_start(start), days)
    timestamps, gaps_days = _session_timestamps(trading_days)
    num_bars = len(timestamps)
    factor = _student_t(np.random.default_rng([seed, 0]), num_bars)

    pieces, truths = [], []
    for symbol in sorted(symbols):
        check = zlib.crc32(symbol.encode())
        rng = np.random.default_rng([seed, 1, check])
        flow_rng = np.random.default_rng([seed, 2, check])
        bars, truth = _bars(_spec(symbol), factor, rng, flow_rng, gaps_days)
        truths.append(truth)
        columns: dict[str, pa.Array] = {
            "timestamp": pa.array(timestamps, type=pa.timestamp("ns", tz="UTC")),
            "symbol": pa.array([symbol] * num_bars, type=pa.string()),
        }
        columns.update({name: pa.array(values) for name, values in bars.items()})
        columns.update(
            {name: pa.array(values) for name, values in features(bars, num_features).items()}
        )
        pieces.append(pa.table(columns))
    return pa.concat_tables(pieces), truths


def _column_encodings(schema: pa.Schema) -> dict[str, str]:
    # Minute timestamps are near-constant steps, which delta encoding stores in a few bits; float
    # bytes split into streams (exponents apart from mantissas) let zstd find the repetition.
    # Together they make the files about a third smaller than the default encodings.
    encodings = {"timestamp": "DELTA_BINARY_PACKED"}
    for field in schema:
        if pa.types.is_floating(field.type):
            encodings[field.name] = "BYTE_STREAM_SPLIT"
    return encodings


def write_bars(
    path: str | os.PathLike[str],
    *,
    days: int,
    num_features: int,
    symbols: Sequence[str] = ("ES",),
    seed: int = 0,
    start: str = "2024-01-02",
) -> Path:
    """Generate bars (see :func:`generate_bars`) and write them to a zstd-compressed Parquet file.

    The file is written to a temporary name in the same folder and then renamed, so a reader never
    sees half a file; missing parent folders are created.

    Args:
        path: the Parquet file to write (replaced if it exists).
        days, num_features, symbols, seed, start: as in :func:`generate_bars`.

    Returns:
        The path written.

    Raises:
        DataError: bad generator arguments, or ``path`` is an existing folder.
    """
    target = Path(path)
    if target.is_dir():
        raise DataError(f"{target} is a folder; pass a file path such as {target / 'bars.parquet'}")
    table = generate_bars(
        days=days, num_features=num_features, symbols=symbols, seed=seed, start=start
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    # A fresh name (not mkstemp, whose file would keep mode 0600) so the file gets the usual
    # permissions.
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        pq.write_table(
            table,
            temporary,
            compression="zstd",
            use_dictionary=["symbol"],
            column_encoding=_column_encodings(table.schema),
        )
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target
