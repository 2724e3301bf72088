"""What a training run shows while it works: rich progress bars, or JSON lines for scripts.

The trainer hands every reporter the same plain records it writes to ``metrics.jsonl``
(``{"kind": "step" | "epoch" | "event" | "summary", ...}``), so the screen, the log and the file
never disagree. Sizes are ``*_bytes`` ints; they are formatted only here. Memory is measured on
a sample of the steps (NOTE [Enforcing the budget] in :mod:`autockpt.training.loop.step_memory`): a
step record's ``peak_bytes`` is None when it was not, and the bars then show the last measured
peak with the step it comes from.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from autockpt import format_bytes

Record = Mapping[str, Any]


class Reporter(Protocol):
    """Receives the trainer's records as they happen."""

    def start(self, *, num_epochs: int, first_epoch: int, steps_per_epoch: int) -> None: ...
    def step(self, record: Record) -> None: ...
    def epoch(self, record: Record) -> None: ...
    def event(self, record: Record) -> None: ...
    def progress(self, record: Record) -> None: ...
    def finish(self, summary: Record) -> None: ...


#: The most seconds between two progress lines of a long wait in JSON lines (``--quiet``).
PROGRESS_LINE_EVERY_S = 2.0


def scoring_progress(
    what: str, report: Callable[[Record], None], *, clock: Callable[[], float] = time.perf_counter
) -> Callable[[int, int], None]:
    """The ``(windows done, windows in all)`` callback of a scoring loop (validation, the test
    windows, ``predict``, ``interpret``) that hands ``report`` a progress record after each
    batch: ``{"kind": "progress", "what", "done", "total", "windows_per_s", "left_s",
    "elapsed_s"}``, the rate and time left from the windows done so far.

    The rate is counted from the first batch on: what comes before it (a row cache's build
    before ``predict``'s first window, the reader's start) is paid once, and a rate that counted
    it would put the time left too high for the whole wait. The first record, with nothing
    after a batch to count, takes its rate from the start."""
    started = clock()
    first: tuple[float, int] | None = None  # (when, windows done) at the first batch

    def advance(done: int, total: int) -> None:
        nonlocal first
        now = clock()
        if first is None:
            first = (now, done)
        since, done_since = now - first[0], done - first[1]
        if since > 0 and done_since > 0:
            rate: float | None = done_since / since
        else:
            rate = done / (now - started) if now > started else None
        report(
            {
                "kind": "progress",
                "what": what,
                "done": done,
                "total": total,
                "windows_per_s": rate,
                "left_s": (total - done) / rate if rate else None,
                "elapsed_s": now - started,
            }
        )

    return advance


