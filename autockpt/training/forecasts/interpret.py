"""What a trained run's model looked at over a data file: each input's mean selection weight, by
the file's column names, and its attention by lag (``autockpt interpret``).

NOTE [Reading the TFT's weights]
The TFT selects its inputs with softmax weights (one per input, summing to 1) and forecasts
with attention over past positions; :meth:`tft.model.transformer.TemporalFusionTransformer.interpret`
returns both for a batch. Over every window of the file:

- *static*: the mean weight of the symbol and each static column;
- *encoder* (the past): the mean over windows and encoder steps of each past input's weight:
  the target's own history (e.g. ``close_log_return``), the observed columns, the known ones
  and the calendar inputs the model adds;
- *decoder* (the known future): the same over the forecast steps;
- *attention by lag*: the mean attention a forecast step pays to the bar ``k`` bars before
  the first forecast bar (``k = 1``: the last bar the model saw), over windows and forecast
  steps. Attention to the forecast steps themselves is left out: it is not a lag.

Each group is sorted, highest weight first. The weights say where the model looked, not that
what it found there is right: read them with the validation skill over the naive forecasts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autockpt.training.forecasts.predict import DEFAULT_BATCH_SIZE, TrainedOnFile
from tft.data.sources.data_source import DataPaths
from tft.data.windows import WindowedData, iterate_batches


@dataclass(frozen=True)
class InputImportance:
    """Mean selection weights by input name, each group sorted highest first, and the mean
    attention by lag (NOTE [Reading the TFT's weights])."""

    static: dict[str, float]
    encoder: dict[str, float]
    decoder: dict[str, float]
    attention_by_lag: list[float]
    """Index ``k - 1``: the attention paid to the bar ``k`` bars before the first forecast."""
    num_windows: int

    def to_json(self) -> dict[str, Any]:
        return {
            "static": self.static,
            "encoder": self.encoder,
            "decoder": self.decoder,
            "attention_by_lag": self.attention_by_lag,
            "num_windows": self.num_windows,
        }


def input_names(data: WindowedData) -> tuple[list[str], list[str], list[str]]:
    """The static, encoder and decoder inputs' names, in the order the model selects them."""
    roles = data.normalizer.roles
    observed_categorical = roles.categorical_columns(roles.observed or [])
    known_categorical = roles.categorical_columns(roles.known)
    static = ["symbol", *(roles.static or [])]
    encoder = [
        *data.observed_columns,
        *data.known_columns,
        *observed_categorical,
        *known_categorical,
    ]
    decoder = [*data.known_columns, *known_categorical]
    return static, encoder, decoder


def interpret(
    run_dir: str | Path,
    data: DataPaths,
    *,
    device: str = "auto",
    batch_size: int | None = None,
    max_windows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> InputImportance:
    """What the run's best model looked at over the windows of ``data``.

    Args:
        run_dir: a run folder of ``autockpt train``.
        data: a Parquet file with the run's columns.
        max_windows: read at most this many windows, evenly spread (default: all).
        progress: called after each batch with the windows read so far and the windows in
            all (the command line draws a bar with it).

    Raises:
        RunError: the run folder is missing or damaged.
        DataError: the data file cannot be read or lacks the run's columns or symbols.
        DeviceError: cuda asked for without a GPU.
    """
    trained = TrainedOnFile.load(run_dir, data, device)
    model, resolved, loaded = trained.model, trained.device, trained.windows
    windows = loaded.whole
    static_names, encoder_names, decoder_names = input_names(loaded)
    sums: dict[str, torch.Tensor] = {}
    count = 0
    step = max(1, len(windows) // max_windows) if max_windows else 1
    done = 0
    with torch.no_grad():
        for batch in iterate_batches(
            windows, batch_size or DEFAULT_BATCH_SIZE, shuffle=False, seed=0, drop_last=False
        ):
            if step > 1:
                batch = type(batch)(*(t[::step] for t in batch))
            _, weights = model.interpret(*(t.to(resolved) for t in batch.inputs()))
            done += len(batch.target) * step
            if progress is not None:
                progress(min(done, len(windows)), len(windows))
            encoder_steps = weights.encoder_weights.size(1)
            parts = {
                "static": weights.static_weights.sum(0),
                "encoder": weights.encoder_weights.mean(1).sum(0),
                "decoder": weights.decoder_weights.mean(1).sum(0),
                # (B, Td, Te): the encoder positions, last first: index k - 1 is lag k.
                "lags": weights.attention[:, :, :encoder_steps].flip(-1).mean(1).sum(0),
            }
            for name, value in parts.items():
                sums[name] = sums.get(name, 0) + value.double().cpu()
            count += weights.static_weights.size(0)
    if count == 0:
        return InputImportance({}, {}, {}, [], 0)

    def ranked(names: list[str], total: torch.Tensor) -> dict[str, float]:
        pairs = zip(names, (total / count).tolist(), strict=True)
        return dict(sorted(pairs, key=lambda pair: -pair[1]))

    return InputImportance(
        static=ranked(static_names, sums["static"]),
        encoder=ranked(encoder_names, sums["encoder"]),
        decoder=ranked(decoder_names, sums["decoder"]),
        attention_by_lag=(sums["lags"] / count).tolist(),
        num_windows=count,
    )
