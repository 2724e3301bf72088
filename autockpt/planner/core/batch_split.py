"""A batch: cutting it into pieces along the batch (micro-batches, the separability probe's
samples), and its shapes, which say whether a plan holds for it.

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

The batch's shapes: :func:`batch_shapes` records the structure of its inputs and targets and
the shape of each tensor leaf; :meth:`BatchShapes.covers` says whether a plan made at one batch
holds for another (NOTE [Shapes a plan holds for]); :func:`padded_to` grows a batch to larger
shapes by repeating its own values, so that a plan can be made for a shape no batch has had yet.

NOTE [Shapes a plan holds for]
A step's memory grows with every dimension of the batch (samples, positions, variables,
pixels): each activation's size is a product of them, and no op of a training step keeps less
for a longer input. So a plan measured at shapes S fits every batch whose tensors are no
larger than S along each dimension, with the same number of dimensions: its segments keep no
more, its chunks and micro-batches hold no larger pieces (a piece count above the batch's size
is cut down to it; :func:`~autockpt.planner.training_step.training_step` and the chunk runners
never run an empty piece). A batch larger along any dimension is outside the plan: the step it
would run was never measured, and what it takes is unknown (a GPT-2 fine-tune planned at 32
tokens took 1.67x the budget at 384). A batch of another structure (a dict with other keys)
is compared by its batch size alone, the one dimension every plan knows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_unflatten

from autockpt.errors import ConfigError


def batch_size_of(values: Sequence[Any]) -> int | None:
    """The batch size of ``values``: the dim-0 size most of its tensors share (nests too;
    on a tie, the first tensor's), or ``None`` when no tensor has a dimension."""
    return _most_common([int(t.shape[0]) for t in tree_flatten(list(values))[0] if _has_rows(t)])


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


#: A tensor leaf's dimension: (its index among the batch's leaves, the dimension).
LeafDim = tuple[int, int]


class BatchShapes(BaseModel):
    """The tree structure of a batch's inputs and targets and the shape of each leaf (NOTE
    [Shapes a plan holds for]); saved in the plan as ``Plan.batch_shapes``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    structure: str
    """``torch.utils._pytree``'s spec of ``(inputs, targets)``: containers and dict keys."""
    names: list[str]
    """Each leaf's path in the batch, as ``inputs[0]['input_ids']``."""
    shapes: list[list[int] | None]
    """Each leaf's shape; ``None`` for a value that is not a tensor."""
    batch_size: int | None
    """The dim-0 size most of the tensors share."""

    def covers(self, other: BatchShapes) -> bool:
        """Whether a plan made at these shapes holds for a batch of ``other``'s: the same
        structure and every tensor no larger along any dimension, or, for another structure,
        a batch size no larger (NOTE [Shapes a plan holds for])."""
        if other.structure != self.structure:
            return (other.batch_size or 0) <= (self.batch_size or 0)
        return all(
            mine is None or theirs is None or _no_larger(theirs, mine)
            for mine, theirs in zip(self.shapes, other.shapes, strict=True)
        )

    def size(self, leaf: int, dim: int) -> int:
        """The size of dimension ``dim`` of leaf ``leaf`` (a tensor's)."""
        shape = self.shapes[leaf]
        assert shape is not None, (leaf, self.names[leaf])
        return shape[dim]

    def num_elements(self) -> int:
        """Elements in all the tensors: which of several plans that cover a batch is the
        smallest."""
        total = 0
        for shape in self.shapes:
            if shape is not None:
                total += int(torch.Size(shape).numel())
        return total

    def differing_dims(self, other: BatchShapes) -> set[LeafDim]:
        """The leaf dimensions whose sizes differ from ``other``'s (same structure only)."""
        if other.structure != self.structure:
            return set()
        found: set[LeafDim] = set()
        for leaf, (mine, theirs) in enumerate(zip(self.shapes, other.shapes, strict=True)):
            if mine is None or theirs is None or len(mine) != len(theirs):
                continue
            pairs = enumerate(zip(mine, theirs, strict=True))
            found.update((leaf, dim) for dim, (a, b) in pairs if a != b)
        return found

    def resized(self, sizes: dict[LeafDim, int]) -> BatchShapes:
        """These shapes with each ``(leaf, dim)`` in ``sizes`` set to its size."""
        shapes = [list(shape) if shape is not None else None for shape in self.shapes]
        for (leaf, dim), size in sizes.items():
            shape = shapes[leaf]
            assert shape is not None and dim < len(shape), (leaf, dim)
            shape[dim] = size
        return self.model_copy(update={"shapes": shapes, "batch_size": _batch_size(shapes)})

    def text(self, *, max_leaves: int = 4) -> str:
        """The tensors' shapes for a line: ``input_ids 8x384, labels 8x384``."""
        shown = [
            f"{_short(name)} {'x'.join(map(str, shape)) or 'scalar'}"
            for name, shape in zip(self.names, self.shapes, strict=True)
            if shape is not None
        ]
        more = len(shown) - max_leaves
        return ", ".join(shown[:max_leaves]) + (f" and {more} more" if more > 0 else "")


def batch_shapes(inputs: Sequence[Any], targets: Sequence[Any] = ()) -> BatchShapes:
    """The structure and the tensors' shapes of a batch (NOTE [Shapes a plan holds for])."""
    with_paths, spec = tree_flatten_with_path((list(inputs), list(targets)))
    names = [_name(path) for path, _ in with_paths]
    shapes = [
        [int(size) for size in leaf.shape] if isinstance(leaf, torch.Tensor) else None
        for _, leaf in with_paths
    ]
    return BatchShapes(
        structure=str(spec), names=names, shapes=shapes, batch_size=_batch_size(shapes)
    )


def padded_to(
    inputs: Sequence[Any], targets: Sequence[Any], shapes: BatchShapes
) -> tuple[list[Any], list[Any]]:
    """The batch grown to ``shapes`` (its own structure, no smaller anywhere): each tensor
    repeated along each dimension it must grow in, its values in their order again and again,
    so token ids stay ids, masks stay masks and labels stay labels."""
    leaves, spec = tree_flatten((list(inputs), list(targets)))
    grown = [
        _repeated_to(leaf, shape) if isinstance(leaf, torch.Tensor) and shape is not None else leaf
        for leaf, shape in zip(leaves, shapes.shapes, strict=True)
    ]
    padded_inputs, padded_targets = tree_unflatten(grown, spec)
    return list(padded_inputs), list(padded_targets)


def read_max_shape(value: Sequence[int] | None) -> tuple[int, ...] | None:
    """A declared maximum as given (a tuple or list of sizes), checked.

    Raises:
        ConfigError: not a non-empty sequence of positive sizes.
    """
    if value is None:
        return None
    shape = tuple(value) if isinstance(value, (tuple, list)) else ()
    if not shape or any(not isinstance(size, int) or size < 1 for size in shape):
        raise ConfigError(
            f"max_shape={value!r} is not a tuple of positive sizes; pass the batch's leading "
            "dimensions at their largest, e.g. max_shape=(16, 2048)"
        )
    return shape


def grown_to(
    max_shape: Sequence[int], inputs: Sequence[Any], targets: Sequence[Any]
) -> tuple[list[Any], list[Any]]:
    """An example batch grown to a declared maximum (``plan(..., max_shape=...)``).

    Raises:
        ConfigError: ``max_shape`` is not a tuple of sizes, or the batch is larger than it.
    """
    maximum = read_max_shape(max_shape)
    assert maximum is not None
    shapes = batch_shapes(inputs, targets)
    sizes = declared_sizes(shapes, maximum)
    if any(shapes.size(leaf, dim) > size for (leaf, dim), size in sizes.items()):
        raise ConfigError(
            f"the example batch ({shapes.text()}) is larger than max_shape="
            f"{tuple(max_shape)}; pass a max_shape at least as large as every batch"
        )
    return padded_to(inputs, targets, shapes.resized(sizes))


def declared_sizes(shapes: BatchShapes, maximum: Sequence[int]) -> dict[LeafDim, int]:
    """The size each leaf dimension may reach (at most) under a declared maximum of the batch's leading
    dimensions (``(16, 2048)``: 16 samples of 2048 positions), for a batch of ``shapes``.

    The reference is the batch's first tensor that carries it with the most dimensions; its
    dimension ``d`` below ``len(maximum)`` goes up to ``maximum[d]``, and so does every
    dimension of another tensor of the same size (labels beside ids, a ``(T, T)`` mask),
    the same dimension index first where two bounded sizes coincide.
    """
    reference = _reference(shapes)
    if reference is None:
        return {}
    bounded = min(len(maximum), len(reference))
    by_size: dict[int, int] = {}
    for dim in reversed(range(bounded)):
        by_size[reference[dim]] = maximum[dim]
    sizes: dict[LeafDim, int] = {}
    for leaf, shape in enumerate(shapes.shapes):
        for dim, size in enumerate(shape or ()):
            if dim < bounded and size == reference[dim]:
                sizes[(leaf, dim)] = maximum[dim]
            elif size in by_size:
                sizes[(leaf, dim)] = by_size[size]
    return sizes


def _repeated_to(tensor: torch.Tensor, shape: Iterable[int]) -> torch.Tensor:
    for dim, size in enumerate(shape):
        have = tensor.shape[dim]
        if size > have and have > 0:
            rows = torch.arange(size, device=tensor.device) % have
            tensor = tensor.index_select(dim, rows)
    return tensor


def _no_larger(shape: Sequence[int], bound: Sequence[int]) -> bool:
    return len(shape) == len(bound) and all(a <= b for a, b in zip(shape, bound, strict=True))


def _batch_size(shapes: Sequence[list[int] | None]) -> int | None:
    """The dim-0 size most tensors share (on a tie, the first tensor's)."""
    return _most_common([shape[0] for shape in shapes if shape])


def _most_common(sizes: list[int]) -> int | None:
    """The size most often in ``sizes`` (on a tie, the first), or ``None`` for none."""
    if not sizes:
        return None
    counts = Counter(sizes)
    return max(counts, key=lambda size: (counts[size], -sizes.index(size)))


def _reference(shapes: BatchShapes) -> list[int] | None:
    """The shape of the first tensor carrying the batch with the most dimensions."""
    carrying = [shape for shape in shapes.shapes if shape and shape[0] == shapes.batch_size]
    return max(carrying, key=len) if carrying else None


def _name(path: Any) -> str:
    text = keystr(path)
    return ("inputs" if text.startswith("[0]") else "targets") + text[3:]


def _short(name: str) -> str:
    """``inputs[0]['input_ids']`` -> ``input_ids``; ``inputs[1]`` stays."""
    last = name.rsplit("[", 1)[-1].rstrip("]")
    return last.strip("'\"") if last.startswith(("'", '"')) else name


def beyond_plan(planned: BatchShapes, given: BatchShapes, ways_out: str) -> str:
    """The one line that refuses a batch outside its plan: both shapes and ``ways_out``."""
    return f"batch {given.text()} is larger than the plan's {planned.text()}; {ways_out}"


def suggested_maximum(*seen: BatchShapes) -> tuple[int, ...]:
    """A ``max_shape`` that bounds every batch in ``seen``: the largest size of each dimension
    of the tensor that carries the batch with the most dimensions."""
    widest: list[int] = []
    for shapes in seen:
        reference = _reference(shapes)
        if reference is None:
            continue
        if len(reference) > len(widest):
            widest += reference[len(widest) :]
        padded = reference + widest[len(reference) :]
        widest = [max(a, b) for a, b in zip(widest, padded, strict=True)]
    return tuple(widest)
