"""Zoo: feed-forward models over token sequences, each written in another common style.

Shape legend: B batch, T tokens, W width. Every model maps ``(B, T, W)`` to ``(B, T, 1)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.zoo.case import Batch, ZooCase, seeded

WIDTH, TOKENS = 32, 32


def _tokens(batch_size: int) -> Batch:
    return (torch.randn(batch_size, TOKENS, WIDTH, generator=seeded(1)),), ()


class FunctionalDropoutMLP(nn.Module):
    """Residual MLP blocks with ``F.dropout(h, p, self.training)`` (torch.fx freezes it on)."""

    def __init__(self, depth: int = 4, dropout: float = 0.2) -> None:
        super().__init__()
        self.dropout = dropout
        self.ups = nn.ModuleList(nn.Linear(WIDTH, 2 * WIDTH) for _ in range(depth))
        self.downs = nn.ModuleList(nn.Linear(2 * WIDTH, WIDTH) for _ in range(depth))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for up, down in zip(self.ups, self.downs, strict=True):
            h = F.dropout(F.gelu(up(x)), self.dropout, self.training)  # (B, T, 2W)
            x = x + down(h)
        return self.head(x)


class TrainingBranch(nn.Module):
    """Noise and stochastic depth drawn by hand under ``if self.training:`` (``randn_like``,
    ``rand``, ``bernoulli``)."""

    def __init__(self, depth: int = 4, dropout: float = 0.2, noise: float = 0.1) -> None:
        super().__init__()
        self.dropout, self.noise = dropout, noise
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 2 * WIDTH), nn.SiLU())
            for _ in range(depth)
        )
        self.projections = nn.ModuleList(nn.Linear(2 * WIDTH, WIDTH) for _ in range(depth))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            x = x + self.noise * torch.randn_like(x)
        for block, projection in zip(self.blocks, self.projections, strict=True):
            h = projection(block(x))  # (B, T, W)
            if self.training:
                # Drop the whole block per sample (stochastic depth), and features by hand.
                keep = (torch.rand(x.shape[0], 1, 1) >= self.dropout).to(h.dtype)
                mask = torch.bernoulli(torch.full_like(h, 1.0 - self.dropout))
                h = h * keep * mask / (1.0 - self.dropout) ** 2
            x = x + h
        return self.head(x)


class GatedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.value = nn.Linear(WIDTH, WIDTH)
        self.gate = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x + scale * mask * self.value(x) * torch.sigmoid(self.gate(x))  # (B, T, W)


class KeywordArguments(nn.Module):
    """A mask input, and blocks called with keyword arguments."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(GatedBlock() for _ in range(depth))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, *, scale: float = 0.5) -> torch.Tensor:
        gate = mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        for block in self.blocks:
            x = block(x, mask=gate, scale=scale)
        return self.head(x)


def _masked_tokens(batch_size: int) -> Batch:
    (x,), _ = _tokens(batch_size)
    mask = torch.rand(batch_size, TOKENS, generator=seeded(2)) > 0.2
    return (x, mask), ()


class SharedBlock(nn.Module):
    """One block applied three times: a submodule called more than once per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.block = nn.Sequential(
            nn.Linear(WIDTH, 2 * WIDTH), nn.Tanh(), nn.Linear(2 * WIDTH, WIDTH)
        )
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for _ in range(3):
            h = h + self.block(h)  # (B, T, W)
        return self.head(h)


class SelfCheckpointed(nn.Module):
    """Blocks the model already runs under ``torch.utils.checkpoint`` itself."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))
            for _ in range(depth)
        )
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return self.head(x)


class InPlace(nn.Module):
    """In-place ops everywhere: ``nn.ReLU(inplace=True)``, ``F.relu(..., inplace=True)``,
    ``+=`` and ``mul_``."""

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.ups = nn.ModuleList(nn.Linear(WIDTH, 2 * WIDTH) for _ in range(depth))
        self.downs = nn.ModuleList(nn.Linear(2 * WIDTH, WIDTH) for _ in range(depth))
        self.relu = nn.ReLU(inplace=True)
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for up, down in zip(self.ups, self.downs, strict=True):
            h = self.relu(up(x))  # (B, T, 2W)
            h = down(h)
            h.mul_(0.5)
            h += x
            x = F.relu(h, inplace=True)
        return self.head(x)


def _built(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls()


FEEDFORWARD = [
    ZooCase(
        "functional_dropout",
        "F.dropout(h, p, self.training)",
        lambda: _built(FunctionalDropoutMLP),
        _tokens,
    ),
    ZooCase(
        "training_branch",
        "if self.training: randn_like, rand, bernoulli",
        lambda: _built(TrainingBranch),
        _tokens,
    ),
    ZooCase(
        "keyword_arguments",
        "a mask input; blocks called with keyword arguments",
        lambda: _built(KeywordArguments),
        _masked_tokens,
        slow=True,
    ),
    ZooCase(
        "shared_block", "one submodule called three times", lambda: _built(SharedBlock), _tokens
    ),
    ZooCase(
        "self_checkpointed",
        "calls torch.utils.checkpoint itself",
        lambda: _built(SelfCheckpointed),
        _tokens,
    ),
    ZooCase(
        "in_place", "ReLU(inplace=True), +=, mul_", lambda: _built(InPlace), _tokens, slow=True
    ),
]
