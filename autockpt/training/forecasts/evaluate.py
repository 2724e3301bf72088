"""Validation: the loss, MAE, RMSE and quantile coverage of a model over a window dataset,
beside the naive forecasts' on the same windows, and the model's skill over them (NOTE [Naive
forecasts] in :mod:`autockpt.training.setup.baselines`).

The :class:`~autockpt.training.loop.train.Trainer` calls :func:`evaluate` at the end of every epoch
and stops early on its loss; it runs without autograd, so it needs no memory plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import torch

from autockpt.training.host.distributed import rank_slice
from autockpt.training.setup.baselines import NAIVE_NAMES, NaiveForecasts, skill
from autockpt.training.setup.prepare import Setup, autocast
from tft.data.windows import Batch, WindowDataset, iterate_batches


@dataclass(frozen=True)
class Scores:
    """One forecast's validation scores; MAE and RMSE of the median in target-transform units."""

    loss: float
    mae: float
    rmse: float
    coverage: float
    """Share of targets between the lowest and the highest quantile."""
    loss_by_step: list[float]
    """The pinball loss of each horizon step."""
    loss_se: float | None = None
    """The standard error of :attr:`loss` from the spread of the batches' mean losses (NOTE
    [Scores in proportion]); None over fewer than two batches."""

    def record(self) -> dict[str, Any]:
        """The scores as the run's metrics carry them."""
        return {
            "loss": self.loss,
            "loss_se": self.loss_se,
            "mae": self.mae,
            "rmse": self.rmse,
            "loss_by_step": self.loss_by_step,
        }


@dataclass(frozen=True)
class Evaluation:
    """Validation metrics of the model, and of the naive forecasts on the same windows
    (NOTE [Naive forecasts])."""

    model: Scores
    naive: dict[str, Scores]
    """Each naive forecast's scores, by name (:data:`NAIVE_NAMES`)."""
    num_windows: int

    @property
    def loss(self) -> float:
        return self.model.loss

    @property
    def mae(self) -> float:
        return self.model.mae

    @property
    def rmse(self) -> float:
        return self.model.rmse

    @property
    def coverage(self) -> float:
        return self.model.coverage

    @property
    def skill(self) -> float | None:
        """``1 - model / naive`` on the pinball loss, over the better naive forecast."""
        return skill(self.model.loss, {k: v.loss for k, v in self.naive.items()})

    @property
    def skill_by_step(self) -> list[float | None]:
        """The skill of each horizon step, over that step's better naive forecast."""
        return [
            skill(loss, {k: v.loss_by_step[h] for k, v in self.naive.items()})
            for h, loss in enumerate(self.model.loss_by_step)
        ]


