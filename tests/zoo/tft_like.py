"""Zoo: the bundled Temporal Fusion Transformer written with functional dropout.

Its dropout modules are replaced by :class:`FunctionalDropout`, a module of one's own that
calls ``F.dropout(x, self.p, self.training)``: torch.fx traces through it and records
``training=True`` as a constant, as in a model written with functional dropout throughout.
The bundled model reaches about 4% of its unplanned peak; so must this one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.zoo.case import Batch, ZooCase
from tft.model.config import TFTConfig, get_preset
from tft.model.transformer import TemporalFusionTransformer


class FunctionalDropout(nn.Module):
    """``F.dropout(x, self.p, self.training)``, traced through by torch.fx."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.dropout = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.dropout, self.training)


def functional_dropout_tft(config: TFTConfig) -> TemporalFusionTransformer:
    """The bundled TFT of ``config`` with every ``nn.Dropout`` made functional."""
    torch.manual_seed(0)
    model = TemporalFusionTransformer(config)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Dropout):
                setattr(module, name, FunctionalDropout(child.p))
    return model


def tft_batch(config: TFTConfig, batch_size: int) -> Batch:
    """Inputs of ``config``'s TFT and quantile-loss targets, for ``batch_size`` windows."""
    generator = torch.Generator().manual_seed(12)
    model = TemporalFusionTransformer(config)
    inputs = model.example_inputs(batch_size, generator=generator)
    return tuple(inputs), (torch.randn(batch_size, config.horizon, generator=generator),)


def tft_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Summed pinball loss over the quantiles 0.1, 0.5, 0.9 (a sum over samples)."""
    quantiles = torch.tensor([0.1, 0.5, 0.9], dtype=prediction.dtype)
    errors = target.unsqueeze(-1) - prediction  # (B, H, Q)
    return torch.maximum(quantiles * errors, (quantiles - 1) * errors).sum()


TINY = get_preset("tiny", dropout=0.1)

TFT_LIKE = [
    ZooCase(
        "tft_functional_dropout",
        "the bundled TFT with F.dropout(x, p, self.training)",
        lambda: functional_dropout_tft(TINY),
        lambda batch_size: tft_batch(TINY, batch_size),
        loss_fn=tft_loss,
        bench_batch_size=32,
        slow=True,
    ),
]
