"""The console the commands print to, and how wide it is.

On a terminal rich fits its output to the window, folding long cells and lines. Anywhere else
(``autockpt plan > plan.txt``, a pipe, a test capturing stdout) rich would assume 80 columns
(or ``$COLUMNS``) and crop the plan table's right-hand columns, the recompute cost among them.
There :func:`make_console` sets a width no report line reaches, so every table is printed at
its natural width, each row on one line, and no line is wrapped.
"""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console

#: The width when stdout is not a terminal: wider than any line the commands print. Tables,
#: progress bars and text size themselves to their content, so nothing is padded to it.
UNCROPPED_WIDTH = 10_000


def writes_to_terminal(file: TextIO) -> bool:
    """Whether ``file`` is a terminal, whose width output must fit.

    Unlike rich's ``Console.is_terminal`` this ignores ``FORCE_COLOR`` and ``TTY_COMPATIBLE``:
    they ask for colours in a file or pipe, which still has no width to crop to.
    """
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty(), or already closed
        return False


def make_console() -> Console:
    """A console on stdout: the terminal's width there, :data:`UNCROPPED_WIDTH` elsewhere."""
    width = None if writes_to_terminal(sys.stdout) else UNCROPPED_WIDTH
    return Console(highlight=False, width=width)
