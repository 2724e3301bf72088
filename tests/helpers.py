"""Shared test helpers: tiny models of different shapes and a real training step, counted."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from autockpt.planner.measure.fake_step import default_loss
from tests.oracle import measured_step


class MLPStack(nn.Module):
    """Residual MLP blocks with dropout: a chain where every block costs the same."""

    def __init__(self, width: int = 64, depth: int = 6, dropout: float = 0.1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)  # (B, W)
        return self.head(x)  # (B, 1)


class GatedBlocks(nn.Module):
    """Residual blocks whose interior (four times the residual's width) is what a step keeps:
    functional activations, a dict output, the way users write them."""

    WIDTH = 128

    def __init__(self, depth: int = 3, dropout: float = 0.0) -> None:
        super().__init__()
        width = self.WIDTH
        self.dropout = dropout
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.ups = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(depth))
        self.gates = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(depth))
        self.downs = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        for norm, up, gate, down in zip(self.norms, self.ups, self.gates, self.downs, strict=True):
            h = norm(x)
            inner = F.dropout(F.silu(gate(h)) * torch.tanh(up(h)), self.dropout, self.training)
            x = x + down(inner)
        return {"prediction": self.head(x)}


class EncoderBlock(nn.Module):
    """Pre-norm transformer encoder block (attention mixes time, not samples)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.feed_forward = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)  # (B, T, W)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.feed_forward(self.norm2(x))


class TinyTransformer(nn.Module):
    """A transformer encoder over (B, T, W) sequences."""

    def __init__(self, width: int = 32, heads: int = 4, depth: int = 3, dropout: float = 0.1):
        super().__init__()
        self.blocks = nn.ModuleList(EncoderBlock(width, heads, dropout) for _ in range(depth))
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # (B, T, 2)


class BatchNormNet(nn.Module):
    """Linear layers with BatchNorm in between: mixes samples in training mode."""

    def __init__(self, width: int = 48) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(width, width),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(width, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class OneHugeOp(nn.Module):
    """One Gram matrix over the batch, far larger than everything else: no plan shrinks it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gram = (x.t() @ x) * self.scale  # (N, N), mixes every sample
        return gram.sum()


def tracked_step(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    plan: autockpt.Plan | None = None,
    *,
    loss_fn: Callable[..., torch.Tensor] = default_loss,
    targets: Sequence[torch.Tensor] = (),
    seed: int = 0,
) -> tuple[int, torch.Tensor, dict[str, torch.Tensor]]:
    """One real AdamW step on a copy of ``model`` (planned with ``plan`` if given), with the
    loss ``loss_fn(output, *targets)``; the targets are held through the step, as in training.

    The peak is counted by the independent counter of :mod:`tests.oracle`, not by the
    planner's own tracker (which would share any blind spot with the prediction).

    Returns:
        (peak bytes, loss, gradients by parameter name).
    """
    return measured_step(model, inputs, plan, loss_fn=loss_fn, targets=targets, seed=seed)
