"""``autockpt interpret`` and the skill over the naive forecasts, on a file with a planted
predictable column: the model must find it, and reach most of what an oracle reaches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from autockpt.cli import main
from autockpt.training.forecasts.interpret import interpret
from autockpt.training.options.config import TrainConfig
from autockpt.training.setup.prepare import prepare
from autockpt.training.setup.runs import RunFolder
from tests.cli.test_cli import assert_one_line, run_cli
from tft.model.loss import quantile_loss

PLANTED = "flow"
#: The planted column is the next bar's return (in its symbol's standard deviations) plus
#: noise of this many standard deviations.
NOISE = 0.5


def _next_return_in_stds(close: np.ndarray, symbols: np.ndarray) -> np.ndarray:
    """Each bar's next log return within its symbol, in that symbol's sample standard
    deviations of its returns; 0 at a symbol's last bar (rows of one symbol in file order)."""
    following = np.zeros(len(close))
    for symbol in np.unique(symbols):
        rows = np.flatnonzero(symbols == symbol)
        returns = np.diff(np.log(close[rows]))
        following[rows[:-1]] = returns / returns.std(ddof=1)
    return following


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A make-data file with a column that leads the return by one bar, and a run on it."""
    folder = tmp_path_factory.mktemp("planted")
    bars = folder / "bars.parquet"
    made = ["make-data", str(bars), "--days", "8", "--features", "4", "--symbols", "ES,NQ"]
    assert main([*made, "--seed", "3"]) == 0
    table = pq.read_table(bars)
    planted = _next_return_in_stds(
        table["close"].to_numpy(), table["symbol"].to_numpy(zero_copy_only=False)
    )
    noise = np.random.default_rng(0).standard_normal(len(table))
    table = table.append_column(PLANTED, pa.array((planted + NOISE * noise).astype("float32")))
    path = folder / "planted.parquet"
    pq.write_table(table, path)
    run = folder / "run"
    epochs = ["--preset", "tiny", "--epochs", "3", "--lr", "0.003", "--quiet", "--seed", "0"]
    assert main(["train", str(path), *epochs, "--out", str(run)]) == 0
    return path, run


def _oracle_skill_at_the_first_step(path: Path, run: Path) -> tuple[float, float]:
    """The model's skill at the first horizon step, and an oracle's: the first target read
    off a line through the planted column at the last encoder bar (least squares on the
    training windows), with the training residuals' quantiles, scored on the validation
    windows against the better naive forecast of that step."""
    setup = prepare(TrainConfig(data=path, preset="tiny", device="cpu"))
    column = setup.data.observed_columns.index(PLANTED)
    levels = torch.tensor(setup.model_config.quantiles)

    def windows(split) -> tuple[torch.Tensor, torch.Tensor]:
        batch = split.batch(np.arange(len(split)))
        return batch.encoder_observed[:, -1, column].double(), batch.target[:, 0].double()

    x, y = windows(setup.data.train)
    slope, intercept = np.polyfit(x.numpy(), y.numpy(), 1)
    residual_quantiles = torch.quantile(y - (intercept + slope * x), levels.double())
    x, y = windows(setup.data.validation)
    oracle = (intercept + slope * x)[:, None] + residual_quantiles[None]  # (B, Q)
    oracle_loss = quantile_loss(oracle[:, None].float(), y[:, None].float(), levels).item()
    record = [r for r in RunFolder(run).read_metrics() if r["kind"] == "epoch"][-1]
    naive = min(s["loss_by_step"][0] for s in record["val_naive"].values())
    return record["val_skill_by_step"][0], 1 - oracle_loss / naive


def test_the_model_reaches_most_of_an_oracle_s_skill_on_a_planted_column(planted) -> None:
    model_skill, oracle_skill = _oracle_skill_at_the_first_step(*planted)
    assert oracle_skill > 0.2  # the planted column says something
    assert model_skill >= 0.7 * oracle_skill, (model_skill, oracle_skill)


def test_interpret_ranks_the_planted_column_first(planted) -> None:
    path, run = planted
    result = interpret(run, path, device="cpu")
    assert next(iter(result.encoder)) == PLANTED, result.encoder
    for weights in (result.static, result.encoder, result.decoder):
        assert sum(weights.values()) == pytest.approx(1.0, abs=1e-4)
        assert list(weights.values()) == sorted(weights.values(), reverse=True)
    setup_columns = {"close_log_return", PLANTED, "volume", "minute_of_day_sin"}
    assert setup_columns <= set(result.encoder)
    assert set(result.decoder) <= set(result.encoder)
    assert len(result.attention_by_lag) == 24 and 0 < sum(result.attention_by_lag) <= 1 + 1e-6


def test_interpret_writes_its_json_in_rank_order_and_refuses_bad_input(
    planted, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, run = planted
    written = tmp_path / "weights.json"
    code, out, err = run_cli(
        ["interpret", str(run), str(path), "--max-windows", "500", "--json", str(written)], capsys
    )
    assert code == 0, err
    assert "past inputs (encoder)" in out
    weights = json.loads(written.read_text())
    assert set(weights) >= {"static", "encoder", "decoder", "attention_by_lag"}
    assert list(weights["encoder"].values()) == sorted(weights["encoder"].values(), reverse=True)
    not_a_run = tmp_path / "not-a-run"
    code, _, err = run_cli(["interpret", str(not_a_run), str(path)], capsys)
    assert code == 2 and "not-a-run" in err
    assert_one_line(err)
    bars_without_the_column = tmp_path / "short.parquet"
    pq.write_table(pq.read_table(path).drop([PLANTED]), bars_without_the_column)
    missing = tmp_path / "missing.json"
    args = ["interpret", str(run), str(bars_without_the_column), "--json", str(missing)]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and PLANTED in err, err
    assert_one_line(err)
    assert not missing.exists()
