"""The workload and the strategies of the memory/time benchmark (see ``memory_time.py``).

The workload is the TFT model of a preset with one batch and its loss; a strategy is one way to
run its training step (the plain model, the planner at a budget, torch.compile at an activation
memory budget), each with its own deep copy of the model and AdamW. This module builds them;
``memory_time_measure.py`` measures them.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, cast

import torch

import autockpt
from autockpt import format_bytes
from tft.model.config import TFTConfig, get_preset
from tft.model.loss import quantile_loss
from tft.model.transformer import TemporalFusionTransformer

#: Budget given when a strategy has no budget of its own (reads as "no limit" on the CPU).
UNLIMITED_BYTES = 2**50
#: Factors over the reported minimum tried, in order, for the "autockpt min" strategy.
MINIMUM_FACTORS = (1.0, 1.01, 1.02, 1.05, 1.1, 1.25, 1.5)
#: Activation memory budgets tried with torch.compile.
COMPILE_BUDGETS = (1.0, 0.5)

Inputs = tuple[torch.Tensor, ...]


# ---------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Workload:
    """The model under test, one batch and the two loss functions."""

    config: TFTConfig
    model: torch.nn.Module
    inputs: Inputs
    target: torch.Tensor  # (B, H)
    device: torch.device

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return quantile_loss(prediction, target, self.config.quantiles)


def make_workload(preset: str, batch_size: int | None, device: torch.device, seed: int) -> Workload:
    config = get_preset(preset)
    if batch_size is not None:
        config = config.with_overrides(batch_size=batch_size)
    torch.manual_seed(seed)
    model = TemporalFusionTransformer(config).to(device).train()
    inputs, target = make_batch(model, config, config.batch_size, device, seed)
    return Workload(config, model, inputs, target, device)


def make_batch(
    model: Any, config: TFTConfig, batch_size: int, device: torch.device, seed: int
) -> tuple[Inputs, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = tuple(t.to(device) for t in model.example_inputs(batch_size, generator=generator))
    target = torch.randn(batch_size, config.horizon, generator=generator).to(device)
    return inputs, target


def plan_for(
    work: Workload, budget: int | str, inputs: Inputs | None = None, **options: Any
) -> autockpt.Plan:
    """``autockpt.plan`` of the workload's model (its target held through the step, as the
    timed steps hold it); forced-mode warnings are kept in the notes."""
    target = work.target
    if inputs is not None:
        target = work.target.new_zeros(inputs[0].shape[0], work.config.horizon)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return autockpt.plan(
            work.model,
            inputs if inputs is not None else work.inputs,
            budget,
            loss_fn=work.loss,
            example_targets=(target,),
            device=work.device,
            **options,
        )


def minimum_bytes(work: Workload, inputs: Inputs | None = None) -> int:
    """The minimum feasible budget the planner reports for an impossible budget of 1 byte."""
    try:
        plan_for(work, 1, inputs)
    except autockpt.InfeasibleBudgetError as error:
        return error.minimum_bytes
    raise RuntimeError("the planner accepted a budget of 1 byte")


def unplanned_budget_bytes(reference: autockpt.Plan) -> int:
    """The smallest budget at which the unplanned step fits, as the planner accounts budgets.

    On the CPU that is the unplanned peak. On CUDA the budget also pays for the context and for
    headroom that is a share of the budget itself, so the peak of the tensors is solved for:
    ``budget = tensors + context + share * budget``.
    """
    breakdown = reference.breakdown
    tensors = reference.unplanned_peak_bytes - breakdown.context_bytes - breakdown.headroom_bytes
    share = breakdown.headroom_bytes / reference.budget_bytes if reference.budget_bytes else 0.0
    return math.ceil((tensors + breakdown.context_bytes) / (1.0 - share))


# ---------------------------------------------------------------------------- strategies


@dataclass
class Strategy:
    """One way to run the step, its copy of the model and what was measured about it."""

    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    runner: torch.nn.Module
    """What the step calls: the model, the planned module or the compiled model."""
    plan: autockpt.Plan | None = None
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    planning_s: float | None = None
    compile_budget: float | None = None
    """For torch.compile strategies, the activation memory budget its backend compiles with."""
    notes: list[str] = field(default_factory=list)
    measured: dict[str, int] = field(default_factory=dict)
    step_s: list[float] = field(default_factory=list)
    failed: str | None = None

    def step(self, work: Workload) -> None:
        """One training step: forward and backward over the plan's pieces, then AdamW."""
        self.optimizer.zero_grad(set_to_none=True)
        autockpt.training_step(
            self.runner, self.plan, work.inputs, (work.target,), work.loss, loss_reduction="mean"
        )
        self.optimizer.step()


def _fresh_copy(work: Workload) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A copy of the model and its AdamW, whose state exists already, as it does in training."""
    model = copy.deepcopy(work.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    parameters = list(model.parameters())
    with torch.no_grad():
        before = [p.detach().clone() for p in parameters]
        for parameter in parameters:
            parameter.grad = torch.zeros_like(parameter)
        optimizer.step()  # weight decay moves the weights even at zero gradient: put them back
        for parameter, value in zip(parameters, before, strict=True):
            parameter.copy_(value)
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def planned_strategy(
    work: Workload, name: str, budget: int | str, *, record_budget: bool = True, **options: Any
) -> Strategy:
    model, optimizer = _fresh_copy(work)
    started = time.perf_counter()
    plan = plan_for(work, budget, **options)
    wall_s = time.perf_counter() - started
    strategy = Strategy(
        name=name,
        model=model,
        optimizer=optimizer,
        runner=autockpt.apply(model, plan),
        plan=plan,
        budget_bytes=plan.budget_bytes if record_budget else None,
        predicted_peak_bytes=plan.predicted_peak_bytes,
        planning_s=plan.planning_s,
    )
    strategy.notes.extend(plan.notes)
    strategy.notes.append(f"plan() wall time {wall_s:.2f} s")
    return strategy


def minimum_strategy(work: Workload) -> Strategy:
    """autockpt at its own minimum feasible budget, or the first factor above it that plans."""
    started = time.perf_counter()
    minimum = minimum_bytes(work)
    probe_s = time.perf_counter() - started
    failures = []
    for factor in MINIMUM_FACTORS:
        budget = math.ceil(minimum * factor)
        try:
            strategy = planned_strategy(work, "autockpt min", budget)
        except autockpt.InfeasibleBudgetError as error:
            failures.append(f"{format_bytes(budget)}: {error}")
            continue
        strategy.notes.append(
            f"reported minimum {format_bytes(minimum)} (probe {probe_s:.2f} s); planned at "
            f"{factor:.2f}x of it"
        )
        strategy.notes.extend(f"infeasible at {failure}" for failure in failures)
        return strategy
    raise RuntimeError(
        f"no plan at up to {MINIMUM_FACTORS[-1]}x the reported minimum "
        f"{format_bytes(minimum)}: " + "; ".join(failures)
    )


def compiled_strategy(work: Workload, activation_memory_budget: float) -> Strategy:
    from torch._inductor.compile_fx import compile_fx

    def backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        # A backend of its own per budget: dynamo then compiles each copy separately, and the
        # partitioner reads the budget while this backend runs.
        with torch._functorch.config.patch(activation_memory_budget=activation_memory_budget):
            return compile_fx(graph, example_inputs)

    model, optimizer = _fresh_copy(work)
    return Strategy(
        name=f"compile {activation_memory_budget:g}",
        model=model,
        optimizer=optimizer,
        runner=cast(torch.nn.Module, torch.compile(model, backend=backend)),
        compile_budget=activation_memory_budget,
    )
