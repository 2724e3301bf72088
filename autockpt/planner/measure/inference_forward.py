"""How few pieces a forward without autograd (validation, prediction) can cut a batch into and
stay within the budget, measured on fake tensors.

NOTE [Validation in as few pieces as fit]
Validation runs the model's own forward under ``torch.no_grad()``, whole, so a region the plan
runs in chunks makes its whole batch's intermediates at once: :attr:`Plan.inference_pieces`
bounds that by cutting the batch into the step's micro-batches times its most chunks (NOTE
[Validation within the step's budget]). The bound is safe but blind: without autograd nothing
is kept for backward, and a step that needed 2 micro-batches and 4 chunks for its saved
activations often runs its forward whole within the same budget. The demo's plan on the sample
(2 micro-batches, a region in 4 chunks) cut each validation batch of 16 windows into 8 pieces
of 2, and its four validations took 5.1 s of a 35.8 s run; in one piece, 3.6 s. So the planner
measures the forward itself: on the fake model, without autograd, under the step's autocast,
with the parameters, their gradients (the trainer may hold them), the optimizer state and the
whole batch counted live, at 1, 2, 4, ... pieces below the bound; each piece's peak, the outputs
of the pieces before it and the joined output (twice: the join and a float copy of it) must fit
the budget's usable bytes. The first count that fits is the plan's; where none below the bound
fits, the bound stands. A model measured on a real copy (NOTE [Module chain]), a head planned
with the loss in chunks (the forward measured is the model cut before it) and FSDP's ranks
(which gather parameters in forward) keep the bound.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils._pytree import tree_map_only

from autockpt.planner.core.batch_split import split_batch
from autockpt.planner.core.memory_tracker import (
    MemoryTracker,
    flat_tensors,
    tensor_bytes,
    tensors_of,
)
from autockpt.planner.measure.step_measurer import StepMeasurer


def fewest_forward_pieces(measurer: StepMeasurer, usable_bytes: int, *, most: int) -> int | None:
    """The fewest pieces (1, 2, 4, ... below ``most``) whose forward without autograd, on the
    measurer's fake model and example batch, fits ``usable_bytes`` (NOTE [Validation in as few
    pieces as fit]); ``None`` where none does, or the model is not on fake tensors: the bound
    ``most`` stands."""
    state, example_inputs = measurer.fake_state, measurer.spec.example_inputs
    autocast_dtype = measurer.spec.autocast_dtype
    mode = state.mode
    if mode is None or most <= 1:
        return None
    batch = measurer.batch_size
    with mode, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs = tree_map_only(torch.Tensor, mode.from_tensor, list(example_inputs))
        held = [*tensors_of(state.model, state.optimizer), *flat_tensors(inputs)]
        gradient_bytes = sum(
            p.untyped_storage().nbytes() for p in state.parameters if p.requires_grad
        )
        device_type = next((x.device.type for x in flat_tensors(inputs)), "cpu")
        pieces = 1
        while pieces < min(most, batch + 1):
            piece = split_batch(inputs, pieces, batch_size=batch)[0]
            tracker = MemoryTracker(initial=held, size_oracle=measurer.oracle)
            tracker.add_bytes(gradient_bytes)
            autocast = torch.autocast(
                device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            )
            with tracker, autocast:
                output = state.model(*piece)
            # Beside the piece's own peak: the outputs of the pieces before it, their join, and
            # the join read as float32 (validation's scores).
            output_bytes = tensor_bytes(output)
            earlier = (pieces - 1) * output_bytes
            joined = pieces * output_bytes if pieces > 1 else 0
            as_float = 4 * pieces * sum(t.numel() for t in flat_tensors(output))
            peak = tracker.peak_bytes + earlier + joined + as_float
            del output
            if peak <= usable_bytes:
                return pieces
            pieces *= 2
    return None
