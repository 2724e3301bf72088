"""The ``autockpt`` argument parser: the subcommands, their options, and the config overrides.

Each subcommand is one small unit here: a name, a one-line summary, an example and a function
adding its own arguments (:data:`SUBCOMMANDS`). The option groups shared by plan, train and demo
are built once. The parser knows nothing of what the commands do; :mod:`autockpt.cli.main` looks
the handler up by the subcommand's name. :func:`overrides` turns the parsed options into the
:class:`~autockpt.training.options.config.TrainConfig` fields the user gave.

Nothing here imports torch, so ``autockpt --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

_DATA_HELP = (
    "Parquet file with the run's columns, a folder of them or a quoted pattern "
    "('data/*.parquet'); several read as one"
)
_BUDGET_HELP = (
    "memory budget as nvidia-smi would show it: 4GB, 3.5GiB, 800MB (GB/MB powers of 10, "
    "GiB/MiB powers of 2, a bare number is bytes) or auto (free GPU memory less 10%%). "
    "Default: auto on a GPU; on the CPU no limit (the plan recomputes nothing); give one to "
    "enforce it on tracked tensor bytes"
)


def comma_list(text: str) -> tuple[str, ...]:
    """``"ES, NQ,"`` -> ``("ES", "NQ")``: a comma-separated option, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


# ---------------------------------------------------------------------------- config overrides

#: The parsed options that are :class:`~autockpt.training.options.config.TrainConfig` fields.
CONFIG_KEYS = (
    "preset",
    "vram_budget",
    "batch_size",
    "device",
    "precision",
    "seed",
    "dropout",
    "encoder_length",
    "horizon",
    "use_gradient_checkpointing",
    "target",
    "target_transform",
    "symbol_column",
    "timestamp_column",
    "split",
    "timezone",
    "timestamp_unit",
    "known_columns",
    "observed_columns",
    "static_columns",
    "categorical_columns",
    "ignore_columns",
    "scaling",
    "max_host_memory",
    "data_cache",
    "quiet",
    "strategy",
    "epochs",
    "lr",
    "max_steps_per_epoch",
    "val_windows",
    "test_windows",
    "memory_check_every",
    "cpu_threads",
    "compile",
    "out",
    "data",
)


