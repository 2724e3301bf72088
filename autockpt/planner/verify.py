"""Stage 5: one real step of the planned model, its measured peak against the prediction, and
what to do when a real step goes over.

On the CPU the peak is the tracked bytes of NOTE [Tracked bytes]; on CUDA it is the caching
allocator's ``max_memory_allocated`` and ``max_memory_reserved`` over the step, plus the
plan's context estimate. The step runs under the autocast the plan was measured under: a check
step in float32 of a plan measured in bfloat16 holds twice the activations, looks over the
budget and makes needless re-plans (or a refusal) on a card. The step runs on the model itself, which is put back afterwards
(parameters, gradients, buffers and the RNG state), so verifying costs no second copy of the
model on a card that is already tight.

NOTE [Planning again]
A real step that goes over its budget is planned again against a lower one, by one policy,
:data:`REPLANNING`, whoever saw the step: ``plan(verify=True)`` after its verification step,
and the trainer after a measured training step (NOTE [Enforcing the budget]). Each round aims
lower than the last by the overshoot the step showed, and by at least ``least_share`` of the
budget it aimed at (a step a few bytes over would otherwise be planned again a few bytes
lower, round after round), at most ``max_rounds`` times; then planning gives up and says so.
(The solver's own rounds, a plan measured on fake tensors over the budget before any real step,
are part of solving: :mod:`autockpt.planner.solve.budget_search`.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from autockpt.planner.apply import apply
from autockpt.planner.core.host_settings import forked_devices
from autockpt.planner.core.memory_tracker import MemoryTracker, tensors_of
from autockpt.planner.core.step_budget import allocator_slack
from autockpt.planner.core.train_eval import training_mode
from autockpt.planner.core.units import format_bytes
from autockpt.planner.measure.fake_step import default_loss
from autockpt.planner.measure.optimizers import give_state, make_optimizer
from autockpt.planner.plan_types import Plan
from autockpt.planner.simulate.step_profile import LossFn, OptimizerSpec
from autockpt.planner.training_step import training_step


@dataclass(frozen=True)
class ReplanPolicy:
    """How many times to plan again after a real step over its budget, and how much lower
    (NOTE [Planning again]).

    Attributes:
        max_rounds: plans made again at most, in one ``plan()`` call or one training run.
        least_share: the least share of the budget aimed at that a round lowers it by.
    """

    max_rounds: int
    least_share: float

    def lowered(self, target_bytes: int, *, over_bytes: int) -> int:
        """The next budget to aim at, after a step ``over_bytes`` over the budget while aiming
        at ``target_bytes``."""
        return min(target_bytes - over_bytes, int(target_bytes * (1.0 - self.least_share)))


#: The one re-plan policy (NOTE [Planning again]).
REPLANNING = ReplanPolicy(max_rounds=3, least_share=0.1)


@dataclass(frozen=True)
class Verification:
    """A real step's peak next to the plan's prediction.

    Attributes:
        measured_peak_bytes: tracked bytes (CPU) or allocated bytes plus context (CUDA).
        reserved_peak_bytes: the allocator's reserved bytes plus context (CUDA), else equal to
            ``measured_peak_bytes``.
        predicted_peak_bytes: the plan's prediction.
        budget_bytes: the plan's budget.
        slack: on CUDA, the allocator's reserved peak over its allocated peak, less one (NOTE
            [What the first card must measure]); None on the CPU.
    """

    measured_peak_bytes: int
    reserved_peak_bytes: int
    predicted_peak_bytes: int
    budget_bytes: int
    slack: float | None = None

    @property
    def within_budget(self) -> bool:
        """Whether what a user would see stayed under the budget."""
        return self.reserved_peak_bytes <= self.budget_bytes

    @property
    def note(self) -> str:
        """The plan's note on this check."""
        slack = "" if self.slack is None else f"; the allocator's slack {self.slack:.0%}"
        return (
            f"verified: a real step peaked at {format_bytes(self.reserved_peak_bytes)}, "
            f"{format_bytes(self.predicted_peak_bytes)} predicted{slack}"
        )

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / max(
            self.measured_peak_bytes, 1
        )


