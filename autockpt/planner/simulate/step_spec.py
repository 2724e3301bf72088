"""The training step a plan is for, as one value every stage of planning reads.

Planning measures the step on fake tensors, times it on the real model and simulates its
plans; each of those needs the same things besides the traced graph: the caller's model and
example batch, the loss, the optimizer, the precision. They travel together as a
:class:`StepSpec` rather than as a handful of arguments threaded through every signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autockpt.planner.simulate.step_profile import LossFn, OptimizerSpec


@dataclass(frozen=True)
class StepSpec:
    """One training step as the caller runs it.

    Attributes:
        model: the caller's model, real (timed, probed for batch-separability; never trained
            by planning).
        example_inputs: the example batch's inputs, as the model takes them.
        example_targets: what the loss takes beside the model's output (may be empty).
        loss_fn: the loss of the model's output and the targets; ``None``: the model's output
            is the loss.
        optimizer: the optimizer whose state the step holds (a name, an instance, a factory,
            or ``None``: none).
        autocast_dtype: the autocast precision the step runs under; ``None``: none.
        gradients_live: every gradient is alive from the start of the step (a loop that
            accumulates them over batches, or zeroes them only after the forward).
    """

    model: torch.nn.Module
    example_inputs: Sequence[Any]
    example_targets: Sequence[Any]
    loss_fn: LossFn | None
    optimizer: OptimizerSpec
    autocast_dtype: torch.dtype | None = None
    gradients_live: bool = False
