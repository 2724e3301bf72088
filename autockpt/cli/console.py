"""The console the commands print to, and how wide it is.

On a terminal rich fits its output to the window, folding long cells and lines. Anywhere else
(``autockpt plan > plan.txt``, a pipe, a test capturing stdout) rich would assume 80 columns
(or ``$COLUMNS``) and crop the plan table's right-hand columns, the recompute cost among them.
There :func:`make_console` sets a width no report line reaches, so every table is printed at
its natural width, each row on one line, and no line is wrapped.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

from autockpt.progress import on_a_terminal, showing_progress

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
    ``(windows done, windows in all)`` callback the library calls after each batch, or None
    where stdout is not a terminal (a file, a pipe, a test), which gets no bar. Until the
    first batch the bar says what the wait is (a row cache's build: NOTE [Progress on long
    waits])."""
    if not writes_to_terminal(sys.stdout):
        yield None
        return
    columns = (BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(
        *Progress.get_default_columns()[:1], *columns, console=console, transient=True
    ) as bar:
        task = bar.add_task(description, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=description)

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
