"""What a measured training step reports: live bytes per segment and per phase (NOTE [Step
accounting] in :mod:`autockpt.planner.measure.fake_step`), and the loss and optimizer a step is
measured with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

LossFn = Callable[..., torch.Tensor]
#: What makes a training run's optimizer from its trainable parameters, e.g.
#: ``functools.partial(torch.optim.AdamW, lr=3e-4, fused=True)``.
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
#: ``"adamw"``, ``"sgd"``, ``None`` (no state), an optimizer instance (its class and settings)
#: or an :data:`OptimizerFactory`.
OptimizerSpec = str | torch.optim.Optimizer | OptimizerFactory | None

PHASES = ("forward", "loss", "backward", "optimizer")


@dataclass
class SegmentProfile:
    """What one segment did during a measured step (bytes are live totals, not increments).

    Attributes:
        start_bytes: live bytes when its forward started.
        end_bytes: live bytes when the next segment (or the loss) started: what it leaves
            behind, after the values only it read were released.
        forward_peak_bytes: highest live bytes during its forward.
        backward_peak_bytes: highest live bytes during its backward (and recompute).
        forward_flops: FLOPs of its forward ops.
        forward_moved_bytes: bytes its forward ops read and wrote.
        forward_num_ops: how many aten ops its forward ran.
        input_bytes: bytes of the tensors it reads from earlier segments.
        output_bytes: bytes of the tensors it hands to later segments.
        input_sizes: bytes of each of its inputs, in the order of the segment's
            ``input_names``.
    """

    start_bytes: int = 0
    end_bytes: int = 0
    forward_peak_bytes: int = 0
    backward_peak_bytes: int = 0
    forward_flops: int = 0
    forward_moved_bytes: int = 0
    forward_num_ops: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    input_sizes: tuple[int, ...] = ()


@dataclass
class StepProfile:
    """One measured training step (NOTE [Step accounting]).

    Attributes:
        start_bytes: live before forward: parameters, optimizer state, the batch.
        parameter_bytes / optimizer_state_bytes / input_bytes: parts of ``start_bytes``.
        gradient_bytes: bytes of the parameter gradients after backward.
        segments: one profile per segment, in chain order.
        phase_peak_bytes: highest live bytes in each phase.
        peak_bytes: highest live bytes over the whole step.
        timeline: live bytes after each op, with its phase and segment (-1: none), in order;
            the optimizer step is one point at its peak.
    """

    start_bytes: int
    parameter_bytes: int
    optimizer_state_bytes: int
    input_bytes: int
    gradient_bytes: int = 0
    segments: list[SegmentProfile] = field(default_factory=list)
    phase_peak_bytes: dict[str, int] = field(default_factory=dict)
    peak_bytes: int = 0
    timeline: list[tuple[int, str, int]] = field(default_factory=list)
