"""``predict``'s scores against a file's actuals, over every window and apart by what the model
saw of each window's forecast bars in training.

NOTE [Scores by what the model saw]
A file given to ``predict`` is often the one the run trained on, or one that overlaps it, and a
score over every window mixes bars the model was fitted on with bars it never saw: the skill
printed was that mix (``skill +16.1%`` over the whole file, most of it trained on). The run
keeps its split's two cut times (the first validation and the first test time, beside the
naive forecasts in ``naive.json``), and each window is put by the time of its first forecast
bar: before the validation cut it was **trained on** (some of its targets were training rows),
before the test cut **validated on** (validation picked the epoch on such windows), else
**never seen** (the test rows and anything after the training file: every target the model
forecasts there was neither trained on nor used to choose it). A window whose forecast bars
straddle a cut goes with the earlier part, so "never seen" is never flattered. Runs saved before
the cuts were kept score every window as one, and say so.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch

from autockpt.training.forecasts.evaluate import Evaluation, ForecastScores
from autockpt.training.setup.baselines import NaiveForecasts
from autockpt.training.setup.runs import NAIVE_FILE, RunFolder
from tft.data.normalize import Normalizer
from tft.data.splits import split_labels
from tft.data.windows import Batch
from tft.model.config import TFTConfig
from tft.model.loss import QuantileLoss

#: The parts of a file's windows, by what the model saw of their forecast bars.
PARTS = ("trained on", "validated on", "never seen")


@dataclass(frozen=True)
class PartEvaluation:
    """The scores of the windows of one part (NOTE [Scores by what the model saw])."""

    part: str
    evaluation: Evaluation


class ScoresByPart:
    """Sums of the model's and the naive forecasts' scores over every window of a file and
    over each part (NOTE [Scores by what the model saw])."""

    def __init__(self, make: Callable[[], ForecastScores], cuts: tuple[int, int] | None):
        self.whole = make()
        self.parts = {part: make() for part in PARTS} if cuts is not None else {}
        self.cuts = cuts

    def add(self, prediction: torch.Tensor, batch: Batch) -> None:
        """Score the model's ``prediction`` ``(B, H, Q)`` of ``batch`` in the whole file's
        sums and in its windows' parts."""
        self.whole.add(prediction, batch)
        if self.cuts is None:
            return
        # Labelled as the split labels rows, by the window's first forecast bar.
        part_of = torch.from_numpy(split_labels(batch.decoder_time_ns[:, 0].numpy(), self.cuts))
        for index, part in enumerate(PARTS):
            inside = part_of == index
            if bool(inside.any()):
                self.parts[part].add(prediction[inside], Batch(*(t[inside] for t in batch)))

    def by_part(self) -> list[PartEvaluation]:
        """Each part's scores, in :data:`PARTS` order, parts with no window left out."""
        return [
            PartEvaluation(part, scores.evaluation())
            for part, scores in self.parts.items()
            if scores.num_windows
        ]


def scoring_of(
    run: RunFolder, config: TFTConfig, normalizer: Normalizer, horizon: int
) -> ScoresByPart | None:
    """Scores against the run's naive forecasts, as validation keeps them (on the CPU, where
    the forecasts are written from), by the run's split cuts; None for a run saved without the
    naive forecasts."""
    path = run.file(NAIVE_FILE)
    if not path.exists():
        return None
    saved = json.loads(path.read_text(encoding="utf-8"))
    naive = NaiveForecasts.from_dict(saved)
    cuts = saved.get("split_cuts_ns")
    make = functools.partial(
        ForecastScores,
        naive,
        QuantileLoss(config.quantiles),
        config.quantiles,
        normalizer.target.std,
        horizon,
        torch.device("cpu"),
    )
    return ScoresByPart(make, None if cuts is None else (cuts[0], cuts[1]))
