"""Scores in proportion (NOTE [Scores in proportion]) and the run's expected time (NOTE [The
run's expected time]): a part larger than its cap is scored on windows spread over every
contract and every month, the same windows whichever run scores them; ``all`` scores every
window; the summary says how many of how many; long waits report progress as JSON lines under
``--quiet``; the run says how long it will take before it starts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from autockpt.cli import main
from autockpt.training.forecasts.evaluate import evaluation_of, score_sums
from autockpt.training.forecasts.scoring_sample import (
    FLOOR_WINDOWS,
    TEST_WINDOWS,
    held_out_sample,
)
from autockpt.training.host.progress import (
    PROGRESS_LINE_EVERY_S,
    ProgressLines,
    scoring_progress,
)
from autockpt.training.loop.run_time import RunClock
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.prepare import prepare
from tft.data.windows import load_windows
from tft.synthetic.bars import generate_bars

_NS_PER_DAY = 86_400 * 10**9


@pytest.fixture(scope="module")
def bars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three contracts over 70 trading days (January to mid-April 2024); CL trades in the
    first week and the last half hour only: a contract with a handful of test windows, fewer
    than the part's windows over the cap."""
    table = generate_bars(days=70, num_features=1, symbols=["ES", "NQ", "CL"], seed=0)
    first, last = pc.min(table["timestamp"]).as_py(), pc.max(table["timestamp"]).as_py()
    late = pc.or_(
        pc.less(table["timestamp"], first + np.timedelta64(7, "D")),
        pc.greater(table["timestamp"], last - np.timedelta64(30, "m")),
    )
    keep = pc.or_(pc.not_equal(table["symbol"], "CL"), late)
    path = tmp_path_factory.mktemp("bars") / "bars.parquet"
    pq.write_table(table.filter(keep), path)
    return path


def _months(time_ns: np.ndarray) -> set[str]:
    return {str(np.datetime64(int(t), "ns").astype("datetime64[M]")) for t in time_ns}


def test_a_large_test_part_is_sampled_over_every_contract_and_every_month(bars: Path) -> None:
    data = load_windows(bars, encoder_length=24, horizon=4, split_fractions=(0.3, 0.1, 0.6))
    test = data.test
    sample = held_out_sample(test.run_counts, None)
    assert sample.spread and len(test) > 4 * TEST_WINDOWS
    assert abs(sample.count - TEST_WINDOWS) <= len(test.run_counts)
    positions = sample.positions
    assert positions is not None and np.all(np.diff(positions) > 0)
    first_rows = test.starts
    every_symbol = set(test.rows.symbol_index[first_rows].tolist())
    sampled_symbols = set(test.rows.symbol_index[first_rows[positions]].tolist())
    assert sampled_symbols == every_symbol and len(every_symbol) == 3
    # Every month the part's windows begin in is in the sample: February to April.
    every_month = _months(test.rows.time_ns[first_rows])
    assert len(every_month) >= 3
    assert _months(test.rows.time_ns[first_rows[positions]]) == every_month
    # Each contract's share is in proportion to its windows; CL's few (under one share of
    # the cap) get one.
    fewest = np.bincount(test.rows.symbol_index[first_rows]).min()
    assert 0 < fewest < len(test) / TEST_WINDOWS / 2
    for symbol in every_symbol:
        share = np.mean(test.rows.symbol_index[first_rows[positions]] == symbol)
        whole = np.mean(test.rows.symbol_index[first_rows] == symbol)
        assert share == pytest.approx(whole, abs=0.01)


def test_the_test_sample_is_the_same_whichever_run_scores_it_and_all_scores_everything(
    bars: Path, tmp_path: Path
) -> None:
    base = {"data": bars, "preset": "tiny", "split": (0.3, 0.1, 0.6), "max_steps_per_epoch": 2}
    clocks = [
        RunClock(prepare(TrainConfig(**base, batch_size=b, seed=s)), steps_per_epoch=steps)
        for b, s, steps in ((16, 0, 2), (512, 3, 20))
    ]
    first, second = (clock.test for clock in clocks)
    assert first.positions is not None and second.positions is not None
    np.testing.assert_array_equal(first.positions, second.positions)
    assert abs(first.count - TEST_WINDOWS) <= 3
    # Validation follows the run: as many windows as an epoch trains on, at least the floor.
    assert abs(clocks[0].validation.count - FLOOR_WINDOWS) <= 3
    assert abs(clocks[1].validation.count - 20 * 512) <= 3
    setup = prepare(TrainConfig(**base, batch_size=16, test_windows="all", val_windows="all"))
    every, data = RunClock(setup, steps_per_epoch=2), setup.data
    assert not every.test.spread and every.test.count == len(data.test)
    assert not every.validation.spread and every.validation.count == len(data.validation)


