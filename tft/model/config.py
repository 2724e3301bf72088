"""Configuration of the Temporal Fusion Transformer: one validated, immutable value and presets.

Build a config from user input with ``TFTConfig(**values)``, ``TFTConfig.from_dict(data)``,
``get_preset(name, **overrides)`` or ``config.with_overrides(**changes)``: each raises
:class:`tft.errors.ConfigError` with a one-line message that names the bad value and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from tft.errors import ConfigError


class TFTConfig(BaseModel):
    """Sizes of a Temporal Fusion Transformer and of the windows it reads."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    num_observed: int
    """Real inputs known only up to the forecast time (the target's past among them)."""

    num_known: int
    """Real inputs known for the past and the future (calendar features); the decoder reads them."""

    static_cardinalities: list[int] = [1]
    """Number of categories of each static input (one id per series, e.g. the symbol)."""

    observed_categorical_cardinalities: list[int] = []
    """Number of categories (the "unknown" one included) of each time-varying categorical
    input known only up to the forecast time (e.g. a trading session flag)."""

    known_categorical_cardinalities: list[int] = []
    """Number of categories of each categorical input known for the past and the future."""

    hidden_size: int = 64
    """Width of the model (d_model): the LSTM, the attention and every GRN between them."""

    variable_hidden_size: int = 8
    """Width of each input variable's embedding and of its own GRN's hidden layer."""

    num_heads: int = 4
    """Attention heads; ``hidden_size`` must be a multiple of it."""

    num_lstm_layers: int = 1
    """Stacked layers of the LSTM encoder and of the LSTM decoder."""

    dropout: float = 0.1
    """Dropout rate in every gated layer and in attention, in [0, 1)."""

    encoder_length: int
    """Past time steps the model reads (the encoder window)."""

    horizon: int
    """Future time steps the model forecasts (the decoder window)."""

    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    """Quantiles forecast at every future step, strictly increasing, each in (0, 1)."""

    batch_size: int = 32
    """Training batch size (windows per optimizer step)."""

    @field_validator(
        "num_observed",
        "num_known",
        "hidden_size",
        "variable_hidden_size",
        "num_heads",
        "num_lstm_layers",
        "encoder_length",
        "horizon",
        "batch_size",
    )
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"must be 1 or more, got {value}")
        return value

    @field_validator("static_cardinalities")
    @classmethod
    def _one_static_input(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("needs at least one static input; use [1] for a single series")
        return value

    @field_validator(
        "static_cardinalities",
        "observed_categorical_cardinalities",
        "known_categorical_cardinalities",
    )
    @classmethod
    def _valid_cardinalities(cls, value: list[int]) -> list[int]:
        bad = [c for c in value if c < 1]
        if bad:
            raise ValueError(f"has cardinalities below 1 ({bad}); every input needs 1 category")
        return value

    @field_validator("dropout")
    @classmethod
    def _valid_dropout(cls, value: float) -> float:
        if not (math.isfinite(value) and 0.0 <= value < 1.0):
            raise ValueError(f"must be in [0, 1), got {value}; use 0 to turn dropout off")
        return value

    @field_validator("quantiles")
    @classmethod
    def _valid_quantiles(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value:
            raise ValueError("needs at least one quantile, e.g. (0.5,)")
        if any(not (0.0 < q < 1.0) for q in value):
            raise ValueError(f"must each lie in (0, 1), got {value}")
        if any(a >= b for a, b in zip(value, value[1:], strict=False)):
            raise ValueError(f"must be strictly increasing without repeats, got {value}")
        return value

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TFTConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}; "
                f"choose hidden_size = num_heads x head width (e.g. {self.num_heads * 16})"
            )
        return self

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise ConfigError(_describe(error)) from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TFTConfig:
        """Build a config from a parsed file (JSON, TOML).

        Raises:
            ConfigError: a missing, unknown or invalid field.
        """
        return cls(**dict(data))

    def with_overrides(self, **changes: Any) -> TFTConfig:
        """A validated copy with ``changes`` applied (``model_copy`` would skip validation).

        Raises:
            ConfigError: a change names an unknown field or gives an invalid value.
        """
        return TFTConfig(**{**self.model_dump(), **changes})

    @property
    def num_quantiles(self) -> int:
        """Outputs per forecast step."""
        return len(self.quantiles)

    @property
    def num_static(self) -> int:
        """Static categorical inputs."""
        return len(self.static_cardinalities)

    @property
    def num_encoder_categorical(self) -> int:
        """Time-varying categorical inputs of the encoder: observed, then known."""
        return len(self.observed_categorical_cardinalities) + self.num_decoder_categorical

    @property
    def num_decoder_categorical(self) -> int:
        """Categorical inputs of the decoder: the known ones."""
        return len(self.known_categorical_cardinalities)


def _describe(error: ValidationError) -> str:
    """One line naming every bad field, its problem and, for unknown fields, the known ones."""
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = f"is not a field (known fields: {', '.join(TFTConfig.model_fields)})"
        elif item["type"] == "missing":
            message = "is required"
        problems.append(f"{field} {message}" if field else message)
    return "bad TFT config: " + "; ".join(problems)


_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        num_observed=6,
        num_known=4,
        hidden_size=16,
        variable_hidden_size=4,
        num_heads=2,
        encoder_length=24,
        horizon=4,
        # At 8 windows a step was mostly per-op overhead: an epoch of the bundled sample took
        # 3,615 steps; at 64 it takes 452, each about 2.5x the time of a step of 8.
        batch_size=64,
    ),
    "small": dict(
        num_observed=32,
        num_known=4,
        hidden_size=32,
        variable_hidden_size=8,
        num_heads=4,
        encoder_length=60,
        horizon=10,
        batch_size=16,
    ),
    "tft-225": dict(
        num_observed=225,
        num_known=4,
        hidden_size=64,
        variable_hidden_size=8,
        num_heads=4,
        encoder_length=120,
        horizon=10,
        dropout=0.1,
        batch_size=32,
    ),
}

#: Names accepted by :func:`get_preset`, smallest first.
PRESET_NAMES: tuple[str, ...] = tuple(_PRESETS)


def get_preset(name: str, **overrides: Any) -> TFTConfig:
    """The named preset, with ``overrides`` applied.

    ``tiny`` runs a CPU training step in milliseconds (tests), ``small`` a laptop run, and
    ``tft-225`` is the full model: 225 observed inputs, two hours of minute bars.

    Args:
        name: one of :data:`PRESET_NAMES`.
        **overrides: fields to change, e.g. ``num_observed=12``.

    Returns:
        The validated config.

    Raises:
        ConfigError: an unknown preset name, or an invalid override.

    Example:
        >>> get_preset("tiny", encoder_length=12).encoder_length
        12
    """
    if name not in _PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    return TFTConfig(**{**_PRESETS[name], **overrides})