def _data_value(paths: list[Path] | None) -> Path | list[Path] | None:
    """The data paths given as the config takes them: none, the one path, or the list of
    several, read as one dataset (NOTE [Several data paths] in
    :mod:`tft.data.sources.data_source`: the shell's expansion of an unquoted pattern is the
    pattern's files)."""
    if not paths:
        return None
    return paths[0] if len(paths) == 1 else paths


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the user gave on the command line (unset options are left out)."""
    values = {key: getattr(args, key, None) for key in CONFIG_KEYS}
    values["data"] = _data_value(values["data"])
    return {key: value for key, value in values.items() if value is not None}


# ---------------------------------------------------------------------------- option groups


def _add_model_options(parser: argparse.ArgumentParser, *, data: bool = True) -> None:
    """Options shared by plan, train and demo: the model, the data roles, the budget."""
    if data:
        parser.add_argument(
            "data",
            nargs="*",
            type=Path,
            help="Parquet file of bars, a folder of them (hive folders' keys are columns) or a "
            "quoted pattern ('data/*.parquet'); several read as one; default: the bundled "
            "sample",
        )
    group = parser.add_argument_group("model and budget")
    group.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML file of settings (keys as in TrainConfig)"
    )
    group.add_argument(
        "--preset", metavar="NAME", help="model size: tiny, small (default) or tft-225"
    )
    group.add_argument("--vram-budget", metavar="SIZE", help=_BUDGET_HELP)
    group.add_argument(
        "--batch-size", type=int, metavar="N", help="windows per step (default: the preset's)"
    )
    group.add_argument(
        "--device", metavar="cpu|cuda|auto", help="cpu, cuda or auto (default: auto)"
    )
    group.add_argument(
        "--precision",
        metavar="fp32|bf16|fp16",
        help="fp32, bf16 or fp16 (default: bf16/fp16 on a GPU, fp32 on the CPU)",
    )
    group.add_argument("--seed", type=int, metavar="N", help="random seed (default: 0)")
    group.add_argument(
        "--strategy",
        choices=("ddp", "fsdp"),
        help="how torchrun's ranks share the model: ddp (default; each holds all of it) or "
        "fsdp (parameters, gradients and optimizer state split over the ranks)",
    )
    group.add_argument(
        "--dropout", type=float, metavar="RATE", help="dropout rate, 0 for none (default: preset's)"
    )
    group.add_argument(
        "--encoder-length", type=int, metavar="N", help="bars of history (default: preset's)"
    )
    group.add_argument(
        "--horizon", type=int, metavar="N", help="bars to forecast (default: preset's)"
    )
    checkpointing = group.add_mutually_exclusive_group()
    checkpointing.add_argument(
        "--use-gradient-checkpointing",
        dest="use_gradient_checkpointing",
        action="store_const",
        const=True,
        help="recompute every segment in backward (neither flag: the planner decides)",
    )
    checkpointing.add_argument(
        "--no-gradient-checkpointing",
        dest="use_gradient_checkpointing",
        action="store_const",
        const=False,
        help="recompute nothing (neither flag: the planner decides)",
    )
    _add_column_options(parser)
    parser.add_argument(
        "--quiet",
        action="store_const",
        const=True,
        help="print JSON lines instead of tables and bars",
    )


def _add_column_options(parser: argparse.ArgumentParser) -> None:
    """The data file's columns and their roles, scaling, and the host memory the data holds."""
    roles = parser.add_argument_group("data columns")
    roles.add_argument("--target", metavar="COLUMN", help="column to forecast (default: close)")
    roles.add_argument(
        "--target-transform",
        metavar="KIND",
        help="log_return (default), diff, or none (the level itself)",
    )
    roles.add_argument(
        "--symbol-column", metavar="COLUMN", help="instrument column (default: symbol, if present)"
    )
    roles.add_argument(
        "--timestamp-column", metavar="COLUMN", help="bar time column (default: timestamp)"
    )
    roles.add_argument(
        "--split",
        type=comma_list,
        metavar="SHARES|DATES",
        help="shares of the timestamps for training, validation and test, in time order "
        "(default: 0.7,0.15,0.15), or the two dates where validation and test begin, e.g. "
        "2024-03-01,2024-03-15 (on --timezone's clock, else UTC)",
    )
    roles.add_argument(
        "--timezone",
        metavar="ZONE",
        help="whose clock times written without a zone are on, e.g. America/Chicago (default: "
        "Parquet timestamps without one are UTC; text without one must say)",
    )
    roles.add_argument(
        "--timestamp-unit",
        choices=("s", "ms", "us", "ns"),
        help="unit of integer epoch timestamps (default: inferred from their size)",
    )
    roles.add_argument(
        "--known-columns",
        type=comma_list,
        metavar="A,B",
        help="comma-separated columns known in advance, e.g. holiday,session",
    )
    roles.add_argument(
        "--observed-columns",
        type=comma_list,
        metavar="A,B",
        help="past-only input columns (default: every number, text and boolean column with no "
        "other role)",
    )
    roles.add_argument(
        "--static-columns",
        type=comma_list,
        metavar="A,B",
        help="columns constant within each symbol, e.g. exchange (default: every text column "
        "that is)",
    )
    roles.add_argument(
        "--categorical-columns",
        type=comma_list,
        metavar="A,B",
        help="integer-coded columns to embed as categories (text and booleans always are)",
    )
    roles.add_argument(
        "--ignore-columns", type=comma_list, metavar="A,B", help="columns to leave out"
    )
    roles.add_argument(
        "--scaling",
        choices=("per_symbol", "global"),
        help="scale the target and real inputs per symbol (default) or over all symbols",
    )
    roles.add_argument(
        "--max-host-memory",
        metavar="SIZE",
        help="host memory the data may hold (default: 1GB); a file whose rows need more is "
        "read in chunks into a row cache on disk and streamed from it",
    )
    roles.add_argument(
        "--data-cache",
        type=Path,
        metavar="DIR",
        help="row cache folder: stream the file through it whatever its size (default: "
        "data-cache/ beside the run folders, for a file too large for --max-host-memory)",
    )


