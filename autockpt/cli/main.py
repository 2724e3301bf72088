"""``autockpt``: plan, train and forecast from the command line; :func:`main` is the entry point.

:func:`main` parses the arguments (:mod:`autockpt.cli.parser`), runs the subcommand's handler
(:mod:`autockpt.cli.commands`) with a console on stdout (:mod:`autockpt.cli.console`) and returns
its exit code. Every user mistake raises one of ``USER_ERRORS``
(:mod:`autockpt.training.options.user_errors`); :func:`main` prints it as one ``error: ...`` line on
stderr and returns 2, with no traceback and nothing half-written.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from autockpt.cli.commands import EXIT_INTERRUPTED, HANDLERS
from autockpt.cli.console import make_console
from autockpt.cli.parser import build_parser
from autockpt.progress import showing_progress
from autockpt.training.options.user_errors import USER_ERRORS

EXIT_USER_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (2 for any user error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code) if isinstance(exit_.code, int) else EXIT_USER_ERROR
    handler = HANDLERS[args.command]
    try:
        # Nothing prints a wait's progress but what a command shows on purpose (cli.console.waiting).
        with showing_progress(None):
            return int(handler(args, make_console()))
    except USER_ERRORS as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
