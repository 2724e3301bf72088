"""Parquet -> windows: splits without leakage, exact targets, normalisation, errors."""

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tft.data.columns import ColumnRoles
from tft.data.normalize import Normalizer
from tft.data.windows import (
    CALENDAR_COLUMNS,
    WindowDataset,
    WindowedData,
    iterate_batches,
    load_windows,
)
from tft.errors import ConfigError, DataError
from tft.synthetic.bars import write_bars

ENCODER, HORIZON = 30, 5
NUM_FEATURES = 4


@pytest.fixture(scope="module")
def bars_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bars") / "bars.parquet"
    return write_bars(path, days=5, num_features=NUM_FEATURES, symbols=["ES", "NQ"], seed=1)


@pytest.fixture(scope="module")
def data(bars_path: Path) -> WindowedData:
    return load_windows(bars_path, encoder_length=ENCODER, horizon=HORIZON)


@pytest.fixture(scope="module")
def kept(bars_path: Path) -> dict[str, np.ndarray]:
    """The file's rows that become window rows (all but each symbol's first), computed apart."""
    table = pq.read_table(bars_path)
    symbol = table["symbol"].to_numpy(zero_copy_only=False)
    close = table["close"].to_numpy()
    first = np.concatenate([[True], symbol[1:] != symbol[:-1]])
    log_return = np.concatenate([[np.nan], np.diff(np.log(close))])
    return {
        "time_ns": table["timestamp"].cast(pa.int64()).to_numpy()[~first],
        "symbol": symbol[~first],
        "log_return": log_return[~first],
        "open": table["open"].to_numpy()[~first],
    }


def _window_rows(dataset: WindowDataset) -> np.ndarray:
    return dataset.starts[:, None] + np.arange(ENCODER + HORIZON)  # (num_windows, Te + Td)


def test_batch_shapes_and_dtypes(data: WindowedData) -> None:
    batch = data.train.batch([0, 5, 7, 11])
    num_observed = 1 + 5 + NUM_FEATURES  # target history, open/high/low/volume/flow, features
    assert data.num_observed == num_observed and data.num_known == 4
    assert data.static_cardinalities == [2] and data.symbols == ["ES", "NQ"]
    assert data.observed_columns[:5] == ["close_log_return", "open", "high", "low", "volume"]
    assert data.known_columns == list(CALENDAR_COLUMNS)
    expected = {
        "static_ids": ((4, 1), torch.int64),
        "encoder_observed": ((4, ENCODER, num_observed), torch.float32),
        "encoder_known": ((4, ENCODER, 4), torch.float32),
        "decoder_known": ((4, HORIZON, 4), torch.float32),
        "target": ((4, HORIZON), torch.float32),
        "decoder_time_ns": ((4, HORIZON), torch.int64),
        "symbol_index": ((4,), torch.int64),
    }
    for name, (shape, dtype) in expected.items():
        tensor = getattr(batch, name)
        assert tuple(tensor.shape) == shape and tensor.dtype == dtype, name
    assert batch.inputs() == tuple(batch)[:4]
    assert torch.equal(batch.static_ids[:, 0], batch.symbol_index)


def test_no_leakage_between_splits(data: WindowedData, kept: dict[str, np.ndarray]) -> None:
    times = kept["time_ns"]
    spans = {}
    for name in ["train", "validation", "test"]:
        rows = _window_rows(getattr(data, name))
        assert len(rows) > 0
        spans[name] = (times[rows].min(), times[rows].max())
    assert spans["train"][1] < spans["validation"][0]
    assert spans["validation"][1] < spans["test"][0]
    for name in ["train", "validation", "test"]:
        starts = getattr(data, name).starts
        for symbol in ["ES", "NQ"]:  # the same calendar span for every symbol
            mine = starts[kept["symbol"][starts] == symbol]
            assert times[mine].min() == times[starts].min()


def test_no_window_spans_two_symbols(data: WindowedData, kept: dict[str, np.ndarray]) -> None:
    for dataset in [data.train, data.validation, data.test, data.whole]:
        rows = _window_rows(dataset)
        symbols = kept["symbol"][rows]
        assert np.all(symbols == symbols[:, :1])
        batch = dataset.batch(np.arange(len(dataset)))
        assert np.array_equal(
            np.array(data.symbols)[batch.symbol_index.numpy()], kept["symbol"][dataset.starts]
        )


