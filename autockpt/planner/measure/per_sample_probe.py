"""Comparing a run on a few samples with runs on each sample alone (NOTE [Batch separability]).

The probe runs a model (or a segment, or one graph node) on ``PROBE_BATCHES[0]`` samples, on
``PROBE_BATCHES[1]`` samples, and on each of the first ones alone. A value *carries the batch*
in the dimension whose size follows the batch between the two larger runs (rows per sample
equal: dim 0 of ``(B, T, H)``, dim 1 of ``(T, B, H)`` or of a variable-major
``(V, B * T, E)``); sample ``j`` is the ``j``-th equal slice of that dimension.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import torch

#: Samples in the two probe batches.
PROBE_BATCHES = (3, 2)


def batch_dim(first: Any, second: Any) -> int | None:
    """The dimension whose size follows the batch between the two probe runs, or None."""
    if not isinstance(first, torch.Tensor) or not isinstance(second, torch.Tensor):
        return None
    if first.dim() != second.dim():
        return None
    big, small = PROBE_BATCHES
    for dim, (a, b) in enumerate(zip(first.shape, second.shape, strict=True)):
        if a != b and a % big == 0 and b % small == 0 and a // big == b // small:
            return dim
    return None


def sample_of(value: Any, dim: int | None, sample: int) -> Any:
    """Sample ``sample``'s slice of ``value`` (a run on ``PROBE_BATCHES[0]`` samples) along
    ``dim``; ``value`` itself when ``dim`` is None."""
    if dim is None:
        return value
    rows = value.shape[dim] // PROBE_BATCHES[0]
    return value.narrow(dim, sample * rows, rows)


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nest of tuples, lists, dicts and dataclasses (a model's output)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_in(item)]
    return []


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal shapes and values, up to the rounding of kernels that block by batch size."""
    if got.shape != want.shape:
        return False
    if not (got.is_floating_point() or got.is_complex()):
        return bool(torch.equal(got, want.to(got.dtype)))
    return bool(torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-5))


def agrees(
    full: Any,
    second: Any,
    alone: Sequence[Any],
    *,
    unbatched: Literal["equal", "skip"],
) -> bool:
    """Whether every tensor of ``full`` agrees with the runs of each sample ``alone``.

    Args:
        full: a value of the run on ``PROBE_BATCHES[0]`` samples (a tensor or a nest).
        second: the same value of the run on ``PROBE_BATCHES[1]`` samples (for batch dims).
        alone: the same value of the run on each sample alone, in order.
        unbatched: what a tensor that does not carry the batch must do: be equal in every
            run (``"equal"``), or nothing (``"skip"``: the loss check covers it).
    """
    tensors = tensors_in(full)
    others = tensors_in(second)
    if len(others) != len(tensors):
        return False
    dims = [batch_dim(a, b) for a, b in zip(tensors, others, strict=True)]
    for sample, value in enumerate(alone):
        singles = tensors_in(value)
        if len(singles) != len(tensors):
            return False
        for whole, single, dim in zip(tensors, singles, dims, strict=True):
            if dim is None and unbatched == "skip":
                continue
            if not close(single, sample_of(whole, dim, sample)):
                return False
    return True
