"""Cutting a batch into pieces along the batch: micro-batches, and the separability probe's samples.

A batch is a sequence of positional inputs (or targets): tensors, or tuples, lists and dicts of
them, nested (``torch.utils._pytree``'s containers). The *batch size* is the dim-0 size most of its
tensors share, and a tensor *carries the batch* when its dim 0 has that size: those are cut, every
other value (a shared mask, a scalar, a flag) goes whole to every piece. Pieces are
``torch.tensor_split``'s: the first ones a sample larger when the count does not divide the batch.
Micro-batches (:func:`~autockpt.planner.training_step.training_step`, the planner's measurement of
one piece) and the separability probe (:mod:`autockpt.planner.measure.separability`) cut with these
functions, so what the probe vouches for is what training runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


def batch_size_of(values: Sequence[Any]) -> int | None:
    """The batch size of ``values``: the dim-0 size most of its tensors share (nests too;
    on a tie, the first tensor's), or ``None`` when no tensor has a dimension."""
    sizes = [int(t.shape[0]) for t in tree_flatten(list(values))[0] if _has_rows(t)]
    if not sizes:
        return None
    counts = Counter(sizes)
    return max(counts, key=lambda size: (counts[size], -sizes.index(size)))


def split_batch(
    values: Sequence[Any], pieces: int, *, batch_size: int | None = None
) -> list[list[Any]]:
    """``values`` cut into ``pieces`` along the batch (see the module docstring).

    Args:
        values: positional inputs or targets, tensors or nests of them.
        pieces: how many pieces; more than the batch size gives empty last pieces.
        batch_size: the batch size to cut (default: :func:`batch_size_of` ``values``); pass
            the inputs' when cutting targets, so that both are cut alike.

    Returns:
        One list per piece, each like ``values`` with every batch-carrying tensor replaced by
        its piece.

    Example:
        >>> first, second = split_batch(({"x": x, "mask": mask}, y), 2)
    """
    if pieces == 1:
        return [list(values)]  # the very tensors: no views for the tracker or the model
    leaves, spec = tree_flatten(list(values))
    size = batch_size if batch_size is not None else batch_size_of(values)
    cut = [
        torch.tensor_split(leaf, pieces, dim=0) if _carries(leaf, size) else None for leaf in leaves
    ]
    pairs = list(zip(leaves, cut, strict=True))
    return [
        tree_unflatten([leaf if parts is None else parts[index] for leaf, parts in pairs], spec)
        for index in range(pieces)
    ]


def take_samples(
    values: Sequence[Any], samples: slice, *, batch_size: int, copy: bool = True
) -> list[Any]:
    """``values`` with every batch-carrying tensor narrowed to ``samples``: a copy (so that
    the probe's runs share no storage with the caller's batch), or with ``copy=False`` a view."""
    leaves, spec = tree_flatten(list(values))
    return tree_unflatten(
        [
            (leaf[samples].clone() if copy else leaf[samples])
            if _carries(leaf, batch_size)
            else leaf
            for leaf in leaves
        ],
        spec,
    )


def piece_sizes(values: Sequence[Any], pieces: int, *, batch_size: int | None = None) -> list[int]:
    """How many samples each of :func:`split_batch`'s pieces holds."""
    size = batch_size if batch_size is not None else batch_size_of(values)
    if size is None:
        return [0] * pieces
    return [len(part) for part in torch.tensor_split(torch.arange(size), pieces)]


def _has_rows(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _carries(value: Any, batch_size: int | None) -> bool:
    return batch_size is not None and _has_rows(value) and value.shape[0] == batch_size
