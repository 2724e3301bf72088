"""Quantile (pinball) loss for the TFT's multi-quantile forecasts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


def quantile_loss(
    prediction: Tensor, target: Tensor, quantiles: Sequence[float] | Tensor
) -> Tensor:
    """Mean pinball loss over batch, horizon and quantiles.

    For quantile ``q`` and error ``e = target - prediction`` the loss is ``max(q e, (q - 1) e)``:
    under-forecasts cost ``q`` per unit, over-forecasts ``1 - q``.

    Args:
        prediction: ``(B, H, Q)``, one forecast per quantile.
        target: ``(B, H)``.
        quantiles: the ``Q`` quantile levels, in the order of the last axis of ``prediction``.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: the shapes do not match.

    Example:
        >>> quantile_loss(torch.zeros(1, 1, 2), torch.ones(1, 1), [0.1, 0.9])
        tensor(0.5000)
    """
    levels = torch.as_tensor(quantiles, dtype=prediction.dtype, device=prediction.device)
    if prediction.shape[:-1] != target.shape or prediction.shape[-1] != levels.numel():
        raise ValueError(
            f"prediction {tuple(prediction.shape)} must be target {tuple(target.shape)} plus one "
            f"axis of {levels.numel()} quantiles"
        )
    errors = target.unsqueeze(-1) - prediction  # (B, H, Q)
    return torch.maximum(levels * errors, (levels - 1) * errors).mean()


class QuantileLoss(nn.Module):
    """:func:`quantile_loss` at fixed quantile levels, computed in float32 whatever the
    autocast (a mean of many small errors loses digits in half precision). The one loss the
    model trains, is planned and is scored with.

    Args:
        quantiles: the quantile levels, in the order of the prediction's last axis.
    """

    def __init__(self, quantiles: Sequence[float]) -> None:
        super().__init__()
        # A tuple, not a buffer: the levels are made on the prediction's device at each call,
        # so the loss needs no ``.to()`` and holds no tensor of its own.
        self.quantiles = tuple(float(q) for q in quantiles)

    def forward(self, prediction: Tensor, target: Tensor) -> Tensor:
        return quantile_loss(prediction.float(), target.float(), self.quantiles)
