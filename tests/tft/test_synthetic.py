"""Invariants of the synthetic bars: calendar, price and volume sanity, features, determinism."""

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tft.errors import DataError
from tft.synthetic.bars import BARS_PER_SESSION, generate_bars, planted_truth, write_bars
from tft.synthetic.features import feature_names, features
from tft.synthetic.planted import FLOW_IMPACT

BAR_COLUMNS = ["timestamp", "symbol", "open", "high", "low", "close", "volume", "order_flow"]
NUM_FEATURES = 20
# Friday 2024-03-08, then Monday 11 and Tuesday 12: a weekend and the switch to daylight saving
# time (Sunday 2024-03-10) fall inside the span.
START = "2024-03-08"


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return generate_bars(
        days=3, num_features=NUM_FEATURES, symbols=("NQ", "ES"), seed=3, start=START
    )


def _column(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy()


def _central_times(table: pa.Table) -> list[dt.datetime]:
    zoneinfo = pytest.importorskip("zoneinfo")
    try:
        central = zoneinfo.ZoneInfo("America/Chicago")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no time zone database on this machine")
    nanoseconds = table["timestamp"].cast(pa.int64()).to_numpy()
    return [
        dt.datetime.fromtimestamp(int(ns) // 10**9, tz=dt.UTC).astimezone(central)
        for ns in nanoseconds
    ]


def test_schema_and_order(table: pa.Table) -> None:
    assert table.column_names == BAR_COLUMNS + feature_names(NUM_FEATURES)
    assert table.schema.field("timestamp").type == pa.timestamp("ns", tz="UTC")
    assert table.schema.field("symbol").type == pa.string()
    for name in ["open", "high", "low", "close"]:
        assert table.schema.field(name).type == pa.float64()
    assert table.schema.field("volume").type == pa.int64()
    for name in ["order_flow", *feature_names(NUM_FEATURES)]:
        assert table.schema.field(name).type == pa.float32()
    symbols = _column(table, "symbol")
    times = _column(table, "timestamp").astype(np.int64)
    assert list(symbols[:: 3 * BARS_PER_SESSION]) == ["ES", "NQ"]
    for symbol in ["ES", "NQ"]:
        assert np.all(np.diff(times[symbols == symbol]) > 0)


def test_ohlc_consistent_and_on_tick(table: pa.Table) -> None:
    open_, high, low, close = (_column(table, name) for name in ["open", "high", "low", "close"])
    assert np.all(high >= np.maximum(open_, close))
    assert np.all(low <= np.minimum(open_, close))
    assert np.all(low > 0)
    for prices in (open_, high, low, close):
        assert np.array_equal(prices * 4, np.round(prices * 4))


def test_volume_non_negative_integers(table: pa.Table) -> None:
    volume = _column(table, "volume")
    assert volume.dtype == np.int64
    assert volume.min() >= 0


def test_sessions_in_central_time(table: pa.Table) -> None:
    central = _central_times(table.slice(0, 3 * BARS_PER_SESSION))  # ES only
    minutes = np.array([t.hour * 60 + t.minute for t in central])
    weekdays = np.array([t.weekday() for t in central])
    assert not np.any((minutes >= 16 * 60) & (minutes < 17 * 60)), "the daily break has bars"
    assert not np.any(weekdays == 5), "bars on a Saturday"
    assert not np.any((weekdays == 6) & (minutes < 17 * 60)), "bars before the Sunday open"
    session_opens = central[::BARS_PER_SESSION]
    assert [t.replace(tzinfo=None) for t in session_opens] == [
        dt.datetime(2024, 3, 7, 17, 0),
        dt.datetime(2024, 3, 10, 17, 0),
        dt.datetime(2024, 3, 11, 17, 0),
    ]
    assert minutes[BARS_PER_SESSION - 1] == 15 * 60 + 59


def test_full_days_have_1380_bars(table: pa.Table) -> None:
    times = _column(table, "timestamp").astype(np.int64)[: 3 * BARS_PER_SESSION]
    steps = np.diff(times) // (60 * 10**9)
    session_breaks = np.flatnonzero(steps != 1)
    assert list(session_breaks + 1) == [BARS_PER_SESSION, 2 * BARS_PER_SESSION]
    assert table.num_rows == 2 * 3 * BARS_PER_SESSION


def test_no_saturday_bars_in_utc(table: pa.Table) -> None:
    times = _column(table, "timestamp").astype("datetime64[D]").astype(np.int64)
    weekday = (times + 3) % 7  # Monday = 0
    assert not np.any(weekday == 5)


def test_features_finite_and_warm_up_zero(table: pa.Table) -> None:
    features = np.stack([_column(table, name) for name in feature_names(NUM_FEATURES)], axis=1)
    assert np.all(np.isfinite(features))
    assert np.all(features[0] == 0)  # no past at the very first bar
    assert np.count_nonzero(features[-1]) > NUM_FEATURES // 2


def test_features_are_causal(table: pa.Table) -> None:
    es = table.slice(0, 3 * BARS_PER_SESSION)
    bars = {name: _column(es, name) for name in ["open", "high", "low", "close", "volume"]}
    full = features(bars, NUM_FEATURES)
    cut = 1000
    prefix = features({name: values[:cut] for name, values in bars.items()}, NUM_FEATURES)
    for name, values in prefix.items():
        np.testing.assert_allclose(values, full[name][:cut], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("num_features", [0, 1, 7, 300])
def test_feature_count(num_features: int) -> None:
    table = generate_bars(days=1, num_features=num_features)
    assert table.num_columns == len(BAR_COLUMNS) + num_features
    assert len(set(table.column_names)) == table.num_columns


def test_deterministic_for_a_seed() -> None:
    first = generate_bars(days=2, num_features=5, symbols=["ES", "NQ"], seed=11)
    second = generate_bars(days=2, num_features=5, symbols=["ES", "NQ"], seed=11)
    other = generate_bars(days=2, num_features=5, symbols=["ES", "NQ"], seed=12)
    assert first.equals(second)
    assert not np.array_equal(_column(first, "close"), _column(other, "close"))


def test_symbol_independent_of_the_others() -> None:
    alone = generate_bars(days=2, num_features=5, symbols=["ES"], seed=4)
    together = generate_bars(days=2, num_features=5, symbols=["NQ", "ES"], seed=4)
    assert together.slice(0, alone.num_rows).equals(alone)


def test_realistic_shape(table: pa.Table) -> None:
    es = table.slice(0, 3 * BARS_PER_SESSION)
    nq = table.slice(3 * BARS_PER_SESSION)
    es_returns = np.diff(np.log(_column(es, "close")))
    nq_returns = np.diff(np.log(_column(nq, "close")))
    assert np.corrcoef(es_returns, nq_returns)[0, 1] > 0.3  # common factor
    size = np.abs(es_returns)
    assert np.corrcoef(size[:-1], size[1:])[0, 1] > 0.1  # volatility clusters
    volume = _column(es, "volume")[:BARS_PER_SESSION]
    rth_open, rth_middle = volume[930:960].mean(), volume[1050:1200].mean()
    rth_close, overnight = volume[1290:1320].mean(), volume[300:500].mean()
    assert rth_open > rth_middle < rth_close  # U shape over the regular session
    assert overnight < rth_middle


def test_order_flow_leads_the_next_return_and_nothing_else_does(table: pa.Table) -> None:
    """NOTE [Planted order flow]: the imbalance tells the next bar's return best; the
    returns' own past, which the flow moved, tells less."""
    es = table.slice(0, 3 * BARS_PER_SESSION)
    flow = _column(es, "order_flow").astype(np.float64)
    assert np.all(np.abs(flow) < 1) and 0.3 < flow.std() < 0.8
    returns = np.diff(np.log(_column(es, "close")))  # returns[t] is bar t + 1's
    leading = np.corrcoef(flow[:-1], returns)[0, 1]
    assert leading > 0.25, leading
    # The flow persists, so it tells its own bar's return too, but less than the next one's.
    assert np.corrcoef(flow[1:], returns)[0, 1] < leading - 0.05
    lag0 = _column(es, "log_return_lag0").astype(np.float64)
    # Past returns carry a little of the flow that moved them: a weaker forecast than it.
    assert 0 < np.corrcoef(lag0[:-1], returns)[0, 1] < leading / 2


def test_planted_truth_is_the_table_s() -> None:
    """The oracle's truth lines up with the table: each bar's return over its volatility is
    the planted mean plus unit-variance noise."""
    arguments = {"days": 3, "symbols": ["NQ", "ES"], "seed": 5}
    table = generate_bars(num_features=0, **arguments)
    truth = planted_truth(**arguments)
    assert len(truth.volatility) == len(truth.flow) == table.num_rows
    close, symbols = _column(table, "close"), _column(table, "symbol")
    origins = np.flatnonzero(symbols[:-1] == symbols[1:])  # bars with a next bar, same symbol
    origins = origins[(origins + 1) % BARS_PER_SESSION != 0]  # not across a session's gap
    returns = np.log(close[origins + 1]) - np.log(close[origins])
    residual = (returns - truth.planted_mean(origins, 1)[:, 0]) / truth.volatility[origins + 1]
    assert 0.9 < residual.std() / np.sqrt(1 - FLOW_IMPACT**2) < 1.1
    assert abs(np.corrcoef(residual, truth.flow[origins])[0, 1]) < 0.05


def test_write_bars_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "new" / "folder" / "bars.parquet"
    written = write_bars(path, days=1, num_features=3, symbols=["ES", "NQ"], seed=2)
    assert written == path
    expected = generate_bars(days=1, num_features=3, symbols=["ES", "NQ"], seed=2)
    assert pq.read_table(path).equals(expected)
    assert sorted(p.name for p in path.parent.iterdir()) == ["bars.parquet"]  # no temp files


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"days": 0}, "days=0"),
        ({"num_features": -1}, "num_features=-1"),
        ({"symbols": []}, "symbols is empty"),
        ({"symbols": "ES"}, "one string"),
        ({"symbols": ["ES", "ES"]}, "repeat"),
        ({"seed": -3}, "seed=-3"),
        ({"start": "Jan 2"}, "start='Jan 2'"),
    ],
)
def test_bad_arguments(tmp_path: Path, arguments: dict, words: str) -> None:
    options = {"days": 1, "num_features": 2, "symbols": ["ES"], "seed": 0} | arguments
    with pytest.raises(DataError, match=words) as caught:
        write_bars(tmp_path / "bars.parquet", **options)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_directory_path_rejected(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a folder"):
        write_bars(tmp_path, days=1, num_features=0)
