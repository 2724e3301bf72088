"""``autockpt``: plan, train and forecast from the command line.

Each subcommand is a small function taking the parsed arguments and returning an exit code.
Every user mistake raises an :class:`~autockpt.errors.AutockptError`; :func:`main` prints it as
one ``error: ...`` line on stderr and returns 2, with no traceback and nothing half-written.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from autockpt.errors import AutockptError, ConfigError, InfeasibleBudgetError
from autockpt.units import format_bytes

if TYPE_CHECKING:  # the commands import torch lazily, so --help stays fast
    from autockpt.config import TrainConfig
    from autockpt.plan import Plan
    from autockpt.prepare import Setup
    from autockpt.runs import RunFolder

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130

_BUDGET_HELP = (
    "memory budget as nvidia-smi would show it: 4GB, 3.5GiB, 800MB (GB/MB powers of 10, "
    "GiB/MiB powers of 2, a bare number is bytes) or auto (free GPU memory less 10%%). "
    "Default: auto on a GPU; on the CPU no limit (the plan recomputes nothing); give one to "
    "enforce it on tracked tensor bytes"
)


# ---------------------------------------------------------------------------- options


def _add_model_options(parser: argparse.ArgumentParser, *, data: bool = True) -> None:
    """Options shared by plan, train and demo: the model, the data roles, the budget."""
    if data:
        parser.add_argument(
            "data", nargs="?", type=Path, help="Parquet file of bars (default: the bundled sample)"
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
        "--known-columns",
        type=_comma_list,
        metavar="A,B",
        help="comma-separated columns known in advance, e.g. holiday,roll_day",
    )
    parser.add_argument(
        "--quiet",
        action="store_const",
        const=True,
        help="print JSON lines instead of tables and bars",
    )


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    group.add_argument("--epochs", type=int, metavar="N", help="passes over the data (default: 10)")
    group.add_argument(
        "--lr", type=float, metavar="RATE", help="peak learning rate (default: 0.001)"
    )
    group.add_argument(
        "--max-steps-per-epoch",
        type=int,
        metavar="N",
        help="cap on steps (and validation batches) per epoch",
    )
    group.add_argument(
        "--out", type=Path, metavar="DIR", help="run folder to create (default: runs/PRESET-TIME)"
    )


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


_CONFIG_KEYS = (
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
    "known_columns",
    "quiet",
    "strategy",
    "epochs",
    "lr",
    "max_steps_per_epoch",
    "out",
    "data",
)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the user gave on the command line (unset options are left out)."""
    values = {key: getattr(args, key, None) for key in _CONFIG_KEYS}
    return {key: value for key, value in values.items() if value is not None}


def _load_config(args: argparse.Namespace, **extra: Any) -> TrainConfig:
    from autockpt.config import load_train_config

    return load_train_config(args.config, {**_overrides(args), **extra})


# ---------------------------------------------------------------------------- printing plans


def _bar(fraction: float, width: int = 12) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "·" * (width - filled)


