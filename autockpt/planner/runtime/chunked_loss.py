"""The head and the loss run together in chunks of positions (NOTE [Loss over positions in
chunks] in :mod:`autockpt.planner.trace.output_head`).

Each chunk's scores, loss and gradients are computed in forward, one chunk at a time, and the
chunk's scores dropped before the next (NOTE [Gradients in forward]). The chunks' losses add up
to the whole loss by :meth:`LossOverPositions.shares`, and their gradients likewise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

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
    chunk's gradients taken in forward; called with the cut model's output
    ``(features, weight, bias)`` (NOTE [Gradients in forward]).

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
        loss: torch.Tensor = _GradientsInForward.apply(self, features, weight, bias, *targets)
        return loss

    def loss_and_gradients(
        self, features: torch.Tensor, weight: torch.Tensor, bias: Any, targets: Sequence[Any]
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The whole loss, and its gradients for ``features``, ``weight`` and ``bias`` (None
        for one that needs none), one chunk of scores at a time: the loss's gradient for the
        chunk's scores by autograd, the head's own by its two matrix products, added into
        one buffer each (no weight-sized tensor per chunk)."""
        dim, shape = self.positions.dim, tuple(features.shape)
        spans = chunk_spans(shape[dim], self.num_chunks)
        wanted = [t is not None and t.requires_grad for t in (features, weight, bias)]
        gradients: list[torch.Tensor | None] = [
            torch.zeros_like(t) if t is not None and w else None
            for t, w in zip((features, weight, bias), wanted, strict=True)
        ]
        grad_features, grad_weight, grad_bias = gradients
        total, dtype = features.new_zeros((), dtype=torch.float64), torch.float32
        for (start, length), share in zip(
            spans, self.positions.shares(targets, shape, spans), strict=True
        ):
            if share == 0.0:
                continue  # every label ignored: no loss, no gradient
            chunk = features.narrow(dim, start, length)
            scores = F.linear(chunk, weight, bias).requires_grad_(any(wanted))
            with torch.enable_grad():
                part = self.loss_fn(scores, *self.positions.piece(targets, shape, start, length))
                part = part * share
                found = torch.autograd.grad(part, scores) if any(wanted) else None
            total += part.detach().double()
            dtype = part.dtype
            del scores, part
            if found is None:
                continue
            rows = found[0].reshape(-1, found[0].shape[-1])  # (chunk positions, vocabulary)
            if grad_features is not None:
                grad_features.narrow(dim, start, length).add_(found[0] @ weight.to(found[0].dtype))
            if grad_weight is not None:
                inputs = chunk.reshape(-1, chunk.shape[-1])
                grad_weight.addmm_(rows.t().to(grad_weight.dtype), inputs.to(grad_weight.dtype))
            if grad_bias is not None:
                grad_bias.add_(rows.sum(0).to(grad_bias.dtype))
        return total.to(dtype), gradients


class _GradientsInForward(torch.autograd.Function):
    """NOTE [Gradients in forward]
    The chunks' scores are computed once: in forward each chunk's loss and its gradients for
    the features, the weight and the bias are taken at once (``torch.autograd.grad`` on the
    chunk), and the scores, their log-probabilities and their gradients are dropped before the
    next chunk. Backward only scales what forward kept, the head's gradients (a features-sized
    tensor, a weight-sized one), by the gradient that reaches the loss: whatever the caller
    does with the loss (a weight, a sum with another term) multiplies it by one number, so the
    gradients scale with it. Recomputing each chunk in backward (``torch.utils.checkpoint``)
    ran the head's forward twice: the Llama-style decoder at 1 x 2048 tokens took 1.35x the
    plain step that way, as plain steps take here without it. A second backward through the
    loss (``create_graph``) is not supported.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        chunked: ChunkedLoss,
        features: torch.Tensor,
        weight: torch.Tensor,
        bias: Any,
        *targets: Any,
    ) -> torch.Tensor:
        loss, gradients = chunked.loss_and_gradients(features, weight, bias, targets)
        ctx.num_targets = len(targets)
        ctx.present = [g is not None for g in gradients]
        ctx.save_for_backward(*(g for g in gradients if g is not None))
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        saved = iter(ctx.saved_tensors)
        scaled = [next(saved) * grad_output if present else None for present in ctx.present]
        return (None, *scaled, *([None] * ctx.num_targets))
