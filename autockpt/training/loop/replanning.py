"""Re-planning a run whose measured step went over its budget: plan tighter, swap the model.

:class:`Replanning` is the part of the :class:`~autockpt.training.loop.train.Trainer` that acts on a
step's measured peak (NOTE [Enforcing the budget] in :mod:`autockpt.training.loop.step_memory`):
the CPU check after a measured step, and the re-plan it and the CUDA out-of-memory retry call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

import autockpt
from autockpt import Parallelism, Plan, format_bytes, parse_budget
from autockpt.training.host.distributed import World, agree_on_plan, plan_digest, wrap
from autockpt.training.host.progress import Reporter
from autockpt.training.loop.step_memory import StepMemoryMeter
from autockpt.training.options.config import TrainConfig
from autockpt.training.setup.checkpoint import RunState
from autockpt.training.setup.planning import make_plan
from autockpt.training.setup.runs import RunFolder

if TYPE_CHECKING:
    from autockpt.training.setup.prepare import Setup

#: Share of the budget a re-plan aims at after a step went over (NOTE [Enforcing the budget]
#: in :mod:`autockpt.training.loop.step_memory`).
REPLAN_FRACTION = 0.9
#: Re-plans allowed in one run before the trainer gives up.
MAX_REPLANS = 3


class Replanning:
    """The trainer's budget checks and re-plans; the attributes are the Trainer's."""

    setup: Setup
    config: TrainConfig
    world: World
    model: torch.nn.Module
    plan: Plan
    planned: torch.nn.Module
    step_model: torch.nn.Module
    parallelism: Parallelism
    meter: StepMemoryMeter
    state: RunState
    run: RunFolder
    reporter: Reporter
    pending: list[dict[str, Any]]
    gave_up_replanning: bool
    compiled: Callable[[torch.nn.Module], torch.nn.Module]

    @property
    def budget_bytes(self) -> int | None:
        return self.setup.budget.bytes if self.setup.budget is not None else None

    @property
    def planning_budget_bytes(self) -> int:
        if self.state.planning_budget_bytes is not None:
            return self.state.planning_budget_bytes
        return self.plan.budget_bytes

    def enforce_budget(self, peak_bytes: int | None) -> None:
        """Re-plan tighter when a measured CPU step went over the budget (``peak_bytes`` None:
        not measured); see NOTE [Enforcing the budget] in :mod:`autockpt.training.loop.step_memory`."""
        budget = self.budget_bytes
        if (
            budget is None
            or peak_bytes is None
            or peak_bytes <= budget
            or self.setup.device.type == "cuda"
        ):
            return
        if self.parallelism == "fsdp" or self.state.num_replans >= MAX_REPLANS:
            if not self.gave_up_replanning:
                self.gave_up_replanning = True
                why = (
                    "FSDP runs do not re-plan (NOTE [FSDP and the planned model]); resume "
                    "with a lower --vram-budget"
                    if self.parallelism == "fsdp"
                    else f"after {MAX_REPLANS} re-plans; not re-planning again"
                )
                self.event(
                    f"step {self.state.global_step} peaked at {format_bytes(peak_bytes)}, over "
                    f"the budget {format_bytes(budget)}, {why}"
                )
            return
        self.replan(
            int(self.planning_budget_bytes * REPLAN_FRACTION),
            reason=(
                f"step {self.state.global_step} peaked at {format_bytes(peak_bytes)}, over the "
                f"budget {format_bytes(budget)}"
            ),
        )

    def replan(self, budget_bytes: int, *, reason: str) -> None:
        """Plan again for ``budget_bytes``, swap the planned model and log why."""
        self.use_plan_for(budget_bytes)
        self.state.num_replans += 1
        self.event(
            f"{reason}: re-planned for {format_bytes(budget_bytes)} "
            f"(predicted peak {format_bytes(self.plan.predicted_peak_bytes)}, "
            f"{self.plan.num_recomputed} segments recomputed, "
            f"{self.plan.num_micro_batches} micro-batches)"
        )
        self.record_plan_agreement()

    def use_plan_for(self, budget_bytes: int) -> None:
        """Plan for ``budget_bytes`` and train with that plan (same parameters, new wrapping)."""
        setup = self.setup
        self.plan = agree_on_plan(
            self.world,
            lambda: make_plan(
                self.model,
                setup.example_inputs,
                setup.example_targets,
                parse_budget(budget_bytes),
                loss_fn=setup.loss_fn,
                device=setup.device,
                config=self.config,
                autocast_dtype=setup.autocast_dtype,
                world_size=self.plan.world_size,
                parallelism=self.parallelism,
            ),
        )
        assert self.parallelism != "fsdp", "FSDP runs do not re-plan"
        self.meter.use_plan(self.plan)
        self.planned = wrap(autockpt.apply(self.model, self.plan), self.world, setup.device)
        self.step_model = self.compiled(self.planned)
        self.state.planning_budget_bytes = budget_bytes
        if self.world.is_main:
            self.run.write_plan(self.plan.model_dump_json(indent=2))

    def record_plan_agreement(self) -> None:
        """Log which plan each rank runs (their digests must be equal), when there are ranks."""
        if not self.world.is_distributed:
            return
        digests = self.world.all_gather(plan_digest(self.plan))
        assert len(set(digests)) == 1, f"the ranks run different plans: {digests}"
        record = {
            "kind": "event",
            "step": self.state.global_step,
            "message": f"{self.world.world_size} ranks run plan {digests[0]}",
            "plan_digest_by_rank": digests,
        }
        self.pending.append(record)
        self.reporter.event(record)

    def event(self, message: str) -> None:
        """Log ``message`` as an event record (metrics.jsonl and the reporter)."""
        record = {"kind": "event", "step": self.state.global_step, "message": message}
        self.pending.append(record)
        self.reporter.event(record)
