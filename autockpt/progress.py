"""What a long wait is doing: planning's stages and a row cache's build, as lines of text.

NOTE [Progress on long waits]
Planning a model takes seconds to a minute (tracing, measuring on fake tensors, timing the
segments, the search, a verifying step) and a row cache of a large file minutes; a silent
wait that long looks like a hang. The work reports what it is doing by calling
:func:`report_progress` with a line of text ("planning: timing the segments on the real
model", "building the row cache, pass 3 of 3 (encoding the rows): 1,200,000 of 4,000,000
rows"), and whoever waits says how
to show it by installing a reporter around the work with :func:`showing_progress`:
the command line installs a spinner on a terminal and none under ``--quiet`` or in a file or
a pipe; :func:`autockpt.plan` (``progress=``) installs one line per stage on stderr when stderr
is a terminal, unless a reporter is installed already. A context variable carries the
reporter, so the work needs no argument for it through every call between (the trainer's
setup, the data reader, the planner's stages), and two threads do not share one.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

__all__ = [
    "ProgressReporter",
    "current_reporter",
    "on_a_terminal",
    "report_progress",
    "showing_progress",
    "stderr_lines",
]

ProgressReporter = Callable[[str], None]
"""Shows one line of what a long wait is doing (the latest line replaces the one before)."""

_REPORTER: contextvars.ContextVar[ProgressReporter | None] = contextvars.ContextVar(
    "autockpt_progress", default=None
)


def report_progress(text: str) -> None:
    """Say what the work is doing now, to the reporter installed around it (none: nothing)."""
    reporter = _REPORTER.get()
    if reporter is not None:
        reporter(text)


def current_reporter() -> ProgressReporter | None:
    """The reporter installed around the caller, if any."""
    return _REPORTER.get()


def _silent(text: str) -> None:
    """The reporter of a block that shows nothing (it hides planning's own stderr lines)."""


@contextlib.contextmanager
def showing_progress(reporter: ProgressReporter | None) -> Iterator[None]:
    """Show the work's progress lines with ``reporter`` inside the block (None: nothing,
    :func:`autockpt.plan`'s stderr lines included)."""
    token = _REPORTER.set(reporter if reporter is not None else _silent)
    try:
        yield
    finally:
        _REPORTER.reset(token)


def stderr_lines(stream: TextIO | None = None, *, prefix: str = "autockpt") -> ProgressReporter:
    """A reporter that writes each new line once, with the seconds since the first, to
    ``stream`` (default: stderr as it is when a line is written)."""
    started = time.perf_counter()
    last: list[str] = []

    def write(text: str) -> None:
        if last and last[0] == text:
            return
        last[:] = [text]
        out = stream if stream is not None else sys.stderr
        print(f"{prefix}: {text} ({time.perf_counter() - started:.1f} s)", file=out, flush=True)

    return write


def on_a_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal someone watches."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty(), or already closed
        return False
