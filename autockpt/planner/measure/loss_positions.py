"""Whether a loss adds up over positions, and how: found by experiment (NOTE [Loss over
positions in chunks] in :mod:`autockpt.planner.trace.output_head`).

The head (the real ``nn.Linear``) runs on random features at ``PROBE_POSITIONS`` positions, the
targets cut to the same positions. The loss of all of them is compared with the losses of two
chunks weighted each way :class:`~autockpt.planner.runtime.chunked_loss.LossOverPositions`
knows; the first way that gives the whole loss is the loss's. To tell a mean over every
position from a mean over the labelled ones, the probe's integer labels have one position set
to the ignored label (if the loss refuses that, the labels are taken as they are). A loss that
shifts its labels by a position or normalises over the sequence matches no way and is not
chunked. Nothing is recorded for backward (no_grad), and nothing of the model changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from autockpt.planner.runtime.chunked_loss import (
    IGNORE_INDEX,
    LossOverPositions,
    Reduction,
)

#: Positions the probe runs the head and the loss at; its chunks are the first two positions
#: and the rest (one of the first two labelled, the rest all labelled).
PROBE_POSITIONS = 6
_CHUNKS = ((0, 2), (2, PROBE_POSITIONS - 2))
_WAYS: tuple[Reduction, ...] = ("mean over labelled", "mean", "sum")


def loss_over_positions(
    head: torch.nn.Linear,
    features_shape: Sequence[int],
    targets: Sequence[Any],
    loss_fn: Any,
) -> LossOverPositions | str:
    """How ``loss_fn(head(features), *targets)`` adds up over the positions of features
    shaped ``features_shape``, or why it does not."""
    dim = len(features_shape) - 2
    if dim < 0 or features_shape[dim] < PROBE_POSITIONS:
        return f"the head's input has fewer than {PROBE_POSITIONS} positions"
    probe = LossOverPositions(dim, "sum")
    if not any(probe.carries_positions(t, features_shape) for t in targets):
        return "no target has the positions of the head's input"
    shape = (*features_shape[:dim], PROBE_POSITIONS, features_shape[-1])
    generator = torch.Generator(device=head.weight.device).manual_seed(0)
    features = torch.randn(
        shape, generator=generator, device=head.weight.device, dtype=head.weight.dtype
    )
    positions = features_shape[dim]
    # The targets as given, at windows spread over the sequence: a position the loss leaves
    # out by a rule of its own (a padding label it masks) shows where the targets have one.
    last = positions - PROBE_POSITIONS
    windows = sorted({min(start, last) for start in (0, positions // 3, 2 * positions // 3, last)})
    given = [probe.piece(targets, features_shape, start, PROBE_POSITIONS) for start in windows]
    planted = [
        [_with_one_ignored(t, dim) if probe.carries_positions(t, shape) else t for t in trial]
        for trial in given
    ]
    labelled = any(p is not g for p, g in zip(planted[0], given[0], strict=True))
    trials = [*planted, *given] if labelled else given
    with torch.no_grad():
        try:
            ways = [
                way
                for way in (_WAYS if labelled else _WAYS[1:])
                if all(
                    _adds_up(LossOverPositions(dim, way), head, features, trial, loss_fn)
                    for trial in trials
                )
            ]
        except _NotOneNumber:
            return "the loss is not one number"
        except Exception as error:  # noqa: BLE001 - the loss's own, whatever it raises
            if labelled:
                return (
                    f"the loss refuses the ignored label {IGNORE_INDEX} "
                    f"({type(error).__name__}), so which positions it counts is not known"
                )
            return f"the loss fails on a chunk of positions ({type(error).__name__})"
    if ways:
        return LossOverPositions(dim, ways[0])
    return (
        "the loss is not a sum or a mean over positions (it mixes them: labels shifted by a "
        "position, or a normalisation over the sequence)"
    )


class _NotOneNumber(Exception):
    pass


def _adds_up(
    rule: LossOverPositions,
    head: torch.nn.Linear,
    features: torch.Tensor,
    targets: Sequence[Any],
    loss_fn: Any,
) -> bool:
    """Whether the loss of ``features`` equals its chunks' losses added up by ``rule``."""
    shape = tuple(features.shape)
    whole = loss_fn(head(features), *targets)
    if not isinstance(whole, torch.Tensor) or whole.numel() != 1:
        raise _NotOneNumber
    parts = [
        loss_fn(head(features.narrow(rule.dim, s, n)), *rule.piece(targets, shape, s, n))
        for s, n in _CHUNKS
    ]
    shares = rule.shares(targets, shape, _CHUNKS)
    total = sum(share * part for share, part in zip(shares, parts, strict=True) if share)
    # A window whose labels are all ignored has no loss (NaN) whole and in chunks alike.
    return bool(torch.allclose(torch.as_tensor(total), whole, rtol=1e-4, atol=1e-6, equal_nan=True))


def _with_one_ignored(target: torch.Tensor, dim: int) -> torch.Tensor:
    """Integer labels with position 1 ignored; other targets as they are."""
    if target.is_floating_point() or target.dtype == torch.bool:
        return target
    planted = target.clone()
    planted.narrow(dim, 1, 1).fill_(IGNORE_INDEX)
    return planted