def print_plan(console: Console, plan: Plan, *, budget_given: bool) -> None:
    """The plan as a table: per-segment memory bars, actions, the peak and its breakdown."""
    largest = max((s.saved_bytes for s in plan.segments), default=1) or 1
    ranks = (
        f"batch {plan.batch_size} per rank, {plan.world_size} ranks {plan.parallelism}"
        if plan.world_size > 1
        else f"batch {plan.batch_size}"
    )
    table = Table(title=f"memory plan ({plan.strategy}, {ranks}, {plan.device})")
    table.add_column("#", justify="right")
    table.add_column("segment", overflow="fold", min_width=20)
    table.add_column("activations", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("plan")
    table.add_column("recompute", justify="right", no_wrap=True)
    for index, segment in enumerate(plan.segments):
        if not segment.recomputed:
            action = "[green]kept[/green]"
        elif segment.num_chunks > 1:
            action = f"[yellow]recomputed, {segment.num_chunks} chunks[/yellow]"
        else:
            action = "[yellow]recomputed[/yellow]"
        table.add_row(
            str(index),
            segment.name,
            format_bytes(segment.saved_bytes),
            _bar(segment.saved_bytes / largest),
            action,
            f"{segment.recompute_s * 1000:.2f} ms" if segment.recomputed else "-",
        )
    console.print(table)
    breakdown = plan.breakdown
    parts = [
        ("parameters", breakdown.parameters_bytes),
        ("gradients", breakdown.gradients_bytes),
        ("optimizer state", breakdown.optimizer_state_bytes),
        ("batch (inputs, targets)", breakdown.inputs_bytes),
        ("activations", breakdown.activations_bytes),
        ("transient", breakdown.transient_bytes),
        ("gathered by FSDP", breakdown.gathered_bytes),
        ("CUDA context", breakdown.context_bytes),
        ("allocator headroom", breakdown.headroom_bytes),
    ]
    per_rank = " per rank" if plan.world_size > 1 else ""
    console.print(
        "budget:        " + (plan.budget_reading + per_rank if budget_given else _no_budget_text())
    )
    if plan.world_size > 1:
        held = "its shards of " if plan.parallelism == "fsdp" else "all of "
        console.print(
            f"ranks:         {plan.world_size} ({plan.parallelism}); each holds {held}the "
            "parameters, gradients and optimizer state; the peak and breakdown are one rank's"
        )
    verdict = "[green]fits[/green]" if plan.fits else "[red]does not fit[/red]"
    against = f" of budget {format_bytes(plan.budget_bytes)} ({verdict})" if budget_given else ""
    console.print(
        f"peak:          {format_bytes(plan.predicted_peak_bytes)} predicted{against}; "
        f"{format_bytes(plan.unplanned_peak_bytes)} with nothing recomputed; minimum about "
        f"{format_bytes(plan.minimum_feasible_bytes)} (the planner's estimate)"
    )
    console.print(
        "breakdown:     "
        + per_rank.strip()
        + (": " if per_rank else "")
        + ", ".join(f"{name} {format_bytes(size)}" for name, size in parts if size)
    )
    overhead = plan.predicted_extra_s / plan.unplanned_step_s if plan.unplanned_step_s else 0.0
    console.print(
        f"step time:     +{plan.predicted_extra_s * 1000:.2f} ms predicted over "
        f"{plan.unplanned_step_s * 1000:.2f} ms (+{overhead:.0%}); "
        f"{plan.num_recomputed} of {len(plan.segments)} segments recomputed"
    )
    if plan.num_micro_batches > 1:
        console.print(
            f"micro-batches: {plan.num_micro_batches} of at most "
            f"{-(-plan.batch_size // plan.num_micro_batches)} samples, gradients accumulated"
        )
    for note in plan.notes:
        console.print(f"note:          {note}")


def _no_budget_text() -> str:
    return "none given: on the CPU training is not limited (pass --vram-budget to plan for one)"


def _check_plot_available(path: Path | None) -> None:
    if path is None:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"--plot {path} needs matplotlib, which is not installed; pip install autockpt[plot]"
        ) from None