def verify_plan(
    model: torch.nn.Module,
    plan: Plan,
    example_inputs: Sequence[torch.Tensor],
    *,
    loss_fn: LossFn | None = None,
    example_targets: Sequence[torch.Tensor] = (),
    optimizer: OptimizerSpec = "adamw",
    autocast_dtype: torch.dtype | None = None,
) -> Verification:
    """Run one real planned training step and measure its peak; leave the model as it was.

    Args:
        model: the model the plan was made for, on the plan's device.
        plan: the plan to check.
        example_inputs: one batch, on the plan's device.
        loss_fn: ``loss_fn(output, *example_targets) -> scalar``; default: the sum of the
            outputs.
        example_targets: what the loss compares against, on the plan's device.
        optimizer: as for :func:`autockpt.plan`.
        autocast_dtype: the precision the plan was measured in (``plan(autocast_dtype=)``);
            the step runs under ``torch.autocast`` with it, as training will.

    Returns:
        The measured and predicted peaks.
    """
    loss_fn = loss_fn or default_loss
    device = torch.device(plan.device)
    # Kept on the host: a copy on the card would be a second set of parameters (and gradients)
    # beside the step, counted as if the step held them.
    saved_state = {k: _on_host(v) for k, v in model.state_dict(keep_vars=True).items()}
    saved_grads = {
        name: None if p.grad is None else _on_host(p.grad) for name, p in model.named_parameters()
    }
    rng_devices = forked_devices(device)
    try:
        # A training step, whatever mode the model is in (NOTE [Modes and the traced graph]).
        with torch.random.fork_rng(devices=rng_devices), training_mode(model):
            return _measure(
                model,
                plan,
                example_inputs,
                example_targets,
                loss_fn,
                optimizer,
                device,
                autocast_dtype,
            )
    finally:
        with torch.no_grad():
            for name, value in model.state_dict(keep_vars=True).items():
                value.copy_(saved_state[name])
        for name, parameter in model.named_parameters():
            saved = saved_grads[name]
            parameter.grad = None if saved is None else saved.to(parameter.device)


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` in host memory."""
    return tensor.detach().to("cpu", copy=True)


def _measure(
    model: torch.nn.Module,
    plan: Plan,
    example_inputs: Sequence[torch.Tensor],
    example_targets: Sequence[torch.Tensor],
    loss_fn: LossFn,
    optimizer_spec: OptimizerSpec,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> Verification:
    optimizer = make_optimizer(optimizer_spec, list(model.parameters()))
    for parameter in model.parameters():
        parameter.grad = None
    if optimizer is not None:
        give_state(optimizer, list(model.parameters()))  # as the plan assumes
    planned = apply(model, plan)

    def step() -> None:
        precision = (
            torch.autocast(device.type, dtype=autocast_dtype)
            if autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with precision:
            training_step(
                planned, plan, example_inputs, example_targets, loss_fn, loss_reduction="sum"
            )
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        # Blocks cached by earlier work in the process are not the step's: released first, the
        # reserved peak is what the step itself made the allocator hold.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        context = plan.breakdown.context_bytes
        allocated = int(torch.cuda.max_memory_allocated(device))
        reserved = int(torch.cuda.max_memory_reserved(device))
        return Verification(
            allocated + context,
            reserved + context,
            plan.predicted_peak_bytes,
            plan.budget_bytes,
            slack=allocator_slack(reserved, allocated),
        )
    with MemoryTracker(
        initial=[*tensors_of(model, optimizer), *example_inputs, *example_targets]
    ) as tracker:
        step()
    return Verification(
        tracker.peak_bytes, tracker.peak_bytes, plan.predicted_peak_bytes, plan.budget_bytes
    )
