"""Copies of a module to measure on: on fake tensors (shapes and bytes without memory or time),
or real ones that share the original's parameter memory."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, TypeVar

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def fake_copy(module: ModuleT, mode: FakeTensorMode) -> ModuleT:
    """A deep copy of ``module`` whose parameters and buffers are fake tensors of ``mode``.

    No real tensor data is copied (each parameter and buffer is mapped to its fake twin before
    the copy starts), so this costs no memory for a large model. Running the copy, a backward
    pass on it, or an optimizer step over its parameters leaves the original untouched:
    BatchNorm statistics and the like change on the copy only.
    """
    memo: dict[int, Any] = {}
    for parameter in module.parameters():
        fake = mode.from_tensor(parameter.detach())
        memo[id(parameter)] = torch.nn.Parameter(fake, requires_grad=parameter.requires_grad)
    for buffer in module.buffers():
        memo[id(buffer)] = mode.from_tensor(buffer)
    return copy.deepcopy(module, memo)


def parameter_sharing_copy(module: ModuleT) -> ModuleT:
    """A deep copy of ``module`` whose parameters share the original's memory.

    For measuring real steps (NOTE [Scaled real measurement] in
    :mod:`autockpt.planner.measure.scaled_step`) without taking the model's memory twice on
    the device it is planned for. Each parameter is a new ``Parameter`` over the same data, so
    a backward on the copy writes the copy's ``.grad``, never the original's; buffers are
    copied (a training forward updates BatchNorm's statistics in place). Nothing may write the
    copy's parameters: the planner never runs a real optimizer step on it.
    """
    memo: dict[int, Any] = {}
    for parameter in module.parameters():
        memo[id(parameter)] = torch.nn.Parameter(
            parameter.detach(), requires_grad=parameter.requires_grad
        )
    copied = copy.deepcopy(module, memo)
    for parameter in copied.parameters():
        parameter.grad = None
    return copied


def storages(value: Any) -> Iterator[torch.UntypedStorage]:
    """The storage behind every tensor in a nested value."""
    for item in tree_flatten(value)[0]:
        if isinstance(item, torch.Tensor):
            yield item.untyped_storage()
