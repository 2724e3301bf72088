"""The console the commands print to, and how wide it is.

On a terminal rich fits its output to the window, folding long cells and lines. Anywhere else
(``autockpt plan > plan.txt``, a pipe, a test capturing stdout) rich would assume 80 columns
(or ``$COLUMNS``) and crop the plan table's right-hand columns, the recompute cost among them.
There :func:`make_console` sets a width no report line reaches, so every table is printed at
its natural width, each row on one line, and no line is wrapped.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from autockpt.progress import on_a_terminal, showing_progress
from autockpt.training.host.progress import ProgressLines, scoring_progress

#: The width when stdout is not a terminal: wider than any line the commands print. Tables,
#: progress bars and text size themselves to their content, so nothing is padded to it.
UNCROPPED_WIDTH = 10_000


def writes_to_terminal(file: TextIO) -> bool:
    """Whether ``file`` is a terminal, whose width output must fit.

    Unlike rich's ``Console.is_terminal`` this ignores ``FORCE_COLOR`` and ``TTY_COMPATIBLE``:
    they ask for colours in a file or pipe, which still has no width to crop to.
    """
    return on_a_terminal(file)


def make_console() -> Console:
    """A console on stdout: the terminal's width there, :data:`UNCROPPED_WIDTH` elsewhere."""
    width = None if writes_to_terminal(sys.stdout) else UNCROPPED_WIDTH
    return Console(highlight=False, width=width)


@contextlib.contextmanager
def windows_progress(
    console: Console, description: str
) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar over windows for a long command (``predict``, ``interpret``): yields the
    ``(windows done, windows in all)`` callback the library calls after each batch. On a
    terminal a bar with the windows done, their rate and the time left; until the first batch
    it says what the wait is (a row cache's build: NOTE [Progress on long waits]). Elsewhere (a
    file, a pipe, a scheduler's log) a JSON progress line on stderr every few seconds, so that
    stdout keeps the command's own output alone."""
    if not writes_to_terminal(sys.stdout):

        def line(record: Mapping[str, Any]) -> None:
            print(json.dumps(dict(record), sort_keys=True), file=sys.stderr, flush=True)

        yield scoring_progress(description, ProgressLines(line))
        return
    rate = TextColumn("{task.fields[rate]}")
    columns = (BarColumn(), MofNCompleteColumn(), rate, TimeRemainingColumn())
    with Progress(
        *Progress.get_default_columns()[:1], *columns, console=console, transient=True
    ) as bar:
        task = bar.add_task(description, total=None, rate="")

        def show(record: Mapping[str, Any]) -> None:
            per_s = record["windows_per_s"]
            bar.update(
                task,
                completed=record["done"],
                total=record["total"],
                description=description,
                rate="" if per_s is None else f"{per_s:,.0f} windows/s",
            )

        advance = scoring_progress(description, show)

        with showing_progress(lambda text: bar.update(task, description=text, refresh=True)):
            yield advance


@contextlib.contextmanager
def waiting(console: Console, *, quiet: bool) -> Iterator[None]:
    """What a long wait is doing (planning's stages, a row cache's build) on one spinner line
    that each new line replaces and that goes when the block ends (NOTE [Progress on long
    waits]); nothing under ``--quiet`` or where stdout is not a terminal."""
    if quiet or not writes_to_terminal(sys.stdout):
        with showing_progress(None):
            yield
        return
    with (
        console.status("reading the data", spinner="dots") as status,
        showing_progress(lambda text: status.update(text)),
    ):
        yield
