"""The ``autockpt`` command line: argument parsing, the commands, and their reports.

:mod:`~autockpt.cli.main` holds the entry point :func:`main`; :mod:`~autockpt.cli.parser` the
arguments, :mod:`~autockpt.cli.commands` the subcommands' handlers, :mod:`~autockpt.cli.report`
the columns table (the plan's is :mod:`autockpt.plan_report`), :mod:`~autockpt.cli.plot` the plan's picture and :mod:`~autockpt.cli.console`
the console they print to.

The command line sits on top of both packages: it reads arguments, asks
:mod:`autockpt.training` to resolve the run's settings, plan and train, and prints what the
planner (:mod:`autockpt.planner`) chose. Nothing below it imports it.
"""

from autockpt.cli.main import main

__all__ = ["main"]
