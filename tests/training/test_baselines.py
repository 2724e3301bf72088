"""The naive forecasts validation scores beside the model (NOTE [Naive forecasts]), checked
against what each is defined to be, computed here from the windows directly."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from autockpt.cli import main
from autockpt.training.forecasts.evaluate import evaluate
from autockpt.training.forecasts.predict import predict
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.baselines import NaiveForecasts, skill
from autockpt.training.setup.prepare import Setup, prepare
from tft.model.loss import quantile_loss


@pytest.fixture(scope="module")
def setup() -> Setup:
    return prepare(TrainConfig(data=SAMPLE_DATA, preset="tiny", device="cpu"))


def test_no_change_forecasts_a_return_of_zero(setup: Setup) -> None:
    batch = setup.data.validation.batch(np.arange(16))
    forecast = setup.naive_forecasts.predictions(batch, setup.device)["no_change"]
    raw = setup.data.normalizer.denormalize_target(forecast, batch.symbol_index)
    torch.testing.assert_close(raw, torch.zeros_like(raw), atol=1e-6, rtol=0)


def test_the_quantile_forecast_holds_each_level_of_the_training_targets(setup: Setup) -> None:
    naive = setup.naive_forecasts
    levels = list(setup.model_config.quantiles)
    targets, symbols = setup.data.train.targets()
    for symbol in np.unique(symbols):
        mine = torch.from_numpy(targets[symbols == symbol])  # (N, H)
        fitted = naive.quantiles[symbol]  # (H, Q)
        # Returns sit on a tick grid, so many tie: each level lies between the share strictly
        # below its quantile and the share at or below it.
        below = (mine[:, :, None] < fitted[None]).double().mean(dim=0)  # (H, Q)
        at_or_below = (mine[:, :, None] <= fitted[None]).double().mean(dim=0)
        wanted = torch.tensor(levels, dtype=torch.float64).expand_as(below)
        assert bool(((below - 0.01 <= wanted) & (wanted <= at_or_below + 0.01)).all())


def test_validation_scores_the_naive_forecasts_on_the_same_windows(setup: Setup) -> None:
    evaluation = evaluate(setup, setup.data.validation, max_batches=None)
    assert evaluation is not None and set(evaluation.naive) == {"no_change", "quantiles"}
    # Every validation window at once, scored here with the loss written out.
    dataset = setup.data.validation
    batch = dataset.batch(np.arange(len(dataset)))
    levels = torch.tensor(setup.model_config.quantiles)
    mean = torch.tensor(setup.data.normalizer.target.mean)[batch.symbol_index][:, None, None]
    std = torch.tensor(setup.data.normalizer.target.std)[batch.symbol_index][:, None, None]
    zero = ((0.0 - mean) / std).expand(-1, dataset.horizon, len(levels)).float()
    want = quantile_loss(zero, batch.target, levels).item()
    assert evaluation.naive["no_change"].loss == pytest.approx(want, rel=1e-4)
    by_step = [
        quantile_loss(zero[:, h : h + 1], batch.target[:, h : h + 1], levels).item()
        for h in range(dataset.horizon)
    ]
    assert evaluation.naive["no_change"].loss_by_step == pytest.approx(by_step, rel=1e-4)
    # The skill is over the better naive forecast.
    best = min(s.loss for s in evaluation.naive.values())
    assert evaluation.skill == pytest.approx(1 - evaluation.loss / best)
    assert len(evaluation.skill_by_step) == dataset.horizon


def test_skill_is_against_the_lower_naive_loss() -> None:
    assert skill(0.5, {"no_change": 2.0, "quantiles": 1.0}) == pytest.approx(0.5)
    assert skill(1.5, {"no_change": 2.0, "quantiles": 1.0}) == pytest.approx(-0.5)
    assert skill(1.0, {"no_change": 0.0}) is None


def test_a_level_target_is_forecast_by_its_last_value() -> None:
    config = TrainConfig(data=SAMPLE_DATA, preset="tiny", device="cpu", target_transform="none")
    level = prepare(config)
    naive = NaiveForecasts.fit(level.data, list(level.model_config.quantiles))
    batch = level.data.validation.batch(np.arange(8))
    forecast = naive.predictions(batch, level.device)["no_change"]
    raw = level.data.normalizer.denormalize_target(forecast, batch.symbol_index)
    # The file's last close before the forecast, read from the rows' own column.
    last = level.data.normalizer.denormalize_target(
        batch.encoder_observed[:, -1, 0], batch.symbol_index
    )
    torch.testing.assert_close(raw, last[:, None, None].expand_as(raw))


def test_predict_scores_the_forecasts_it_writes_beside_the_naive_ones(tmp_path) -> None:
    run = tmp_path / "run"
    epoch = ["--preset", "tiny", "--quiet", "--epochs", "1", "--max-steps-per-epoch", "3"]
    assert main(["train", str(SAMPLE_DATA), *epoch, "--out", str(run)]) == 0
    result = predict(run, SAMPLE_DATA, tmp_path / "forecasts.parquet", device="cpu")
    assert result.evaluation is not None
    # Read back from the file predict wrote, in target-transform units.
    table = pq.read_table(result.path)
    actual, median = table["actual"].to_numpy(), table["q0.5"].to_numpy()
    assert result.evaluation.mae == pytest.approx(np.abs(median - actual).mean(), rel=1e-4)
    # No change forecasts a return of 0: its error is the return itself.
    no_change = result.evaluation.naive["no_change"]
    assert no_change.mae == pytest.approx(np.abs(actual).mean(), rel=1e-4)
    assert no_change.rmse == pytest.approx(np.sqrt(np.square(actual).mean()), rel=1e-4)
    # NOTE [Scores by what the model saw]: each window by its first forecast bar against the
    # run's split, the cut times found here from the file's own timestamps.
    assert result.parts_known
    times = np.unique(pq.read_table(SAMPLE_DATA, columns=["timestamp"])["timestamp"].to_numpy())
    cuts = times[round(0.7 * len(times))], times[round(0.85 * len(times))]
    stamps = table["timestamp"].to_numpy().astype("datetime64[ns]")
    first = stamps[table["horizon_step"].to_numpy() == 1]
    part_of = np.repeat((first >= cuts[0]).astype(int) + (first >= cuts[1]), result.horizon)
    by_part = {p.part: p.evaluation for p in result.evaluation_by_part}
    assert list(by_part) == ["trained on", "validated on", "never seen"]
    for index, part in enumerate(by_part):
        inside = part_of == index
        assert by_part[part].num_windows == inside.sum() // result.horizon > 0
        mae = np.abs(median[inside] - actual[inside]).mean()
        assert by_part[part].mae == pytest.approx(mae, rel=1e-4), part
    assert sum(e.num_windows for e in by_part.values()) == result.num_windows