def test_the_standard_error_is_that_of_the_batches_means() -> None:
    # Four batches of 8 windows with a loss of known mean each: the standard error of the
    # overall mean is their spread over sqrt(4), worked out here with numpy.
    torch.manual_seed(0)

    def loss_fn(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (prediction[..., 0] - target).abs().mean()

    totals = np.zeros(8 + 2)
    means = []
    for shift in (0.1, 0.5, 0.2, 0.9):
        target = torch.zeros(8, 2)
        prediction = torch.full((8, 2, 1), shift) + 0.01 * torch.rand(8, 2, 1)
        totals += score_sums(loss_fn, prediction, target, torch.ones(8, 1), 0)
        means.append(float(loss_fn(prediction, target)))
    evaluation = evaluation_of({"model": totals}, 32, 64)
    expected = np.std(means, ddof=1) / math.sqrt(4)
    assert evaluation.model.loss == pytest.approx(np.mean(means))
    assert evaluation.model.loss_se == pytest.approx(expected, rel=1e-9)


def test_progress_lines_come_every_few_seconds_and_at_the_end() -> None:
    now = [0.0]
    written: list[dict] = []
    lines = ProgressLines(written.append, clock=lambda: now[0])
    advance = scoring_progress("test", lines, clock=lambda: now[0])
    for batch in range(1, 101):  # a batch every 0.1 s for 10 s
        now[0] = batch * 0.1
        advance(batch * 64, 100 * 64)
    assert written[-1]["done"] == written[-1]["total"] == 6400
    assert 10 / PROGRESS_LINE_EVERY_S <= len(written) <= 10 / PROGRESS_LINE_EVERY_S + 2
    assert written[0]["windows_per_s"] == pytest.approx(640.0)
    assert written[0]["left_s"] == pytest.approx((6400 - 64) / 640.0)


def test_the_rate_leaves_out_the_wait_before_the_first_batch() -> None:
    """predict's first window waits for a row cache's build: a rate counted from the start
    would put the time left at many times the scoring's own."""
    now = [0.0]
    written: list[dict] = []
    advance = scoring_progress("predict", written.append, clock=lambda: now[0])
    now[0] = 60.0  # a minute's build, then a batch of 64 windows every 0.1 s
    for batch in range(1, 11):
        now[0] = 60.0 + batch * 0.1
        advance(batch * 64, 1000 * 64)
    assert written[-1]["windows_per_s"] == pytest.approx(640.0)
    assert written[-1]["left_s"] == pytest.approx((1000 - 10) * 64 / 640.0)
    assert written[-1]["elapsed_s"] == pytest.approx(61.0)


def test_a_quiet_run_says_its_expected_time_its_waits_and_its_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["train", str(SAMPLE_DATA), "--preset", "tiny", "--epochs", "1", "--quiet"]
    args += ["--max-steps-per-epoch", "3", "--batch-size", "16", "--out", str(out)]
    args += ["--val-windows", "700", "--test-windows", "500"]
    assert main(args) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    kinds = [r["kind"] for r in records]
    expected = next(r for r in records if "expected" in r)
    # Said before the first step: the steps at the plan's predicted seconds.
    assert kinds.index("event", records.index(expected)) < kinds.index("step")
    plan_step_s = json.loads((out / "plan.json").read_text())
    step_s = plan_step_s["unplanned_step_s"] + plan_step_s["predicted_extra_s"]
    assert expected["expected"]["train_s"] == pytest.approx(3 * step_s)
    assert expected["expected"]["test_s"] > 0 and expected["expected"]["validation_s"] > 0
    assert "expected run time" in expected["message"]
    progress = [r for r in records if r["kind"] == "progress"]
    assert {r["what"] for r in progress} == {"validation", "test"}
    assert all(r["done"] == r["total"] for r in progress if r is progress[-1])
    summary = records[-1]
    assert summary["kind"] == "summary"
    assert (summary["test_windows"], summary["test_windows_spread"]) == (500, True)
    assert summary["test_windows_of"] > 500 and summary["test_loss_se"] > 0
    assert (summary["val_windows"], summary["val_windows_spread"]) == (700, True)
    measured = summary["run_time"]["measured"]
    assert measured["test_s"] > 0 and measured["train_s"] > 0
    assert summary["run_time"]["expected"]["train_s"] == expected["expected"]["train_s"]
    # predict off a terminal: progress as JSON lines on stderr, stdout its own lines alone.
    forecasts = tmp_path / "forecasts.parquet"
    assert main(["predict", str(out), str(SAMPLE_DATA), "-o", str(forecasts)]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")]
    assert lines and all(r["kind"] == "progress" for r in lines)
    assert lines[-1]["done"] == lines[-1]["total"] > 0 and lines[-1]["windows_per_s"] > 0
    assert not any(line.startswith("{") for line in captured.out.splitlines())


def test_a_bad_window_count_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--test-windows", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "'none' is not a number of windows" in err[-1] and "or all" in err[-1]
