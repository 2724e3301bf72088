"""The head and the loss run together in chunks of positions (NOTE [Loss over positions in
chunks] in :mod:`autockpt.planner.trace.output_head`).

Each chunk's scores and loss run under non-reentrant ``torch.utils.checkpoint``: in forward
the chunk's scores and everything the loss computes from them are dropped as soon as its loss
is known; in backward they are computed again, one chunk at a time, when that chunk's gradient
arrives. The chunks' losses add up to the whole loss by :meth:`LossOverPositions.shares`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

Reduction = Literal["sum", "mean", "mean over labelled"]

#: The label a position is ignored with: ``F.cross_entropy``'s default ``ignore_index``, and
#: Hugging Face's for padding and prompts.
IGNORE_INDEX = -100


@dataclass(frozen=True)
class LossOverPositions:
    """How a loss adds up over the positions of the head's input.

    Attributes:
        dim: the positions' dimension: the one before the features (dim 1 of
            ``(batch, positions, features)``). Targets whose leading dimensions up to it are
            the features' are cut along it; other targets go whole to every chunk.
        reduction: ``"sum"``: the whole loss is the chunks' losses added; ``"mean"``: each
            weighted by its share of the positions; ``"mean over labelled"``: each weighted
            by its share of the positions whose integer label is not ``IGNORE_INDEX``
            (cross-entropy with ignored labels, with or without label smoothing).
    """

    dim: int
    reduction: Reduction

    def carries_positions(self, target: Any, features_shape: Sequence[int]) -> bool:
        """Whether ``target`` is cut along the positions with the features."""
        leading = tuple(features_shape[: self.dim + 1])
        return (
            isinstance(target, torch.Tensor)
            and target.dim() > self.dim
            and tuple(target.shape[: self.dim + 1]) == leading
        )

    def piece(
        self, targets: Sequence[Any], features_shape: Sequence[int], start: int, length: int
    ) -> list[Any]:
        """``targets`` for the positions ``start`` to ``start + length``; contiguous, as a
        loss that flattens with ``view`` needs them."""
        return [
            target.narrow(self.dim, start, length).contiguous()
            if self.carries_positions(target, features_shape)
            else target
            for target in targets
        ]

    def shares(
        self,
        targets: Sequence[Any],
        features_shape: Sequence[int],
        spans: Sequence[tuple[int, int]],
    ) -> list[float]:
        """Each chunk's weight in the whole loss (0: the chunk adds nothing and is skipped).

        For ``"mean over labelled"`` the labelled positions are counted in the first integer
        target that carries positions: one read of the device per step.
        """
        positions = features_shape[self.dim]
        if self.reduction == "sum":
            return [1.0] * len(spans)
        if self.reduction == "mean":
            return [length / positions for _, length in spans]
        labels = next(
            t
            for t in targets
            if self.carries_positions(t, features_shape) and not t.is_floating_point()
        )
        labelled = labels != IGNORE_INDEX
        counts = torch.stack([labelled.narrow(self.dim, s, n).sum() for s, n in spans])
        # One copy to the host, then host reads (each read of a fake count is a neutral 1,
        # NOTE [Values read off fake tensors]).
        per_chunk = [int(count) for count in counts.cpu()]
        total = sum(per_chunk)
        if total == 0:  # nothing labelled: the loss of the whole is NaN, as the plain step's
            return [1.0 / len(spans)] * len(spans)
        return [count / total for count in per_chunk]


def chunk_spans(positions: int, num_chunks: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each chunk: ``torch.tensor_split``'s sizes, the first chunks a
    position longer when ``num_chunks`` does not divide ``positions``."""
    size, extra = divmod(positions, num_chunks)
    spans, start = [], 0
    for index in range(min(num_chunks, positions)):
        length = size + (index < extra)
        spans.append((start, length))
        start += length
    return spans


@dataclass(frozen=True)
class ChunkedLoss:
    """``loss_fn(head(features), *targets)`` in ``num_chunks`` chunks of positions, each
    recomputed in backward; called with the cut model's output ``(features, weight, bias)``.

    Attributes:
        loss_fn: the user's ``loss_fn(logits, *targets) -> scalar``.
        num_chunks: how many chunks of positions.
        positions: how the loss adds up over them.
    """

    loss_fn: Callable[..., torch.Tensor]
    num_chunks: int
    positions: LossOverPositions

    def __call__(self, output: Any, *targets: Any) -> torch.Tensor:
        features, weight, bias = output
        dim, shape = self.positions.dim, tuple(features.shape)
        spans = chunk_spans(shape[dim], self.num_chunks)
        total: torch.Tensor | None = None
        for (start, length), share in zip(
            spans, self.positions.shares(targets, shape, spans), strict=True
        ):
            if share == 0.0:
                continue  # every label ignored: no loss, no gradient
            part = checkpoint(
                self._head_loss,
                features.narrow(dim, start, length),
                weight,
                bias,
                *self.positions.piece(targets, shape, start, length),
                use_reentrant=False,
            )
            part = part * share
            total = part if total is None else total + part
        assert total is not None, "a loss over no positions"
        return total

    def _head_loss(
        self, features: torch.Tensor, weight: torch.Tensor, bias: Any, *targets: Any
    ) -> torch.Tensor:
        return self.loss_fn(F.linear(features, weight, bias), *targets)
