"""The run's settings resolved from a :class:`~autockpt.training.options.config.TrainConfig`.

Each function turns one option into what the run uses: the device, the autocast dtype, the
budget, the optimizer, the data file and its column roles, the loss, the seeds. They read and check; none
writes anything, so a bad option ends the run before anything is on disk.
"""

from __future__ import annotations

import functools
import random
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from autockpt import Budget, OptimizerFactory, Parallelism, parse_budget
from autockpt.errors import DataError, DeviceError
from autockpt.training.options.config import TrainConfig
from tft.data.columns import ColumnRoles
from tft.data.sources.data_source import DataSource

#: The bundled sample, found from the source tree (``train`` and ``demo`` without a file).
SAMPLE_DATA = Path(__file__).resolve().parents[3] / "examples" / "data" / "sample.parquet"


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
        # Emulated bf16 (a card without bf16 kernels, which torch counts by default) runs
        # slower than fp32: fp16 there.
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.bfloat16 if native else torch.float16
    if choice == "fp16" and device.type != "cuda":
        raise DeviceError("--precision fp16 needs a CUDA GPU; use fp32 or bf16 on the CPU")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[choice]


def resolve_budget(given: Budget | Literal["auto"] | None, device: torch.device) -> Budget | None:
    """The budget to plan for: as given (read once, by the config), ``auto`` (the device's free
    memory) on CUDA when unset, no limit on the CPU."""
    if isinstance(given, Budget):
        return given
    if given is None and device.type != "cuda":
        return None
    return parse_budget("auto", device=device)


def run_optimizer(
    config: TrainConfig, device: torch.device, parallelism: Parallelism
) -> OptimizerFactory:
    """What makes the run's AdamW: planning counts and times the optimizer this makes, and the
    run trains with what it makes. On the CPU its fused kernel updates every parameter in one
    op, where the default loops over them: 15 ms against 1 ms a step on ``tiny`` (136
    parameters); FSDP's sharded parameters take the default."""
    fused = device.type == "cpu" and parallelism != "fsdp"
    return functools.partial(
        torch.optim.AdamW, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None
    )


def resolve_data_path(config: TrainConfig) -> tuple[DataSource, str | None]:
    """The data (a file, a folder, a pattern or several paths) and, when it is the bundled
    sample, a note saying so."""
    if config.data is not None:
        return DataSource.of(config.data), None
    if not SAMPLE_DATA.is_file():
        raise DataError(
            f"no data file given and the bundled sample {SAMPLE_DATA} is missing; pass a "
            "Parquet file, or make one with `autockpt make-data bars.parquet --days 15`"
        )
    return DataSource.of(SAMPLE_DATA), f"no data file given: using the bundled sample {SAMPLE_DATA}"


def column_roles(config: TrainConfig) -> ColumnRoles:
    """The data module's roles, with only the options the user set."""
    given = {
        "target": config.target,
        "target_transform": config.target_transform,
        "symbol": config.symbol_column,
        "timestamp": config.timestamp_column,
        "timezone": config.timezone,
        "timestamp_unit": config.timestamp_unit,
        "known": config.known_columns,
        "observed": config.observed_columns,
        "static": config.static_columns,
        "categorical": config.categorical_columns,
        "ignore": config.ignore_columns,
        "scaling": config.scaling,
    }
    return ColumnRoles.model_validate(
        {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in given.items()
            if value is not None
        }
    )


def default_run_dir(config: TrainConfig) -> Path:
    """``runs/<preset>-<date>-<time>`` under the current folder."""
    return Path("runs") / f"{config.preset}-{datetime.now():%Y%m%d-%H%M%S}"


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and Python's ``random``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