def test_target_is_the_row_after_the_encoder(
    data: WindowedData, kept: dict[str, np.ndarray]
) -> None:
    indices = np.array([0, 17, len(data.validation) - 1])
    batch = data.validation.batch(indices)
    denormalize = data.normalizer.denormalize_target
    targets = denormalize(batch.target.double(), batch.symbol_index)  # (B, Td)
    for i, start in enumerate(data.validation.starts[indices]):
        last_encoder_row = start + ENCODER - 1
        for h in range(HORIZON):
            row = last_encoder_row + h + 1
            assert math.isclose(float(targets[i, h]), kept["log_return"][row], abs_tol=1e-8)
            assert batch.decoder_time_ns[i, h] == kept["time_ns"][row]
        history = denormalize(
            batch.encoder_observed[i : i + 1, :, 0].double(), batch.symbol_index[i : i + 1]
        )[0].numpy()
        np.testing.assert_allclose(history, kept["log_return"][start : start + ENCODER], atol=1e-8)


def test_normalizer_fitted_on_train_rows_only(
    tmp_path: Path, bars_path: Path, data: WindowedData, kept: dict[str, np.ndarray]
) -> None:
    train_end = kept["time_ns"][_window_rows(data.validation)].min()
    train_rows = kept["time_ns"] < train_end
    stats = data.normalizer
    for index, symbol in enumerate(data.symbols):
        rows = train_rows & (kept["symbol"] == symbol)
        returns = kept["log_return"][rows]
        assert math.isclose(stats.target.mean[index], returns.mean(), rel_tol=1e-9)
        assert math.isclose(stats.target.std[index], returns.std(), rel_tol=1e-9)
        assert math.isclose(stats.reals["open"].mean[index], kept["open"][rows].mean())
        assert math.isclose(stats.reals["open"].std[index], kept["open"][rows].std())

    table = pq.read_table(bars_path)
    times = table["timestamp"].cast(pa.int64()).to_numpy()
    late = times >= kept["time_ns"][_window_rows(data.test)].min()
    early = times < train_end
    for rows, should_change in [(late, False), (early, True)]:
        columns = {name: table[name].to_numpy(zero_copy_only=False) for name in table.column_names}
        for name in table.column_names[2:]:
            columns[name] = np.where(rows, columns[name] * 3, columns[name])
        changed = tmp_path / f"changed_{should_change}.parquet"
        pq.write_table(pa.table(columns, schema=table.schema), changed)
        refitted = load_windows(changed, encoder_length=ENCODER, horizon=HORIZON).normalizer
        assert (refitted.to_dict() != stats.to_dict()) is should_change


def test_normalizer_round_trip(data: WindowedData, bars_path: Path) -> None:
    saved = json.loads(json.dumps(data.normalizer.to_dict()))
    restored = Normalizer.from_dict(saved)
    assert restored == data.normalizer
    values = np.array([-1.0, 0.0, 2.5])
    symbols = np.array([1, 0, 1])
    mean, std = np.array(restored.target.mean), np.array(restored.target.std)
    expected = values * std[symbols] + mean[symbols]
    assert mean[0] != mean[1]  # each symbol its own scale
    np.testing.assert_allclose(restored.denormalize_target(values, symbols), expected)
    tensor = restored.denormalize_target(torch.tensor(values), torch.tensor(symbols))
    assert isinstance(tensor, torch.Tensor)
    np.testing.assert_allclose(tensor.numpy(), expected)

    again = load_windows(
        bars_path,
        encoder_length=ENCODER,
        horizon=HORIZON,
        normalizer=restored,
        split_fractions=None,
    )
    assert len(again.train) == 0 and len(again.whole) == len(data.whole)
    first, second = data.whole.batch([0, 99]), again.whole.batch([0, 99])
    for name, tensor in first._asdict().items():
        assert torch.equal(tensor, getattr(second, name)), name


def test_normalizer_from_bad_dict_raises(data: WindowedData) -> None:
    broken = data.normalizer.to_dict() | {"observed_std": [1.0]}
    with pytest.raises(DataError, match="Normalizer.to_dict"):
        Normalizer.from_dict(broken)


def test_whole_file_without_splits(bars_path: Path, kept: dict[str, np.ndarray]) -> None:
    whole = load_windows(bars_path, encoder_length=ENCODER, horizon=HORIZON, split_fractions=None)
    rows_per_symbol = len(kept["symbol"]) // 2
    assert len(whole.whole) == 2 * (rows_per_symbol - ENCODER - HORIZON + 1)
    assert len(whole.train) == len(whole.validation) == len(whole.test) == 0
    es = kept["log_return"][kept["symbol"] == "ES"]
    assert math.isclose(whole.normalizer.target.mean[0], es.mean(), rel_tol=1e-9)


