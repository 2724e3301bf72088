"""A ResNet-18 written the way torchvision writes it, for tests and benchmarks.

torchvision is not a dependency (its wheel for this torch is a CUDA build), so the model is
written here in its style: ``BasicBlock`` with one ``nn.ReLU(inplace=True)`` called twice,
``out += identity``, BatchNorm after every convolution, a strided 1x1 convolution plus
BatchNorm as the downsample path, and a stem of a 7x7 convolution and a max pool.
``width=64`` and 224x224 or 128x128 images give the real model's shapes; tests use a narrow
one on small images.

Shapes: ``(B, 3, H, W)`` in, ``(B, num_classes)`` out; the four stages run at H/4, H/8, H/16
and H/32 with ``width``, 2, 4 and 8 times ``width`` channels.
"""

from __future__ import annotations

import torch
from torch import nn


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """A 3x3 convolution with padding 1 and no bias (BatchNorm follows)."""
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a skip connection, ReLUs in place."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)  # (B, P, H', W')
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet18(nn.Module):
    """ResNet-18: a stem, four stages of two ``BasicBlock``s, global pooling, a classifier."""

    def __init__(self, width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._stage(width, width, stride=1)
        self.layer2 = self._stage(width, 2 * width, stride=2)
        self.layer3 = self._stage(2 * width, 4 * width, stride=2)
        self.layer4 = self._stage(4 * width, 8 * width, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width, num_classes)

    @staticmethod
    def _stage(in_planes: int, planes: int, *, stride: int) -> nn.Sequential:
        return nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)  # (B, width, H/2, W/2)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)  # (B, width, H/4, W/4)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)  # (B, 8 * width, H/32, W/32)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)  # (B, num_classes)
