"""What a zoo model comes with: how to build it and its batch, its loss, what to expect.

Every zoo model keeps its randomness in attributes a test can turn off after planning:
``nn.Dropout.p``, and float attributes named ``dropout`` or ``noise`` on any module (read
in ``forward``, so torch.fx records them as constants when the planned model is traced again).
The planner probes the model with them on; the gradient check runs with them off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

Batch = tuple[tuple[Any, ...], tuple[Any, ...]]


@dataclass(frozen=True)
class ZooCase:
    """One model of the zoo.

    Attributes:
        name: short name (the test id and the benchmark's row).
        style: what way of writing PyTorch it stands for, one line.
        build: makes the model (seeded, so every call gives the same weights).
        batch: makes ``(inputs, targets)`` for a batch size (seeded too).
        loss_fn: ``loss_fn(output, *targets)``; None: the planner's default, the outputs' sum.
        loss_reduction: whether the loss is a mean or a sum over samples.
        separable: whether nothing in its training step mixes samples (so micro-batches or
            chunks may cut the batch).
        test_batch_size / bench_batch_size: the batch of the tests and of the benchmark.
        slow: whether its test takes more than a few seconds (marked slow).
    """

    name: str
    style: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], Batch]
    loss_fn: Callable[..., torch.Tensor] | None = None
    loss_reduction: Literal["mean", "sum"] = "sum"
    separable: bool = True
    test_batch_size: int = 8
    bench_batch_size: int = 64
    slow: bool = False


def seeded(seed: int) -> torch.Generator:
    """A generator for a case's data: the same batch whatever ran before."""
    return torch.Generator().manual_seed(seed)


def randomness_off(model: nn.Module) -> nn.Module:
    """``model`` with every dropout probability and noise scale set to 0 (in place)."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name in ("dropout", "noise"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    return model


def feedforward_blocks(depth: int, width: int, dropout: float) -> nn.ModuleList:
    """``depth`` blocks of ``Linear(W, 2W)``, GELU, ``Dropout``, ``Linear(2W, W)``: the body
    several zoo models share under different forwards."""
    return nn.ModuleList(
        nn.Sequential(
            nn.Linear(width, 2 * width),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(2 * width, width),
        )
        for _ in range(depth)
    )