class ProgressLines:
    """Progress records as JSON lines, one at most every :data:`PROGRESS_LINE_EVERY_S` seconds
    of each wait, and its last (done == total) always."""

    def __init__(
        self, write: Callable[[Record], None], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._write, self._clock = write, clock
        self._last: dict[str, float] = {}

    def __call__(self, record: Record) -> None:
        now, what = self._clock(), record["what"]
        finished = record["done"] >= record["total"]
        if finished or now - self._last.get(what, -math.inf) >= PROGRESS_LINE_EVERY_S:
            self._last[what] = now
            self._write(record)
        if finished:
            self._last.pop(what, None)


#: How the naive forecasts (NOTE [Naive forecasts]) are named on the terminal.
_NAIVE_LABELS = {"no_change": "no change", "quantiles": "quantiles"}


def _skill_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def _naive_text(record: Record) -> str:
    naive = record.get("val_naive")
    return naive_text(naive, record.get("val_skill")) if naive else ""


def naive_text(naive: dict[str, dict[str, Any]], skill: float | None) -> str:
    """``"  | naive (loss/MAE/RMSE): no change 0.18/0.00015/0.00021, ...  skill +2.1%"``: each
    naive forecast's scores (as ``Scores.record`` gives them) and the model's skill over the
    better one."""
    parts = ", ".join(
        f"{_NAIVE_LABELS[name]} {s['loss']:.4f}/{s['mae']:.4g}/{s['rmse']:.4g}"
        for name, s in naive.items()
    )
    return f"  | naive (loss/MAE/RMSE): {parts}  skill {_skill_text(skill)}"


def memory_text(peak_bytes: int | None, budget_bytes: int | None) -> str:
    """``"120.00 MiB / 200.00 MiB (60%)"``, or just the peak when there is no budget."""
    if peak_bytes is None:
        return "n/a"
    if budget_bytes is None:
        return format_bytes(peak_bytes)
    return f"{format_bytes(peak_bytes)} / {format_bytes(budget_bytes)} ({peak_bytes / budget_bytes:.0%})"


def _share_text(peak_bytes: int, budget_bytes: int | None) -> str:
    """Short form for the progress bar: ``"52% of budget"``, or the size without one."""
    if budget_bytes is None:
        return format_bytes(peak_bytes)
    return f"{peak_bytes / budget_bytes:.0%} of budget"


class JsonLinesReporter:
    """Prints each record as one JSON object per line (``--quiet``)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._progress_lines = ProgressLines(self._print)

    def _print(self, record: Record) -> None:
        self._stream.write(json.dumps(dict(record), sort_keys=True) + "\n")
        self._stream.flush()

    def start(self, *, num_epochs: int, first_epoch: int, steps_per_epoch: int) -> None:
        self._print(
            {
                "kind": "start",
                "num_epochs": num_epochs,
                "first_epoch": first_epoch,
                "steps_per_epoch": steps_per_epoch,
            }
        )

    def step(self, record: Record) -> None:
        self._print(record)

    def epoch(self, record: Record) -> None:
        self._print(record)

    def event(self, record: Record) -> None:
        self._print(record)

    def progress(self, record: Record) -> None:
        self._progress_lines(record)

    def finish(self, summary: Record) -> None:
        self._print(summary)


class RichReporter:
    """An epoch bar and a step bar with loss, samples/s and peak memory against the budget."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=False,
        )
        self._epochs: TaskID | None = None
        self._steps: TaskID | None = None
        self._steps_per_epoch = 0
        self._last_peak: tuple[int, int] | None = None
        """(step, peak bytes) of the last measured step."""
        self._waits: dict[str, TaskID] = {}
        """The bar of each wait under way, by what it is."""

    def start(self, *, num_epochs: int, first_epoch: int, steps_per_epoch: int) -> None:
        self._steps_per_epoch = steps_per_epoch
        self._progress.start()
        self._epochs = self._progress.add_task(
            "epochs", total=num_epochs, completed=first_epoch, info=""
        )
        self._steps = self._progress.add_task("steps ", total=steps_per_epoch, info="")

    def step(self, record: Record) -> None:
        assert self._steps is not None, "start() comes first"
        if record["peak_bytes"] is not None:
            self._last_peak = (record["step"], record["peak_bytes"])
        info = f"loss {record['loss']:.4f}  {record['samples_per_s']:,.0f} samples/s"
        if self._last_peak is not None:
            step, peak = self._last_peak
            sampled = "" if step == record["step"] else f" (sampled at step {step})"
            info += f"  peak {_share_text(peak, record['budget_bytes'])}{sampled}"
        if record["step_in_epoch"] == 1:
            self._progress.reset(self._steps, total=self._steps_per_epoch)
        self._progress.update(self._steps, completed=record["step_in_epoch"], info=info)

    def epoch(self, record: Record) -> None:
        assert self._epochs is not None and self._steps is not None, "start() comes first"
        self._progress.update(self._epochs, completed=record["epoch"], info="")
        val = record.get("val_loss")
        val_text = (
            f"val {val:.4f}{_se_text(record.get('val_loss_se'))}  MAE {record['val_mae']:.4g}  "
            f"RMSE {record['val_rmse']:.4g}  "
            f"coverage {record['val_coverage']:.0%}{_naive_text(record)}"
            if val is not None
            else "no validation windows"
        )
        marker = "  [green]best[/green]" if record.get("improved") else ""
        peak = record.get("peak_bytes")
        peak_text = (
            f"  peak {memory_text(peak, record.get('budget_bytes'))} "
            f"({record['num_measured_steps']} steps measured)"
            if peak is not None
            else ""
        )
        self._progress.console.print(
            f"epoch {record['epoch']}/{record['num_epochs']}  train {record['train_loss']:.4f}  "
            f"{val_text}{peak_text}  {record['epoch_s']:.1f} s{marker}"
        )

    def event(self, record: Record) -> None:
        self._progress.console.print(f"[yellow]{record['message']}[/yellow]")

    def progress(self, record: Record) -> None:
        """A bar for each wait (validation, the test windows) with windows done, the rate and
        the time left; it goes when the wait ends."""
        what = record["what"]
        task = self._waits.get(what)
        if task is None:
            task = self._progress.add_task(f"{what:<6}", total=record["total"], info="")
            self._waits[what] = task
        rate, left = record["windows_per_s"], record["left_s"]
        info = "" if rate is None else f"{rate:,.0f} windows/s, {left:.0f} s left"
        self._progress.update(task, completed=record["done"], total=record["total"], info=info)
        if record["done"] >= record["total"]:
            self._progress.remove_task(self._waits.pop(what))

    def finish(self, summary: Record) -> None:
        self._progress.stop()
        table = Table(title="training run", show_header=False)
        table.add_column("what")
        table.add_column("value")
        table.add_row("run folder", str(summary["run_dir"]))
        table.add_row("epochs", f"{summary['epochs_done']} ({summary['stopped']})")
        table.add_row("steps", str(summary["global_step"]))
        if summary.get("best_val_loss") is not None:
            table.add_row("best validation loss", f"{summary['best_val_loss']:.4f}")
        if summary.get("naive_val_loss"):
            naive = ", ".join(
                f"{_NAIVE_LABELS[k]} {v:.4f}" for k, v in summary["naive_val_loss"].items()
            )
            table.add_row("naive forecasts", naive)
            table.add_row("skill (best over naive)", _skill_text(summary.get("best_val_skill")))
        if summary.get("split"):
            table.add_row("split (--split)", split_text(summary["split"]))
        if summary.get("test_loss") is not None:  # NOTE [Test windows at the end of a run]
            table.add_row(
                "test windows (best.pt)",
                f"{windows_text(summary, 'test')}: loss {summary['test_loss']:.4f}"
                f"{_se_text(summary.get('test_loss_se'))}, MAE {summary['test_mae']:.4g}, "
                f"RMSE {summary['test_rmse']:.4g}",
            )
            naive = naive_text(summary["test_naive"], summary.get("test_skill"))
            table.add_row("test naive forecasts", naive.removeprefix("  | naive (loss/MAE/RMSE): "))
        elif summary.get("test_not_scored"):
            table.add_row("test windows", f"not scored: {summary['test_not_scored']}")
        measure, peak = summary["memory_measure"], summary.get("peak_bytes")
        if peak is None:
            table.add_row("peak memory", measure)
        else:
            measured = f"{summary['num_measured_steps']} of {summary['global_step']} steps measured"
            table.add_row(
                "peak memory",
                f"{memory_text(peak, summary.get('budget_bytes'))} ({measure}; {measured})",
            )
        if summary.get("budget_bytes") is not None:
            within = (
                summary["peak_bytes"] is not None
                and summary["peak_bytes"] <= summary["budget_bytes"]
            )
            table.add_row("within budget", "[green]yes[/green]" if within else "[red]no[/red]")
        table.add_row("mean step time", f"{summary['mean_step_s'] * 1000:.1f} ms")
        if summary.get("val_windows_of"):
            table.add_row("validation windows", windows_text(summary, "val") + " each epoch")
        if "run_time" in summary:  # NOTE [The run's expected time]
            table.add_row("run time (expected)", run_time_text(summary["run_time"]))
        if "data_wait_share" in summary:
            table.add_row(
                "waiting for data",
                f"{summary['data_wait_s']:.2f} s ({summary['data_wait_share']:.1%} of step time)",
            )
        self._console.print(table)


