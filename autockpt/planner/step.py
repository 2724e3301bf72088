"""Running one planned training step: forward and backward over the plan's micro-batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import torch

from autockpt.planner.plan_model import Plan


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
    """Forward and backward of one batch in ``plan.num_micro_batches`` pieces.

    Every input and target is split along dim 0 into the plan's number of pieces; each piece
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

    Example:
        >>> loss = autockpt.training_step(planned, plan, batch.inputs(), (batch.target,), loss_fn)
        >>> optimizer.step(); optimizer.zero_grad()
    """
    pieces = max(plan.num_micro_batches, 1) if plan is not None else 1
    if pieces == 1:
        loss = loss_fn(model(*inputs), *targets)
        loss.backward()
        return loss.detach()
    batch = _batch_size(inputs)
    split_inputs = [_split(x, pieces) for x in inputs]
    split_targets = [_split(t, pieces) for t in targets]
    # A Python number: a tensor here would stay alive through every later piece, on top of
    # what the plan measured (one piece, nothing else held). On CUDA reading it waits for the
    # piece to finish, once per micro-batch.
    total = 0.0
    for index in range(pieces):
        piece_inputs = [parts[index] for parts in split_inputs]
        piece_targets = [parts[index] for parts in split_targets]
        size = piece_inputs[0].shape[0] if piece_inputs else 1
        weight = size / batch if loss_reduction == "mean" else 1.0
        last = index == pieces - 1
        with nullcontext() if no_sync is None or last else no_sync():
            loss = loss_fn(model(*piece_inputs), *piece_targets) * weight
            loss.backward()
        total += float(loss.detach())
        del loss
    return torch.tensor(total, dtype=torch.float32)


def _split(value: torch.Tensor, pieces: int) -> tuple[Any, ...]:
    return torch.tensor_split(value, pieces, dim=0)


def _batch_size(inputs: Sequence[torch.Tensor]) -> int:
    return int(inputs[0].shape[0]) if inputs else 1