def _windows(text: str) -> int | str:
    """``--val-windows`` / ``--test-windows``: a whole number >= 1, or ``all``."""
    if text.strip().lower() == "all":
        return "all"
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of windows; pass a whole number >= 1 such as 4096, or all"
        )
    return int(text)


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by train and demo: epochs, learning rate, step cap, run folder."""
    group = parser.add_argument_group("training")
    group.add_argument("--epochs", type=int, metavar="N", help="passes over the data (default: 10)")
    group.add_argument(
        "--lr", type=float, metavar="RATE", help="peak learning rate (default: 0.001)"
    )
    group.add_argument(
        "--max-steps-per-epoch", type=int, metavar="N", help="cap on training steps per epoch"
    )
    group.add_argument(
        "--val-windows",
        type=_windows,
        metavar="N|all",
        help="validation windows scored each epoch, spread evenly over the part (default: as "
        "many as an epoch trains on, at least 4096)",
    )
    group.add_argument(
        "--test-windows",
        type=_windows,
        metavar="N|all",
        help="test windows scored at the end, spread evenly over the part; the same windows "
        "for every run (default: 16384)",
    )
    group.add_argument(
        "--memory-check-every",
        type=int,
        metavar="N",
        help="on the CPU with a budget, measure every Nth step's memory besides the first "
        "steps after each plan (default: 50; 1 measures every step)",
    )
    group.add_argument(
        "--cpu-threads",
        type=int,
        metavar="N",
        help="torch threads of a CPU run (default: 1 for a small model, else all cores)",
    )
    group.add_argument(
        "--compile",
        action="store_const",
        const=True,
        help="run the planned training steps through torch.compile (slower first steps)",
    )
    group.add_argument(
        "--out", type=Path, metavar="DIR", help="run folder to create (default: runs/PRESET-TIME)"
    )


# ---------------------------------------------------------------------------- subcommands


def _make_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="Parquet file to write")
    parser.add_argument("--days", type=int, default=15, help="trading days (default: 15)")
    parser.add_argument("--features", type=int, default=16, help="feature columns (default: 16)")
    parser.add_argument("--symbols", default="ES", help="comma-separated symbols (default: ES)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    _add_model_options(parser)
    parser.add_argument(
        "--world-size",
        type=int,
        metavar="N",
        help="plan for one of N ranks (with --strategy; default: 1, one process)",
    )
    parser.add_argument("--json", type=Path, help="also write the plan as JSON to this file")
    parser.add_argument("--plot", type=Path, help="draw per-segment memory and the budget (PNG)")


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    _add_model_options(parser)
    _add_training_options(parser)
    parser.add_argument(
        "--resume", type=Path, metavar="DIR", help="continue the run in this folder"
    )


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    _add_model_options(parser, data=False)
    _add_training_options(parser)


def _predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="run folder (its best.pt is used)")
    parser.add_argument("data", nargs="+", type=Path, help=_DATA_HELP)
    parser.add_argument("-o", "--output", type=Path, required=True, help="Parquet file to write")
    parser.add_argument("--device", help="cpu, cuda or auto (default: auto)")
    parser.add_argument("--batch-size", type=int, help="windows per forward (default: 256)")
    parser.add_argument(
        "--max-host-memory",
        metavar="SIZE",
        help="host memory the data and forecasts may hold (default: the run's, 1GB unless set)",
    )


def _interpret_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="run folder (its best.pt is used)")
    parser.add_argument("data", nargs="+", type=Path, help=_DATA_HELP)
    parser.add_argument("--json", type=Path, help="write the weights as JSON here")
    parser.add_argument("--plot", type=Path, help="draw the importances and attention by lag (PNG)")
    parser.add_argument("--device", help="cpu, cuda or auto (default: auto)")
    parser.add_argument("--batch-size", type=int, help="windows per forward (default: 256)")
    parser.add_argument(
        "--max-windows", type=int, help="read at most this many windows, evenly spread"
    )


class Subcommand(NamedTuple):
    """One subcommand: its name, its help line, an example and its arguments."""

    name: str
    summary: str
    example: str
    add_arguments: Callable[[argparse.ArgumentParser], None]


SUBCOMMANDS = (
    Subcommand(
        "make-data",
        "write synthetic 1-minute futures bars with features to a Parquet file",
        "autockpt make-data bars.parquet --days 15 --features 16 --symbols ES,NQ --seed 7",
        _make_data_arguments,
    ),
    Subcommand(
        "plan",
        "print the memory plan for training the model on a data file under a budget",
        "autockpt plan bars.parquet --vram-budget 4GB --preset tft-225 --json plan.json",
        _plan_arguments,
    ),
    Subcommand(
        "train",
        "plan, then train the TFT under the budget, writing a run folder",
        "autockpt train bars.parquet --vram-budget 4GB --epochs 10 --out runs/es",
        _train_arguments,
    ),
    Subcommand(
        "demo",
        "plan and briefly train the tiny model on the bundled sample (a first look)",
        "autockpt demo --out runs/demo",
        _demo_arguments,
    ),
    Subcommand(
        "predict",
        "write quantile forecasts of a trained run for every window of a data file",
        "autockpt predict runs/es bars.parquet -o forecasts.parquet",
        _predict_arguments,
    ),
    Subcommand(
        "interpret",
        "show what a trained run's model looked at: input importances and attention by lag",
        "autockpt interpret runs/es bars.parquet --json weights.json --plot weights.png",
        _interpret_arguments,
    ),
)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit code 2.

    argparse's own ``error`` prints the whole usage block first; every other user mistake
    ends in one line (README), so a missing ``-o`` or two exclusive flags end in one too,
    naming the way to the full usage. Subcommand parsers are made of the same class.
    """

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE; see PROG --help`` and exit 2."""
        line = " ".join(message.split())
        print(f"{self.prog}: error: {line}; see {self.prog} --help", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; ``parse_args`` leaves the subcommand's name in ``command``."""
    parser = OneLineParser(
        prog="autockpt",
        description=(
            "Train a Temporal Fusion Transformer on intraday bars under a memory budget: "
            "autockpt plans which segments to recompute, chunk or micro-batch so a step fits."
        ),
        epilog="first run: autockpt demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for subcommand in SUBCOMMANDS:
        sub = commands.add_parser(
            subcommand.name,
            help=subcommand.summary,
            description=subcommand.summary,
            epilog=f"example:\n  {subcommand.example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        subcommand.add_arguments(sub)
    return parser
