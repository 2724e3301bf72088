"""Whether a loss adds up over positions, and how: found by experiment (NOTE [Loss over
positions in chunks] in :mod:`autockpt.planner.trace.output_head`).

The head (the real ``nn.Linear``) runs on random features at ``PROBE_POSITIONS`` positions, the
targets cut to the same positions, and the loss is given the scores as the model gives them
(in its output's structure, NOTE [The loss sees the scores alone]). The loss of all of them is
compared with the losses of two chunks weighted each way
:class:`~autockpt.planner.runtime.chunked_loss.LossOverPositions` knows, with the labels read
where they are or a position on (NOTE [Losses that shift their labels]); the first way that
gives the whole loss is the loss's. To tell a mean over every position from a mean over the
labelled ones, the probe's integer labels have one position set to the ignored label (if the
loss refuses that, the labels are taken as they are). A loss that normalises over the sequence
matches no way and is not chunked, nor one that reads more of the output than the scores or
needs gradients for anything else. Nothing is recorded for the model's backward, and nothing
of the model changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from autockpt.planner.runtime.chunked_loss import (
    IGNORE_INDEX,
    LossOverPositions,
    OutputSlot,
    Reduction,
    gradient_leaves_besides,
    loss_input,
)

#: Positions the probe runs the head and the loss at; its chunks are the first two terms and
#: the rest (one of the first two labelled, the rest all labelled).
PROBE_POSITIONS = 6
_WAYS: tuple[Reduction, ...] = ("mean over labelled", "mean", "sum")
#: Samples whose windows the probe tries (each alone: one sample's scores at a time).
PROBE_SAMPLES = 16
#: How many positions on a loss may read its labels (NOTE [Losses that shift their labels]).
_SHIFTS = (0, 1)


def loss_over_positions(
    head: torch.nn.Linear,
    features_shape: Sequence[int],
    targets: Sequence[Any],
    loss_fn: Any,
    slot: OutputSlot | None = None,
) -> LossOverPositions | str:
    """How ``loss_fn(output, *targets)``, the output the head's scores for features shaped
    ``features_shape`` (in ``slot`` of the model's output), adds up over the positions, or
    why it does not."""
    dim = len(features_shape) - 2
    if dim < 0 or features_shape[dim] < PROBE_POSITIONS:
        return f"the head's input has fewer than {PROBE_POSITIONS} positions"
    probe = LossOverPositions(dim, "sum")
    if not any(probe.carries_positions(t, features_shape) for t in targets):
        return (
            "no target has the positions of the head's input (pass the labels, one a position, "
            "as a target: loss_fn(output, labels), not closed over or cut to the loss's terms)"
        )
    # Scores drawn in float64, not made by the head: the sums compare to float32's rounding
    # (a loss's own ``.float()``), whatever the head's precision (NOTE [Probing in float64]).
    # One sample at a time: planning holds the probe's real scores, their gradient and the
    # loss's own copies, all a vocabulary wide (a loss that normalises each sample by its own
    # count is not told apart from one over the batch; NOTE [Probing in float64]).
    shape = (*([1] * dim), PROBE_POSITIONS, head.out_features)
    device = head.weight.device
    generator = torch.Generator(device=device).manual_seed(0)
    scores = torch.randn(shape, generator=generator, device=device, dtype=torch.float64)
    positions = features_shape[dim]
    # The targets as given, at windows spread over the sequence: a position the loss leaves
    # out by a rule of its own (a padding label it masks) shows where the targets have one.
    last = positions - PROBE_POSITIONS
    windows = sorted({min(start, last) for start in (0, positions // 3, 2 * positions // 3, last)})
    # Each sample's windows apart (at most ``PROBE_SAMPLES``), one sample's scores at a time.
    window = (*features_shape[:dim], PROBE_POSITIONS, features_shape[-1])
    samples = range(min(features_shape[0], PROBE_SAMPLES)) if dim else range(1)
    given = [
        [
            _one_sample(t, dim, sample) if probe.carries_positions(t, window) else t
            for t in probe.piece(targets, features_shape, start, PROBE_POSITIONS)
        ]
        for sample in samples
        for start in windows
    ]
    planted = [
        [_with_one_ignored(t, dim) if probe.carries_positions(t, shape) else t for t in trial]
        for trial in given
    ]
    labelled = any(p is not g for p, g in zip(planted[0], given[0], strict=True))
    trials = [*planted, *given] if labelled else given
    rules = [
        LossOverPositions(dim, way, shift)
        for shift in _SHIFTS
        for way in (_WAYS if labelled else _WAYS[1:])
    ]
    try:
        if others := _gradient_leaves(scores, trials[0], loss_fn, slot):
            return (
                f"the loss needs gradients for {len(others)} tensors besides the head's scores "
                "(a penalty on the parameters, a value kept from the forward); add that term "
                "outside loss_fn"
            )
        rule = next(
            (
                rule
                for rule in rules
                if all(_adds_up(rule, scores, trial, loss_fn, slot) for trial in trials)
            ),
            None,
        )
    except _NotOneNumber:
        return "the loss is not one number"
    except Exception as error:  # noqa: BLE001 - the loss's own, whatever it raises
        if labelled:
            return (
                f"the loss refuses the ignored label {IGNORE_INDEX} or reads more of the output "
                f"than the head's scores ({type(error).__name__}: {_first_line(error)})"
            )
        return (
            "the loss fails on a chunk of positions or reads more of the output than the head's "
            f"scores ({type(error).__name__}: {_first_line(error)})"
        )
    if rule is not None:
        return rule
    return (
        "the loss is not a sum or a mean over positions, with its labels where the scores "
        "are or a position on (it normalises over the sequence, or slices positions away)"
    )


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0][:120] if text else ""


class _NotOneNumber(Exception):
    pass


def _gradient_leaves(
    scores: torch.Tensor, targets: Sequence[Any], loss_fn: Any, slot: OutputSlot | None
) -> list[torch.Tensor]:
    """What the loss needs gradients for besides the scores (NOTE [The loss sees the scores
    alone])."""
    scores = scores.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(loss_input(slot, scores), *targets)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise _NotOneNumber
    return gradient_leaves_besides(loss, scores) if loss.grad_fn is not None else []


def _loss_and_gradient(
    scores: torch.Tensor, targets: Sequence[Any], loss_fn: Any, slot: OutputSlot | None
) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """The loss of ``scores`` and its gradient for them (zeros where it reads none), both in
    float64, and the precision the loss computed in (its own ``.float()`` or not)."""
    scores = scores.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(loss_input(slot, scores), *targets)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise _NotOneNumber
        loss = loss.reshape(())
        found = loss.requires_grad and torch.autograd.grad(loss, scores, allow_unused=True)[0]
    gradient = found if isinstance(found, torch.Tensor) else torch.zeros_like(scores)
    return loss.detach().double(), gradient.double(), loss.dtype


def _adds_up(
    rule: LossOverPositions,
    scores: torch.Tensor,
    targets: Sequence[Any],
    loss_fn: Any,
    slot: OutputSlot | None,
) -> bool:
    """Whether the loss of ``scores`` and its gradient equal its chunks' added up by ``rule``.

    NOTE [Probing in float64]
    A term weighted wrongly in chunks can be small beside the rest of the loss (a z-loss at
    1e-4 over every position beside a cross-entropy over the labelled ones was 1e-4 of the
    loss, inside float32's tolerance for sums, and was taken for a mean over labelled), and a
    term can have no value at all and a gradient (a straight-through estimator's
    ``x - x.detach()``). So the scores are float64 and both the loss and its gradient for every
    score are compared. A loss
    that stays in float64 is compared to float64's rounding (a z-loss at 1e-5 shows in the
    gradients); one that casts to float32 itself (``.float()``) only to float32's, where a
    term under about 1e-5 of the loss is within rounding whichever way it is weighted, and so
    are the gradients it would move.
    """
    shape = tuple(scores.shape)
    whole, want, precision = _loss_and_gradient(scores, targets, loss_fn, slot)
    first = 2
    spans = [(0, first), (first, rule.terms(shape) - first)]
    total, got = torch.zeros((), dtype=torch.float64, device=scores.device), torch.zeros_like(want)
    for (start, terms), share in zip(spans, rule.shares(targets, shape, spans), strict=True):
        if not share:
            continue
        length = terms + rule.shift
        window = rule.piece(targets, shape, start, length)
        part, gradient, _ = _loss_and_gradient(
            scores.narrow(rule.dim, start, length), window, loss_fn, slot
        )
        total = total + share * part
        got.narrow(rule.dim, start, length).add_(share * gradient)
    # A window whose labels are all ignored has no loss (NaN) whole and in chunks alike.
    if whole.isnan():
        return bool(total.isnan())
    scale = float(want.abs().max()) or 1.0
    rounding = 1e-9 if precision == torch.float64 else 1e-5
    return bool(
        torch.allclose(total, whole, rtol=rounding, atol=1e-9)
        and torch.allclose(got, want, rtol=rounding, atol=rounding * 0.1 * scale)
    )


def _one_sample(target: torch.Tensor, dim: int, sample: int) -> torch.Tensor:
    """``target`` cut to one ``sample`` of its first dimension and the first entry of the
    others before ``dim``."""
    for leading in range(dim):
        target = target.narrow(leading, sample if leading == 0 else 0, 1)
    return target


def _with_one_ignored(target: torch.Tensor, dim: int) -> torch.Tensor:
    """Integer labels with position 1 ignored; other targets as they are."""
    if target.is_floating_point() or target.dtype == torch.bool:
        return target
    planted = target.clone()
    planted.narrow(dim, 1, 1).fill_(IGNORE_INDEX)
    return planted
