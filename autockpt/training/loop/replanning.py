"""The plan a run trains with, and re-planning it when a measured step goes over its budget.

:class:`Replanner` is the part of a run the :class:`~autockpt.training.loop.train.Trainer` holds
for its plan: the plan, the planned model built from it and the model the steps run (through
``torch.compile`` with ``--compile``). It acts on a step's measured peak (NOTE [Enforcing the
budget] in :mod:`autockpt.training.loop.step_memory`): the CPU check after a measured step, and
the re-plan that check and the CUDA out-of-memory retry call, lowered as the one re-plan policy
says (NOTE [Planning again] in :mod:`autockpt.planner.verify`). A re-plan swaps all three, so the
next step runs the new plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

import autockpt
from autockpt import Plan, format_bytes
from autockpt.planner.verify import REPLANNING
from autockpt.training.host.distributed import agree_on_plan, plan_digest, wrap
from autockpt.training.setup.checkpoint import RunState
from autockpt.training.setup.planning import make_plan
from autockpt.training.setup.runs import RunFolder

if TYPE_CHECKING:
    from autockpt.training.setup.prepare import Setup

#: ``planned`` as the steps run it, for ``plan`` (the trainer's ``--compile``).
CompileStep = Callable[[torch.nn.Module, Plan], torch.nn.Module]


class Replanner:
    """A run's plan and planned model, made again when a measured step goes over the budget.

    Args:
        setup: the prepared run (its model, device, ranks, budget, plan and example batch).
        run: the run folder a new plan is written to.
        new_plan: told of every plan made again (the step meter measures by it).
        compile_step: the model the steps run, from the planned one.
        log: takes an event record (the trainer's metrics and progress display).
    """

    def __init__(
        self,
        setup: Setup,
        run: RunFolder,
        *,
        new_plan: Callable[[Plan], None],
        compile_step: CompileStep,
        log: Callable[[dict[str, Any]], None],
    ) -> None:
        self.setup = setup
        self.run = run
        self.new_plan = new_plan
        self.compile_step = compile_step
        self.log = log
        self.world = setup.world
        self.parallelism = setup.parallelism
        self.plan = setup.plan
        self.planned = wrap(
            autockpt.apply(setup.model, self.plan),
            self.world,
            setup.device,
            parallelism=self.parallelism,
            model=setup.model,
        )
        self.step_model = compile_step(self.planned, self.plan)
        self.gave_up = False
        self.num_plans = 1
        """Plans the run has made: the first, and one per re-plan (its batches all have the
        shape of the first, or are smaller: the last batch of an epoch)."""
        self.planning_s = self.plan.planning_s
        """Seconds those plans took."""

    @property
    def budget_bytes(self) -> int | None:
        """The run's budget (``None``: none given)."""
        return self.setup.budget_bytes

    def planning_budget_bytes(self, state: RunState) -> int:
        """The budget the current plan was made for (lower than the run's after a re-plan)."""
        if state.planning_budget_bytes is not None:
            return state.planning_budget_bytes
        return self.plan.budget_bytes

    def enforce_budget(self, peak_bytes: int | None, state: RunState) -> None:
        """Re-plan tighter when a measured CPU step went over the budget (``peak_bytes`` None:
        not measured); see NOTE [Enforcing the budget] in
        :mod:`autockpt.training.loop.step_memory`."""
        budget = self.budget_bytes
        if (
            budget is None
            or peak_bytes is None
            or peak_bytes <= budget
            or self.setup.device.type == "cuda"
        ):
            return
        if self.parallelism == "fsdp" or state.num_replans >= REPLANNING.max_rounds:
            if not self.gave_up:
                self.gave_up = True
                why = (
                    "FSDP runs do not re-plan (NOTE [FSDP and the planned model]); resume "
                    "with a lower --vram-budget"
                    if self.parallelism == "fsdp"
                    else f"after {REPLANNING.max_rounds} re-plans; not re-planning again"
                )
                self.event(
                    state,
                    f"step {state.global_step} peaked at {format_bytes(peak_bytes)}, over "
                    f"the budget {format_bytes(budget)}, {why}",
                )
            return
        self.replan(
            REPLANNING.lowered(self.planning_budget_bytes(state), over_bytes=peak_bytes - budget),
            state,
            reason=(
                f"step {state.global_step} peaked at {format_bytes(peak_bytes)}, over the "
                f"budget {format_bytes(budget)}"
            ),
        )

    def replan(self, budget_bytes: int, state: RunState, *, reason: str) -> None:
        """Plan again for ``budget_bytes``, swap the planned model and log why."""
        self.use_plan_for(budget_bytes, state)
        state.num_replans += 1
        self.event(
            state,
            f"{reason}: re-planned for {format_bytes(budget_bytes)} "
            f"(predicted peak {format_bytes(self.plan.predicted_peak_bytes)}, "
            f"{self.plan.num_recomputed} segments recomputed, "
            f"{self.plan.num_micro_batches} micro-batches)",
        )
        self.record_plan_agreement(state)

    def use_plan_for(self, budget_bytes: int, state: RunState) -> None:
        """Plan for ``budget_bytes`` and train with that plan (same parameters, new wrapping)."""
        setup = self.setup
        run_budget = setup.budget
        assert run_budget is not None, "only a run with a budget plans again"
        self.plan = agree_on_plan(
            self.world,
            lambda: make_plan(
                setup.model,
                setup.example_inputs,
                setup.example_targets,
                run_budget.lowered_to(budget_bytes),
                loss_fn=setup.loss_fn,
                device=setup.device,
                config=setup.config,
                autocast_dtype=setup.autocast_dtype,
                world_size=self.plan.world_size,
                parallelism=self.parallelism,
            ),
        )
        assert self.parallelism != "fsdp", "FSDP runs do not re-plan"
        self.num_plans += 1
        self.planning_s += self.plan.planning_s
        self.new_plan(self.plan)
        self.planned = wrap(autockpt.apply(setup.model, self.plan), self.world, setup.device)
        self.step_model = self.compile_step(self.planned, self.plan)
        state.planning_budget_bytes = budget_bytes
        if self.world.is_main:
            self.run.write_plan(self.plan.model_dump_json(indent=2))

    def record_plan_agreement(self, state: RunState) -> None:
        """Log which plan each rank runs (their digests must be equal), when there are ranks."""
        if not self.world.is_distributed:
            return
        digests = self.world.all_gather(plan_digest(self.plan))
        assert len(set(digests)) == 1, f"the ranks run different plans: {digests}"
        self.log(
            {
                "kind": "event",
                "step": state.global_step,
                "message": f"{self.world.world_size} ranks run plan {digests[0]}",
                "plan_digest_by_rank": digests,
            }
        )

    def event(self, state: RunState, message: str) -> None:
        """Log ``message`` as an event record (metrics.jsonl and the reporter)."""
        self.log({"kind": "event", "step": state.global_step, "message": message})
