"""Zoo: models that return a dict or a dataclass, and one whose decoder is its encoder's
transpose (tied weights).

Shape legend: B batch, T tokens, W width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tests.zoo.case import Batch, ZooCase, feedforward_blocks, seeded

TOKENS, WIDTH = 32, 32


def _regression(batch_size: int) -> Batch:
    generator = seeded(7)
    x = torch.randn(batch_size, TOKENS, WIDTH, generator=generator)
    y = torch.randn(batch_size, TOKENS, generator=generator)
    return (x,), (y,)


class Trunk(nn.Module):
    def __init__(self, depth: int = 3, dropout: float = 0.1) -> None:
        super().__init__()
        self.blocks = feedforward_blocks(depth, WIDTH, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)  # (B, T, W)
        return x


class DictOutput(nn.Module):
    """Returns ``{"prediction": (B, T), "features": (B, T, W)}``."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = Trunk()
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.trunk(x)
        return {"prediction": self.head(features).squeeze(-1), "features": features}


def _dict_loss(output: dict[str, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output["prediction"], y, reduction="sum")


@dataclass
class Forecast:
    """A dataclass output, as many libraries return."""

    prediction: torch.Tensor
    features: torch.Tensor


class DataclassOutput(nn.Module):
    """Returns a :class:`Forecast`."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = Trunk()
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> Forecast:
        features = self.trunk(x)
        return Forecast(prediction=self.head(features).squeeze(-1), features=features)


def _dataclass_loss(output: Forecast, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output.prediction, y, reduction="sum")


class TiedAutoencoder(nn.Module):
    """The decoder is the encoder's weight transposed (``F.linear(h, encoder.weight.t())``)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(WIDTH, 4 * WIDTH)
        self.trunk = nn.Sequential(
            nn.Linear(4 * WIDTH, 4 * WIDTH), nn.Tanh(), nn.Linear(4 * WIDTH, 4 * WIDTH), nn.Tanh()
        )
        self.decoder_bias = nn.Parameter(torch.zeros(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.encoder(x))  # (B, T, 4W)
        h = h + self.trunk(h)
        return F.linear(h, self.encoder.weight.t(), self.decoder_bias)  # (B, T, W)


def _reconstruction_loss(output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return ((output - x) ** 2).sum()


def _autoencoding(batch_size: int) -> Batch:
    x = torch.randn(batch_size, TOKENS, WIDTH, generator=seeded(8))
    return (x,), (x,)


def _built(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls()


OUTPUTS = [
    ZooCase(
        "dict_output", "returns a dict", lambda: _built(DictOutput), _regression, loss_fn=_dict_loss
    ),
    ZooCase(
        "dataclass_output",
        "returns a dataclass",
        lambda: _built(DataclassOutput),
        _regression,
        loss_fn=_dataclass_loss,
    ),
    ZooCase(
        "tied_weights",
        "decoder = encoder weight transposed",
        lambda: _built(TiedAutoencoder),
        _autoencoding,
        loss_fn=_reconstruction_loss,
        test_batch_size=16,
        bench_batch_size=128,
    ),
]