def windows_text(record: Record, part: str) -> str:
    """``"4,096 of 120,000, spread evenly"`` or ``"1,200"``: the windows a score took (NOTE
    [Scores in proportion]), from a record's ``{part}_windows`` fields."""
    count, total = record[f"{part}_windows"], record.get(f"{part}_windows_of")
    if not record.get(f"{part}_windows_spread") or total is None:
        return f"{count:,}"
    return f"{count:,} of {total:,}, spread evenly"


def _se_text(standard_error: float | None) -> str:
    return "" if standard_error is None else f" ± {standard_error:.4f}"


def run_time_text(run_time: Record) -> str:
    """``"12 s (10 s expected): data 1.00 s (1.00 s), steps ..."``: each part of a run's time
    measured, its expectation in brackets (NOTE [The run's expected time])."""
    expected, measured = run_time["expected"], run_time["measured"]
    parts = [
        f"{name} {seconds_text(measured[key])} ({seconds_text(expected[key])})"
        for name, key in (
            ("data", "data_s"),
            ("steps", "train_s"),
            ("validation", "validation_s"),
            ("test", "test_s"),
        )
    ]
    total = f"{seconds_text(measured['total_s'])} ({seconds_text(expected['total_s'])} expected)"
    return f"{total}: " + ", ".join(parts)


def seconds_text(value: float) -> str:
    """``"0.42 s"``, ``"12 s"``, ``"3 min 20 s"``."""
    if value < 10:
        return f"{value:.2f} s"
    if value < 120:
        return f"{value:.0f} s"
    minutes, seconds = divmod(round(value), 60)
    return f"{minutes} min {seconds} s"


def split_text(split: Record) -> str:
    """The summary's split as one line: each part's windows and where it begins."""
    windows = split["windows"]
    parts = [
        f"train {windows['train']:,} windows",
        f"validation {windows['validation']:,}"
        + (f" from {split['validation_from']}" if split.get("validation_from") else ""),
        f"test {windows['test']:,}"
        + (f" from {split['test_from']}" if split.get("test_from") else ""),
    ]
    return ", ".join(parts)