def evaluate(
    setup: Setup,
    dataset: WindowDataset,
    *,
    max_batches: int | None = None,
    positions: np.ndarray | None = None,
    model: torch.nn.Module | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Evaluation | None:
    """Metrics of the model and of the naive forecasts on ``dataset`` without autograd;
    None when empty.

    ``positions`` (ascending) scores those windows alone (a :class:`~autockpt.training.
    forecasts.scoring_sample.ScoringSample`'s), ``max_batches`` the first batches alone;
    ``progress`` is called after each batch with the windows scored and the windows to score.

    With several ranks each evaluates its share of every global batch and the sums are added
    up, so every rank gets the metrics one process would over the same windows. ``model``
    defaults to the unplanned model; under FSDP it is the sharded planned one, whose forward
    every rank must run together (a rank with no windows of the last batch runs one anyway).
    """
    if len(dataset) == 0:
        return None
    model = setup.model if model is None else model
    scores = ForecastScores(
        setup.naive_forecasts,
        setup.loss_fn,
        setup.model_config.quantiles,
        setup.data.normalizer.target.std,
        dataset.horizon,
        setup.device,
    )
    was_training = model.training
    model.eval()
    size = setup.global_batch_size
    if positions is None:
        batches = iterate_batches(dataset, size, shuffle=False, seed=0, drop_last=False)
    else:
        batches = (dataset.batch(positions[i : i + size]) for i in range(0, len(positions), size))
    to_score = len(dataset) if positions is None else len(positions)
    if max_batches is not None:
        to_score = min(to_score, max_batches * size)
    pieces, every_piece = setup.plan.inference_pieces, setup.parallelism == "fsdp"
    scored = 0
    with torch.no_grad(), autocast(setup):
        for global_batch in islice(batches, max_batches):
            batch = rank_slice(global_batch, setup.world)
            if len(batch.target):
                inputs = tuple(t.to(setup.device) for t in batch.inputs())
                output = forward_in_pieces(model, inputs, pieces, every_piece=every_piece)
                scores.add(output.float(), batch)  # (B, H, Q)
            elif every_piece:  # the others gather parameters in forward
                one = tuple(t[:1].to(setup.device) for t in global_batch.inputs())
                forward_in_pieces(model, one, pieces, every_piece=True)
            scored += len(global_batch.target)
            if progress is not None:
                progress(scored, to_score)
    model.train(was_training)
    if setup.world.is_distributed:
        by_rank = setup.world.all_gather((scores.totals, scores.num_windows, scores.num_values))
        scores.totals = {
            key: np.sum([rank[key] for rank, _, _ in by_rank], axis=0) for key in scores.totals
        }
        scores.num_windows = sum(windows for _, windows, _ in by_rank)
        scores.num_values = sum(values for _, _, values in by_rank)
    return scores.evaluation()


def forward_in_pieces(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    pieces: int,
    *,
    every_piece: bool = False,
) -> torch.Tensor:
    """The model's output for a batch, its forward run on ``pieces`` slices of the batch one
    after the other and joined: what keeps validation within the step's budget.
    ``every_piece``: run ``pieces`` forwards whatever the batch's size (a slice with no rows
    runs on the batch's first row, its output dropped), as FSDP's ranks must run together.

    NOTE [Validation within the step's budget]
    Validation runs without autograd, where the planned module runs the model's forward whole:
    a region the plan runs in chunks then makes its intermediates for the whole batch at once.
    On an H200 with a 4 GiB card emulated, tft-225 trained at batch 128 with a segment in four
    chunks (a step's peak 3.28 GiB), and the first validation asked for 864 MiB more and ran
    out of memory. So validation cuts each batch into the plan's ``inference_pieces``, which
    makes no intermediate larger than one of the step's chunks, or into the fewer pieces
    planning measured to fit (NOTE [Validation in as few pieces as fit]).
    """
    if pieces <= 1:
        return model(*inputs)
    outputs = []
    for piece in zip(*(t.tensor_split(pieces) for t in inputs), strict=True):
        if len(piece[0]):
            outputs.append(model(*piece))
        elif every_piece:
            model(*(t[:1] for t in inputs))
    return torch.cat(outputs)


class ForecastScores:
    """Sums of the scores of the model's forecasts and of the naive ones (NOTE [Naive
    forecasts]) over batches of windows: what validation and ``predict`` report.

    Args:
        naive: the naive forecasts to score beside the model's.
        loss_fn: the pinball loss, ``loss_fn(prediction, target)``.
        quantiles: the quantile levels of a forecast's last axis.
        target_std: each symbol's target scale: errors are reported in target-transform units.
        horizon: forecast steps per window.
        device: where the model's forecasts are.
    """

    def __init__(
        self,
        naive: NaiveForecasts,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        quantiles: Sequence[float],
        target_std: Sequence[float],
        horizon: int,
        device: torch.device,
    ) -> None:
        self.naive, self.loss_fn, self.device = naive, loss_fn, device
        self.median = min(range(len(quantiles)), key=lambda i: abs(quantiles[i] - 0.5))
        self.target_std = torch.tensor(target_std, device=device)
        # Per forecast: score_sums' sums, then each step's loss sum.
        self.totals = {name: np.zeros(SUMS + horizon) for name in ("model", *NAIVE_NAMES)}
        self.num_windows = self.num_values = 0

    def add(self, prediction: torch.Tensor, batch: Batch) -> None:
        """Score the model's ``prediction`` ``(B, H, Q)`` of ``batch``, and the naive
        forecasts of it."""
        target = batch.target.to(self.device)  # (B, H)
        scale = self.target_std[batch.symbol_index.to(self.device)][:, None]  # (B, 1)
        forecasts = {"model": prediction, **self.naive.predictions(batch, self.device)}
        for name, forecast in forecasts.items():
            self.totals[name] += score_sums(self.loss_fn, forecast, target, scale, self.median)
        self.num_windows += len(target)
        self.num_values += target.numel()

    def evaluation(self) -> Evaluation:
        return evaluation_of(self.totals, self.num_windows, self.num_values)


#: The sums :func:`score_sums` gives before each step's loss sum: loss, |error|, error^2,
#: covered, and for the loss's standard error the batches' squared loss sums, their loss sums
#: times their sizes, their squared sizes and their count.
SUMS = 8


def evaluation_of(totals: dict[str, np.ndarray], num_windows: int, num_values: int) -> Evaluation:
    """The :class:`Evaluation` of :func:`score_sums` added up over every window, by forecast
    (``"model"`` and the naive ones)."""
    scores = {
        name: Scores(
            loss=float(sums[0]) / num_windows,
            mae=float(sums[1]) / num_values,
            rmse=math.sqrt(float(sums[2]) / num_values),
            coverage=float(sums[3]) / num_values,
            loss_by_step=[float(v) / num_windows for v in sums[SUMS:]],
            loss_se=_loss_standard_error(sums, num_windows),
        )
        for name, sums in totals.items()
    }
    return Evaluation(model=scores.pop("model"), naive=scores, num_windows=num_windows)


def score_sums(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    prediction: torch.Tensor,
    target: torch.Tensor,
    scale: torch.Tensor,
    median: int,
) -> np.ndarray:
    """One batch's loss, |error|, error^2, covered and per-step loss sums of one forecast
    ``(B, H, Q)`` of normalised ``target`` ``(B, H)``; errors in target-transform units by
    ``scale`` ``(B, 1)``, of the quantile at index ``median``."""
    error = (prediction[..., median] - target) * scale
    inside = (target >= prediction[..., 0]) & (target <= prediction[..., -1])
    size = len(target)
    by_step = [
        loss_fn(prediction[:, h : h + 1], target[:, h : h + 1]).item() * size
        for h in range(target.size(1))
    ]
    loss_sum = loss_fn(prediction, target).item() * size
    return np.array(
        [
            loss_sum,
            error.abs().sum().item(),
            error.square().sum().item(),
            inside.sum().item(),
            loss_sum**2,
            loss_sum * size,
            size**2,
            1.0,
            *by_step,
        ]
    )


def _loss_standard_error(sums: np.ndarray, num_windows: int) -> float | None:
    """The standard error of the mean loss from its batches' spread (NOTE [Scores in
    proportion]): each batch b of n_b windows and mean loss m_b is one draw of a ratio
    estimator, whose variance is B / (B - 1) * sum(n_b^2 (m_b - M)^2) / N^2; expanded, the sum
    is sum(n_b^2 m_b^2) - 2 M sum(n_b^2 m_b) + M^2 sum(n_b^2), sums that add up over ranks."""
    squared, by_size, sizes_squared, batches = (float(v) for v in sums[4:SUMS])
    if batches < 2:
        return None
    mean = float(sums[0]) / num_windows
    spread = squared - 2 * mean * by_size + mean**2 * sizes_squared
    return math.sqrt(max(spread, 0.0) * batches / (batches - 1)) / num_windows
