"""The training run's settings: one validated :class:`TrainConfig`, from TOML and the command line.

Every field has a docstring; it is also what an error message quotes when a value is rejected,
so a user reading ``error: ...`` learns what the key expects. Keys in a TOML file are the field
names (``batch_size = 64``); command-line options override the file. Relative paths are read from
the current folder, as on the command line.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_serializer, field_validator

from autockpt import Budget, parse_budget
from autockpt.errors import AutockptError, BudgetError, ConfigError
from tft.data.splits import split_starts_ns

Device = Literal["cpu", "cuda", "auto"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Schedule = Literal["cosine", "constant"]
TargetTransform = Literal["log_return", "diff", "none"]
Scaling = Literal["per_symbol", "global"]
Strategy = Literal["ddp", "fsdp"]


class TrainConfig(BaseModel):
    """Everything a training run needs, resolved and validated.

    Example:
        >>> TrainConfig(preset="tiny", epochs=2).batch_size is None  # the preset's batch size
        True
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    data: Path | list[Path] | None = None
    """Parquet file of bars, a folder of them or a pattern read as one (NOTE [A folder of files
    as one dataset]), or a list of such paths read as one (NOTE [Several data paths]); unset
    means the bundled sample examples/data/sample.parquet."""
    preset: str = "small"
    """model size, one of tiny, small, tft-225; tiny trains on a laptop CPU in seconds."""
    epochs: int = 10
    """passes over the training windows, a whole number >= 1 (early stopping may end sooner)."""
    batch_size: int | None = None
    """windows per optimizer step, a whole number >= 1; unset uses the preset's batch size."""
    lr: float = 1e-3
    """peak learning rate of AdamW, a number > 0 such as 0.001."""
    weight_decay: float = 0.01
    """AdamW weight decay, a number >= 0 such as 0.01."""
    dropout: float | None = None
    """dropout rate of the model, a number in [0, 1); 0 turns it off; unset uses the preset's."""
    grad_clip_norm: float | None = 1.0
    """largest global gradient norm before clipping, a number > 0; unset turns clipping off."""
    lr_schedule: Schedule = "cosine"
    """learning-rate schedule: cosine (linear warm-up, then cosine decay to 0) or constant."""
    warmup_fraction: float = 0.05
    """share of all steps spent warming the learning rate up, a number in [0, 1)."""
    patience: int = 3
    """epochs without a better validation loss before stopping early, a whole number >= 1."""
    max_steps_per_epoch: int | None = None
    """cap on training steps per epoch, >= 1; unset means all."""
    val_windows: int | Literal["all"] | None = None
    """validation windows scored each epoch, spread evenly over the part: a whole number >= 1,
    or all; unset: as many as an epoch trains on, at least 4096 (NOTE [Scores in proportion])."""
    test_windows: int | Literal["all"] | None = None
    """test windows scored at the end, spread evenly over the part: a whole number >= 1, or
    all; unset: 16384, the same windows for every run (NOTE [Scores in proportion])."""
    device: Device = "auto"
    """where to train: cpu, cuda, or auto (cuda when a GPU is present, else cpu)."""
    precision: Precision = "auto"
    """fp32, bf16 or fp16; auto is bf16 on GPUs that support it, fp16 on other GPUs, fp32 on cpu."""
    seed: int = 0
    """random seed, a whole number >= 0; the same seed gives the same run."""
    out: Path | None = None
    """run folder to create; unset means runs/<preset>-<date>-<time>."""
    vram_budget: Budget | Literal["auto"] | None = None
    """memory budget such as 4GB, 3.5GiB or auto; unset means auto on cuda, no limit on cpu."""
    use_gradient_checkpointing: bool | None = None
    """true recomputes every segment, false none; unset lets the planner choose for the budget."""
    compile: bool = False
    """run the planned training steps through torch.compile (the plan's peak is the eager one)."""
    target: str | None = None
    """column to forecast; unset uses the data module's default (the close price)."""
    target_transform: TargetTransform | None = None
    """what is forecast: log_return (default), diff (price change) or none (the price itself)."""
    symbol_column: str | None = None
    """column naming the instrument; unset uses the data module's default (symbol)."""
    timestamp_column: str | None = None
    """column of bar times; unset uses the data module's default (timestamp)."""
    split: tuple[float, float, float] | tuple[str, str] = (0.7, 0.15, 0.15)
    """shares of the distinct timestamps for the train, validation and test rows, in time
    order: three numbers >= 0 (train > 0) that add up to 1; or two dates, where validation and
    then test begin (2024-03-01,2024-03-15; on --timezone's clock, else UTC)."""
    timezone: str | None = None
    """whose clock times written without a zone are on (America/Chicago); unset reads Parquet
    timestamps without one as UTC and refuses text without one."""
    timestamp_unit: Literal["s", "ms", "us", "ns"] | None = None
    """the unit of integer epoch timestamps; unset infers it from their size."""
    known_columns: tuple[str, ...] | None = None
    """columns known in advance (a holiday flag, the session); calendar features are added anyway."""
    observed_columns: tuple[str, ...] | None = None
    """past-only input columns; unset uses every number, text and boolean column given no other role."""
    static_columns: tuple[str, ...] | None = None
    """columns constant within each symbol (the exchange); unset takes every text column that is."""
    categorical_columns: tuple[str, ...] | None = None
    """integer-coded columns to embed as categories (text and boolean columns always are)."""
    ignore_columns: tuple[str, ...] | None = None
    """columns to leave out."""
    scaling: Scaling | None = None
    """per_symbol (default): the target and real inputs scaled with each symbol's statistics;
    global: one scale over all symbols."""
    encoder_length: int | None = None
    """bars of history the model reads, a whole number >= 1; unset uses the preset's."""
    horizon: int | None = None
    """bars ahead to forecast, a whole number >= 1; unset uses the preset's."""
    quiet: bool = False
    """print JSON lines instead of progress bars (for scripts and logs)."""
    memory_check_every: int = 50
    """on the CPU with a budget, measure the memory of every Nth step (besides the first steps
    after each plan or change of batch shape), a whole number >= 1; 1 measures every step."""
    cpu_threads: int | None = None
    """torch threads of a CPU run, a whole number >= 1; unset: 1 for a small step, else torch's
    default (NOTE [Tuning the host process] in autockpt/training/host/host_tuning.py)."""
    max_host_memory: str = "1GB"
    """host memory the data may hold, such as 1GB or 800MB: a file whose rows need more is
    read in chunks into a row cache on disk and mapped from there (NOTE [Row cache])."""
    data_cache: Path | None = None
    """folder of the row cache of a file too large for max_host_memory; unset means
    data-cache/<file name>-<hash> beside the run folder."""
    strategy: Strategy | None = None
    """how several torchrun ranks share the model: ddp (each holds all of it; the default)
    or fsdp (parameters, gradients and optimizer state split over the ranks)."""

    @field_validator(
        "epochs",
        "batch_size",
        "patience",
        "max_steps_per_epoch",
        "encoder_length",
        "horizon",
        "memory_check_every",
        "cpu_threads",
        "val_windows",
        "test_windows",
    )
    @classmethod
    def _at_least_one(cls, value: Any) -> Any:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be at least 1")
        return value

    @field_validator("data")
    @classmethod
    def _some_data(cls, value: Path | list[Path] | None) -> Path | list[Path] | None:
        if isinstance(value, list) and not value:
            raise ValueError("is an empty list; name a path, or leave it unset for the sample")
        return value

    @field_validator("seed")
    @classmethod
    def _non_negative_int(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 or more")
        return value

    @field_validator("lr", "grad_clip_norm")
    @classmethod
    def _positive_number(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError("must be a finite number above 0")
        return value

    @field_validator("weight_decay")
    @classmethod
    def _non_negative_number(cls, value: float) -> float:
        if not (math.isfinite(value) and value >= 0):
            raise ValueError("must be a finite number >= 0")
        return value

    @field_validator("warmup_fraction", "dropout")
    @classmethod
    def _fraction(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 <= value < 1.0:
            raise ValueError("must be in [0, 1)")
        return value

    @field_validator("split", mode="before")
    @classmethod
    def _dates_as_text(cls, value: Any) -> Any:
        # TOML writes an unquoted date as a date value; the split reads dates as ISO text.
        if isinstance(value, list | tuple):
            return tuple(v.isoformat() if isinstance(v, date) else v for v in value)
        return value

    @field_validator("split")
    @classmethod
    def _shares(
        cls, value: tuple[float, float, float] | tuple[str, str]
    ) -> tuple[float, float, float] | tuple[str, str]:
        shares_or_dates = (
            "must be three shares >= 0, train > 0, that add up to 1, or the two dates where "
            "validation and test begin; write it like 0.8,0.1,0.1 or 2024-03-01,2024-03-15"
        )
        if len(value) == 2:
            if all(_is_number(text) for text in value):
                raise ValueError(shares_or_dates)
            split_starts_ns(value, None)  # ISO text, the second after the first
            return value
        if not (
            all(math.isfinite(share) and share >= 0 for share in value)
            and value[0] > 0
            and math.isclose(sum(value), 1.0, abs_tol=1e-6)
        ):
            raise ValueError(shares_or_dates)
        return value

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        from tft.model.config import PRESET_NAMES

        if value not in PRESET_NAMES:
            raise ValueError("is not a preset")
        return value

    @field_validator("vram_budget", mode="before")
    @classmethod
    def _read_budget(cls, value: Any) -> Any:
        # NOTE [One budget] in autockpt.planner.core.step_budget: the budget is read here, once,
        # so that a typo fails before any data is loaded; ``auto`` needs the device, so the run
        # reads the device's free memory once it knows it (settings.resolve_budget).
        if value is None or isinstance(value, Budget):
            return value
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        return parse_budget(value)

    @field_serializer("vram_budget")
    def _budget_as_written(self, value: Budget | str | None) -> str | None:
        return value.text if isinstance(value, Budget) else value

    @field_validator("max_host_memory")
    @classmethod
    def _readable_size(cls, value: str) -> str:
        try:
            if value.strip().lower() == "auto":
                raise BudgetError("auto is for the device")
            parse_budget(value)
        except BudgetError:
            raise ValueError("is not a size; write it like 1GB, 800MB or 2GiB") from None
        return value

    @field_validator(
        "known_columns",
        "observed_columns",
        "static_columns",
        "categorical_columns",
        "ignore_columns",
    )
    @classmethod
    def _distinct_columns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None:
            if any(not name.strip() for name in value):
                raise ValueError("holds an empty column name")
            if len(set(value)) != len(value):
                raise ValueError("names a column twice")
        return value

    def with_updates(self, **changes: Any) -> TrainConfig:
        """A validated copy with ``changes`` applied (``model_copy`` would skip validation)."""
        # The fields' values as they are (a budget already read stays read), not as dumped.
        return _validate({**dict(self), **changes}, sources={})


def load_train_config(
    toml_path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    base: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """Read a TOML file, apply overrides, validate.

    Args:
        toml_path: a TOML file whose top-level keys are :class:`TrainConfig` fields, or None.
        overrides: field values that win over the file (the command line); ``None`` values are
            ignored, so unset options leave the file's value alone.
        base: values under the file's (a resumed run's saved config).

    Returns:
        The validated config.

    Raises:
        ConfigError: the file is missing or not TOML, a key is unknown, or a value is invalid;
            the message names the key, the value and what it expects.

    Example:
        >>> load_train_config(None, {"preset": "tiny", "epochs": 1}).epochs
        1
    """
    values: dict[str, Any] = dict(base or {})
    sources: dict[str, str] = {}
    if toml_path is not None:
        path = Path(toml_path)
        from_file = _read_toml(path)
        values.update(from_file)
        sources = {key: f"{path}: {key}" for key in from_file}
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
            sources[key] = f"--{key.replace('_', '-')}"
    return _validate(values, sources=sources)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} does not exist; check the path after --config"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"config file {path} cannot be read ({error}); pass a TOML text file"
        ) from None
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(
            f"config file {path} is not valid TOML ({error}); write keys as name = value, "
            'e.g. epochs = 10 or vram_budget = "4GB"'
        ) from None
    for key in values:
        if key not in TrainConfig.model_fields:
            raise ConfigError(f"config file {path}: {_unknown_key_message(key)}")
    return values


def _unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, TrainConfig.model_fields, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key {key!r}; {hint}valid keys: {', '.join(TrainConfig.model_fields)}"


def _validate(values: dict[str, Any], *, sources: Mapping[str, str]) -> TrainConfig:
    try:
        return TrainConfig.model_validate(values)
    except ValidationError as error:
        raise ConfigError(_describe(error.errors()[0], values, sources)) from None


def _describe(detail: Any, values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """One line for the first validation error: where the value came from, why, and the fix."""
    key = str(detail["loc"][0]) if detail["loc"] else "config"
    if detail["type"] == "extra_forbidden":
        return _unknown_key_message(key)
    cause = detail.get("ctx", {}).get("error")
    if isinstance(cause, AutockptError):
        return str(cause)
    where = sources.get(key, key)
    reason = str(detail["msg"]).removeprefix("Value error, ")
    field = TrainConfig.model_fields.get(key)
    about = field.description.rstrip(".") if field is not None and field.description else ""
    about_text = f" ({key}: {about})" if about else ""
    return f"{where} = {values.get(key)!r} is invalid: {reason}{about_text}"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
