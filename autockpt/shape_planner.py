"""``ShapePlanner``: a training step that stays under its budget on every batch the data
gives, planning each new shape bucket before its step (NOTE [Plans that follow the shapes of a
run] in :mod:`autockpt.plans_by_shape`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch

from autockpt.planner.apply import apply
from autockpt.planner.core.step_budget import BudgetGiven
from autockpt.planner.core.units import Budget, read_unless_auto
from autockpt.planner.entry import plan as make_plan
from autockpt.planner.plan_types import Plan
from autockpt.planner.training_step import training_step
from autockpt.plans_by_shape import MAX_PLANS, PlansByShape, ShapeFollowing


class ShapePlanner:
    """Plans a model's training step for each shape of batch a run gives, and runs each step
    with the plan of its shape (NOTE [Plans that follow the shapes of a run]).

    The first batch is planned at its own shape (or, with ``max_shape``, at the declared
    largest); a later batch that no plan made so far holds for is planned, before its step, at
    its bucket (each dimension seen to vary up to the next power of two), and a batch a plan
    holds for runs with it at no cost. Every plan is made by :func:`autockpt.plan` with the
    same budget and options, and applied to the same model (the planned copies share its
    parameters).

    Args:
        model: the model to train.
        budget: as :func:`autockpt.plan` takes it, read once for every plan of the run.
        loss_fn: ``loss_fn(output, *targets) -> scalar``, planned and run.
        loss_reduction: whether ``loss_fn`` averages (``"mean"``) or adds (``"sum"``) samples
            (see :func:`autockpt.training_step`).
        max_shape: the batch's leading dimensions at their largest (``(16, 2048)``: at most
            16 samples of 2048 positions): one plan, made at the first batch for that shape,
            holds for every batch under it.
        replan: plan a batch no plan holds for before its step; ``False`` refuses it in one
            line (:class:`~autockpt.errors.ShapeError`).
        max_plans: plans made at most; past that, one for the largest shape seen.
        plan_options: any other keyword of :func:`autockpt.plan` (``optimizer``,
            ``autocast_dtype``, ``allow_micro_batches``, ...).

    Example:
        >>> planner = autockpt.ShapePlanner(model, "4GB", loss_fn=loss_fn, optimizer=optimizer)
        >>> for ids, labels in loader:  # padded to each batch's longest sequence
        ...     loss = planner.training_step((ids,), (labels,))
        ...     optimizer.step(); optimizer.zero_grad()
        >>> print(planner.num_plans, f"{planner.planning_s:.1f} s")
    """

    def __init__(
        self,
        model: torch.nn.Module,
        budget: BudgetGiven = "auto",
        *,
        loss_fn: Callable[..., torch.Tensor],
        loss_reduction: Literal["mean", "sum"] = "mean",
        max_shape: Sequence[int] | None = None,
        replan: bool = True,
        max_plans: int = MAX_PLANS,
        **plan_options: Any,
    ) -> None:
        self.model = model
        # NOTE [One budget]: read once, so every plan of the run has the same.
        self._budget: BudgetGiven = (
            read_unless_auto(budget) if isinstance(budget, (str, int, Budget)) else budget
        )
        self.loss_fn = loss_fn
        self.loss_reduction = loss_reduction
        self._options = plan_options
        self._plans: PlansByShape[torch.nn.Module] = PlansByShape(
            ShapeFollowing.read(max_shape, replan=replan, max_plans=max_plans),
            refusal="plan for the largest batch (ShapePlanner(..., max_shape={max_shape}))",
        )
        self.plan: Plan | None = None
        """The plan the last step ran with."""

    @property
    def plans(self) -> list[Plan]:
        """Every plan made so far, in the order they were made."""
        return self._plans.plans

    @property
    def num_plans(self) -> int:
        """How many plans the run has made."""
        return self._plans.num_plans

    @property
    def planning_s(self) -> float:
        """Seconds spent planning, every plan together."""
        return self._plans.planning_s

    def plan_for(
        self, inputs: Sequence[Any], targets: Sequence[Any] = ()
    ) -> tuple[Plan, torch.nn.Module]:
        """The plan a batch runs with and the planned model, planned now if no plan holds for
        it (see the class).

        Raises:
            ShapeError: no plan holds for the batch and ``replan`` is off.
            InfeasibleBudgetError: the batch's bucket cannot fit the budget.
        """
        entry = self._plans.follow(inputs, targets, self._make)
        self.plan = entry.plan
        return entry.plan, entry.runner

    def training_step(
        self,
        inputs: Sequence[Any],
        targets: Sequence[Any] = (),
        *,
        no_sync: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> torch.Tensor:
        """:func:`autockpt.training_step` of this batch with the plan of its shape (planned
        first where none holds for it). The caller steps the optimizer.

        Returns:
            The whole batch's loss, detached.
        """
        plan, planned = self.plan_for(inputs, targets)
        return training_step(
            planned,
            plan,
            inputs,
            targets,
            self.loss_fn,
            loss_reduction=self.loss_reduction,
            no_sync=no_sync,
        )

    def _make(self, inputs: list[Any], targets: list[Any]) -> tuple[Plan, torch.nn.Module]:
        plan = make_plan(
            self.model,
            inputs,
            self._budget,
            loss_fn=self.loss_fn,
            example_targets=targets,
            **self._options,
        )
        # NOTE [One budget]: "auto" (read on the device) or a function of the plain step is
        # read by the first plan; every later plan keeps that reading.
        self._budget = plan.budget
        return plan, apply(self.model, plan)
