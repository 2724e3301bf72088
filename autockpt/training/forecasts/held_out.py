"""The test windows scored once, at the end of training, by the run's best checkpoint.

NOTE [Test windows at the end of a run]
The split's last part (``--split``, by shares or dates) is never trained on and never chooses the
best epoch: validation does that. So its scores are the run's honest estimate of how the model
forecasts bars it has not seen, and the summary gives them beside the naive forecasts' on the
same windows (NOTE [Naive forecasts]), as ``test_*`` fields. They are the best checkpoint's
(``best.pt``, what ``autockpt predict`` uses): its weights are loaded into the model for the
scoring and the last epoch's put back after, kept on the host in between, so the device holds
no second copy of the model and the run's model is the one it was. Under FSDP the model is
sharded over the ranks and the test windows are not scored here (the summary says so);
``autockpt predict`` on the file scores them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autockpt.training.forecasts.evaluate import evaluate
from autockpt.training.forecasts.scoring_sample import ScoringSample
from autockpt.training.setup.prepare import Setup
from autockpt.training.setup.runs import BEST_FILE, RunFolder
from tft.data.splits import NO_CUT, time_text


def score_test_windows(
    setup: Setup,
    run: RunFolder,
    sample: ScoringSample,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The run summary's ``test_*`` fields: the best checkpoint's loss (and its standard
    error), MAE, RMSE, coverage and skill on the test windows of ``sample`` (NOTE [Scores in
    proportion]), and the naive forecasts' scores there (NOTE [Test windows at the end of a
    run]); ``test_windows`` 0 and no scores when the split leaves none. ``progress`` is called
    after each batch with the windows scored and the windows to score."""
    dataset = setup.data.test
    if len(dataset) == 0 or setup.parallelism == "fsdp":
        skipped = "sharded over the ranks" if len(dataset) else "the split leaves no test windows"
        return {
            "split": split_record(setup),
            **sample.record("test"),
            "test_windows": 0,
            "test_not_scored": skipped,
        }
    setup.world.all_gather(None)  # the main rank wrote best.pt: every rank reads it after
    best = run.load_checkpoint(BEST_FILE)["model"]  # on the host, copied into the model
    model = setup.model
    last = {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}
    try:
        model.load_state_dict(best)
        del best
        evaluation = evaluate(setup, dataset, positions=sample.positions, progress=progress)
    finally:
        model.load_state_dict(last)
    assert evaluation is not None  # the dataset has windows
    return {
        "split": split_record(setup),
        **sample.record("test"),
        "test_windows": evaluation.num_windows,
        "test_loss": evaluation.loss,
        "test_loss_se": evaluation.model.loss_se,
        "test_mae": evaluation.mae,
        "test_rmse": evaluation.rmse,
        "test_coverage": evaluation.coverage,
        "test_naive": {name: scores.record() for name, scores in evaluation.naive.items()},
        "test_skill": evaluation.skill,
    }


def split_record(setup: Setup) -> dict[str, Any]:
    """The run summary's ``split``: what ``--split`` asked for, the times validation and test
    begin at (ISO 8601, UTC; None where the split has no such cut) and each part's windows."""
    data = setup.data
    cuts = data.split_cuts_ns or ()
    return {
        "asked": list(setup.config.split),
        "validation_from": time_text(cuts[0]) if cuts and cuts[0] != NO_CUT else None,
        "test_from": time_text(cuts[1]) if cuts and cuts[1] != NO_CUT else None,
        "windows": {
            "train": len(data.train),
            "validation": len(data.validation),
            "test": len(data.test),
        },
    }
