"""Copies of a module on fake tensors: shapes and bytes without memory or time."""

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


def storages(value: Any) -> Iterator[torch.UntypedStorage]:
    """The storage behind every tensor in a nested value."""
    for item in tree_flatten(value)[0]:
        if isinstance(item, torch.Tensor):
            yield item.untyped_storage()
