"""Zoo: a torchvision-style ResNet-18 (BatchNorm in training mixes samples; in-place ReLUs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.resnet_style import ResNet18
from tests.zoo.case import Batch, ZooCase, seeded


def _images(batch_size: int) -> Batch:
    generator = seeded(11)
    images = torch.randn(batch_size, 3, 64, 64, generator=generator)
    labels = torch.randint(0, 10, (batch_size,), generator=generator)
    return (images,), (labels,)


def _classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, reduction="sum")


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return ResNet18(width=8, num_classes=10)


CONVNET = [
    ZooCase(
        "resnet_batchnorm",
        "torchvision-style ResNet-18: BatchNorm, ReLU(inplace=True), out += identity",
        _resnet,
        _images,
        loss_fn=_classification_loss,
        separable=False,
        bench_batch_size=16,
    ),
]
