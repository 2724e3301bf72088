"""The head and the loss run together in chunks of positions (NOTE [Loss over positions in
chunks] in :mod:`autockpt.planner.trace.output_head`).

Each chunk's scores, loss and gradients are computed in forward, one chunk at a time, and the
chunk's scores dropped before the next (NOTE [Gradients in forward]). The chunks' losses add up
to the whole loss by :meth:`LossOverPositions.shares`, and their gradients likewise.

NOTE [Losses that shift their labels]
A language model's loss is most often written the way the model's own is: the scores at
position t against the label at t + 1, either by slicing (``logits[:, :-1]`` against
``ids[:, 1:]``) or by shifting the labels and ignoring the last position (Hugging Face's
``ForCausalLMLoss``). Cut into chunks of positions as they are, both lose a term at every
chunk's end. So a loss found to shift by ``shift`` positions runs each chunk on ``shift``
positions more than the chunk's own terms, its scores and its targets alike: the slice (or the
ignored padding) drops exactly those, and the chunk's loss is the loss of its own terms, its
labels read ``shift`` positions on. The extra position's scores get no gradient from the chunk
(the loss does not read them); the next chunk, whose first term it is, gives it its own. The
chunks cover the ``positions - shift`` terms of the whole.

NOTE [The loss sees the scores alone]
Where the model returns a structure (a ``CausalLMOutput``, a dict, a tuple) the loss is given
one of the same type with each chunk's scores in the head's place and ``None`` in every other:
a loss that reads anything else of the output (an auxiliary loss, the hidden states) fails the
probe and is not chunked, since its gradient would not flow. For the same reason a loss whose
value needs gradients through any tensor but the scores (a penalty on the parameters) is not
chunked: each chunk's gradients are taken for the scores alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from autockpt.errors import PlanMismatchError
from autockpt.planner.core.output_structure import OutputSlot

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
        shift: how many positions on the loss reads a term's label (1: ``logits[:, :-1]``
            against ``ids[:, 1:]``, or labels shifted and padded inside the loss); each chunk
            runs on that many positions more (NOTE [Losses that shift their labels]).
    """

    dim: int
    reduction: Reduction
    shift: int = 0

    def terms(self, features_shape: Sequence[int]) -> int:
        """The loss's terms along the positions: every position but the last ``shift``."""
        return features_shape[self.dim] - self.shift

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
        if self.reduction == "sum":
            return [1.0] * len(spans)
        if self.reduction == "mean":
            return [length / self.terms(features_shape) for _, length in spans]
        labels = next(
            t
            for t in targets
            if self.carries_positions(t, features_shape) and not t.is_floating_point()
        )
        labelled = labels != IGNORE_INDEX
        # A term's label is ``shift`` positions on (NOTE [Losses that shift their labels]).
        counts = torch.stack([labelled.narrow(self.dim, s + self.shift, n).sum() for s, n in spans])
        # One copy to the host, then host reads (each read of a fake count is a neutral 1,
        # NOTE [Values read off fake tensors]).
        per_chunk = [int(count) for count in counts.cpu()]
        total = sum(per_chunk)
        if total == 0:  # nothing labelled: the loss of the whole is NaN, as the plain step's
            return [1.0 / len(spans)] * len(spans)
        return [count / total for count in per_chunk]


def gradient_leaves_besides(loss: torch.Tensor, scores: torch.Tensor) -> list[torch.Tensor]:
    """The tensors needing gradients that ``loss`` was computed from, other than ``scores``
    (NOTE [The loss sees the scores alone])."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        leaf = getattr(node, "variable", None)  # an AccumulateGrad node's tensor
        if leaf is not None and leaf is not scores:
            found.append(leaf)
        stack.extend(following for following, _ in node.next_functions)
    return found


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


def loss_input(slot: OutputSlot | None, scores: torch.Tensor) -> Any:
    """What the loss is given for ``scores``: them, or the model's output around them."""
    return scores if slot is None else slot.output(scores)


@dataclass(frozen=True)
class ChunkedLoss:
    """``loss_fn(head(features), *targets)`` in ``num_chunks`` chunks of positions, each
    chunk's gradients taken in forward; called with the cut model's output, whose first three
    are ``(features, weight, bias)`` (NOTE [Gradients in forward]).

    Attributes:
        loss_fn: the user's ``loss_fn(output, *targets) -> scalar``.
        num_chunks: how many chunks of positions.
        positions: how the loss adds up over them.
        slot: where the scores sit in the model's output; ``None``: the scores are the output.
    """

    loss_fn: Callable[..., torch.Tensor]
    num_chunks: int
    positions: LossOverPositions
    slot: OutputSlot | None = None

    def __call__(self, output: Any, *targets: Any) -> torch.Tensor:
        features, weight, bias = output[:3]
        loss: torch.Tensor = _GradientsInForward.apply(self, features, weight, bias, *targets)
        return loss

    def loss_and_gradients(
        self, features: torch.Tensor, weight: torch.Tensor, bias: Any, targets: Sequence[Any]
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The whole loss, and its gradients for ``features``, ``weight`` and ``bias`` (None
        for one that needs none), one chunk of scores at a time: the loss's gradient for the
        chunk's scores by autograd, the head's own by its two matrix products, added into
        one buffer each (no weight-sized tensor per chunk)."""
        rule = self.positions
        dim, shape = rule.dim, tuple(features.shape)
        spans = chunk_spans(rule.terms(shape), self.num_chunks)
        wanted = [t is not None and t.requires_grad for t in (features, weight, bias)]
        gradients: list[torch.Tensor | None] = [
            torch.zeros_like(t) if t is not None and w else None
            for t, w in zip((features, weight, bias), wanted, strict=True)
        ]
        grad_features, grad_weight, grad_bias = gradients
        total, dtype = features.new_zeros((), dtype=torch.float64), torch.float32
        checked = False
        for (start, terms), share in zip(spans, rule.shares(targets, shape, spans), strict=True):
            if share == 0.0:
                continue  # every label ignored: no loss, no gradient
            # NOTE [Losses that shift their labels]: ``shift`` positions more than its terms.
            length = terms + rule.shift
            chunk = features.narrow(dim, start, length)
            scores = F.linear(chunk, weight, bias).requires_grad_(any(wanted))
            with torch.enable_grad():
                part = self.loss_fn(
                    loss_input(self.slot, scores), *rule.piece(targets, shape, start, length)
                )
                if not checked and (others := gradient_leaves_besides(part, scores)):
                    raise PlanMismatchError(
                        f"the loss reads {len(others)} tensors that need gradients besides the "
                        "head's scores (a penalty on the parameters, a value kept from the "
                        "forward); in chunks of positions they would get none: re-plan with "
                        "allow_loss_chunks=False, or add that term outside loss_fn"
                    )
                checked = True  # one chunk's graph tells: the loss is the same code for each
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
