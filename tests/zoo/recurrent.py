"""Zoo: recurrent models, an LSTM with the batch first and a GRU with time first.

Shape legend: B batch, T time steps, F features, H hidden.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.zoo.case import Batch, ZooCase, seeded

STEPS, FEATURES, HIDDEN = 24, 16, 32


class LSTMForecaster(nn.Module):
    """``nn.LSTM(batch_first=True)``, two layers with dropout between, a head per step."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, HIDDEN)
        self.lstm = nn.LSTM(HIDDEN, HIDDEN, num_layers=2, dropout=dropout, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(), nn.Linear(2 * HIDDEN, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(torch.relu(self.embed(x)))  # (B, T, H)
        return self.head(h)  # (B, T, 1)


class GRUTimeFirst(nn.Module):
    """``nn.GRU(batch_first=False)``: inputs and outputs are ``(T, B, .)``."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, HIDDEN)
        self.gru = nn.GRU(HIDDEN, HIDDEN, num_layers=2, dropout=dropout)
        self.head = nn.Sequential(
            nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(), nn.Linear(2 * HIDDEN, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(torch.tanh(self.embed(x)))  # (T, B, H)
        return self.head(h)  # (T, B, 1)


def _batch_first(batch_size: int) -> Batch:
    return (torch.randn(batch_size, STEPS, FEATURES, generator=seeded(5)),), ()


def _time_first(batch_size: int) -> Batch:
    return (torch.randn(STEPS, batch_size, FEATURES, generator=seeded(6)),), ()


def _built(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls()


RECURRENT = [
    ZooCase(
        "lstm_batch_first",
        "nn.LSTM(batch_first=True)",
        lambda: _built(LSTMForecaster),
        _batch_first,
    ),
    ZooCase(
        "gru_time_first",
        "nn.GRU(batch_first=False): the batch in dim 1",
        lambda: _built(GRUTimeFirst),
        _time_first,
        # Micro-batches cut dim 0, here time, which the GRU mixes; chunks of the per-step
        # head along time are still possible.
        separable=False,
        slow=True,
    ),
]
