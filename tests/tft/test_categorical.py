"""A user's own file: every column in the table, categorical covariates, per-symbol scaling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import autockpt
from tests.oracle import measured_step
from tests.tft.futures import FUTURES_ROLES, futures_table, write_futures
from tft.data.columns import ColumnRoles
from tft.data.normalize import Normalizer
from tft.data.windows import WindowedData, load_windows
from tft.errors import DataError
from tft.model.config import get_preset
from tft.model.transformer import TemporalFusionTransformer

WINDOW = {"encoder_length": 24, "horizon": 4}


@pytest.fixture(scope="module")
def futures_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_futures(tmp_path_factory.mktemp("futures") / "mine.parquet")


def _load(path: Path, **roles: object) -> WindowedData:
    return load_windows(path, roles=ColumnRoles(**FUTURES_ROLES, **roles), **WINDOW)  # type: ignore[arg-type]


def test_every_column_of_the_file_has_a_role_or_a_reason(futures_path: Path) -> None:
    data = _load(futures_path)
    table = {column.name: column for column in data.columns}
    assert list(table) == pq.read_schema(futures_path).names
    roles = {name: (column.role, column.kind) for name, column in table.items()}
    assert roles == {
        "ts": ("timestamp", "time"),
        "ticker": ("symbol", "symbol"),
        "px_last": ("target", "real"),
        "vol": ("observed", "real"),
        "bid": ("observed", "real"),
        "ask": ("observed", "real"),
        "session": ("observed", "categorical"),
        "is_roll": ("observed", "categorical"),
        "imb": ("observed", "real"),
        "exchange": ("static", "categorical"),  # text, constant within each ticker
        "raw": ("unused", None),
    }
    assert table["raw"].note == "type binary is neither a number nor a category"
    assert table["session"].categories == 2 and table["exchange"].categories == 2
    assert table["bid"].scaling == "per symbol"
    assert data.observed_columns == ["px_last_log_return", "vol", "bid", "ask", "imb"]
    # The symbol, then the exchange; each categorical has its two values and "unknown".
    assert data.static_cardinalities == [2, 3]
    assert data.observed_categorical_cardinalities == [3, 3]

    named = _load(futures_path, known=["session"], ignore=["imb"], observed=["bid"])
    table = {column.name: column for column in named.columns}
    assert table["session"].role == "known" and table["imb"].note == "ignored as asked"
    assert table["ask"].note == "not listed as known, observed or static"
    assert named.known_categorical_cardinalities == [3]
    batch = named.train.batch([0, 1])
    assert batch.encoder_categorical.shape == (2, 24, 1)
    assert batch.decoder_categorical.shape == (2, 4, 1)
    # The decoder's session codes are the encoder's rows' successors: RTH or ETH, never unknown.
    assert set(batch.decoder_categorical.unique().tolist()) <= {1, 2}


def test_two_symbols_with_the_same_moves_30x_apart_get_the_same_inputs(futures_path: Path) -> None:
    data = _load(futures_path)
    batch = data.whole.batch(np.arange(len(data.whole)))
    crude, gold = (batch.symbol_index == 0), (batch.symbol_index == 1)
    assert int(crude.sum()) == int(gold.sum())
    for name in ("bid", "ask"):
        j = data.observed_columns.index(name)
        torch.testing.assert_close(
            batch.encoder_observed[crude][..., j], batch.encoder_observed[gold][..., j]
        )
        scale = data.normalizer.reals[name]
        assert scale.mean[1] == pytest.approx(30 * scale.mean[0])
    torch.testing.assert_close(batch.target[crude], batch.target[gold])

    one_scale = _load(futures_path, scaling="global")
    batch = one_scale.whole.batch(np.arange(len(one_scale.whole)))
    j = one_scale.observed_columns.index("bid")
    bids = batch.encoder_observed[..., j]
    # One mean and deviation over both: crude's bids all sit near -1 and gold's near +1.
    assert float(bids[crude].max()) < -0.9 and float(bids[gold].min()) > 0.9
    assert one_scale.normalizer.reals["bid"].mean[0] == one_scale.normalizer.reals["bid"].mean[1]


def test_a_value_the_training_rows_never_had_is_the_unknown_category(tmp_path: Path) -> None:
    late = {minute: "AUCTION" for minute in range(1400, 1420)}  # in the test period only
    path = write_futures(tmp_path / "auction.parquet", session_override=late)
    data = _load(path)
    assert data.normalizer.categories["session"] == ["ETH", "RTH"]
    session = {column.name: column for column in data.columns}["session"]
    assert session.categories == 2 and session.unknown_rows == 2 * 20  # both tickers
    everything = data.whole.batch(np.arange(len(data.whole)))
    j = data.normalizer.roles.categorical_columns(data.normalizer.roles.observed or []).index(
        "session"
    )
    assert int((everything.encoder_categorical[..., j] == 0).sum()) > 0

    # Prediction on a file with a new session value: coded unknown and counted, no error.
    fitted = _load(tmp_path.parent / tmp_path.name / "auction.parquet").normalizer
    newer = write_futures(tmp_path / "newer.parquet", session_override={5: "HOLIDAY"})
    again = load_windows(newer, split_fractions=None, normalizer=fitted, **WINDOW)
    session = {column.name: column for column in again.columns}["session"]
    assert session.unknown_rows == 2


def test_the_normalizer_round_trips_and_reads_the_one_scale_layout(futures_path: Path) -> None:
    data = _load(futures_path)
    saved = json.loads(json.dumps(data.normalizer.to_dict()))
    assert Normalizer.from_dict(saved) == data.normalizer
    again = load_windows(futures_path, split_fractions=None, normalizer=data.normalizer, **WINDOW)
    first, second = data.whole.batch([0, 1500]), again.whole.batch([0, 1500])
    for name, tensor in first._asdict().items():
        assert torch.equal(tensor, getattr(second, name)), name

    old = {
        "roles": {"target": "close", "symbol": "symbol", "observed": ["open"], "known": []},
        "symbols": ["ES", "NQ"],
        "target_mean": 0.5,
        "target_std": 2.0,
        "observed_mean": [10.0],
        "observed_std": [3.0],
        "known_mean": [],
        "known_std": [],
    }
    upgraded = Normalizer.from_dict(old)
    assert upgraded.roles.scaling == "global" and upgraded.roles.static == []
    assert upgraded.reals["open"].mean == [10.0, 10.0]
    values = upgraded.denormalize_target(np.array([1.0, 1.0]), np.array([0, 1]))
    np.testing.assert_allclose(values, [2.5, 2.5])


def _bad(tmp_path: Path, table: pa.Table) -> Path:
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    return path


def _replaced(name: str, values: pa.Array, minutes: int = 1500) -> pa.Table:
    table = futures_table(minutes=minutes)
    return table.set_column(table.schema.get_field_index(name), name, values)


BAD = {
    "too many categories": (
        # An order id as text: 11,200 distinct values in the training rows.
        lambda: _replaced("session", pa.array([f"id{i}" for i in range(16000)]), minutes=8000),
        {},
        "column 'session' has 11,1[0-9]{2} distinct values .*at most 10,000",
    ),
    "bool target": (
        lambda: _replaced("px_last", pa.array([True, False] * 1500)),
        {},
        "target column 'px_last' has type bool, not a number",
    ),
    "static that varies": (
        lambda: futures_table(),
        {"static": ["session"]},
        "static column 'session' takes more than one value within a symbol",
    ),
    "float as categorical": (
        lambda: futures_table(),
        {"categorical": ["imb"]},
        "categorical column 'imb' has type double",
    ),
    "unreadable observed": (
        lambda: futures_table(),
        {"observed": ["raw"]},
        "observed column 'raw' has type binary, neither a number nor a category",
    ),
    "ignored column missing": (
        lambda: futures_table(),
        {"ignore": ["imbalance"]},
        "no ignored column 'imbalance'",
    ),
    "two roles": (
        lambda: futures_table(),
        {"known": ["session"], "static": ["session"]},
        "column 'session' has two roles \\(known, static\\)",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_columns_end_in_one_line_naming_the_column(tmp_path: Path, case: str) -> None:
    make, roles, words = BAD[case]
    path = _bad(tmp_path, make())
    with pytest.raises(DataError, match=words) as caught:
        _load(path, **roles)
    assert "\n" not in str(caught.value)


def _categorical_tft(batch_size: int) -> tuple[TemporalFusionTransformer, tuple[torch.Tensor, ...]]:
    config = get_preset(
        "tiny",
        dropout=0.0,
        static_cardinalities=[2, 3],
        observed_categorical_cardinalities=[3, 3],
        known_categorical_cardinalities=[4],
    )
    model = TemporalFusionTransformer(config)
    return model, model.example_inputs(batch_size, generator=torch.Generator().manual_seed(0))


def test_categorical_inputs_reach_the_forecast_and_get_gradients() -> None:
    model, inputs = _categorical_tft(8)
    model.eval()
    changed = list(inputs)
    changed[4] = (inputs[4] + 1) % 3  # another session at every encoder step
    assert not torch.allclose(model(*inputs), model(*changed))
    model.train()
    model(*inputs).sum().backward()
    for name in ("encoder_categorical_embedding", "decoder_categorical_embedding"):
        grad = getattr(model, name).embedding.weight.grad
        assert grad is not None and grad.abs().sum() > 0, name
    with torch.no_grad():
        _, seen = model.interpret(*inputs)
    # 6 observed + 4 known reals, then 2 observed and 1 known categorical.
    assert seen.encoder_weights.shape == (8, 24, 13) and seen.decoder_weights.shape == (8, 4, 5)
    with pytest.raises(ValueError, match="encoder_categorical is None"):
        model(*inputs[:4])


def test_the_planner_plans_the_categorical_inputs_and_keeps_every_gradient() -> None:
    model, inputs = _categorical_tft(32)
    unplanned = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=False)
    embeddings = sum(
        parameter.numel() * 4
        for name, parameter in model.named_parameters()
        if "categorical" in name
    )
    assert embeddings > 0
    plain_model = TemporalFusionTransformer(
        model.config.with_overrides(
            observed_categorical_cardinalities=[], known_categorical_cardinalities=[]
        )
    )
    plain = autockpt.plan(plain_model, inputs[:4], 10**12, use_gradient_checkpointing=False)
    assert unplanned.breakdown.parameters_bytes > plain.breakdown.parameters_bytes
    assert unplanned.unplanned_peak_bytes > plain.unplanned_peak_bytes

    want_peak, want_loss, want = measured_step(model, inputs)
    budget = want_peak // 2
    plan = autockpt.plan(model, inputs, budget)
    peak, loss, got = measured_step(model, inputs, plan)
    assert peak <= budget, (peak, budget)
    torch.testing.assert_close(loss, want_loss)
    assert got.keys() == want.keys()
    for name in want:
        # Chunks or micro-batches (the plan depends on the machine's timing) add a gradient up
        # in another order: float32 sums agree to a few units in the sixth digit (a norm's bias
        # gradient near 36 differed by 6e-5 once), not to assert_close's default of 1.3e-6.
        torch.testing.assert_close(
            got[name], want[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )
