"""The subcommands' handlers: ``make-data``, ``plan``, ``train``, ``demo`` and ``predict``.

Each handler is a small function taking the parsed arguments and the console and returning an
exit code; :data:`HANDLERS` maps the subcommand names of :mod:`autockpt.cli.parser` to them.
Handlers raise :class:`~autockpt.errors.AutockptError` for every user mistake and leave turning
it into one line on stderr to :func:`autockpt.cli.main.main`. They import torch and the
training package lazily, so ``autockpt --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from autockpt import format_bytes, parse_budget
from autockpt.cli.console import waiting, windows_progress
from autockpt.cli.importance import plot_importance, print_importance
from autockpt.cli.parser import comma_list, overrides
from autockpt.cli.plot import PLAN_PICTURE, check_plot_available, plot_available, plot_plan
from autockpt.cli.report import columns_record, print_columns, split_line
from autockpt.errors import ConfigError, InfeasibleBudgetError
from autockpt.plan_report import print_plan

if TYPE_CHECKING:
    from autockpt.training.forecasts.evaluate import Evaluation
    from autockpt.training.options.config import TrainConfig
    from autockpt.training.setup.prepare import Setup
    from autockpt.training.setup.runs import RunFolder

#: What a handler returns when Ctrl-C stopped it (128 + SIGINT, as shells do).
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace, Console], int]


# NOTE [The demo's training]
# The demo trains long enough to find the sample's planted order flow (NOTE [Planted order
# flow] in tft.synthetic.planted): measured with benchmarks/sample_skill.py, the tiny preset at a peak
# rate of 0.003 is past the naive forecasts after 200 steps and ranks order_flow first by 600.
# At 0.01 the input selection collapsed onto one volatility column and did not find the flow.
DEMO_EPOCHS = 3
DEMO_STEPS_PER_EPOCH = 200
DEMO_LR = 0.003


def _load_config(args: argparse.Namespace, **extra: Any) -> TrainConfig:
    """The run's settings: the ``--config`` file, then the command line, then ``extra``."""
    from autockpt.training.options.config import load_train_config

    return load_train_config(args.config, {**overrides(args), **extra})


def cmd_make_data(args: argparse.Namespace, console: Console) -> int:
    """Write synthetic bars (``tft.synthetic.bars``) to a Parquet file."""
    from tft.synthetic.bars import write_bars

    symbols = list(comma_list(args.symbols))
    path = write_bars(
        args.out, days=args.days, num_features=args.features, symbols=symbols, seed=args.seed
    )
    console.print(
        f"wrote {path}: {len(symbols)} symbols x {args.days} days of 1-minute bars, "
        f"{args.features} features"
    )
    return 0


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    """Plan without training: the report (or JSON with --quiet), --json and --plot files."""
    from autockpt.training.setup.prepare import prepare
    from autockpt.training.setup.runs import write_text_atomic

    check_plot_available(args.plot)
    config = _load_config(args)
    if args.world_size is not None and args.world_size < 1:
        raise ConfigError(f"--world-size {args.world_size} must be 1 or more")
    # Tuned as a training run would be, so that the step times it prints are the run's.
    with waiting(console, quiet=config.quiet):
        setup = prepare(config, plan_world_size=args.world_size or 1, tune_host=True)
    if setup.host_tuning is not None:
        setup.host_tuning.restore()
    if config.quiet:
        print(
            json.dumps(columns_record(setup.data.columns, config.split, setup.data), sort_keys=True)
        )
        print(setup.plan.model_dump_json())
    else:
        for note in setup.notes:
            console.print(f"[dim]{note}[/dim]")
        print_columns(console, setup.data.columns)
        console.print(split_line(config.split, setup.data))
        print_plan(console, setup.plan, budget_given=setup.budget is not None)
    if args.json is not None:
        write_text_atomic(args.json, setup.plan.model_dump_json(indent=2))
    if args.plot is not None:
        plot_plan(setup.plan, args.plot, budget_given=setup.budget is not None)
    if not config.quiet:
        for written in (args.json, args.plot):
            if written is not None:
                console.print(f"wrote {written}")
    return 0


def cmd_train(args: argparse.Namespace, console: Console) -> int:
    """Train; under ``torchrun`` every rank runs this (NOTE [Distributed training])."""
    from autockpt.training.host.distributed import (
        process_group,
        resolve_parallelism,
        world_from_environment,
    )
    from autockpt.training.options.settings import resolve_device
    from autockpt.training.setup.runs import resume_run, resumed_config, start_run

    world = world_from_environment()
    run: RunFolder | None = None
    if args.resume is not None:
        given = overrides(args)
        if "out" in given and Path(given["out"]) != args.resume:
            raise ConfigError(
                f"--out {given['out']} and --resume {args.resume} name different folders; "
                "a resumed run continues in its own folder, so drop --out"
            )
        run, config = resumed_config(args.resume, args.config, given)
    else:
        config = _load_config(args)
    resolve_parallelism(config.strategy, world.world_size)  # a bad combination fails here
    with process_group(world, world.device(resolve_device(config.device))):
        with waiting(console, quiet=config.quiet or not world.is_main):
            if run is not None:
                setup, checkpoint = resume_run(run, config, world=world)
            else:
                setup, run = start_run(config, world=world)
                checkpoint = None
        return _run_training(setup, run, console, checkpoint=checkpoint)


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """Briefly train the tiny model on the sample, under half its unplanned peak."""
    from autockpt.training.setup.prepare import prepare
    from autockpt.training.setup.runs import start_run

    config = _load_config(
        args,
        preset=args.preset or "tiny",
        epochs=args.epochs or DEMO_EPOCHS,
        max_steps_per_epoch=args.max_steps_per_epoch or DEMO_STEPS_PER_EPOCH,
        lr=args.lr or DEMO_LR,
    )
    if config.out is None:
        config = config.with_updates(out=Path(tempfile.mkdtemp(prefix="autockpt-demo-")) / "run")
    decided = config.vram_budget is None
    with waiting(console, quiet=config.quiet):
        if decided and config.compile:
            # A compiled search compiles its candidates for a budget in bytes: the plain
            # step's peak is planned for first.
            half = prepare(config).plan.unplanned_peak_bytes // 2
            config = config.with_updates(vram_budget=parse_budget(half))
        try:
            # Show the planner at work: half of what the step takes with nothing recomputed,
            # decided in the one planning (NOTE [A budget decided from the plain step]), or a
            # tenth over the least any plan takes where no plan fits half.
            half_of_plain = (
                (lambda plain: parse_budget(plain // 2)) if config.vram_budget is None else None
            )
            setup, run = start_run(config, budget_of_plain=half_of_plain)
        except InfeasibleBudgetError as error:
            if not decided:
                raise
            target = parse_budget(int(error.minimum_bytes * 1.1))
            setup, run = start_run(config.with_updates(vram_budget=target))
    if decided and not config.quiet:
        console.print(
            f"demo: the step takes {format_bytes(setup.plan.unplanned_peak_bytes)} with nothing "
            f"recomputed; planning for {format_bytes(setup.plan.budget_bytes)} instead"
        )
    return _run_training(setup, run, console, checkpoint=None)


def _run_training(
    setup: Setup, run: RunFolder, console: Console, *, checkpoint: dict[str, Any] | None
) -> int:
    """Print the plan, then train with the reporter the rank and --quiet call for."""
    from autockpt.training.host.distributed import SilentReporter
    from autockpt.training.host.progress import JsonLinesReporter, Reporter, RichReporter
    from autockpt.training.loop.train import train

    reporter: Reporter
    if setup.world.is_main and plot_available():
        # The plan's picture beside plan.json, memory across one step included.
        plot_plan(setup.plan, run.file(PLAN_PICTURE), budget_given=setup.budget is not None)
    if not setup.world.is_main:
        reporter = SilentReporter()
    elif setup.config.quiet:
        reporter = JsonLinesReporter()
        reporter.event(columns_record(setup.data.columns, setup.config.split, setup.data))
    else:
        for note in setup.notes:
            console.print(f"[dim]{note}[/dim]")
        print_columns(console, setup.data.columns)
        console.print(split_line(setup.config.split, setup.data))
        print_plan(console, setup.plan, budget_given=setup.budget is not None)
        if setup.world.is_distributed:
            console.print(
                f"ranks:         {setup.world.world_size} {setup.parallelism} "
                f"({setup.device.type}), each a batch of {setup.batch_size} under the budget "
                f"above; global batch {setup.global_batch_size}"
            )
        console.print(f"run folder:    {run.path}")
        reporter = RichReporter(console)
    try:
        summary = train(setup, run, reporter, checkpoint=checkpoint)
    except KeyboardInterrupt:
        if not setup.world.is_main:
            return EXIT_INTERRUPTED
        print(
            f"interrupted: the last finished epoch is saved in {run.path}; continue with "
            f"autockpt train --resume {run.path}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if (
        setup.world.is_main
        and summary["budget_bytes"] is not None
        and not summary["within_budget"]
        and not setup.config.quiet
    ):
        console.print("[red]the run went over the budget at least once; see metrics.jsonl[/red]")
    return 0


def cmd_predict(args: argparse.Namespace, console: Console) -> int:
    """Write a trained run's quantile forecasts for a data file."""
    from autockpt.training.forecasts.predict import predict

    with windows_progress(console, "forecasting") as progress:
        result = predict(
            args.run,
            args.data,
            args.output,
            device=args.device or "auto",
            batch_size=args.batch_size,
            max_host_memory=args.max_host_memory,
            progress=progress,
        )
    if result.data_note is not None:
        console.print(result.data_note)
    console.print(
        f"wrote {result.num_rows:,} forecasts ({result.num_windows:,} windows x horizon "
        f"{result.horizon}) to {result.path}"
    )
    if result.evaluation is not None:
        # NOTE [Scores by what the model saw]: the whole file, then apart by part.
        whole = f"all {result.num_windows:,} windows"
        if not result.parts_known:
            whole += " (the run kept no split times: trained-on windows not told apart)"
        console.print("against the actuals (loss/MAE/RMSE):")
        console.print(_scores_line(whole, result.evaluation))
        for part in result.evaluation_by_part:
            label = f"{part.part} ({part.evaluation.num_windows:,} windows)"
            console.print(_scores_line(label, part.evaluation))
    for name, count in result.unknown_rows.items():
        if count:
            console.print(
                f"{name}: {count:,} rows had a value the training rows never had (or none); "
                "the model read them as the unknown category"
            )
    return 0


def _scores_line(label: str, scores: Evaluation) -> str:
    """``"  never seen (120 windows): model 0.41/0.0002/0.0003  | naive (...)  skill +3.1%"``."""
    from autockpt.training.host.progress import naive_text

    naive = {name: s.record() for name, s in scores.naive.items()}
    return (
        f"  {label}: model {scores.loss:.4f}/{scores.mae:.4g}/{scores.rmse:.4g}"
        f"{naive_text(naive, scores.skill)}"
    )


def cmd_interpret(args: argparse.Namespace, console: Console) -> int:
    """Print (and write) what a trained run's model looked at over a data file."""
    from autockpt.training.forecasts.interpret import interpret
    from autockpt.training.setup.runs import write_text_atomic

    for value, flag in ((args.batch_size, "--batch-size"), (args.max_windows, "--max-windows")):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value} is not a positive count; give 1 or more")
    check_plot_available(args.plot)
    with windows_progress(console, "reading the model's weights") as progress:
        result = interpret(
            args.run,
            args.data,
            device=args.device or "auto",
            batch_size=args.batch_size,
            max_windows=args.max_windows,
            progress=progress,
        )
    print_importance(console, result)
    if args.json is not None:
        # Not sorted by key: each group keeps its order, highest weight first.
        write_text_atomic(args.json, json.dumps(result.to_json(), indent=2) + "\n")
        console.print(f"wrote {args.json}")
    if args.plot is not None:
        plot_importance(result, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


#: The handler of each subcommand, by the name :mod:`autockpt.cli.parser` gives it.
HANDLERS: dict[str, Handler] = {
    "make-data": cmd_make_data,
    "plan": cmd_plan,
    "train": cmd_train,
    "demo": cmd_demo,
    "predict": cmd_predict,
    "interpret": cmd_interpret,
}
