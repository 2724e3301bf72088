"""Planning says what it is doing (NOTE [Progress on long waits] in :mod:`autockpt.progress`):
a line per stage to the reporter asked for, to stderr on a terminal by default, and nothing
where nobody watches or the caller said so."""

from __future__ import annotations

import io

import pytest
import torch

import autockpt
from autockpt.planner import entry
from autockpt.progress import report_progress, showing_progress, stderr_lines
from tests.helpers import MLPStack

STAGES = (
    "planning: tracing the model",
    "planning: measuring the step's memory on fake tensors",
    "planning: timing the segments on the real model",
    "planning: searching for the fastest plan that fits",
)


def _plan(**options: object) -> autockpt.Plan:
    model, inputs = MLPStack(64, 4, 0.0), (torch.randn(1024, 64),)
    peak = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=False, progress=False)
    return autockpt.plan(model, inputs, peak.predicted_peak_bytes * 3 // 4, **options)  # type: ignore[arg-type]


def test_a_function_hears_every_stage_in_order() -> None:
    lines: list[str] = []
    _plan(progress=lines.append)
    assert [line for line in lines if line in STAGES] == list(STAGES)


def test_the_default_writes_to_stderr_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _plan()
    assert capsys.readouterr().err == ""  # stderr is captured here: not a terminal
    monkeypatch.setattr(entry, "on_a_terminal", lambda stream: True)
    _plan()
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in err] == [f"autockpt: {stage}" for stage in STAGES]
    _plan(progress=False)
    assert capsys.readouterr().err == ""


def test_a_reporter_around_the_call_hears_it_and_silence_around_it_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(entry, "on_a_terminal", lambda stream: True)
    lines: list[str] = []
    with showing_progress(lines.append):
        _plan()
    assert STAGES[0] in lines
    with showing_progress(None):  # what `autockpt ... --quiet` installs
        _plan()
    assert capsys.readouterr().err == ""
    report_progress("nobody listens")  # outside any block: nothing, and no error


def test_stderr_lines_write_each_new_line_once_with_its_time() -> None:
    stream = io.StringIO()
    write = stderr_lines(stream)
    for text in ("a", "a", "b"):
        write(text)
    lines = stream.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["autockpt: a", "autockpt: b"]
    assert lines[0].endswith(" s)")
