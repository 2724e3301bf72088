"""From a :class:`~autockpt.training.options.config.TrainConfig` to everything a run needs before its first step.

:func:`prepare` resolves the device and precision, reads the budget, loads the data windows,
builds the TFT from the preset and the data's dimensions, and plans its training step. It writes
nothing but the row cache of a file too large for memory (NOTE [Row cache], written whole or
not at all), so the ``plan`` command stops here and a bad input leaves no trace; ``train`` goes
on to :mod:`autockpt.training.loop.train`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from autockpt import Budget, Parallelism, Plan
from autockpt.errors import DataError
from autockpt.training.host.distributed import (
    SINGLE_PROCESS,
    World,
    agree_on_plan,
    main_first,
    resolve_parallelism,
)
from autockpt.training.host.host_tuning import (
    HostTuning,
    choose_threads,
    keep_freed_memory,
)
from autockpt.training.host.host_tuning import tune_host as tune_process
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.data_source import read_windows
from autockpt.training.options.settings import (
    column_roles,
    default_run_dir,
    resolve_budget,
    resolve_data_path,
    resolve_device,
    resolve_precision,
    seed_everything,
)
from autockpt.training.setup.baselines import NaiveForecasts
from autockpt.training.setup.planning import make_plan
from tft.data.normalize import Normalizer
from tft.data.sources.data_source import DataSource
from tft.data.windows import WindowedData
from tft.model.config import TFTConfig, get_preset
from tft.model.loss import QuantileLoss
from tft.model.transformer import TemporalFusionTransformer


@dataclass(frozen=True)
class Setup:
    """Everything resolved from a config before the first step; ``plan`` prints it."""

    config: TrainConfig
    device: torch.device
    autocast_dtype: torch.dtype | None
    data_source: DataSource
    data: WindowedData
    model_config: TFTConfig
    model: TemporalFusionTransformer
    budget: Budget | None
    """None: no budget given on the CPU, so the run is not limited (the plan still is made)."""
    plan: Plan
    loss_fn: QuantileLoss
    example_inputs: tuple[torch.Tensor, ...]
    example_targets: tuple[torch.Tensor, ...]
    notes: tuple[str, ...] = ()
    world: World = SINGLE_PROCESS
    """The ranks training together (NOTE [Distributed training]); one process by default."""
    parallelism: Parallelism = "single"
    """How the ranks share the model (``config.strategy`` resolved for the world's size)."""
    host_tuning: HostTuning | None = None
    """What was set about the process before planning (``prepare(..., tune_host=True)`` on
    the CPU); the run logs it and puts the threads back when it ends."""
    data_s: float = 0.0
    """Seconds reading the data into windows (a row cache's build, where one was needed)."""

    @functools.cached_property
    def naive_forecasts(self) -> NaiveForecasts:
        """The naive forecasts validation scores beside the model (NOTE [Naive forecasts])."""
        return NaiveForecasts.fit(self.data, list(self.model_config.quantiles))

    @property
    def batch_size(self) -> int:
        """Windows per step on this rank (what the plan is for)."""
        return self.model_config.batch_size

    @property
    def global_batch_size(self) -> int:
        """Windows per optimizer step over all ranks."""
        return self.model_config.batch_size * self.world.world_size

    @property
    def budget_bytes(self) -> int | None:
        """The run's budget in bytes (``None``: none given)."""
        return self.budget.bytes if self.budget is not None else None


def prepare(
    config: TrainConfig,
    *,
    normalizer: Normalizer | None = None,
    world: World = SINGLE_PROCESS,
    plan_world_size: int | None = None,
    tune_host: bool = False,
    budget_of_plain: Callable[[int], Budget] | None = None,
) -> Setup:
    """Resolve the device, read the data, build the model and plan its training step.

    Args:
        config: the run's settings.
        normalizer: statistics to apply instead of fitting them (a resumed run's own).
        world: the ranks training together; rank 0 plans for every rank (its process group
            must be joined already, see :func:`autockpt.training.host.distributed.process_group`).
        plan_world_size: plan for one rank of this many instead of the world's (the ``plan``
            command's ``--world-size``, run in one process).
        tune_host: on the CPU, set the process's threads and malloc as the run will train
            before planning for the budget, so that the step times the planner measures are
            the run's (NOTE [Tuning the host process]); the setup records what was set.
        budget_of_plain: where the config gives no budget, the budget as a function of the
            plain step's bytes, decided in the one planning (NOTE [A budget decided from the
            plain step]); the setup's config and budget hold what it decided.

    Returns:
        The setup; nothing is written to disk.

    Raises:
        DeviceError, BudgetError, DataError, ConfigError, InfeasibleBudgetError: user errors.
    """
    device = world.device(resolve_device(config.device))
    num_ranks = plan_world_size if plan_world_size is not None else world.world_size
    how = "plan for one of N ranks with --world-size N"
    parallelism = (
        resolve_parallelism(config.strategy, num_ranks, how=how)
        if plan_world_size is not None
        else resolve_parallelism(config.strategy, num_ranks)
    )
    autocast_dtype = resolve_precision(config.precision, device)
    budget = resolve_budget(config.vram_budget, device)
    if budget is not None and budget_of_plain is not None:
        raise ValueError("budget_of_plain is for a config without a budget")
    data_source, note = resolve_data_path(config)
    preset = get_preset(config.preset)
    data_started = time.perf_counter()
    data, streamed = main_first(
        world,
        lambda: read_windows(
            data_source,
            roles=column_roles(config) if normalizer is None else None,
            encoder_length=config.encoder_length or preset.encoder_length,
            horizon=config.horizon or preset.horizon,
            split=config.split,
            normalizer=normalizer,
            max_host_memory=config.max_host_memory,
            cache=config.data_cache,
            runs_root=(config.out or default_run_dir(config)).parent,
        ),
    )
    data_s = time.perf_counter() - data_started
    model_config = _model_config(preset, data, config, world, data_source)
    seed_everything(config.seed)
    model = TemporalFusionTransformer(model_config).to(device)
    loss_fn = QuantileLoss(model_config.quantiles)
    example = data.train.batch(np.arange(model_config.batch_size))
    example_inputs = tuple(t.to(device) for t in example.inputs())
    example_targets = (example.target.to(device),)

    def planned(
        for_budget: Budget | Callable[[int], Budget] | None,
        settings: TrainConfig,
        threads: Callable[[int], int] | None = None,
    ) -> Plan:
        return agree_on_plan(
            world,
            lambda: make_plan(
                model,
                example_inputs,
                example_targets,
                for_budget,
                loss_fn=loss_fn,
                device=device,
                config=settings,
                autocast_dtype=autocast_dtype,
                world_size=num_ranks,
                parallelism=parallelism,
                cpu_threads=threads,
            ),
        )

    host_tuning = None
    asked = budget_of_plain or budget
    if tune_host and device.type == "cpu":
        plan, host_tuning = _planned_as_tuned(config, device, asked, planned)
    else:
        plan = planned(asked, config)
    if budget_of_plain is not None:
        budget = plan.budget
        config = config.with_updates(vram_budget=budget)
    return Setup(
        config=config,
        device=device,
        autocast_dtype=autocast_dtype,
        data_source=data_source,
        data=data,
        model_config=model_config,
        model=model,
        budget=budget,
        plan=plan,
        loss_fn=loss_fn,
        example_inputs=example_inputs,
        example_targets=example_targets,
        notes=tuple(text for text in (note, streamed) if text),
        world=world,
        parallelism=parallelism,
        host_tuning=host_tuning,
        data_s=data_s,
    )


def _planned_as_tuned(
    config: TrainConfig,
    device: torch.device,
    budget: Budget | Callable[[int], Budget] | None,
    planned: Callable[
        [Budget | Callable[[int], Budget] | None, TrainConfig, Callable[[int], int] | None], Plan
    ],
) -> tuple[Plan, HostTuning | None]:
    """The plan for ``budget`` made in the process tuned as the run will train (NOTE [Tuning
    the host process]), and what was set.

    malloc's setting does not depend on the step, so it is made first; the thread count
    does, and the planner chooses it once the plain step is measured, before it times the
    real model at it (NOTE [Threads chosen from the plain step]): one planning. A compiled
    search times compiled steps outside that planning, so it is sized by a plan without a
    limit first, as before.
    """
    previous = torch.get_num_threads()
    forced = config.use_gradient_checkpointing is True
    if config.compile and isinstance(budget, Budget):
        sizing_config = config.with_updates(use_gradient_checkpointing=None) if forced else config
        unplanned_bytes = planned(None, sizing_config, None).unplanned_peak_bytes
        host_tuning = tune_process(config, device, unplanned_bytes)
    else:
        keep_freed_memory()
        host_tuning = None
    try:
        plan = planned(
            budget,
            config,
            lambda step_bytes: choose_threads(config, step_bytes, default=previous)[0],
        )
    except BaseException:
        torch.set_num_threads(previous)  # no run follows to put the threads back
        raise
    if host_tuning is None:
        host_tuning = tune_process(config, device, plan.unplanned_peak_bytes)
    return plan, host_tuning


def _model_config(
    preset: TFTConfig,
    data: WindowedData,
    config: TrainConfig,
    world: World,
    data_source: DataSource,
) -> TFTConfig:
    """The preset fitted to the data's columns and the run's settings, its batch checked
    against the training windows of every rank."""
    model_config = preset.with_overrides(
        num_observed=data.num_observed,
        num_known=data.num_known,
        static_cardinalities=data.static_cardinalities,
        observed_categorical_cardinalities=data.observed_categorical_cardinalities,
        known_categorical_cardinalities=data.known_categorical_cardinalities,
        encoder_length=data.encoder_length,
        horizon=data.horizon,
        batch_size=config.batch_size or preset.batch_size,
        dropout=config.dropout if config.dropout is not None else preset.dropout,
    )
    if len(data.train) < model_config.batch_size * world.world_size:
        ranks = f" x {world.world_size} ranks" if world.is_distributed else ""
        raise DataError(
            f"{data_source}: {len(data.train)} training windows are fewer than the batch size "
            f"{model_config.batch_size}{ranks}; lower --batch-size or use a longer file"
        )
    return model_config


def autocast(setup: Setup) -> AbstractContextManager[Any]:
    if setup.autocast_dtype is None:
        return nullcontext()
    return torch.autocast(setup.device.type, dtype=setup.autocast_dtype)
