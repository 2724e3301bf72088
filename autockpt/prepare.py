"""From a :class:`~autockpt.config.TrainConfig` to everything a run needs before its first step.

:func:`prepare` resolves the device and precision, reads the budget, loads the data windows,
builds the TFT from the preset and the data's dimensions, and plans its training step. It writes
nothing, so the ``plan`` command stops here and a bad input leaves no trace; ``train`` goes on
to :mod:`autockpt.train`.
"""

from __future__ import annotations

import random
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

import autockpt
from autockpt.config import TrainConfig
from autockpt.distributed import SINGLE_PROCESS, World, agree_on_plan, resolve_parallelism
from autockpt.errors import DataError, DeviceError
from autockpt.plan import Plan
from autockpt.sharding import Parallelism
from autockpt.units import Budget, parse_budget
from tft.config import TFTConfig, get_preset
from tft.data import ColumnRoles, Normalizer, WindowedData, load_windows
from tft.loss import quantile_loss
from tft.model import TemporalFusionTransformer

#: The bundled sample, found from the source tree (``train`` and ``demo`` without a file).
SAMPLE_DATA = Path(__file__).resolve().parents[1] / "examples" / "data" / "sample.parquet"
#: What "no limit" plans against on the CPU when no budget is given: far above any step.
UNLIMITED_BYTES = 2**60


