"""Cutting a batch into pieces along the batch: micro-batches, and the separability probe's samples.

A batch is a sequence of positional inputs (or targets): tensors, or tuples, lists and dicts of
them, nested (``torch.utils._pytree``'s containers). The *batch size* is the dim-0 size most of its
tensors share, and a tensor *carries the batch* when its dim 0 has that size: those are cut, every
other value (a shared mask, a scalar, a flag) goes whole to every piece. Pieces are
``torch.tensor_split``'s: the first ones a sample larger when the count does not divide the batch.
Micro-batches (:func:`~autockpt.planner.training_step.training_step`, the planner's measurement of
one piece) and the separability probe (:mod:`autockpt.planner.measure.separability`) cut with these
functions, so what the probe vouches for is what training runs.

NOTE [The batch's leaves, as planned]
Which tensors carry the batch is read off their dim-0 sizes, and one batch can make that
ambiguous: a ``DataLoader``'s last batch of 4 samples beside a shared ``scale`` of shape (4,)
gives both dim 0 = 4, and the scale, whole in the plain step, was cut into the micro-batches'
pieces (a wrong value in each piece's forward, or a shape that no longer broadcasts). The batch
the plan was made at says which leaves carry it: the plan records the inputs' and the targets'
structure and one flag per leaf (:func:`carrying_leaves`, ``Plan.batch_leaves``), and
:func:`~autockpt.planner.training_step.training_step` cuts a later batch by those flags where it
has the same structure (containers, dict keys in order) and its flagged leaves agree on a size
(:func:`flagged_batch_size`); otherwise (another structure, a plan saved before it recorded them)
the sizes decide, as before. A batch planned at a size a shared leaf has too stays ambiguous:
nothing in one batch tells them apart.
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


def carrying_leaves(values: Sequence[Any], batch_size: int | None) -> tuple[str, list[bool]]:
    """The tree structure of ``values`` (as ``torch.utils._pytree`` writes it: containers, dict
    keys) and one flag per leaf in ``tree_flatten``'s order: whether it carries a batch of
    ``batch_size`` (NOTE [The batch's leaves, as planned])."""
    leaves, spec = tree_flatten(list(values))
    return str(spec), [_carries(leaf, batch_size) for leaf in leaves]


def flagged_batch_size(
    values: Sequence[Any], structure: str, flags: Sequence[bool], *, size: int | None = None
) -> int | None:
    """The batch size of ``values`` as ``structure`` and ``flags`` (from
    :func:`carrying_leaves` at another batch) mark it: the dim 0 every flagged leaf shares,
    which must be ``size`` where given. ``None`` where ``values`` has another structure, a
    flagged leaf has no rows, or the flagged leaves disagree; ``size`` (or ``None``) where
    none is flagged."""
    leaves, spec = tree_flatten(list(values))
    if str(spec) != structure or len(leaves) != len(flags):
        return None
    flagged = [leaf for leaf, flag in zip(leaves, flags, strict=True) if flag]
    if not all(_has_rows(leaf) for leaf in flagged):
        return None
    sizes = {int(leaf.shape[0]) for leaf in flagged}
    if not sizes:
        return size
    if len(sizes) > 1 or (size is not None and size not in sizes):
        return None
    return sizes.pop()


def split_batch(
    values: Sequence[Any],
    pieces: int,
    *,
    batch_size: int | None = None,
    flags: Sequence[bool] | None = None,
) -> list[list[Any]]:
    """``values`` cut into ``pieces`` along the batch (see the module docstring).

    Args:
        values: positional inputs or targets, tensors or nests of them.
        pieces: how many pieces; more than the batch size gives empty last pieces.
        batch_size: the batch size to cut (default: :func:`batch_size_of` ``values``); pass
            the inputs' when cutting targets, so that both are cut alike.
        flags: which leaves to cut, one flag per leaf (NOTE [The batch's leaves, as
            planned]); given, ``batch_size`` is not read.

    Returns:
        One list per piece, each like ``values`` with every batch-carrying tensor replaced by
        its piece.

    Example:
        >>> first, second = split_batch(({"x": x, "mask": mask}, y), 2)
    """
    if pieces == 1:
        return [list(values)]  # the very tensors: no views for the tracker or the model
    leaves, spec = tree_flatten(list(values))
    if flags is None:
        size = batch_size if batch_size is not None else batch_size_of(values)
        flags = [_carries(leaf, size) for leaf in leaves]
    cut = [
        torch.tensor_split(leaf, pieces, dim=0) if flag else None
        for leaf, flag in zip(leaves, flags, strict=True)
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
