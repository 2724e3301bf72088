"""Running one planned training step: forward and backward over the plan's micro-batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import torch

from autockpt.errors import ShapeError
from autockpt.planner.core.batch_split import (
    batch_shapes,
    batch_size_of,
    beyond_plan,
    flagged_batch_size,
    piece_sizes,
    split_batch,
    suggested_maximum,
)
from autockpt.planner.loss_chunks import chunked_loss_of
from autockpt.planner.plan_types import Plan
from autockpt.planner.runtime.head_cut import features_before_head


def training_step(
    model: torch.nn.Module,
    plan: Plan | None,
    inputs: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    loss_fn: Callable[..., torch.Tensor],
    *,
    loss_reduction: Literal["mean", "sum"] = "mean",
    no_sync: Callable[[], AbstractContextManager[Any]] | None = None,
) -> torch.Tensor:
    """Forward and backward of one batch in ``plan.num_micro_batches`` pieces, with the head
    and the loss in chunks of positions where the plan says so (``plan.loss_chunks``, NOTE
    [Loss over positions in chunks]).

    Every tensor of the inputs and targets that carries the batch (those that did at the
    batch the plan was made at, ``plan.batch_leaves``; for another structure, those whose dim
    0 is the most common dim-0 size; inside tuples, lists and dicts too) is split along dim 0
    into the plan's number of pieces (at most one a sample), and other values go whole to every piece; each piece
    runs forward, ``loss_fn(output, *targets)`` and backward, and the gradients add up in the
    parameters' ``.grad``. With ``loss_reduction="mean"`` each piece's loss is weighted by its
    share of the batch, so the gradients equal those of one pass over the whole batch (up to
    float rounding; with dropout on, each piece draws its own masks). The caller clips and
    steps the optimizer.

    Args:
        model: the planned model (from :func:`autockpt.apply`) or any model.
        plan: its plan; ``None`` runs the batch in one piece.
        inputs: the model's positional inputs for the whole batch.
        targets: what ``loss_fn`` compares against, for the whole batch.
        loss_fn: ``loss_fn(output, *targets) -> scalar``, a mean or a sum over samples.
        loss_reduction: whether ``loss_fn`` averages (``"mean"``) or adds (``"sum"``) samples.
        no_sync: a context that defers gradient synchronisation, such as
            ``DistributedDataParallel.no_sync``; every piece but the last runs inside it, so the
            gradients are synchronised once per step. ``None``: nothing is deferred.

    Returns:
        The whole batch's loss, detached.

    Raises:
        ShapeError: the batch is larger along some dimension than the one the plan was made
            for (``plan.batch_shapes``, NOTE [Shapes a plan holds for]): its step was never
            measured. Plan for the largest (``autockpt.plan(..., max_shape=...)``) or let
            :class:`autockpt.ShapePlanner` plan each shape.

    Example:
        >>> loss = autockpt.training_step(planned, plan, batch.inputs(), (batch.target,), loss_fn)
        >>> optimizer.step(); optimizer.zero_grad()
    """
    _check_shapes(plan, inputs, targets)
    pieces = max(plan.num_micro_batches, 1) if plan is not None else 1
    if pieces > 1:
        # Every tensor that carries the batch is cut, in nests too (core.batch_split).
        batch, (input_flags, target_flags) = _batch_cut(plan, inputs, targets)
        pieces = min(pieces, batch)  # a smaller batch: no empty piece (NOTE [Shapes a plan ...])
    if pieces == 1:
        loss = _loss(model, plan, inputs, targets, loss_fn)
        _backward(loss)
        return loss.detach()
    split_inputs = split_batch(inputs, pieces, batch_size=batch, flags=input_flags)
    split_targets = split_batch(targets, pieces, batch_size=batch, flags=target_flags)
    sizes = piece_sizes(inputs, pieces, batch_size=batch)
    # A Python number: a tensor here would stay alive through every later piece, on top of
    # what the plan measured (one piece, nothing else held). On CUDA reading it waits for the
    # piece to finish, once per micro-batch.
    total = 0.0
    for index in range(pieces):
        piece_inputs, piece_targets = split_inputs[index], split_targets[index]
        weight = sizes[index] / batch if loss_reduction == "mean" else 1.0
        last = index == pieces - 1
        with nullcontext() if no_sync is None or last else no_sync():
            loss = _loss(model, plan, piece_inputs, piece_targets, loss_fn) * weight
            _backward(loss)
        total += float(loss.detach())
        del loss
    return torch.tensor(total, dtype=torch.float32)


def _backward(loss: torch.Tensor) -> None:
    """``loss.backward()``, autocast's cast weights released first.

    NOTE [Autocast's weight cache]
    Under ``torch.autocast`` each parameter's low-precision copy is cast once and cached until
    the outermost autocast context exits. A loop that runs its whole step inside one (the
    trainer does, as many loops do) kept every cast weight alive through backward, where the
    planner's step (forward under autocast, backward after it) frees each as backward passes
    the op that saved it: an MLP of eight 1024-wide layers at bf16 peaked 16.8 MB over its
    prediction on the CPU, exactly its bf16 weights. Clearing the cache before backward leaves
    the copies autograd saved, and frees each once its op is done, as planned; the next
    forward casts again (the values are the same).
    """
    torch.clear_autocast_cache()
    loss.backward()


def _check_shapes(plan: Plan | None, inputs: Sequence[Any], targets: Sequence[Any]) -> None:
    """Refuse a batch larger than the plan's (NOTE [Shapes a plan holds for])."""
    if plan is None or plan.batch_shapes is None:
        return
    given = batch_shapes(inputs, targets)
    if not plan.batch_shapes.covers(given):
        maximum = suggested_maximum(given, plan.batch_shapes)
        raise ShapeError(
            beyond_plan(
                plan.batch_shapes,
                given,
                f"plan for the largest batch (autockpt.plan(..., max_shape={maximum})), or "
                "let autockpt.ShapePlanner plan each new shape before its step",
            )
        )


def _batch_cut(
    plan: Plan | None, inputs: Sequence[Any], targets: Sequence[Any]
) -> tuple[int, tuple[list[bool] | None, list[bool] | None]]:
    """The batch size and which leaves of the inputs and targets to cut: as the plan's batch
    had them (NOTE [The batch's leaves, as planned]) where this batch has the same structure
    and the flagged leaves agree on a size, else (``None``) as their dim-0 sizes say."""
    leaves = plan.batch_leaves if plan is not None else None
    if leaves is not None:
        size = flagged_batch_size(inputs, leaves.inputs_structure, leaves.inputs)
        if size is not None and size == flagged_batch_size(
            targets, leaves.targets_structure, leaves.targets, size=size
        ):
            return size, (leaves.inputs, leaves.targets)
    return batch_size_of(inputs) or 1, (None, None)


def _loss(
    model: torch.nn.Module,
    plan: Plan | None,
    inputs: Sequence[Any],
    targets: Sequence[Any],
    loss_fn: Callable[..., torch.Tensor],
) -> torch.Tensor:
    """``loss_fn(model(*inputs), *targets)``; with ``plan.loss_chunks``, the model's head and
    the loss in chunks of positions (NOTE [Loss over positions in chunks])."""
    if plan is None or plan.loss_chunks is None:
        return loss_fn(model(*inputs), *targets)
    cut = features_before_head(model, inputs, plan.loss_chunks.head)
    if cut is None:  # the model's own forward runs (a flag or an argument the graph froze)
        return loss_fn(model(*inputs), *targets)
    head_input, slot = cut
    return chunked_loss_of(plan, loss_fn, slot)(head_input, *targets)
