"""The command line's long waits (NOTE [Progress on long waits]): one spinner line on a terminal
that follows the work, nothing under ``--quiet`` or in a file or a pipe, and no stray lines
from the library's own default."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from autockpt.cli import console as cli_console
from autockpt.cli import main
from autockpt.planner import entry
from autockpt.progress import report_progress


def test_on_a_terminal_the_spinner_follows_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_console, "writes_to_terminal", lambda file: True)
    stream = io.StringIO()
    terminal = Console(file=stream, force_terminal=True, width=120)
    with cli_console.waiting(terminal, quiet=False):
        report_progress("planning: tracing the model")
    assert "planning: tracing the model" in stream.getvalue()
    stream = io.StringIO()
    with cli_console.waiting(Console(file=stream, force_terminal=True), quiet=True):
        report_progress("planning: tracing the model")
    assert stream.getvalue() == ""


def test_the_windows_bar_says_what_it_waits_on_before_the_first_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli_console, "writes_to_terminal", lambda file: True)
    stream = io.StringIO()
    terminal = Console(file=stream, force_terminal=True, width=160)
    with cli_console.windows_progress(terminal, "forecasting") as advance:
        report_progress("building the row cache, pass 1 of 3")
        assert advance is not None
        advance(10, 100)
    shown = stream.getvalue()
    assert "building the row cache, pass 1 of 3" in shown and "forecasting" in shown


def test_a_command_prints_no_progress_where_nobody_watches(
    sample_parquet: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # stderr a terminal: the library alone would write its stage lines there.
    monkeypatch.setattr(entry, "on_a_terminal", lambda stream: True)
    args = ["plan", str(sample_parquet), "--preset", "tiny", "--vram-budget", "8MB"]
    assert main([*args, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "planning: tracing" not in captured.out + captured.err
    assert main(args) == 0  # stdout is not a terminal here: no spinner either
    captured = capsys.readouterr()
    assert "planning: tracing" not in captured.out + captured.err and "peak:" in captured.out
