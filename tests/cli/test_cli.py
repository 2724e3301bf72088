"""The command line through ``main(argv)``: plan, make-data, demo, predict and every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

import autockpt
from autockpt.cli import main
from autockpt.training.options.settings import SAMPLE_DATA

TINY = ["--preset", "tiny"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(err: str) -> None:
    """What every exit-2 path must print: exactly one line on stderr, no traceback."""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and "usage:" not in err, err


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A three-step tiny run on the sample, with rich output (shared, read-only)."""
    out = tmp_path_factory.mktemp("runs") / "tiny"
    args = ["train", str(SAMPLE_DATA), *TINY, "--epochs", "1", "--max-steps-per-epoch", "3"]
    assert main([*args, "--out", str(out)]) == 0
    return out


def folder_snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------------------- help


def test_help_of_every_command_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    for command in ("make-data", "plan", "train", "demo", "predict"):
        assert main([command, "--help"]) == 0
        assert "example:" in capsys.readouterr().out


def test_python_dash_m_runs_the_same_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "autockpt", "plan", "--preset", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: --preset = 'nope' is invalid")
    assert_one_line(result.stderr)


ARGPARSE_ERRORS = [
    pytest.param([], "autockpt", "required: COMMAND", id="no-command"),
    pytest.param(["nope"], "autockpt", "invalid choice: 'nope'", id="unknown-command"),
    pytest.param(["predict", "run", "bars.parquet"], "autockpt predict", "-o/--output", id="no-o"),
    pytest.param(
        ["plan", "--use-gradient-checkpointing", "--no-gradient-checkpointing"],
        "autockpt plan",
        "not allowed with argument --use-gradient-checkpointing",
        id="exclusive-flags",
    ),
    pytest.param(["train", "--epochs"], "autockpt train", "expected one argument", id="no-value"),
    pytest.param(["train", "--epochs", "x"], "autockpt train", "invalid int value", id="not-int"),
    pytest.param(["plan", "--bogus"], "autockpt", "unrecognized arguments", id="unknown-option"),
]


@pytest.mark.parametrize(("args", "prog", "message"), ARGPARSE_ERRORS)
def test_usage_errors_are_one_line_naming_the_help(
    args: list[str], prog: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"{prog}: error: ") and message in err
    assert err.rstrip().endswith(f"; see {prog} --help")
    assert_one_line(err)


# ---------------------------------------------------------------------------- plan