def plot_plan(plan: Plan, path: Path, *, budget_given: bool) -> None:
    """Left: activation memory per segment, recomputed ones hatched. Right: the predicted peak
    by part next to the peak with nothing recomputed, and the budget line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autockpt.runs import write_atomic

    mib = 2**20
    names = [f"{i}: {s.name}" for i, s in enumerate(plan.segments)]
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(13, max(3.5, 0.3 * len(names) + 1.5)), width_ratios=[3, 2]
    )
    kept = [s.saved_bytes / mib if not s.recomputed else 0 for s in plan.segments]
    dropped = [s.saved_bytes / mib if s.recomputed else 0 for s in plan.segments]
    left.barh(names, kept, color="tab:green", label="kept for backward")
    left.barh(names, dropped, color="tab:orange", hatch="//", label="recomputed in backward")
    left.invert_yaxis()
    left.set_xlabel("activations (MiB)")
    left.set_title("activation memory per segment")
    left.legend(loc="lower right")

    right.bar(["nothing\nrecomputed"], [plan.unplanned_peak_bytes / mib], color="tab:gray")
    bottom = 0.0
    for name, size in plan.breakdown.model_dump().items():
        if size:
            label = name.removesuffix("_bytes").replace("_", " ")
            right.bar(["this plan"], [size / mib], bottom=bottom, label=label)
            bottom += size / mib
    top = max(plan.unplanned_peak_bytes, plan.predicted_peak_bytes)
    if budget_given:
        right.axhline(plan.budget_bytes / mib, color="red", linestyle="--", label="budget")
        top = max(top, plan.budget_bytes)
    right.set_ylim(0, 1.1 * top / mib)
    right.set_ylabel("MiB")
    right.set_title("predicted peak of one step")
    right.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png", dpi=120))
    plt.close(figure)


# ---------------------------------------------------------------------------- subcommands


def cmd_make_data(args: argparse.Namespace, console: Console) -> int:
    from tft.synthetic import write_bars

    symbols = list(_comma_list(args.symbols))
    path = write_bars(
        args.out, days=args.days, num_features=args.features, symbols=symbols, seed=args.seed
    )
    console.print(
        f"wrote {path}: {len(symbols)} symbols x {args.days} days of 1-minute bars, "
        f"{args.features} features"
    )
    return 0


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from autockpt.prepare import prepare
    from autockpt.runs import write_text_atomic

    _check_plot_available(args.plot)
    config = _load_config(args)
    if args.world_size is not None and args.world_size < 1:
        raise ConfigError(f"--world-size {args.world_size} must be 1 or more")
    setup = prepare(config, plan_world_size=args.world_size or 1)
    if config.quiet:
        print(setup.plan.model_dump_json())
    else:
        for note in setup.notes:
            console.print(f"[dim]{note}[/dim]")
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
    from autockpt.distributed import process_group, resolve_parallelism, world_from_environment
    from autockpt.prepare import resolve_device
    from autockpt.runs import resume_run, resumed_config, start_run

    world = world_from_environment()
    run: RunFolder | None = None
    if args.resume is not None:
        overrides = _overrides(args)
        if "out" in overrides and Path(overrides["out"]) != args.resume:
            raise ConfigError(
                f"--out {overrides['out']} and --resume {args.resume} name different folders; "
                "a resumed run continues in its own folder, so drop --out"
            )
        run, config = resumed_config(args.resume, args.config, overrides)
    else:
        config = _load_config(args)
    resolve_parallelism(config.strategy, world.world_size)  # a bad combination fails here
    with process_group(world, world.device(resolve_device(config.device))):
        if run is not None:
            setup, checkpoint = resume_run(run, config, world=world)
        else:
            setup, run = start_run(config, world=world)
            checkpoint = None
        return _run_training(setup, run, console, checkpoint=checkpoint)


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from autockpt.prepare import prepare
    from autockpt.runs import start_run

    config = _load_config(
        args,
        preset=args.preset or "tiny",
        epochs=args.epochs or 2,
        max_steps_per_epoch=args.max_steps_per_epoch or 20,
    )
    if config.out is None:
        config = config.with_updates(out=Path(tempfile.mkdtemp(prefix="autockpt-demo-")) / "run")
    if config.vram_budget is None:
        # Show the planner at work: half of what the step takes with nothing recomputed.
        unplanned = prepare(config).plan
        try:
            # A one-byte budget makes the planner examine everything and say its minimum.
            prepare(config.with_updates(vram_budget="1"))
            minimum = 1
        except InfeasibleBudgetError as error:
            minimum = error.minimum_bytes
        target = max(unplanned.unplanned_peak_bytes // 2, int(minimum * 1.1))
        if not config.quiet:
            console.print(
                f"demo: the step takes {format_bytes(unplanned.unplanned_peak_bytes)} with "
                f"nothing recomputed; planning for {format_bytes(target)} instead"
            )
        config = config.with_updates(vram_budget=str(target))
    setup, run = start_run(config)
    return _run_training(setup, run, console, checkpoint=None)


def _run_training(
    setup: Setup, run: RunFolder, console: Console, *, checkpoint: dict[str, Any] | None
) -> int:
    from autockpt.distributed import SilentReporter
    from autockpt.progress import JsonLinesReporter, Reporter, RichReporter
    from autockpt.train import train

    reporter: Reporter
    if not setup.world.is_main:
        reporter = SilentReporter()
    elif setup.config.quiet:
        reporter = JsonLinesReporter()
    else:
        for note in setup.notes:
            console.print(f"[dim]{note}[/dim]")
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
    from autockpt.predict import predict

    result = predict(
        args.run,
        args.data,
        args.output,
        device=args.device or "auto",
        batch_size=args.batch_size,
    )
    console.print(
        f"wrote {result.num_rows:,} forecasts ({result.num_windows:,} windows x horizon "
        f"{result.horizon}) to {result.path}"
    )
    return 0


# ---------------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autockpt",
        description=(
            "Train a Temporal Fusion Transformer on intraday bars under a memory budget: "
            "autockpt plans which segments to recompute, chunk or micro-batch so a step fits."
        ),
        epilog="first run: autockpt demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[..., int], summary: str, example: str) -> Any:
        sub = commands.add_parser(
            name,
            help=summary,
            description=summary,
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler)
        return sub

    make = command(
        "make-data",
        cmd_make_data,
        "write synthetic 1-minute futures bars with features to a Parquet file",
        "autockpt make-data bars.parquet --days 15 --features 16 --symbols ES,NQ --seed 7",
    )
    make.add_argument("out", type=Path, help="Parquet file to write")
    make.add_argument("--days", type=int, default=15, help="trading days (default: 15)")
    make.add_argument("--features", type=int, default=16, help="feature columns (default: 16)")
    make.add_argument("--symbols", default="ES", help="comma-separated symbols (default: ES)")
    make.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")

    plan = command(
        "plan",
        cmd_plan,
        "print the memory plan for training the model on a data file under a budget",
        "autockpt plan bars.parquet --vram-budget 4GB --preset tft-225 --json plan.json",
    )
    _add_model_options(plan)
    plan.add_argument(
        "--world-size",
        type=int,
        metavar="N",
        help="plan for one of N ranks (with --strategy; default: 1, one process)",
    )
    plan.add_argument("--json", type=Path, help="also write the plan as JSON to this file")
    plan.add_argument("--plot", type=Path, help="draw per-segment memory and the budget (PNG)")

    train = command(
        "train",
        cmd_train,
        "plan, then train the TFT under the budget, writing a run folder",
        "autockpt train bars.parquet --vram-budget 4GB --epochs 10 --out runs/es",
    )
    _add_model_options(train)
    _add_training_options(train)
    train.add_argument("--resume", type=Path, metavar="DIR", help="continue the run in this folder")

    demo = command(
        "demo",
        cmd_demo,
        "plan and briefly train the tiny model on the bundled sample (a first look)",
        "autockpt demo --out runs/demo",
    )
    _add_model_options(demo, data=False)
    _add_training_options(demo)

    predict = command(
        "predict",
        cmd_predict,
        "write quantile forecasts of a trained run for every window of a data file",
        "autockpt predict runs/es bars.parquet -o forecasts.parquet",
    )
    predict.add_argument("run", type=Path, help="run folder (its best.pt is used)")
    predict.add_argument("data", type=Path, help="Parquet file with the run's columns")
    predict.add_argument("-o", "--output", type=Path, required=True, help="Parquet file to write")
    predict.add_argument("--device", help="cpu, cuda or auto (default: auto)")
    predict.add_argument("--batch-size", type=int, help="windows per forward (default: 256)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (2 for any user error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code) if isinstance(exit_.code, int) else EXIT_USER_ERROR
    console = Console(stderr=False, highlight=False)
    try:
        return int(args.handler(args, console))
    except AutockptError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
