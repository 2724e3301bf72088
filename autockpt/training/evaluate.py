"""Validation: the loss, MAE, RMSE and quantile coverage of a model over a window dataset.

The :class:`~autockpt.training.train.Trainer` calls :func:`evaluate` at the end of every epoch
and stops early on its loss; it runs without autograd, so it needs no memory plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import islice

import torch

from autockpt.training.distributed import rank_slice
from autockpt.training.prepare import Setup, autocast
from tft.data import WindowDataset, iterate_batches


@dataclass(frozen=True)
class Evaluation:
    """Validation metrics; MAE and RMSE of the median are in target-transform units."""

    loss: float
    mae: float
    rmse: float
    coverage: float
    """Share of targets between the lowest and the highest quantile."""
    num_windows: int


def evaluate(
    setup: Setup,
    dataset: WindowDataset,
    *,
    max_batches: int | None,
    model: torch.nn.Module | None = None,
) -> Evaluation | None:
    """Metrics of the model on ``dataset`` without autograd; None when empty.

    With several ranks each evaluates its share of every global batch and the sums are added
    up, so every rank gets the metrics one process would over the same windows. ``model``
    defaults to the unplanned model; under FSDP it is the sharded planned one, whose forward
    every rank must run together (a rank with no windows of the last batch runs one anyway).
    """
    if len(dataset) == 0:
        return None
    model = setup.model if model is None else model
    quantiles = setup.model_config.quantiles
    median = min(range(len(quantiles)), key=lambda i: abs(quantiles[i] - 0.5))
    # Errors are reported in target-transform units, each window with its symbol's scale.
    target_std = torch.tensor(setup.data.normalizer.target.std, device=setup.device)
    totals = {"loss": 0.0, "abs": 0.0, "square": 0.0, "covered": 0.0}
    num_windows = num_values = 0
    was_training = model.training
    model.eval()
    batches = iterate_batches(
        dataset, setup.global_batch_size, shuffle=False, seed=0, drop_last=False
    )
    with torch.no_grad(), autocast(setup):
        for global_batch in islice(batches, max_batches):
            batch = rank_slice(global_batch, setup.world)
            if len(batch.target) == 0:
                if setup.parallelism == "fsdp":  # the others gather parameters in forward
                    model(*(t[:1].to(setup.device) for t in global_batch.inputs()))
                continue
            inputs = tuple(t.to(setup.device) for t in batch.inputs())
            target = batch.target.to(setup.device)  # (B, H)
            prediction = model(*inputs).float()  # (B, H, Q)
            scale = target_std[batch.symbol_index.to(setup.device)][:, None]  # (B, 1)
            error = (prediction[..., median] - target) * scale
            inside = (target >= prediction[..., 0]) & (target <= prediction[..., -1])
            totals["loss"] += setup.loss_fn(prediction, target).item() * len(target)
            totals["abs"] += error.abs().sum().item()
            totals["square"] += error.square().sum().item()
            totals["covered"] += inside.sum().item()
            num_windows += len(target)
            num_values += target.numel()
    model.train(was_training)
    if setup.world.is_distributed:
        by_rank = setup.world.all_gather((totals, num_windows, num_values))
        totals = {key: sum(rank_totals[key] for rank_totals, _, _ in by_rank) for key in totals}
        num_windows = sum(windows for _, windows, _ in by_rank)
        num_values = sum(values for _, _, values in by_rank)
    return Evaluation(
        loss=totals["loss"] / num_windows,
        mae=totals["abs"] / num_values,
        rmse=math.sqrt(totals["square"] / num_values),
        coverage=totals["covered"] / num_values,
        num_windows=num_windows,
    )
