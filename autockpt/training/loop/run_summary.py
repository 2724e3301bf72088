"""The records that sum a run up: an epoch's validation scores, and the summary that ends the
run (what was trained, how it scored, what memory and time it took, how often it was
planned)."""

from __future__ import annotations

from typing import Any, Protocol

from autockpt import Parallelism
from autockpt.training.forecasts.evaluate import Evaluation
from autockpt.training.forecasts.scoring_sample import ScoringSample
from autockpt.training.host.distributed import World
from autockpt.training.loop.replanning import Replanner
from autockpt.training.loop.run_time import RunClock
from autockpt.training.loop.step_memory import StepMemoryMeter
from autockpt.training.setup.baselines import skill
from autockpt.training.setup.checkpoint import RunState
from autockpt.training.setup.runs import RunFolder


def validation_record(evaluation: Evaluation | None, sample: ScoringSample) -> dict[str, Any]:
    """An epoch record's ``val_*`` fields: the scores of ``evaluation`` (None: no validation
    windows) and how many windows of how many it took (NOTE [Scores in proportion])."""
    return {
        "val_loss": evaluation.loss if evaluation else None,
        "val_loss_se": evaluation.model.loss_se if evaluation else None,
        "val_mae": evaluation.mae if evaluation else None,
        "val_rmse": evaluation.rmse if evaluation else None,
        "val_coverage": evaluation.coverage if evaluation else None,
        # NOTE [Naive forecasts]: the same windows, forecast knowing nothing.
        "val_loss_by_step": evaluation.model.loss_by_step if evaluation else None,
        "val_naive": {k: v.record() for k, v in evaluation.naive.items()} if evaluation else None,
        "val_skill": evaluation.skill if evaluation else None,
        "val_skill_by_step": evaluation.skill_by_step if evaluation else None,
        **sample.record("val"),
        "val_windows": evaluation.num_windows if evaluation else 0,
    }


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
    clock: RunClock

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
        # NOTE [Scores in proportion], NOTE [The run's expected time]
        **trainer.clock.validation.record("val"),
        "run_time": trainer.clock.record(trainer.step_s_run),
        "num_replans": trainer.state.num_replans,
        "num_plans": trainer.plans.num_plans,
        "planning_s": trainer.plans.planning_s,
        "world_size": trainer.world.world_size,
        "parallelism": trainer.parallelism,
    }
