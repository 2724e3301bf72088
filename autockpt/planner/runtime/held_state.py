"""Python state a link writes in forward, put back around its recompute (NOTE [Python state
written in forward] in :mod:`autockpt.planner.trace.python_state`).

A snapshot records which objects and tensors the lists, dicts, tuples and attributes of the
given objects hold, a few levels down (``STATE_DEPTH``), without copying a tensor; putting it
back makes every one of them hold those again, the same objects, so a cache the caller holds
is the caller's cache throughout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autockpt.planner.trace.python_state import STATE_DEPTH, python_objects


class HeldState:
    """What a set of Python objects hold (lists, dicts, attributes, a few levels down, not
    copying tensors), to put back as it was."""

    def __init__(self, objects: list[Any]) -> None:
        self.snapshots = [_snapshot(value, 0) for value in objects]

    def put_back(self) -> None:
        for snapshot in self.snapshots:
            _restore(snapshot)


def _snapshot(value: Any, depth: int) -> tuple[Any, ...]:
    if depth > STATE_DEPTH or isinstance(value, (torch.Tensor, torch.nn.Module, type)):
        return ("ref", value)
    if isinstance(value, list):
        return ("list", value, [_snapshot(v, depth + 1) for v in value])
    if isinstance(value, tuple):
        return ("tuple", value, [_snapshot(v, depth + 1) for v in value])
    if isinstance(value, dict):
        return ("dict", value, {k: _snapshot(v, depth + 1) for k, v in value.items()})
    if hasattr(value, "__dict__") and not callable(value):
        return ("object", value, {k: _snapshot(v, depth + 1) for k, v in vars(value).items()})
    return ("ref", value)


def _restore(snapshot: tuple[Any, ...]) -> Any:
    kind, value = snapshot[0], snapshot[1]
    if kind == "list":
        value[:] = [_restore(child) for child in snapshot[2]]
    elif kind == "tuple":
        for child in snapshot[2]:
            _restore(child)
    elif kind == "dict":
        restored = {k: _restore(child) for k, child in snapshot[2].items()}
        value.clear()
        value.update(restored)
    elif kind == "object":
        restored = {k: _restore(child) for k, child in snapshot[2].items()}
        value.__dict__.clear()
        value.__dict__.update(restored)
    return value


def with_state_put_back(run: Callable[..., Any], arguments: Any) -> Callable[..., Any]:
    """``run``, which a checkpoint calls in forward and again in backward, seeing the Python
    objects among ``arguments`` as its forward found them when it runs again, and leaving them
    as they were before that run (what every later forward wrote) once it is done."""
    objects = python_objects(arguments)
    if not objects:
        return run
    before = HeldState(objects)
    runs = [0]

    def guarded(*args: Any, **kwargs: Any) -> Any:
        runs[0] += 1
        if runs[0] == 1:  # forward
            return run(*args, **kwargs)
        now = HeldState(objects)
        before.put_back()
        try:
            return run(*args, **kwargs)
        finally:
            now.put_back()

    return guarded
