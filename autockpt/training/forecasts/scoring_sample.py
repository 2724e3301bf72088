"""Which windows a score is taken on: every window of a part, or a sample spread evenly over it.

NOTE [Scores in proportion]
Scoring a window costs a forward pass, a third or so of what training on it costs; scoring every
window of a long history's validation or test part costs hours where the run asked for minutes
(a 60M-bar folder's 9M test windows took 14 minutes after a 20-step run). So by default a part
with more windows than a cap is scored on a sample:

- spread evenly: the part's windows come in runs, a symbol's windows in time order each
  (NOTE [Window starts without a per-window array]); each run gets a share of the cap in
  proportion to its windows, and at least one, at evenly spaced positions from its first
  window to its last. So every contract is in the sample and, within it, every stretch of
  time: at the default caps a test part of a year keeps every month for up to about 1,300
  contracts (a run needs 12 windows for 12 months);
- fixed by the data and the split alone: the positions depend on the part's size and the cap,
  not on the run, its seed or its batch size; two runs scored at the same cap score the same
  windows, so their test scores compare (NOTE [Test windows at the end of a run]);
- sized for the run, with a floor: validation, scored every epoch, takes at most as many
  windows as an epoch trains on (steps x the global batch: its forwards cost about a third of
  the epoch's steps) and never fewer than :data:`FLOOR_WINDOWS`; the test part, scored once
  and compared across runs, takes :data:`TEST_WINDOWS` whatever the run.

The floor keeps the score's sampling error small. Each score records its own standard error
(``*_loss_se``, from the spread of its batches' mean losses: a batch's windows are neighbours
in time, so this counts how neighbouring windows move together, which a per-window spread would
not). Measured on a held-out history of 60M one-minute bars, 40 contracts (the 20-step run of
``benchmarks/long_history.py``): the test loss on the 16,400 spread windows was 0.24233 with a
standard error of 0.00224 (0.9%), on all 9.0M test windows 0.24091 (0.00043): the sample was
0.6 of its standard error off, in 3.9 s where every window took 37 minutes.

``--val-windows N|all`` and ``--test-windows N|all`` choose; the summary says how many windows
each score used, out of how many, and whether they were spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

#: Validation's least sample by default (NOTE [Scores in proportion]).
FLOOR_WINDOWS = 4096
#: The test part's sample by default: the same for every run (NOTE [Scores in proportion]).
TEST_WINDOWS = 16384

#: How many windows a score may take, as the config holds it: a count, every window, or
#: unset (the default cap).
WindowsAsked = int | Literal["all"] | None


@dataclass(frozen=True)
class ScoringSample:
    """The windows of a part a score is taken on.

    Attributes:
        positions: the windows' positions in the part, ascending; None: every window.
        total: the part's windows.
    """

    positions: np.ndarray | None
    total: int

    @property
    def count(self) -> int:
        """Windows scored."""
        return self.total if self.positions is None else len(self.positions)

    @property
    def spread(self) -> bool:
        """Whether the score takes a sample, not every window."""
        return self.positions is not None

    def record(self, part: str) -> dict[str, Any]:
        """The run records' fields for this sample: ``{part}_windows`` scored, out of
        ``{part}_windows_of``, ``{part}_windows_spread``."""
        return {
            f"{part}_windows": self.count,
            f"{part}_windows_of": self.total,
            f"{part}_windows_spread": self.spread,
        }

    def text(self) -> str:
        """``"4,096 of 9,012,345 windows, spread evenly"`` or ``"all 1,234 windows"``."""
        if not self.spread:
            return f"all {self.total:,} windows"
        return f"{self.count:,} of {self.total:,} windows, spread evenly"


def spread_evenly(run_counts: np.ndarray, cap: int) -> np.ndarray:
    """About ``cap`` positions among the windows of runs of ``run_counts`` windows each (one
    run a symbol, in time order), each run's share in proportion to its windows and at least
    one, evenly spaced within it, first and last included (NOTE [Scores in proportion])."""
    counts = np.asarray(run_counts, dtype=np.int64)
    total = int(counts.sum())
    if cap >= total:
        return np.arange(total, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pieces = []
    for offset, count in zip(offsets, counts, strict=True):
        if count == 0:
            continue
        share = min(int(count), max(1, round(cap * int(count) / total)))
        within = np.unique(np.round(np.linspace(0, count - 1, share)).astype(np.int64))
        pieces.append(offset + within)
    return np.concatenate(pieces)


def validation_sample(
    run_counts: np.ndarray, asked: WindowsAsked, *, windows_per_epoch: int
) -> ScoringSample:
    """Validation's windows each epoch: ``asked``, or by default as many as an epoch trains
    on and at least :data:`FLOOR_WINDOWS` (NOTE [Scores in proportion])."""
    cap = max(FLOOR_WINDOWS, windows_per_epoch) if asked is None else asked
    return _sample(run_counts, cap)


def held_out_sample(run_counts: np.ndarray, asked: WindowsAsked) -> ScoringSample:
    """The test part's windows: ``asked``, or by default :data:`TEST_WINDOWS`, the same for
    every run on the data and split (NOTE [Scores in proportion])."""
    return _sample(run_counts, TEST_WINDOWS if asked is None else asked)


def _sample(run_counts: np.ndarray, cap: int | Literal["all"]) -> ScoringSample:
    total = int(np.sum(run_counts))
    if cap == "all" or cap >= total:
        return ScoringSample(None, total)
    return ScoringSample(spread_evenly(run_counts, cap), total)
