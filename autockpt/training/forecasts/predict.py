"""Quantile forecasts from a trained run, for every window of a data file, as Parquet.

One output row per (window, horizon step): ``timestamp`` (UTC time of the forecast bar),
``symbol``, ``horizon_step`` (1 = the bar after the last one the model saw),
``actual`` (the realised target, when the file has it, which every full window does) and one
column per quantile, ``q0.1``, ``q0.5``, ... All values are de-normalised to target-transform
units (log returns by default), each symbol with its own scale; the schema metadata records the
target and its transform, and ``unknown_rows`` the rows of each categorical column read as the
unknown category (a JSON object).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from autockpt.errors import RunError, first_line
from autockpt.training.forecasts.evaluate import Evaluation
from autockpt.training.forecasts.scores_by_part import PartEvaluation, ScoresByPart, scoring_of
from autockpt.training.options.data_source import read_windows
from autockpt.training.options.settings import resolve_device
from autockpt.training.setup.runs import BEST_FILE, RunFolder, write_atomic
from tft.data.normalize import Normalizer
from tft.data.sources.data_source import DataPaths, DataSource
from tft.data.windows import WindowDataset, WindowedData, iterate_batches
from tft.model.config import TFTConfig
from tft.model.transformer import TemporalFusionTransformer

DEFAULT_BATCH_SIZE = 256
DEFAULT_MAX_HOST_MEMORY = "1GB"
"""A run's ``max_host_memory`` when its config predates the setting."""
ROW_GROUP_WINDOWS = 16_384
"""Windows of forecasts per row group written (NOTE [Forecasts in row groups])."""


@dataclass(frozen=True)
class PredictionResult:
    """What :func:`predict` wrote."""

    path: Path
    num_rows: int
    num_windows: int
    horizon: int
    unknown_rows: dict[str, int]
    """Rows of each categorical column read as the unknown category (NOTE [Categories])."""
    evaluation: Evaluation | None = None
    """The forecasts against the file's actuals, beside the naive forecasts the run fitted
    (NOTE [Naive forecasts]), over every window; None for a run saved without them."""
    evaluation_by_part: list[PartEvaluation] = field(default_factory=list)
    """The same scores apart for the windows the model trained on, validated on and never saw
    (NOTE [Scores by what the model saw]); parts with no window left out."""
    parts_known: bool = False
    """Whether the run kept its split's cut times (runs before it did not: no parts)."""
    data_note: str | None = None
    """How the file was read where it was streamed from a row cache (and what the cache
    reused); None for a file read into memory."""


def quantile_column(quantile: float) -> str:
    """Column name of one quantile: ``q0.1``, ``q0.5``, ``q0.975``."""
    return f"q{quantile:g}"


@dataclass(frozen=True)
class TrainedOnFile:
    """A run's best model (eval mode) and the windows of a data file, read with the run's
    normalizer: what ``predict`` and ``interpret`` start from."""

    run: RunFolder
    device: torch.device
    model: TemporalFusionTransformer
    config: TFTConfig
    normalizer: Normalizer
    windows: WindowedData
    """Every window of the file (``windows.whole``), no split."""
    data_note: str | None = None
    """:func:`~autockpt.training.options.data_source.read_windows`'s note (a streamed file)."""

    @classmethod
    def load(
        cls,
        run_dir: str | Path,
        data: DataPaths,
        device: str,
        *,
        max_host_memory: str | None = None,
    ) -> TrainedOnFile:
        """Raises RunError, DataError or DeviceError as :func:`predict` documents.

        A file too large for ``max_host_memory`` (unset: the run's setting) is streamed from
        a row cache beside the run folder (NOTE [Row cache] in :mod:`tft.data.streamed.row_cache`);
        the run's own file is read through the cache the run named with ``--data-cache``, if
        it named one: its rows were encoded with this normaliser and need no second build;
        the run's data and more (today's file beside its folder) grows from it (NOTE [A cache
        grown from another] in :mod:`tft.data.streamed.row_cache`).
        """
        run = RunFolder.open(run_dir, need=(BEST_FILE,))
        resolved = resolve_device(device)
        model, config, normalizer = load_trained_model(run, resolved)
        settings = run.read_config()
        if max_host_memory is None:
            saved = settings.get("max_host_memory")
            max_host_memory = saved if isinstance(saved, str) else DEFAULT_MAX_HOST_MEMORY
        run_cache = settings.get("data_cache")
        run_data = settings.get("data")
        same_file = run_data is not None and (
            DataSource.of(run_data).resolved() == DataSource.of(data).resolved()
        )
        windows, note = read_windows(
            data,
            roles=None,
            encoder_length=config.encoder_length,
            horizon=config.horizon,
            split=None,
            normalizer=normalizer,
            max_host_memory=max_host_memory,
            cache=Path(run_cache) if run_cache and same_file else None,
            runs_root=run.path.parent,
            grow_from=Path(run_cache) if run_cache else None,
        )
        return cls(run, resolved, model, config, normalizer, windows, note)


