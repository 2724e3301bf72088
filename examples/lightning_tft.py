"""pytorch-forecasting's Temporal Fusion Transformer on the bundled sample, trained by Lightning
under half its unplanned memory with one callback: ``autockpt.lightning.MemoryPlan``.

    pip install "autockpt[lightning]" pytorch-forecasting
    python examples/lightning_tft.py                    # plan for half the unplanned peak
    python examples/lightning_tft.py --budget 40MB      # or for a budget of your own
    python examples/lightning_tft.py --compare          # plain and planned side by side

The sample's two symbols become two series of a ``TimeSeriesDataSet``: the target is the
one-minute log return of the close, the sample's features are past-only inputs, the minute of
the day a known one. Without ``--budget`` the script first asks the planner what one step takes
with nothing recomputed and plans for half of it. ``--compare`` trains the same model twice
from the same seed, without and with the callback, and prints the losses of both, the peak of
one step as tracked tensor bytes (``autockpt.MemoryTracker``, on the CPU) and the median step
times. Planning's own peak is printed beside the budget: the model does not run on fake tensors,
so the planner measures it with real steps, at batches that fit the budget.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import torch
from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet
from pytorch_forecasting.metrics import QuantileLoss

import autockpt
from autockpt.lightning import MemoryPlan

SAMPLE = Path(__file__).resolve().parent / "data" / "sample.parquet"


def sample_dataset(num_features: int) -> TimeSeriesDataSet:
    """The bundled sample as a TimeSeriesDataSet (module docstring)."""
    bars = pd.read_parquet(SAMPLE)
    bars["time_idx"] = bars.groupby("symbol").cumcount()
    bars["log_return"] = np.log(bars["close"]).groupby(bars["symbol"]).diff().fillna(0.0)
    minute = bars["timestamp"].dt.hour * 60 + bars["timestamp"].dt.minute
    bars["minute_sin"] = np.sin(2 * np.pi * minute / 1440)
    bars["minute_cos"] = np.cos(2 * np.pi * minute / 1440)
    features = [c for c in bars.columns if c.startswith(("volatility_", "momentum_", "range_"))]
    return TimeSeriesDataSet(
        bars,
        time_idx="time_idx",
        target="log_return",
        group_ids=["symbol"],
        max_encoder_length=120,
        max_prediction_length=10,
        static_categoricals=["symbol"],
        time_varying_known_reals=["minute_sin", "minute_cos"],
        time_varying_unknown_reals=["log_return", *features[:num_features]],
    )


def tft(dataset: TimeSeriesDataSet) -> TemporalFusionTransformer:
    torch.manual_seed(0)
    return TemporalFusionTransformer.from_dataset(
        dataset,
        hidden_size=32,
        attention_head_size=4,
        dropout=0.1,
        hidden_continuous_size=16,
        loss=QuantileLoss(),
        log_interval=-1,
    )


class StepRecord(pl.Callback):
    """Each step's loss and time; the tracked peak of one step (the second)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.step_s: list[float] = []
        self.peak_bytes = 0
        self._tracker: autockpt.MemoryTracker | None = None
        self._started = 0.0

    def on_train_batch_start(
        self, trainer: pl.Trainer, module: Any, batch: Any, index: int
    ) -> None:
        if index == 1 and trainer.optimizers:
            batch_tensors = torch.utils._pytree.tree_leaves(batch)
            self._tracker = autockpt.MemoryTracker(
                initial=[
                    *autockpt.tensors_of(module, trainer.optimizers[0]),
                    *(t for t in batch_tensors if isinstance(t, torch.Tensor)),
                ]
            )
            self._tracker.__enter__()
        self._started = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, index: int
    ) -> None:
        self.step_s.append(time.perf_counter() - self._started)
        self.losses.append(float(outputs["loss"]))
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            self.peak_bytes = self._tracker.peak_bytes
            self._tracker = None


def train(dataset: TimeSeriesDataSet, callbacks: list[pl.Callback], steps: int) -> None:
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    loader = dataset.to_dataloader(train=True, batch_size=64, num_workers=0, shuffle=False)
    trainer.fit(tft(dataset), loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--budget", help="memory budget, e.g. 40MB (default: half the unplanned peak)"
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps (default: 20)")
    parser.add_argument("--features", type=int, default=16, help="past-only features (default: 16)")
    parser.add_argument("--compare", action="store_true", help="also train without the callback")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module="lightning|pytorch_forecasting")
    dataset = sample_dataset(args.features)

    budget: str | int | None = args.budget
    if budget is None:
        sizing = MemoryPlan(budget=10**15, use_gradient_checkpointing=False, show=False)
        train(dataset, [sizing], steps=1)
        assert sizing.plan is not None
        budget = sizing.plan.unplanned_peak_bytes // 2
        print(
            f"unplanned step: {autockpt.format_bytes(sizing.plan.unplanned_peak_bytes)}; "
            f"planning for half of it, {autockpt.format_bytes(budget)}"
        )

    planned, memory_plan = StepRecord(), MemoryPlan(budget=budget)
    train(dataset, [memory_plan, planned], steps=args.steps)
    assert memory_plan.plan is not None
    print(
        f"planning: held {autockpt.format_bytes(memory_plan.plan.planning_peak_bytes)} at its "
        f"peak, model and batch included, against the budget "
        f"{autockpt.format_bytes(memory_plan.plan.budget_bytes)}"
    )
    print(
        f"planned: losses {[f'{x:.4g}' for x in planned.losses[:4]]} ...; step peak "
        f"{autockpt.format_bytes(planned.peak_bytes)} (tracked); median step "
        f"{statistics.median(planned.step_s[1:]) * 1000:.0f} ms"
    )
    if args.compare:
        plain = StepRecord()
        train(dataset, [plain], steps=args.steps)
        same = np.allclose(plain.losses, planned.losses, rtol=1e-5, atol=1e-6)
        ratio = statistics.median(planned.step_s[1:]) / statistics.median(plain.step_s[1:])
        print(
            f"plain:   losses {[f'{x:.4g}' for x in plain.losses[:4]]} ...; step peak "
            f"{autockpt.format_bytes(plain.peak_bytes)} (tracked); median step "
            f"{statistics.median(plain.step_s[1:]) * 1000:.0f} ms"
        )
        print(
            f"same losses: {same}; planned/plain peak {planned.peak_bytes / plain.peak_bytes:.2f}, "
            f"step time {ratio:.2f}x"
        )


if __name__ == "__main__":
    main()
