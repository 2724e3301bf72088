"""The run's plan: :func:`autockpt.plan` called for the TFT as the run's settings say.

Planning draws random numbers (calibration, probes); it runs under ``fork_rng`` so that the
streams training draws from are untouched (NOTE [Exact resume] in :mod:`autockpt.training.setup.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import autockpt
from autockpt import Budget, Parallelism, Plan
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.settings import run_optimizer
from tft.model.loss import QuantileLoss

#: What "no limit" plans against on the CPU when no budget is given: far above any step.
UNLIMITED_BYTES = 2**60


def make_plan(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    example_targets: tuple[torch.Tensor, ...],
    budget: Budget | Callable[[int], Budget] | None,
    *,
    loss_fn: QuantileLoss,
    device: torch.device,
    config: TrainConfig,
    autocast_dtype: torch.dtype | None,
    world_size: int = 1,
    parallelism: Parallelism = "single",
    cpu_threads: Callable[[int], int] | None = None,
) -> Plan:
    """Plan without touching the random streams training draws from (NOTE [Exact resume]).

    The plan is for one of ``world_size`` ranks sharing the model by ``parallelism``;
    ``cpu_threads`` chooses the threads the run trains with from the plain step's bytes
    (NOTE [Threads chosen from the plain step]); ``budget`` may be decided from them too
    (NOTE [A budget decided from the plain step]), though not for a compiled search.
    """
    planned_for = budget if budget is not None else unlimited_budget()
    # NOTE [Compiled plans]: with --compile and a budget, the plan is searched for among
    # compiled steps measured for real; without a budget nothing needs fitting, and the
    # trainer compiles the plain plan itself. The search plans one process in full precision.
    compiled_search = (
        config.compile
        and isinstance(budget, Budget)
        and world_size == 1
        and autocast_dtype is None
        and config.use_gradient_checkpointing is None
    )
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return autockpt.plan(
            model,
            example_inputs,
            planned_for,
            loss_fn=loss_fn,
            example_targets=example_targets,
            optimizer=run_optimizer(config, device, parallelism),
            device=device,
            use_gradient_checkpointing=config.use_gradient_checkpointing,
            autocast_dtype=autocast_dtype,
            world_size=world_size,
            parallelism=parallelism,
            compile=compiled_search,
            cpu_threads=cpu_threads,
        )


def unlimited_budget() -> Budget:
    return Budget(
        bytes=UNLIMITED_BYTES,
        text="none",
        reading="no --vram-budget on the CPU: training is not limited (give one to plan for it)",
    )
