"""Training checkpoints: what ``best.pt`` and ``last.pt`` hold, and continuing a run from one.

(Saved training state, not activation checkpointing, which is the planner's business.) The
:class:`~autockpt.training.loop.train.Trainer` gathers its states with :func:`gather_states` and
:func:`gather_random_states`, builds the files' contents with :func:`model_checkpoint` and
:func:`resume_checkpoint`, and the run folder (:mod:`autockpt.training.setup.runs`) writes them.

NOTE [Exact resume]
``last.pt`` is written at the end of every epoch, after validation, with the model, optimizer,
scheduler and gradient-scaler states and the torch/numpy/Python random states. Batch order comes
from ``iterate_batches(seed=seed + epoch)`` and planning runs under ``torch.random.fork_rng``, so
a run that is stopped after epoch k and resumed draws exactly the dropout masks and batches the
uninterrupted run would have: the weights come out equal. With several ranks (NOTE [Distributed
training] in :mod:`autockpt.training.host.distributed`) rank 0 saves every rank's random states; under FSDP
every rank takes part in gathering the model and optimizer states that rank 0 saves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from autockpt import Parallelism
from autockpt.training.host.distributed import World
from autockpt.training.setup.prepare import Setup
from autockpt.training.setup.runs import capture_rng_state, restore_rng_state

#: Bump when the checkpoint layout changes.
CHECKPOINT_FORMAT = 1


@dataclass
class RunState:
    """Where the run is; saved in ``last.pt``."""

    epoch: int = 0
    """Epochs finished."""
    global_step: int = 0
    best_val_loss: float | None = None
    epochs_without_improvement: int = 0
    planning_budget_bytes: int | None = None
    """The budget the current plan was made for, once a re-plan tightened it."""
    num_replans: int = 0
    peak_bytes: int = 0
    """The largest measured peak (0 before any step is measured)."""
    num_measured_steps: int = 0
    """Steps whose peak was measured (NOTE [Enforcing the budget])."""
    step_seconds: list[float] = field(default_factory=list)


# ---------------------------------------------------------------------------- saving


def gather_states(
    model: torch.nn.Module,
    planned: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    parallelism: Parallelism,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and the optimizer's state dicts as one process has them.

    Under FSDP this is collective: every rank must call it, and rank 0 alone gets the
    whole states (the others get empty dicts), read through the sharded ``planned`` model.
    """
    if parallelism != "fsdp":
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(planned, options=options)
    optimizer_state = get_optimizer_state_dict(planned, optimizer, options=options)
    return dict(model_state), dict(optimizer_state)


def gather_random_states(world: World) -> list[dict[str, Any]]:
    """Every rank's random states, by rank (collective: every rank must call it)."""
    return world.all_gather(capture_rng_state())


def model_checkpoint(setup: Setup, state: RunState, model_state: dict[str, Any]) -> dict[str, Any]:
    """What ``best.pt`` holds: the model and what reading it back needs."""
    data = setup.data
    return {
        "format": CHECKPOINT_FORMAT,
        "model": model_state,
        "model_config": setup.model_config.model_dump(mode="json"),
        "normalizer": data.normalizer.to_dict(),
        "column_roles": data.normalizer.roles.model_dump(mode="json"),
        "epoch": state.epoch,
        "global_step": state.global_step,
        "best_val_loss": state.best_val_loss,
        "world_size": setup.world.world_size,
        "parallelism": setup.parallelism,
    }


def resume_checkpoint(
    setup: Setup,
    state: RunState,
    states: tuple[dict[str, Any], dict[str, Any]],
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    rng_by_rank: list[dict[str, Any]],
) -> dict[str, Any]:
    """What ``last.pt`` holds: :func:`model_checkpoint` and everything NOTE [Exact resume]
    needs; ``states`` from :func:`gather_states`, ``rng_by_rank`` from
    :func:`gather_random_states`."""
    model_state, optimizer_state = states
    checkpoint = model_checkpoint(setup, state, model_state)
    checkpoint.update(
        optimizer=optimizer_state,
        scheduler=scheduler.state_dict(),
        scaler=scaler.state_dict() if scaler is not None else None,
        rng=rng_by_rank[0],
        rng_by_rank=rng_by_rank,
        epochs_without_improvement=state.epochs_without_improvement,
        planning_budget_bytes=state.planning_budget_bytes,
        num_replans=state.num_replans,
        peak_bytes=state.peak_bytes,
        num_measured_steps=state.num_measured_steps,
    )
    return checkpoint


# ---------------------------------------------------------------------------- resuming


def restore_states(
    checkpoint: dict[str, Any],
    *,
    model: torch.nn.Module,
    planned: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    parallelism: Parallelism,
) -> None:
    """Load the model, optimizer, scheduler and scaler states of a ``last.pt``."""
    if parallelism == "fsdp":
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        # Every rank holds the whole checkpoint and keeps its own shard of it.
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(planned, checkpoint["model"], options=options)
        set_optimizer_state_dict(planned, optimizer, checkpoint["optimizer"], options=options)
    else:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    if scaler is not None and checkpoint["scaler"] is not None:
        scaler.load_state_dict(checkpoint["scaler"])


def restored_run_state(checkpoint: dict[str, Any]) -> RunState:
    """Where the run of a ``last.pt`` was (step times start afresh)."""
    return RunState(
        epoch=checkpoint["epoch"],
        global_step=checkpoint["global_step"],
        best_val_loss=checkpoint["best_val_loss"],
        epochs_without_improvement=checkpoint["epochs_without_improvement"],
        planning_budget_bytes=checkpoint["planning_budget_bytes"],
        num_replans=checkpoint["num_replans"],
        peak_bytes=checkpoint["peak_bytes"],
        # Runs saved before steps were sampled measured every step.
        num_measured_steps=checkpoint.get("num_measured_steps", checkpoint["global_step"]),
    )


def restore_random_states(checkpoint: dict[str, Any], rank: int) -> None:
    """Put back ``rank``'s random states (a single-process ``last.pt`` has only ``rng``).

    Last of all on resume: anything drawing random numbers after it would shift the streams.
    """
    by_rank = checkpoint.get("rng_by_rank") or [checkpoint["rng"]]
    restore_rng_state(by_rank[rank])