def test_plan_prints_the_table_and_writes_reloadable_json(
    tmp_path: Path, sample_parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plans" / "plan.json"
    code, out, err = run_cli(["plan", str(sample_parquet), *TINY, "--json", str(path)], capsys)
    assert code == 0, err
    assert "memory plan" in out
    assert "none given: on the CPU training is not limited" in out
    assert "step time:" in out
    plan = autockpt.Plan.model_validate_json(path.read_text())
    assert plan.num_recomputed == 0  # no budget: nothing to save
    assert [p.name for p in path.parent.iterdir()] == ["plan.json"]  # no temporary left


def test_plan_into_a_file_or_pipe_keeps_the_whole_table(
    tmp_path: Path,
    sample_parquet: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `autockpt plan > plan.txt`: stdout is no terminal, where rich assumes 80 columns (or
    # $COLUMNS) and used to crop the columns right of "plan", the recompute cost among them.
    monkeypatch.setenv("COLUMNS", "80")
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "plan.json"
    args = ["plan", str(sample_parquet), *TINY, "--use-gradient-checkpointing"]
    code, out, err = run_cli([*args, "--json", str(path)], capsys)
    assert code == 0, err
    plan = autockpt.Plan.model_validate_json(path.read_text())
    assert plan.num_recomputed == len(plan.segments) > 0  # every row has a recompute cost
    lines = out.splitlines()
    header = next(line for line in lines if "segment" in line and "┃" in line)
    assert header.rstrip().endswith("┃")  # the header's right border is there
    headers = [cell.strip() for cell in header.strip().strip("┃").split("┃")]
    assert headers == ["#", "segment", "activations", "", "plan", "recompute"]
    below = lines[lines.index(header) :]  # the column table comes first
    rows = [line.rstrip() for line in below if line.startswith("│")]
    assert len(rows) == len(plan.segments), rows  # no name folded onto a second line
    for index, (row, segment) in enumerate(zip(rows, plan.segments, strict=True)):
        assert row.endswith("│"), row  # the right border is there: nothing cropped
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        assert cells[:2] == [str(index), segment.name]
        assert cells[4:] == ["recomputed", f"{segment.recompute_s * 1000:.2f} ms"]
    assert any(
        line.startswith("step time:") and line.endswith("segments recomputed") for line in lines
    )


@pytest.mark.slow
def test_plan_under_a_tight_budget_recomputes_and_fits(
    tmp_path: Path, sample_parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loose = tmp_path / "loose.json"
    assert main(["plan", str(sample_parquet), *TINY, "--json", str(loose)]) == 0
    capsys.readouterr()
    unplanned = autockpt.Plan.model_validate_json(loose.read_text())
    budget = (unplanned.unplanned_peak_bytes + unplanned.minimum_feasible_bytes) // 2
    tight = tmp_path / "tight.json"
    args = ["plan", str(sample_parquet), *TINY, "--vram-budget", str(budget), "--json", str(tight)]
    code, out, err = run_cli([*args, "--quiet"], capsys)
    assert code == 0, err
    # --quiet prints two JSON lines: the column table, then the plan.
    columns, plan_line = out.splitlines()
    assert json.loads(columns)["kind"] == "columns"
    plan = autockpt.Plan.model_validate_json(plan_line)
    assert plan == autockpt.Plan.model_validate_json(tight.read_text())
    assert f"{budget:,} bytes" in plan.budget_reading
    assert plan.fits and plan.predicted_peak_bytes <= budget
    assert plan.num_recomputed > 0 or plan.num_micro_batches > 1


def test_plot_without_matplotlib_says_how_to_install(
    tmp_path: Path, sample_parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = tmp_path / "plan.png"
    code, _, err = run_cli(["plan", str(sample_parquet), *TINY, "--plot", str(picture)], capsys)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert code == 2
        assert "pip install autockpt[plot]" in err
        assert_one_line(err)
        assert not picture.exists()
    else:
        assert code == 0, err
        assert picture.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------- make-data, demo


def test_make_data_writes_bars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bars.parquet"
    args = ["make-data", str(path), "--days", "1", "--features", "3", "--symbols", "ES,NQ"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    table = pq.read_table(path)
    assert table.num_rows == 2 * 1380
    assert "log_return_lag0" in table.column_names


def test_three_step_train_on_the_sample(trained_run: Path) -> None:
    records = [
        json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2, 3]
    # No budget was given, so nothing was promised: the summary does not claim one was kept.
    assert records[-1]["kind"] == "summary" and records[-1]["budget_bytes"] is None
    assert records[-1]["within_budget"] is None
    autockpt.Plan.model_validate_json((trained_run / "plan.json").read_text())


# ---------------------------------------------------------------------------- predict


def test_predict_writes_quantile_forecasts(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One day with the sample's columns and symbols keeps the forward passes few.
    bars = tmp_path / "bars.parquet"
    assert main(["make-data", str(bars), "--days", "1", "--symbols", "ES,NQ", "--seed", "3"]) == 0
    out = tmp_path / "forecasts.parquet"
    args = ["predict", str(trained_run), str(bars), "-o", str(out), "--batch-size", "1024"]
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    table = pq.read_table(out)
    config = json.loads((trained_run / "config.json").read_text())
    assert config["preset"] == "tiny"
    assert table.column_names == [
        "timestamp",
        "symbol",
        "horizon_step",
        "actual",
        "q0.1",
        "q0.5",
        "q0.9",
    ]
    assert set(table.column("symbol").to_pylist()) == {"ES", "NQ"}
    assert sorted(set(table.column("horizon_step").to_pylist())) == [1, 2, 3, 4]
    assert table.schema.metadata[b"target_transform"] == b"log_return"
    assert f"{table.num_rows:,} forecasts" in stdout
    # NOTE [Scores by what the model saw]: the whole file, then the parts it has.
    windows = table.num_rows // 4
    assert f"  all {windows:,} windows: model " in stdout
    parts = [line.split(" (")[0].strip() for line in stdout.splitlines() if " windows): " in line]
    assert parts and set(parts) <= {"trained on", "validated on", "never seen"}
    # De-normalised: log returns of minute bars are tiny, not unit-scaled.
    median = table.column("q0.5").to_numpy()
    assert abs(median).max() < 0.05


def test_predict_of_a_missing_run(tmp_path: Path, sample_parquet: Path, capsys) -> None:
    out = tmp_path / "f.parquet"
    code, _, err = run_cli(
        ["predict", str(tmp_path / "nope"), str(sample_parquet), "-o", str(out)], capsys
    )
    assert code == 2
    assert err.startswith("error: run folder") and "does not exist" in err
    assert_one_line(err)
    assert not out.exists()


def test_predict_needs_an_output(trained_run: Path, sample_parquet: Path, capsys) -> None:
    code, _, err = run_cli(["predict", str(trained_run), str(sample_parquet)], capsys)
    assert code == 2
    assert err.startswith("autockpt predict: error: ") and "-o/--output" in err
    assert_one_line(err)


# ---------------------------------------------------------------------------- bad input


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


BAD_INPUTS = [
    pytest.param(["--vram-budget", "4XB"], "budget '4XB' is not a size", id="budget-unit"),
    pytest.param(["--vram-budget=-1GB"], "budget '-1GB' is negative", id="budget-negative"),
    pytest.param(["--vram-budget", "0"], "budget '0' is zero", id="budget-zero"),
    pytest.param(["--vram-budget", ""], "budget is empty", id="budget-empty"),
    pytest.param(
        ["--preset", "huge"],
        "is not a preset (preset: model size, one of tiny, small, tft-225",
        id="preset",
    ),
    pytest.param(["--epochs", "0"], "--epochs = 0 is invalid", id="epochs"),
    pytest.param(["--precision", "fp8"], "--precision = 'fp8' is invalid", id="precision"),
    pytest.param(["--target", "nope"], "no target column 'nope'", id="target-column"),
    pytest.param(
        ["--batch-size", "100000"], "fewer than the batch size 100000", id="batch-too-large"
    ),
]


@pytest.mark.parametrize(("extra", "message"), BAD_INPUTS)
def test_bad_option_exits_2_with_one_line_and_writes_nothing(
    extra: list[str],
    message: str,
    tmp_path: Path,
    sample_parquet: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "run"
    args = ["train", str(sample_parquet), "--preset", "tiny", *extra, "--out", str(out)]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert err.startswith("error: ") and message in err
    assert_one_line(err)
    assert not out.exists()


@pytest.mark.slow  # finding the minimum to name plans every micro-batch count
def test_budget_below_minimum_names_the_minimum_and_the_lever(
    tmp_path: Path, sample_parquet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["train", str(sample_parquet), *TINY, "--vram-budget", "1KB", "--out", str(out)]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert err.startswith("error: budget 1KB")
    assert_one_line(err)
    assert "below the minimum" in err and "raise the budget" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("make_file", "message"),
    [
        (lambda d: d / "missing.parquet", "no such file"),
        (
            lambda d: write(d / "corrupt.parquet", b"this is not parquet"),
            "cannot be read as Parquet",
        ),
    ],
    ids=["missing", "corrupt"],
)
def test_bad_data_file(make_file, message, tmp_path: Path, capsys) -> None:
    data, out = make_file(tmp_path), tmp_path / "run"
    code, _, err = run_cli(["train", str(data), *TINY, "--out", str(out)], capsys)
    assert code == 2
    assert message in err and str(data) in err
    assert_one_line(err)
    assert not out.exists()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("epochs = = 3\n", "is not valid TOML"),
        ("epochz = 3\n", "unknown key 'epochz'; did you mean 'epochs'?"),
        ('vram_budget = "4XB"\n', "budget '4XB' is not a size"),
    ],
    ids=["bad-toml", "unknown-key", "bad-value"],
)
def test_bad_config_file(toml: str, message: str, tmp_path: Path, sample_parquet, capsys) -> None:
    config, out = write(tmp_path / "run.toml", toml), tmp_path / "run"
    args = ["train", str(sample_parquet), *TINY, "--config", str(config), "--out", str(out)]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert message in err
    assert_one_line(err)
    assert not out.exists()


def test_cuda_without_a_gpu(tmp_path: Path, sample_parquet: Path, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "run"
    code, _, err = run_cli(
        ["train", str(sample_parquet), *TINY, "--device", "cuda", "--out", str(out)], capsys
    )
    assert code == 2
    assert "--device cuda" in err and "no CUDA GPU" in err
    assert_one_line(err)
    assert not out.exists()


def test_checkpointing_flags_are_exclusive(sample_parquet: Path, capsys) -> None:
    args = [
        "plan",
        str(sample_parquet),
        "--use-gradient-checkpointing",
        "--no-gradient-checkpointing",
    ]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert err.startswith("autockpt plan: error: ") and "not allowed with argument" in err
    assert_one_line(err)


def test_out_folder_holding_a_run_is_not_overwritten(
    trained_run: Path, sample_parquet, capsys
) -> None:
    before = folder_snapshot(trained_run)
    code, _, err = run_cli(["train", str(sample_parquet), *TINY, "--out", str(trained_run)], capsys)
    assert code == 2
    assert "already holds a run; continue it with --resume" in err
    assert_one_line(err)
    assert folder_snapshot(trained_run) == before


def test_resume_of_a_missing_run(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope"
    code, _, err = run_cli(["train", "--resume", str(missing)], capsys)
    assert code == 2
    assert f"run folder {missing} does not exist" in err
    assert_one_line(err)
    assert not missing.exists()


def test_resume_of_an_incompatible_run(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = folder_snapshot(trained_run)
    code, _, err = run_cli(["train", "--resume", str(trained_run), "--preset", "small"], capsys)
    assert code == 2
    assert f"cannot resume {trained_run}" in err and "preset='tiny'" in err
    assert_one_line(err)

    args = ["train", "--resume", str(trained_run), "--known-columns", "volume"]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert f"cannot resume {trained_run}" in err and "known=[]" in err
    assert_one_line(err)

    other = tmp_path / "other.parquet"
    assert (
        main(["make-data", str(other), "--days", "2", "--features", "3", "--symbols", "ES,NQ"]) == 0
    )
    capsys.readouterr()
    code, _, err = run_cli(["train", str(other), "--resume", str(trained_run)], capsys)
    assert code == 2
    assert f"cannot resume {trained_run}" in err
    assert_one_line(err)
    assert folder_snapshot(trained_run) == before
    assert not any(name.endswith(".tmp") for name in os.listdir(trained_run))


def test_predict_and_interpret_report_progress_by_windows(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from autockpt.cli import console as console_module
    from autockpt.training.forecasts.interpret import interpret
    from autockpt.training.forecasts.predict import predict

    bars = tmp_path / "bars.parquet"
    assert main(["make-data", str(bars), "--days", "1", "--symbols", "ES,NQ", "--seed", "4"]) == 0
    seen: list[tuple[int, int]] = []
    result = predict(
        trained_run,
        bars,
        tmp_path / "f.parquet",
        batch_size=256,
        progress=lambda *n: seen.append(n),
    )
    done = [d for d, _ in seen]
    assert len(seen) > 2 and done == sorted(done)
    assert seen[-1] == (result.num_windows, result.num_windows)
    seen.clear()
    interpret(trained_run, bars, batch_size=256, progress=lambda *n: seen.append(n))
    assert len(seen) > 2 and seen[-1][0] == seen[-1][1]
    # Not a terminal (captured): no bar in the output. A terminal: the bar, and the same result.
    out = tmp_path / "g.parquet"
    args = ["predict", str(trained_run), str(bars), "-o", str(out), "--batch-size", "256"]
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0 and "forecasting" not in stdout
    monkeypatch.setattr(console_module, "writes_to_terminal", lambda _file: True)
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0 and f"{result.num_rows:,} forecasts" in stdout