def _minute_table(num_rows: int = 60, **overrides: np.ndarray | pa.Array) -> pa.Table:
    """Two symbols, interleaved row by row, one bar a minute from 2024-01-02 14:30 UTC."""
    minutes = np.repeat(np.arange(num_rows // 2), 2)
    columns: dict[str, np.ndarray | pa.Array] = {
        "timestamp": pa.array(
            np.datetime64("2024-01-02T14:30", "ns") + minutes * np.timedelta64(1, "m"),
            type=pa.timestamp("ns", tz="UTC"),
        ),
        "symbol": np.array(["NQ", "ES"] * (num_rows // 2)),
        "close": 100.0 + np.arange(num_rows, dtype=np.float64),
        "feature": np.linspace(-1.0, 1.0, num_rows),
        "flag": np.arange(num_rows) % 3,
    }
    columns.update(overrides)
    return pa.table(columns)


def _load(path: Path, **options: object) -> WindowedData:
    settings: dict = {"encoder_length": 3, "horizon": 2, "split_fractions": None} | options
    return load_windows(path, **settings)


def test_calendar_features_and_interleaved_symbols(tmp_path: Path) -> None:
    path = tmp_path / "minutes.parquet"
    pq.write_table(_minute_table(), path)
    loaded = _load(path, roles=ColumnRoles(known=["flag"], target_transform="diff"))
    assert loaded.symbols == ["ES", "NQ"]
    assert loaded.known_columns == ["flag", *CALENDAR_COLUMNS]
    batch = loaded.whole.batch([0])
    # First kept ES row: 2024-01-02 14:31 UTC, a Tuesday (weekday 1): minute 871 of the day.
    minute_angle, weekday_angle = 2 * math.pi * 871 / 1440, 2 * math.pi * 1 / 7
    expected = [
        math.sin(minute_angle),
        math.cos(minute_angle),
        math.sin(weekday_angle),
        math.cos(weekday_angle),
    ]
    np.testing.assert_allclose(batch.encoder_known[0, 0, 1:].numpy(), expected, atol=1e-6)
    assert int(batch.symbol_index[0]) == 0  # ES, although the file lists NQ first
    # The ES closes are 101, 103, 105, ...: every difference is 2, a constant target.
    assert loaded.normalizer.target.mean == [2.0, 2.0]
    assert loaded.normalizer.target.std == [1.0, 1.0]
    denormalized = loaded.normalizer.denormalize_target(batch.target, batch.symbol_index)
    np.testing.assert_allclose(denormalized.numpy(), 2.0)


def test_target_none_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "minutes.parquet"
    pq.write_table(_minute_table(), path)
    loaded = _load(path, roles=ColumnRoles(target_transform="none", observed=["feature"]))
    assert loaded.observed_columns == ["close_level", "feature"]
    assert len(loaded.whole) == 2 * (30 - 5 + 1)
    batch = loaded.whole.batch([0])
    first = loaded.normalizer.denormalize_target(batch.target, batch.symbol_index)[0, 0]
    assert first.item() == pytest.approx(107.0)


def test_normalizer_from_other_symbols_rejected(tmp_path: Path) -> None:
    path = tmp_path / "minutes.parquet"
    pq.write_table(_minute_table(), path)
    fitted = _load(path).normalizer
    other = tmp_path / "other.parquet"
    pq.write_table(_minute_table(symbol=np.array(["ES", "YM"] * 30)), other)
    with pytest.raises(DataError, match="symbol 'YM'.*not in the training data"):
        _load(other, normalizer=fitted)
    with pytest.raises(DataError, match="roles differ"):
        _load(path, normalizer=fitted, roles=ColumnRoles(observed=["feature"]))


def _write_table(table: pa.Table) -> Callable[[Path], Path]:
    def write(folder: Path) -> Path:
        path = folder / "bad.parquet"
        pq.write_table(table, path)
        return path

    return write


def _write_text(folder: Path) -> Path:
    path = folder / "bad.parquet"
    path.write_text("timestamp,close\n2024-01-02,1.0\n")
    return path


NAN_AT_7 = np.where(np.arange(60) == 7, np.nan, np.linspace(-1.0, 1.0, 60))
INF_AT_9 = np.where(np.arange(60) == 9, np.inf, np.linspace(-1.0, 1.0, 60))
SAME_TIMES = pa.array(
    np.repeat(np.datetime64("2024-01-02T14:30", "ns"), 60), type=pa.timestamp("ns", tz="UTC")
)
BACKWARDS = pa.array(
    np.datetime64("2024-01-02T14:30", "ns") - np.repeat(np.arange(30), 2) * np.timedelta64(1, "m"),
    type=pa.timestamp("ns", tz="UTC"),
)

BAD_INPUTS = {
    "missing file": (lambda folder: folder / "absent.parquet", {}, "no such file"),
    "folder": (lambda folder: folder, {}, "is a folder"),
    "not parquet": (_write_text, {}, "cannot be read as Parquet"),
    "empty": (_write_table(_minute_table().slice(0, 0)), {}, "has no rows"),
    "no timestamp": (
        _write_table(_minute_table().drop_columns(["timestamp"])),
        {},
        "no timestamp column 'timestamp'.*ColumnRoles\\(timestamp=",
    ),
    "timestamp integers no epoch": (
        _write_table(_minute_table(timestamp=np.arange(60))),
        {},
        r"'timestamp' holds integers \(0 ... 59\) that are no epoch .* --timestamp-unit",
    ),
    "timestamp not a time": (
        _write_table(_minute_table(timestamp=np.arange(60) + 0.5)),
        {},
        "'timestamp' has type double: store times as a Parquet timestamp, ISO 8601 text or "
        "integer epochs",
    ),
    "no target": (
        _write_table(_minute_table().drop_columns(["close"])),
        {},
        "no target column 'close'",
    ),
    "binary observed": (
        _write_table(_minute_table(feature=pa.array([b"a"] * 60))),
        {"roles": ColumnRoles(observed=["feature"])},
        "observed column 'feature' has type binary, neither a number nor a category",
    ),
    "text target": (
        _write_table(_minute_table(close=np.array(["x"] * 60))),
        {},
        "target column 'close' has type string, not a number",
    ),
    "all NaN": (
        _write_table(_minute_table(feature=np.full(60, np.nan))),
        {},
        "column 'feature' has no finite value",
    ),
    "NaN feature": (
        _write_table(_minute_table(feature=NAN_AT_7)),
        {},
        r"column 'feature' is null/NaN or infinite at 1 rows, the first row 7 \(null/NaN\)",
    ),
    "inf feature": (
        _write_table(_minute_table(feature=INF_AT_9)),
        {},
        r"column 'feature' is null/NaN or infinite at 1 rows, the first row 9 \(inf\)",
    ),
    "null target": (
        _write_table(_minute_table(close=pa.array([100.0] * 10 + [None] + [101.0] * 49))),
        {},
        r"column 'close' is null/NaN or infinite at 1 rows, the first row 10 \(null/NaN\)",
    ),
    "duplicate times": (
        _write_table(_minute_table(timestamp=SAME_TIMES)),
        {},
        "row 3 repeats the timestamp .* of row 1 for symbol 'ES'",
    ),
    "unsorted times": (
        _write_table(_minute_table(timestamp=BACKWARDS)),
        {},
        "row 3 .* is earlier than row 1 .* sort the file",
    ),
    "too few rows": (
        _write_table(_minute_table()),
        {"encoder_length": 25, "horizon": 5},
        "needs 30 consecutive rows .* longest run there has 29; lower the encoder length",
    ),
    "too few rows in a split": (
        _write_table(_minute_table()),
        {"encoder_length": 4, "horizon": 2, "split_fractions": (0.8, 0.1, 0.1)},
        "the validation split has no full window: one needs 6.*larger share \\(--split TRAIN,VAL,TEST",
    ),
    "non-positive price": (
        _write_table(_minute_table(close=np.where(np.arange(60) == 4, -1.0, 100.0))),
        {},
        "target column 'close' is -1.0 at row 4; log returns need prices > 0",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_raises_one_line_data_error(tmp_path: Path, case: str) -> None:
    make_path, options, words = BAD_INPUTS[case]
    path = make_path(tmp_path)
    with pytest.raises(DataError, match=words) as caught:
        _load(path, **options)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(path))


@pytest.mark.parametrize(
    "options",
    [{"encoder_length": 0}, {"horizon": -1}, {"split_fractions": (0.5, 0.2, 0.2)}],
)
def test_bad_options_raise_config_error(bars_path: Path, options: dict) -> None:
    with pytest.raises(ConfigError):
        load_windows(bars_path, **({"encoder_length": 3, "horizon": 2} | options))


def test_iterate_batches(data: WindowedData) -> None:
    dataset = data.validation

    def first_times(seed: int, shuffle: bool) -> list[int]:
        batches = iterate_batches(dataset, 64, shuffle=shuffle, seed=seed, drop_last=False)
        return [int(t) for batch in batches for t in batch.decoder_time_ns[:, 0]]

    in_order = first_times(0, shuffle=False)
    everything = dataset.batch(np.arange(len(dataset)))
    assert in_order == everything.decoder_time_ns[:, 0].tolist()
    shuffled = first_times(3, shuffle=True)
    assert shuffled == first_times(3, shuffle=True)
    assert shuffled != first_times(4, shuffle=True)
    assert sorted(shuffled) == sorted(in_order)
    kept = list(iterate_batches(dataset, 64, shuffle=True, seed=0, drop_last=True))
    assert len(kept) == len(dataset) // 64
    assert all(len(batch.target) == 64 for batch in kept)
    with pytest.raises(ConfigError):
        next(iterate_batches(dataset, 0, shuffle=False, seed=0, drop_last=False))
