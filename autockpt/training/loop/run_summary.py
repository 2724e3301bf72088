"""The summary record that ends a training run: what was trained, how it scored, what memory
and time it took, and how often it was planned."""

from __future__ import annotations

from typing import Any, Protocol

from autockpt import Parallelism
from autockpt.training.host.distributed import World
from autockpt.training.loop.replanning import Replanner
from autockpt.training.loop.step_memory import StepMemoryMeter
from autockpt.training.setup.baselines import skill
from autockpt.training.setup.checkpoint import RunState
from autockpt.training.setup.runs import RunFolder


class SummarisedRun(Protocol):
    """What the summary reads off a run: the :class:`~autockpt.training.loop.train.Trainer`."""

    state: RunState
    run: RunFolder
    naive_losses: dict[str, float] | None
    plans: Replanner
    meter: StepMemoryMeter
    data_wait_s: float
    step_s_run: float
    world: World
    parallelism: Parallelism

    @property
    def budget_bytes(self) -> int | None: ...


def run_summary(trainer: SummarisedRun, stopped: str) -> dict[str, Any]:
    """The ``summary`` record of ``trainer``'s run, which stopped because ``stopped``."""
    seconds = trainer.state.step_seconds
    return {
        "kind": "summary",
        "run_dir": str(trainer.run.path),
        "epochs_done": trainer.state.epoch,
        "stopped": stopped,
        "global_step": trainer.state.global_step,
        "best_val_loss": trainer.state.best_val_loss,
        "naive_val_loss": trainer.naive_losses,
        "best_val_skill": skill(trainer.state.best_val_loss, trainer.naive_losses)
        if trainer.naive_losses and trainer.state.best_val_loss is not None
        else None,
        "peak_bytes": trainer.state.peak_bytes if trainer.state.num_measured_steps else None,
        "num_measured_steps": trainer.state.num_measured_steps,
        "budget_bytes": trainer.budget_bytes,
        "predicted_peak_bytes": trainer.plans.plan.predicted_peak_bytes,
        # Without a budget nothing was promised: None, not a vacuous True.
        "within_budget": None
        if trainer.budget_bytes is None
        else trainer.state.peak_bytes <= trainer.budget_bytes,
        "memory_measure": trainer.meter.description,
        # NOTE [What the first card must measure]: what the plan took as stand-ins, read on
        # the card (None on the CPU).
        "measured_context_bytes": trainer.meter.context_bytes,
        "planned_context_bytes": trainer.plans.plan.breakdown.context_bytes,
        "measured_allocator_slack": trainer.meter.slack,
        "mean_step_s": sum(seconds) / len(seconds) if seconds else 0.0,
        # NOTE [Prefetching batches]: this process's wait for data, against its steps.
        "data_wait_s": trainer.data_wait_s,
        "data_wait_share": trainer.data_wait_s / (trainer.data_wait_s + trainer.step_s_run)
        if trainer.step_s_run
        else 0.0,
        "num_replans": trainer.state.num_replans,
        "num_plans": trainer.plans.num_plans,
        "planning_s": trainer.plans.planning_s,
        "world_size": trainer.world.world_size,
        "parallelism": trainer.parallelism,
    }
