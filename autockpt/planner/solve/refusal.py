"""The refusal of a budget no plan can meet: the minimum, what bounds it, and levers that work.

NOTE [Refusal]
When no plan fits, :class:`~autockpt.errors.InfeasibleBudgetError` gives the lowest peak the
planner measured (a budget planning is sure to meet) and says, in one line:

1. what does not shrink with the batch: parameters, their gradients and the optimizer state;
2. why the batch cannot be split further: the separability probe's reason, naming the
   operation that mixes samples (NOTE [Batch separability]), or the micro-batches the
   minimum already uses;
3. where the lowest plan peaks: the optimizer step, the loss, or the forward or backward of
   one segment, with what that segment adds at its peak;
4. only levers that would work. Raising the budget always does. Lowering the batch size is
   offered only when the measured per-sample part says a batch of at least 2 would fit: the
   lowest plan is measured again at half the batch, and the minimum is taken as linear in the
   batch between the two. Where parameters, gradients and optimizer state dominate, or
   micro-batches already cut the batch to single samples, a smaller batch barely helps, and
   the message says so instead of promising "a batch of about 1".
"""

from __future__ import annotations

import math

from autockpt.errors import InfeasibleBudgetError
from autockpt.planner.core.units import Budget, format_bytes
from autockpt.planner.measure.separability import Separability
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_decoding import Decision


def infeasible_error(
    *,
    budget: Budget,
    minimum_bytes: int,
    fixed_bytes: int,
    batch_size: int,
    separability: Separability | None,
    micro_batches_tried: bool,
    lowest: tuple[Decision, StepProfile] | None,
    half_minimum_bytes: int | None,
    context_bytes: int = 0,
) -> InfeasibleBudgetError:
    """The error for a budget below every plan (NOTE [Refusal]).

    Args:
        budget: the budget asked for.
        minimum_bytes: the lowest measured peak, as the device shows it.
        fixed_bytes: parameters, gradients and optimizer state, as the device shows them
            (the allocator's share included, the CUDA context not).
        batch_size: the training batch size.
        separability: what the probe found (None: it did not run).
        micro_batches_tried: whether micro-batch plans were among the options.
        lowest: the lowest-peak plan and its measured step.
        half_minimum_bytes: that plan's peak measured at half the batch, as the device shows
            it, or None when it could not be measured.
        context_bytes: what the device holds before any tensor (the CUDA context).
    """
    fixed = f"parameters, gradients and optimizer state take {format_bytes(fixed_bytes)}"
    if context_bytes:
        fixed += f" and the CUDA context {format_bytes(context_bytes)}"
    clauses = [fixed]
    clauses.append(_split_clause(separability, micro_batches_tried, lowest))
    if lowest is not None:
        clauses.append(_peak_clause(*lowest))
    # The minimum is a budget that plans (it is the lowest plan's measured step): one floor,
    # the same in the sentence's two places.
    raise_to = f"raise the budget to at least {format_bytes(minimum_bytes)}"
    if fixed_bytes + context_bytes >= budget.bytes:
        lever = f"they alone exceed the budget: {raise_to} or use a smaller model"
    else:
        lever = _batch_lever(
            budget.bytes, minimum_bytes, fixed_bytes, batch_size, half_minimum_bytes, raise_to
        )
    bound = "; ".join(clauses)
    return InfeasibleBudgetError(
        f"budget {budget.text} ({format_bytes(budget.bytes)}) is below the minimum "
        f"{format_bytes(minimum_bytes)} for batch {batch_size}: {bound}; {lever}",
        budget_bytes=budget.bytes,
        minimum_bytes=minimum_bytes,
        bound=bound,
    )


def _split_clause(
    separability: Separability | None,
    micro_batches_tried: bool,
    lowest: tuple[Decision, StepProfile] | None,
) -> str:
    if micro_batches_tried and lowest is not None:
        if lowest[0].num_micro_batches > 1:
            return f"the lowest plan already runs {lowest[0].num_micro_batches} micro-batches"
        return "micro-batches do not lower it"
    if separability is None:
        return "the batch was not split"
    if separability.micro_batchable and not micro_batches_tried:
        return "micro-batches were not allowed"
    chunks = "" if any(separability.chunkable) else " or chunks"
    return f"{separability.reason}, so no micro-batches{chunks}"


def _peak_clause(decision: Decision, profile: StepProfile) -> str:
    phases = profile.phase_peak_bytes
    phase = max(phases, key=lambda name: phases[name]) if phases else "backward"
    if phase == "optimizer":
        return "the peak is the optimizer step"
    if phase == "loss" or not profile.segments:
        return "the peak is the loss"
    key = "backward_peak_bytes" if phase == "backward" else "forward_peak_bytes"
    index = max(range(len(profile.segments)), key=lambda i: getattr(profile.segments[i], key))
    segment = profile.segments[index]
    added = max(getattr(segment, key) - segment.start_bytes, 0)
    action = decision.actions[index]
    if action.num_chunks > 1:
        how = f"recomputed in {action.num_chunks} chunks"
    else:
        how = "recomputed whole" if action.recompute else "kept"
    return (
        f"the peak is in the {phase} of {decision.segments[index].name} ({how}, it adds "
        f"{format_bytes(added)})"
    )


def _batch_lever(
    budget_bytes: int,
    minimum_bytes: int,
    fixed_bytes: int,
    batch_size: int,
    half_minimum_bytes: int | None,
    raise_to: str,
) -> str:
    half = batch_size // 2
    if half_minimum_bytes is not None and 0 < half < batch_size:
        per_sample = (minimum_bytes - half_minimum_bytes) / (batch_size - half)
    else:
        # Not measured: all but the fixed part taken as per-sample (an upper bound).
        per_sample = max(minimum_bytes - fixed_bytes, 0) / max(batch_size, 1)
    if per_sample <= 0:
        return f"a smaller batch would not lower the minimum; {raise_to}"
    fitting = batch_size - math.ceil((minimum_bytes - budget_bytes) / per_sample)
    if 2 <= fitting < batch_size:
        return f"lower the batch size to about {fitting} or {raise_to}"
    return f"a smaller batch saves only about {format_bytes(per_sample)} a sample; {raise_to}"
