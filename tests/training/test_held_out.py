"""The test windows scored at the end of a run (NOTE [Test windows at the end of a run]); the
scores themselves are checked by hand against ``best.pt`` in ``test_train.py``."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from autockpt.training.forecasts.held_out import score_test_windows
from autockpt.training.forecasts.scoring_sample import held_out_sample
from autockpt.training.host.progress import RichReporter
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.prepare import prepare
from autockpt.training.setup.runs import BEST_FILE, RunFolder


@pytest.fixture(scope="module")
def setup():
    return prepare(TrainConfig(data=SAMPLE_DATA, preset="tiny", batch_size=32))


def test_best_weights_score_the_test_windows_and_the_last_ones_come_back(
    setup, tmp_path: Path
) -> None:
    model = setup.model
    last = {k: v.clone() for k, v in model.state_dict().items()}
    run = RunFolder.create(tmp_path / "run")
    with torch.no_grad():
        best = {k: v + 0.01 if v.is_floating_point() else v for k, v in last.items()}
    run.save_checkpoint(BEST_FILE, {"model": best})
    every = held_out_sample(setup.data.test.run_counts, "all")
    scores = score_test_windows(setup, run, every)
    assert scores["test_windows"] == len(setup.data.test) > 0
    for name, value in model.state_dict().items():  # the run's model is the one it was
        torch.testing.assert_close(value, last[name], rtol=0, atol=0)
    run.save_checkpoint(BEST_FILE, {"model": last})
    assert score_test_windows(setup, run, every)["test_loss"] != scores["test_loss"]


def test_a_split_without_test_windows_says_so(tmp_path: Path) -> None:
    setup = prepare(
        TrainConfig(data=SAMPLE_DATA, preset="tiny", batch_size=32, split=(0.8, 0.2, 0.0))
    )
    sample = held_out_sample(setup.data.test.run_counts, None)
    scores = score_test_windows(setup, RunFolder.create(tmp_path / "run"), sample)
    split = scores.pop("split")
    assert scores == {
        "test_windows": 0,
        "test_windows_of": 0,
        "test_windows_spread": False,
        "test_not_scored": "the split leaves no test windows",
    }
    assert split["asked"] == [0.8, 0.2, 0.0] and split["windows"]["test"] == 0
    # The empty test part's cut is just after the file's last bar (tft.data.splits.split_cuts).
    assert split["test_from"] == "2024-01-22T21:59 UTC"


def _summary_text(**fields: object) -> str:
    """What the run's summary table shows for a run that scored 120 test windows, ``fields``
    added or replaced."""
    stream = io.StringIO()
    reporter = RichReporter(Console(file=stream, width=300))
    reporter.start(num_epochs=1, first_epoch=0, steps_per_epoch=1)
    naive = {"no_change": {"loss": 0.5, "mae": 0.1, "rmse": 0.2}}
    summary = {
        "run_dir": "runs/x",
        "epochs_done": 1,
        "stopped": "finished",
        "global_step": 1,
        "memory_measure": "tracked tensors",
        "peak_bytes": None,
        "mean_step_s": 0.1,
        "test_windows": 120,
        "test_loss": 0.4,
        "test_mae": 0.09,
        "test_rmse": 0.19,
        "test_naive": naive,
        "test_skill": 0.2,
        "split": {
            "asked": ["2024-01-15", "2024-01-19"],
            "validation_from": "2024-01-15T00:00 UTC",
            "test_from": "2024-01-19T00:00 UTC",
            "windows": {"train": 2000, "validation": 500, "test": 120},
        },
    }
    reporter.finish({**summary, **fields})
    return stream.getvalue()


def test_the_run_summary_shows_the_test_scores() -> None:
    text = _summary_text()
    assert (
        "train 2,000 windows, validation 500 from 2024-01-15T00:00 UTC, test 120 from "
        "2024-01-19T00:00 UTC" in text
    )
    assert "test windows (best.pt)" in text and "120: loss 0.4000" in text
    assert "no change 0.5000/0.1/0.2  skill +20.0%" in text


def test_the_run_summary_shows_how_many_windows_were_scored() -> None:
    # NOTE [Scores in proportion], NOTE [The run's expected time]
    times = {"data_s": 1.0, "train_s": 2.0, "validation_s": 3.0, "test_s": 4.0, "total_s": 10.0}
    text = _summary_text(
        test_windows=16380,
        test_windows_of=9_000_000,
        test_windows_spread=True,
        test_loss_se=0.005,
        val_windows=4096,
        val_windows_of=120_000,
        val_windows_spread=True,
        run_time={"expected": times, "measured": {**times, "total_s": 12.0}},
    )
    assert "16,380 of 9,000,000, spread evenly: loss 0.4000 ± 0.0050" in text
    assert "4,096 of 120,000, spread evenly each epoch" in text
    assert "12 s (10 s expected)" in text
