"""Which part of the run's split each of ``predict``'s windows is scored in (NOTE [Scores by
what the model saw]); the scores themselves are checked against the written forecasts in
``test_baselines.py``."""

from __future__ import annotations

import numpy as np
import torch

from autockpt.training.forecasts.scores_by_part import ScoresByPart
from tft.data.batch import Batch
from tft.data.splits import split_cuts


class _Recording:
    """Stands in for ForecastScores: keeps each added window's first forecast time."""

    def __init__(self, *_: object) -> None:
        self.first_times: list[int] = []
        self.num_windows = 0

    def add(self, prediction: torch.Tensor, batch: Batch) -> None:
        assert len(prediction) == len(batch.target)
        self.first_times += batch.decoder_time_ns[:, 0].tolist()
        self.num_windows += len(prediction)

    def evaluation(self) -> list[int]:
        return self.first_times


def _batch(first_times: list[int], horizon: int = 3) -> Batch:
    n = len(first_times)
    times = torch.tensor(first_times)[:, None] + torch.arange(horizon)
    empty = torch.zeros(n, horizon, 0)
    return Batch(
        torch.zeros(n, 1, dtype=torch.long),
        torch.zeros(n, 2, 0),
        torch.zeros(n, 2, 0),
        empty,
        torch.zeros(n, 2, 0, dtype=torch.long),
        torch.zeros(n, horizon, 0, dtype=torch.long),
        torch.zeros(n, horizon),
        times,
        torch.zeros(n, dtype=torch.long),
    )


def test_windows_go_by_their_first_forecast_bar_and_a_straddler_with_the_earlier_part() -> None:
    scores = ScoresByPart(_Recording, (10, 20))
    # 8 straddles the validation cut (bars 8, 9, 10) and 19 the test cut: the earlier part.
    scores.add(torch.zeros(7, 3, 1), _batch([0, 8, 10, 17, 19, 20, 500]))
    parts = {p.part: p.evaluation for p in scores.by_part()}
    assert parts == {"trained on": [0, 8], "validated on": [10, 17, 19], "never seen": [20, 500]}
    assert scores.whole.num_windows == 7


def test_a_later_file_is_never_seen_when_the_split_has_no_test_part() -> None:
    times = np.arange(0, 100, dtype=np.int64)
    validation_from, test_from = split_cuts(times, (0.8, 0.2, 0.0))
    assert (validation_from, test_from) == (80, 100)  # just after the file's last time
    scores = ScoresByPart(_Recording, (validation_from, test_from))
    scores.add(torch.zeros(2, 3, 1), _batch([95, 130]))  # 130: a bar after the training file
    assert [p.part for p in scores.by_part()] == ["validated on", "never seen"]


def test_a_run_without_split_times_scores_every_window_as_one() -> None:
    scores = ScoresByPart(_Recording, None)
    scores.add(torch.zeros(2, 3, 1), _batch([0, 500]))
    assert scores.by_part() == [] and scores.whole.num_windows == 2
