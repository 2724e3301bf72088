"""pytorch-forecasting's TFT, trained by Lightning with MemoryPlan: the issue's promise, on a
small synthetic TimeSeriesDataSet (skipped where pytorch-forecasting is not installed)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("lightning", reason="the lightning extra is not installed")
forecasting = pytest.importorskip(
    "pytorch_forecasting", reason="pytorch-forecasting is not installed"
)
pd = pytest.importorskip("pandas")

from autockpt.lightning import MemoryPlan  # noqa: E402
from tests.lightning.test_callback import Losses, StepPeak, _fit, pl  # noqa: E402

NUM_STEPS = 3


def _dataset() -> object:
    rng = np.random.default_rng(0)
    frames = []
    for group in range(4):
        steps = 400
        frames.append(
            pd.DataFrame(
                {
                    "time_idx": np.arange(steps),
                    "group": str(group),
                    "target": np.cumsum(rng.normal(size=steps)).astype(np.float32),
                    "x1": rng.normal(size=steps).astype(np.float32),
                    "x2": rng.normal(size=steps).astype(np.float32),
                    "session": np.where(np.arange(steps) % 24 < 8, "RTH", "ETH"),
                }
            )
        )
    return forecasting.TimeSeriesDataSet(
        pd.concat(frames, ignore_index=True),
        time_idx="time_idx",
        target="target",
        group_ids=["group"],
        max_encoder_length=60,
        max_prediction_length=10,
        static_categoricals=["group"],
        time_varying_known_categoricals=["session"],
        time_varying_unknown_reals=["target", "x1", "x2"],
    )


def _train(dataset: object, callbacks: list[pl.Callback]) -> None:
    torch.manual_seed(0)
    model = forecasting.TemporalFusionTransformer.from_dataset(
        dataset,
        hidden_size=32,
        attention_head_size=2,
        dropout=0.0,
        hidden_continuous_size=16,
        loss=forecasting.metrics.QuantileLoss(),
        log_interval=-1,
    )
    loader = dataset.to_dataloader(train=True, batch_size=64, num_workers=0, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and hyperparameters
        _fit(model, callbacks, loader=loader, limit_train_batches=NUM_STEPS)


def test_the_tft_trains_under_half_its_peak_with_the_plain_losses() -> None:
    dataset = _dataset()
    plain, plain_peak = Losses(), StepPeak(batch_index=1)
    _train(dataset, [plain, plain_peak])
    budget = plain_peak.peak_bytes // 2
    memory_plan, planned, planned_peak = (
        MemoryPlan(budget=budget, show=False),
        Losses(),
        StepPeak(1),
    )
    # Counted from before the callback plans (callbacks run in order): planning's own peak
    # and the first step's. The model does not run on fake tensors: planning runs it for real.
    planning_and_first = StepPeak(0)
    _train(dataset, [planning_and_first, memory_plan, planned, planned_peak])
    assert memory_plan.plan is not None and memory_plan.plan.num_recomputed > 0
    assert planning_and_first.peak_bytes <= budget, (planning_and_first.peak_bytes, budget)
    assert 0 < memory_plan.plan.planning_peak_bytes <= budget
    assert planned_peak.peak_bytes <= budget, (planned_peak.peak_bytes, budget)
    assert planned.losses == pytest.approx(plain.losses, rel=1e-5, abs=1e-6)
