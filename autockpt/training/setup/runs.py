"""The run folder: everything a training run leaves behind, written so a kill never corrupts it.

```
runs/NAME/
  config.json     the resolved TrainConfig
  columns.json    every column of the data file and how the model uses it (tft.data.column_table)
  plan.json       the memory plan (autockpt.Plan.model_validate_json reloads it)
  metrics.jsonl   one JSON object per line: steps, epochs, events (re-plans)
  best.pt         the model with the best validation loss so far
  last.pt         the state at the end of the last finished epoch (what --resume reads)
```

Every file is written to a temporary name in the same folder and renamed over the old one
(``os.replace`` is atomic on one file system), so a reader sees the old file or the new one,
never half of one. ``metrics.jsonl`` is rewritten whole at the end of each epoch, together with
``last.pt``, so the two always describe the same point of the run.

Model files hold only tensors and plain containers and are read with
``torch.load(weights_only=True)``: opening someone else's run folder never runs their code. The
random-number states of torch, numpy and Python are therefore stored as tensors and lists.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tft.errors as tft_errors
from autockpt import Budget
from autockpt.errors import DataError, RunError
from autockpt.training.host.distributed import SINGLE_PROCESS, World, resolve_parallelism
from autockpt.training.options.config import TrainConfig, load_train_config
from autockpt.training.options.settings import column_roles, default_run_dir
from autockpt.training.setup.prepare import Setup, prepare
from tft.data.normalize import Normalizer
from tft.model.config import TFTConfig

CONFIG_FILE = "config.json"
PLAN_FILE = "plan.json"
COLUMNS_FILE = "columns.json"
METRICS_FILE = "metrics.jsonl"
NAIVE_FILE = "naive.json"
BEST_FILE = "best.pt"
LAST_FILE = "last.pt"


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary_path)``, then rename the temporary file to ``path``.

    The temporary file lives in ``path``'s folder (a rename across file systems is not atomic)
    and is removed if ``write`` fails, so nothing half-written is ever left behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        # mkstemp makes the file private; give it the permissions a plain open() would.
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""

    def write(temporary: Path) -> None:
        temporary.write_text(text, encoding="utf-8")

    write_atomic(path, write)


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


class RunFolder:
    """One training run's folder; see the module docstring for its files.

    Use :meth:`create` for a new run and :meth:`open` to resume or read one.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, path: str | Path) -> RunFolder:
        """Make the folder for a new run.

        Raises:
            RunError: the folder already holds a run (so it is never overwritten by accident),
                or it is a file.
        """
        folder = Path(path)
        cls.check_new(folder)
        folder.mkdir(parents=True, exist_ok=True)
        return cls(folder)

    @staticmethod
    def check_new(path: str | Path) -> None:
        """Raise unless ``path`` can become a new run's folder (creates nothing).

        Raises:
            RunError: the path is a file, or a folder that already holds a run.
        """
        folder = Path(path)
        if folder.exists() and not folder.is_dir():
            raise RunError(f"run folder {folder} is a file; pass a folder path to --out")
        if (folder / CONFIG_FILE).exists() or (folder / LAST_FILE).exists():
            raise RunError(
                f"run folder {folder} already holds a run; continue it with --resume {folder} "
                "or choose another --out"
            )

    @classmethod
    def open(cls, path: str | Path, *, need: Iterable[str] = (CONFIG_FILE, LAST_FILE)) -> RunFolder:
        """Open an existing run whose folder holds every file in ``need``.

        Raises:
            RunError: the folder or one of the files is missing.
        """
        folder = Path(path)
        if not folder.is_dir():
            raise RunError(
                f"run folder {folder} does not exist; check the path, or start a new run with "
                f"--out {folder}"
            )
        for name in need:
            if not (folder / name).is_file():
                raise RunError(
                    f"run folder {folder} has no {name}, so it holds no finished epoch; "
                    f"start a new run with --out, or pass the folder of a run that finished one"
                )
        return cls(folder)

    def file(self, name: str) -> Path:
        """Path of ``name`` inside the folder."""
        return self.path / name

    def read_config(self) -> dict[str, Any]:
        """The saved config as a plain dict (validated by the caller)."""
        try:
            value = json.loads(self.file(CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RunError(
                f"run folder {self.path}: {CONFIG_FILE} cannot be read ({error}); "
                "the run is damaged, start a new one with --out"
            ) from None
        if not isinstance(value, dict):
            raise RunError(
                f"run folder {self.path}: {CONFIG_FILE} is not a JSON object; "
                "start a new run with --out"
            )
        return value

    def write_config(self, config: Mapping[str, Any]) -> None:
        write_json_atomic(self.file(CONFIG_FILE), dict(config))

    def write_plan(self, plan_json: str) -> None:
        write_text_atomic(self.file(PLAN_FILE), plan_json)

    def write_columns(self, setup: Setup) -> None:
        """The data's column table (what the model reads), as a JSON list."""
        columns = [column.model_dump(mode="json") for column in setup.data.columns]
        write_json_atomic(self.file(COLUMNS_FILE), columns)

    def write_naive(self, setup: Setup) -> None:
        """The naive forecasts fitted on the training windows (NOTE [Naive forecasts]) and the
        run's split's cut times, for ``predict`` to score against and by (NOTE [Scores by what
        the model saw])."""
        cuts = setup.data.split_cuts_ns
        scoring = {**setup.naive_forecasts.to_dict(), "split_cuts_ns": cuts and list(cuts)}
        write_json_atomic(self.file(NAIVE_FILE), scoring)

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every record of ``metrics.jsonl`` (empty when there is none yet)."""
        path = self.file(METRICS_FILE)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    def append_metrics(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Add records to ``metrics.jsonl``, rewriting it atomically."""
        path = self.file(METRICS_FILE)
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        new = "".join(json.dumps(dict(record), sort_keys=True) + "\n" for record in records)
        write_text_atomic(path, old + new)

    def save_checkpoint(self, name: str, checkpoint: Mapping[str, Any]) -> None:
        """Save a checkpoint (tensors and plain containers only) atomically."""
        write_atomic(self.file(name), lambda temporary: torch.save(dict(checkpoint), temporary))

    def load_checkpoint(
        self, name: str, *, map_location: str | torch.device = "cpu"
    ) -> dict[str, Any]:
        """Load a checkpoint without running any code stored in it.

        Raises:
            RunError: the file is missing, damaged, or holds more than tensors and plain values.
        """
        path = self.file(name)
        if not path.is_file():
            raise RunError(
                f"run folder {self.path} has no {name}; train it first with --out {self.path}"
            )
        try:
            value = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as error:  # torch raises many types for a damaged or unsafe file
            first_line = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            raise RunError(
                f"{path} cannot be loaded safely ({first_line}); the run is damaged or was not "
                "written by autockpt, start a new one with --out"
            ) from None
        if not isinstance(value, dict):
            raise RunError(f"{path} is not an autockpt checkpoint; start a new run with --out")
        return value


def capture_rng_state() -> dict[str, Any]:
    """The torch, CUDA, numpy and Python random states as tensors and lists (safe to save)."""
    numpy_name, numpy_keys, numpy_pos, numpy_has_gauss, numpy_gauss = np.random.get_state()
    python_version, python_internal, python_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "name": str(numpy_name),
            "keys": torch.from_numpy(np.asarray(numpy_keys, dtype=np.int64)),
            "pos": int(numpy_pos),
            "has_gauss": int(numpy_has_gauss),
            "cached_gaussian": float(numpy_gauss),
        },
        "python": {
            "version": int(python_version),
            "internal": list(python_internal),
            "gauss_next": python_gauss,
        },
    }


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        # Saved on more devices than this machine has (resumed on fewer GPUs): the devices it
        # has take theirs; set_rng_state_all would index past the last one.
        for device, saved in zip(range(torch.cuda.device_count()), state["cuda"], strict=False):
            torch.cuda.set_rng_state(saved, device)
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["name"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    python_state = state["python"]
    random.setstate(
        (python_state["version"], tuple(python_state["internal"]), python_state["gauss_next"])
    )


def check_compatible(
    folder: Path, saved: Mapping[str, Any], current: Mapping[str, Any], *, what: str
) -> None:
    """Raise if ``current`` differs from ``saved`` (the model or the data columns of a run).

    Raises:
        RunError: naming the first differing key, both values, and the way out.
    """
    saved_plain = json.loads(json.dumps(dict(saved), default=str))
    current_plain = json.loads(json.dumps(dict(current), default=str))
    for key in sorted(set(saved_plain) | set(current_plain)):
        if saved_plain.get(key) != current_plain.get(key):
            raise RunError(
                f"cannot resume {folder}: its {what} has {key}={saved_plain.get(key)!r} but this run "
                f"has {key}={current_plain.get(key)!r}; resume with the run's own settings, or start a "
                "new run with --out"
            )


# ---------------------------------------------------------------------------- starting and resuming


def start_run(
    config: TrainConfig,
    *,
    world: World = SINGLE_PROCESS,
    budget_of_plain: Callable[[int], Budget] | None = None,
) -> tuple[Setup, RunFolder]:
    """Prepare a new run and create its folder (only once everything checked out).

    With several ranks every rank checks the folder, rank 0 alone creates and writes it.
    ``budget_of_plain``: where the config gives no budget, the budget as a function of the
    plain step's bytes (NOTE [A budget decided from the plain step]); the run's saved config
    holds what it decided.
    """
    out = config.out or default_run_dir(config)
    RunFolder.check_new(out)
    # Planning is collective (rank 0 sends the plan), so no rank creates the folder before
    # every rank has checked it.
    setup = prepare(config, world=world, tune_host=True, budget_of_plain=budget_of_plain)
    if not world.is_main:
        return setup, RunFolder(out)
    run = RunFolder.create(out)
    # The data path (and its cache's) is stored absolute so that --resume and predict work
    # from any folder.
    cache = setup.config.data_cache
    resolved = setup.config.model_copy(
        update={
            "out": out,
            "data": setup.data_source.config_value(),
            "data_cache": cache.resolve() if cache is not None else None,
        }
    )
    run.write_config(resolved.model_dump(mode="json"))
    run.write_plan(setup.plan.model_dump_json(indent=2))
    run.write_columns(setup)
    run.write_naive(setup)
    return setup, run


def resumed_config(
    folder: str | Path, toml_path: str | Path | None, overrides: dict[str, Any]
) -> tuple[RunFolder, TrainConfig]:
    """Open a run to continue it and give its saved config with a TOML file and ``overrides``.

    Settings that change the model or its data (preset, column roles, window lengths, batch
    size) must stay as they were; the rest (epochs, device, budget, ...) may change.

    Raises:
        RunError: the folder is missing or damaged, or the overrides change the model or data.
    """
    run = RunFolder.open(folder)
    saved = run.read_config()
    try:
        saved_config = TrainConfig.model_validate(saved)
    except ValueError as error:
        raise RunError(
            f"run folder {run.path}: {run.file('config.json').name} is not a valid config "
            f"({str(error).splitlines()[0]}); start a new run with --out"
        ) from None
    config = load_train_config(
        toml_path, {**overrides, "out": run.path}, base=saved_config.model_dump()
    )
    check_compatible(
        run.path,
        {"preset": saved_config.preset, **column_roles(saved_config).model_dump()},
        {"preset": config.preset, **column_roles(config).model_dump()},
        what="config",
    )
    return run, config


def resume_run(
    run: RunFolder, config: TrainConfig, *, world: World = SINGLE_PROCESS
) -> tuple[Setup, dict[str, Any]]:
    """Prepare the continuation of ``run`` (from :func:`resumed_config`) and its last state.

    Raises:
        RunError: the checkpoint is damaged, was trained on another number of ranks or with
            another strategy, or does not fit the data or the model.
    """
    checkpoint = run.load_checkpoint(LAST_FILE)
    saved_world_size = int(checkpoint.get("world_size", 1))
    if saved_world_size != world.world_size:
        raise RunError(
            f"cannot resume {run.path}: it was trained on {saved_world_size} rank(s) and this "
            f"run has {world.world_size}; resume with torchrun --nproc-per-node "
            f"{saved_world_size} (or a plain autockpt train for 1), or start a new run with --out"
        )
    saved_parallelism = checkpoint.get("parallelism", "single" if saved_world_size == 1 else "ddp")
    parallelism = resolve_parallelism(config.strategy, world.world_size)
    if saved_parallelism != parallelism:
        raise RunError(
            f"cannot resume {run.path}: it was trained with --strategy {saved_parallelism} and "
            f"this run uses {parallelism} (the saved optimizer state is laid out for it); "
            f"resume with --strategy {saved_parallelism}, or start a new run with --out"
        )
    try:
        setup = prepare(
            config, normalizer=_saved_normalizer(run, checkpoint), world=world, tune_host=True
        )
    except (DataError, tft_errors.DataError) as error:
        raise RunError(f"cannot resume {run.path} on this data: {error}") from None
    check_compatible(
        run.path,
        saved_model_config(checkpoint),
        setup.model_config.model_dump(mode="json"),
        what="model",
    )
    if world.is_main:
        run.write_config(config.model_dump(mode="json"))
        run.write_plan(setup.plan.model_dump_json(indent=2))
        run.write_columns(setup)
        run.write_naive(setup)
    return setup, checkpoint


def saved_model_config(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's model config with every field, those added since it was saved at
    their defaults (a run from before categorical inputs has none), or as saved if invalid."""
    saved = dict(checkpoint.get("model_config", {}))
    try:
        return TFTConfig.from_dict(saved).model_dump(mode="json")
    except tft_errors.ConfigError:
        return saved


def _saved_normalizer(run: RunFolder, checkpoint: dict[str, Any]) -> Normalizer:
    try:
        return Normalizer.from_dict(checkpoint["normalizer"])
    except (KeyError, tft_errors.DataError):
        raise RunError(
            f"run folder {run.path}: {LAST_FILE} has no usable normalizer; start a new run with --out"
        ) from None