def load_trained_model(
    run: RunFolder, device: torch.device
) -> tuple[TemporalFusionTransformer, TFTConfig, Normalizer]:
    """The run's best model (eval mode, on ``device``), its config and its normalizer.

    Raises:
        RunError: ``best.pt`` is missing, damaged, or does not describe a TFT.
    """
    checkpoint = run.load_checkpoint(BEST_FILE)
    try:
        config = TFTConfig.from_dict(checkpoint["model_config"])
        normalizer = Normalizer.from_dict(checkpoint["normalizer"])
        model = TemporalFusionTransformer(config)
        model.load_state_dict(checkpoint["model"])
    except (KeyError, ValueError, RuntimeError) as error:
        raise RunError(
            f"{run.file(BEST_FILE)} is not a TFT checkpoint of autockpt ({first_line(error)}); "
            "pass the folder of a run made by autockpt train"
        ) from None
    return model.to(device).eval(), config, normalizer


def predict(
    run_dir: str | Path,
    data: DataPaths,
    output: str | Path,
    *,
    device: str = "auto",
    batch_size: int | None = None,
    max_host_memory: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PredictionResult:
    """Forecast every window of ``data`` with the run's best model and write Parquet atomically.

    Args:
        run_dir: a run folder written by ``autockpt train`` (its ``best.pt`` is used).
        data: a Parquet file with the columns the run was trained on.
        output: the Parquet file to write (replaced atomically if it exists).
        device: cpu, cuda or auto.
        batch_size: windows per forward pass.
        max_host_memory: the host memory the data may hold (unset: the run's setting); a
            larger file is streamed from a row cache, and the forecasts are written a row
            group at a time whatever the file's size.
        progress: called after each batch with the windows forecast so far and the windows
            in all (the command line draws a bar with it).

    Returns:
        The path and the number of rows and windows written.

    Raises:
        RunError: the run folder is missing or damaged.
        DataError: the data file cannot be read or lacks the run's columns or symbols.
        DeviceError: cuda asked for without a GPU.

    Example:
        >>> predict("runs/es", "bars.parquet", "forecasts.parquet").num_rows
    """
    trained = TrainedOnFile.load(run_dir, data, device, max_host_memory=max_host_memory)
    run, resolved, model, config = trained.run, trained.device, trained.model, trained.config
    normalizer, loaded = trained.normalizer, trained.windows
    windows = loaded.whole
    unknown_rows = {
        column.name: column.unknown_rows
        for column in loaded.columns
        if column.unknown_rows is not None
    }
    scoring = scoring_of(run, config, normalizer, windows.horizon)
    target = Path(output)
    num_rows = 0

    def write(temporary: Path) -> None:
        # NOTE [Forecasts in row groups]: each batch's forecasts go to the file as they are
        # made (a row group per ROW_GROUP_WINDOWS windows), so a file larger than memory
        # predicts in the memory of a few batches; the writer's schema carries the metadata.
        nonlocal num_rows
        writer: pq.ParquetWriter | None = None
        pending: list[pa.Table] = []
        pending_windows = 0
        try:
            for table in _forecast_tables(
                model,
                resolved,
                windows,
                normalizer,
                config,
                scoring,
                batch_size or DEFAULT_BATCH_SIZE,
                progress,
            ):
                metadata = {
                    **(table.schema.metadata or {}),
                    b"unknown_rows": json.dumps(unknown_rows),
                }
                table = table.replace_schema_metadata(metadata)
                pending.append(table)
                pending_windows += table.num_rows // config.horizon
                num_rows += table.num_rows
                if pending_windows >= ROW_GROUP_WINDOWS:
                    writer = writer or pq.ParquetWriter(temporary, table.schema)
                    writer.write_table(pa.concat_tables(pending))
                    pending, pending_windows = [], 0
            if pending or writer is None:
                last = (
                    pa.concat_tables(pending)
                    if pending
                    else _empty_table(normalizer, config, unknown_rows)
                )
                writer = writer or pq.ParquetWriter(temporary, last.schema)
                writer.write_table(last)
        finally:
            if writer is not None:
                writer.close()

    write_atomic(target, write)
    return PredictionResult(
        path=target,
        num_rows=num_rows,
        num_windows=len(windows),
        horizon=config.horizon,
        unknown_rows=unknown_rows,
        evaluation=scoring.whole.evaluation() if scoring is not None and len(windows) else None,
        evaluation_by_part=scoring.by_part() if scoring is not None else [],
        parts_known=scoring is not None and scoring.cuts is not None,
        data_note=trained.data_note,
    )


def _forecast_tables(
    model: TemporalFusionTransformer,
    device: torch.device,
    windows: WindowDataset,
    normalizer: Normalizer,
    config: TFTConfig,
    scoring: ScoresByPart | None,
    batch_size: int,
    progress: Callable[[int, int], None] | None,
) -> Iterator[pa.Table]:
    """Each batch's forecasts as a table of output rows, scored on the way when ``scoring``."""
    done = 0
    with torch.no_grad():
        for batch in iterate_batches(windows, batch_size, shuffle=False, seed=0, drop_last=False):
            done += len(batch.target)
            if progress is not None:
                progress(done, len(windows))
            inputs = tuple(t.to(device) for t in batch.inputs())
            prediction = model(*inputs).float().cpu()  # (B, H, Q)
            if scoring is not None:
                scoring.add(prediction, batch)
            symbol_index = batch.symbol_index.numpy()
            yield _forecast_table(
                normalizer.denormalize_target(prediction.numpy(), symbol_index),
                normalizer.denormalize_target(batch.target.numpy(), symbol_index),
                batch.decoder_time_ns.numpy(),  # (B, H)
                symbol_index,  # (B,)
                normalizer,
                config.quantiles,
            )


def _empty_table(
    normalizer: Normalizer, config: TFTConfig, unknown_rows: dict[str, int]
) -> pa.Table:
    """The output of a file with no window: the columns, no rows."""
    horizon, quantiles = config.horizon, config.quantiles
    table = _forecast_table(
        np.zeros((0, horizon, len(quantiles))),
        np.zeros((0, horizon)),
        np.zeros((0, horizon), dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        normalizer,
        quantiles,
    )
    metadata = {**(table.schema.metadata or {}), b"unknown_rows": json.dumps(unknown_rows)}
    return table.replace_schema_metadata(metadata)


def _forecast_table(
    forecasts: np.ndarray,
    actuals: np.ndarray,
    times: np.ndarray,
    symbol_index: np.ndarray,
    normalizer: Normalizer,
    quantiles: tuple[float, ...],
) -> pa.Table:
    num_windows, horizon, _ = forecasts.shape  # (N, H, Q)
    names = np.asarray(normalizer.symbols, dtype=object)
    columns: dict[str, pa.Array] = {
        "timestamp": pa.array(times.reshape(-1), type=pa.timestamp("ns", tz="UTC")),
        "symbol": pa.array(np.repeat(names[symbol_index], horizon), type=pa.string()),
        "horizon_step": pa.array(np.tile(np.arange(1, horizon + 1), num_windows), type=pa.int32()),
        "actual": pa.array(actuals.reshape(-1).astype(np.float64)),
    }
    for index, quantile in enumerate(quantiles):
        columns[quantile_column(quantile)] = pa.array(
            forecasts[:, :, index].reshape(-1).astype(np.float64)
        )
    roles = normalizer.roles
    metadata = {"target": roles.target, "target_transform": roles.target_transform}
    return pa.table(columns).replace_schema_metadata(metadata)