class QuantileLoss:
    """``loss(prediction (B, H, Q), target (B, H)) -> scalar`` in fp32, whatever the autocast."""

    def __init__(self, quantiles: tuple[float, ...]) -> None:
        self.quantiles = quantiles

    def __call__(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return quantile_loss(prediction.float(), target.float(), self.quantiles)


@dataclass(frozen=True)
class Setup:
    """Everything resolved from a config before the first step; ``plan`` prints it."""

    config: TrainConfig
    device: torch.device
    autocast_dtype: torch.dtype | None
    data_path: Path
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

    @property
    def batch_size(self) -> int:
        """Windows per step on this rank (what the plan is for)."""
        return self.model_config.batch_size

    @property
    def global_batch_size(self) -> int:
        """Windows per optimizer step over all ranks."""
        return self.model_config.batch_size * self.world.world_size


def resolve_device(choice: str) -> torch.device:
    """``cpu``, ``cuda`` or ``auto`` -> a device; ``cuda`` without a GPU is a user error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "--device cuda was asked for but PyTorch sees no CUDA GPU here; use --device cpu "
            "(or auto), or install a CUDA build of PyTorch on a machine with a GPU"
        )
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def resolve_precision(choice: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None = plain fp32): bf16 on GPUs with it, fp16 on older GPUs."""
    if choice == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if choice == "fp16" and device.type != "cuda":
        raise DeviceError("--precision fp16 needs a CUDA GPU; use fp32 or bf16 on the CPU")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[choice]


def resolve_budget(text: str | None, device: torch.device) -> Budget | None:
    """The budget to plan for: as given, ``auto`` on CUDA when unset, no limit on the CPU."""
    if text is None:
        return parse_budget("auto", device=device) if device.type == "cuda" else None
    return parse_budget(text, device=device)


def resolve_data_path(config: TrainConfig) -> tuple[Path, str | None]:
    """The data file and, when it is the bundled sample, a note saying so."""
    if config.data is not None:
        return config.data, None
    if not SAMPLE_DATA.is_file():
        raise DataError(
            f"no data file given and the bundled sample {SAMPLE_DATA} is missing; pass a "
            "Parquet file, or make one with `autockpt make-data bars.parquet --days 15`"
        )
    return SAMPLE_DATA, f"no data file given: using the bundled sample {SAMPLE_DATA}"


def column_roles(config: TrainConfig) -> ColumnRoles:
    """The data module's roles, with only the options the user set."""
    given = {
        "target": config.target,
        "target_transform": config.target_transform,
        "symbol": config.symbol_column,
        "timestamp": config.timestamp_column,
        "known": list(config.known_columns) if config.known_columns is not None else None,
    }
    return ColumnRoles.model_validate(
        {key: value for key, value in given.items() if value is not None}
    )


def default_run_dir(config: TrainConfig) -> Path:
    """``runs/<preset>-<date>-<time>`` under the current folder."""
    return Path("runs") / f"{config.preset}-{datetime.now():%Y%m%d-%H%M%S}"


def prepare(
    config: TrainConfig,
    *,
    normalizer: Normalizer | None = None,
    world: World = SINGLE_PROCESS,
    plan_world_size: int | None = None,
) -> Setup:
    """Resolve the device, read the data, build the model and plan its training step.

    Args:
        config: the run's settings.
        normalizer: statistics to apply instead of fitting them (a resumed run's own).
        world: the ranks training together; rank 0 plans for every rank (its process group
            must be joined already, see :func:`autockpt.distributed.process_group`).
        plan_world_size: plan for one rank of this many instead of the world's (the ``plan``
            command's ``--world-size``, run in one process).

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
    data_path, note = resolve_data_path(config)
    preset = get_preset(config.preset)
    data = load_windows(
        data_path,
        roles=column_roles(config) if normalizer is None else None,
        encoder_length=config.encoder_length or preset.encoder_length,
        horizon=config.horizon or preset.horizon,
        normalizer=normalizer,
    )
    model_config = preset.with_overrides(
        num_observed=data.num_observed,
        num_known=data.num_known,
        static_cardinalities=data.static_cardinalities,
        encoder_length=data.encoder_length,
        horizon=data.horizon,
        batch_size=config.batch_size or preset.batch_size,
        dropout=config.dropout if config.dropout is not None else preset.dropout,
    )
    global_batch_size = model_config.batch_size * world.world_size
    if len(data.train) < global_batch_size:
        ranks = f" x {world.world_size} ranks" if world.is_distributed else ""
        raise DataError(
            f"{data_path}: {len(data.train)} training windows are fewer than the batch size "
            f"{model_config.batch_size}{ranks}; lower --batch-size or use a longer file"
        )
    seed_everything(config.seed)
    model = TemporalFusionTransformer(model_config).to(device)
    loss_fn = QuantileLoss(model_config.quantiles)
    example = data.train.batch(np.arange(model_config.batch_size))
    example_inputs = tuple(t.to(device) for t in example.inputs())
    example_targets = (example.target.to(device),)
    plan = agree_on_plan(
        world,
        lambda: make_plan(
            model,
            example_inputs,
            example_targets,
            budget,
            loss_fn=loss_fn,
            device=device,
            config=config,
            autocast_dtype=autocast_dtype,
            world_size=num_ranks,
            parallelism=parallelism,
        ),
    )
    return Setup(
        config=config,
        device=device,
        autocast_dtype=autocast_dtype,
        data_path=data_path,
        data=data,
        model_config=model_config,
        model=model,
        budget=budget,
        plan=plan,
        loss_fn=loss_fn,
        example_inputs=example_inputs,
        example_targets=example_targets,
        notes=(note,) if note else (),
        world=world,
        parallelism=parallelism,
    )


def make_plan(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    example_targets: tuple[torch.Tensor, ...],
    budget: Budget | None,
    *,
    loss_fn: QuantileLoss,
    device: torch.device,
    config: TrainConfig,
    autocast_dtype: torch.dtype | None,
    world_size: int = 1,
    parallelism: Parallelism = "single",
) -> Plan:
    """Plan without touching the random streams training draws from (NOTE [Exact resume]).

    The plan is for one of ``world_size`` ranks sharing the model by ``parallelism``.
    """
    planned_for = budget if budget is not None else unlimited_budget()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return autockpt.plan(
            model,
            example_inputs,
            planned_for,
            loss_fn=loss_fn,
            example_targets=example_targets,
            optimizer="adamw",
            device=device,
            use_gradient_checkpointing=config.use_gradient_checkpointing,
            autocast_dtype=autocast_dtype,
            world_size=world_size,
            parallelism=parallelism,
        )


def unlimited_budget() -> Budget:
    return Budget(
        bytes=UNLIMITED_BYTES,
        text="none",
        reading="no --vram-budget on the CPU: training is not limited (give one to plan for it)",
    )


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and Python's ``random``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def autocast(setup: Setup) -> AbstractContextManager[Any]:
    if setup.autocast_dtype is None:
        return nullcontext()
    return torch.autocast(setup.device.type, dtype=setup.autocast_dtype)
