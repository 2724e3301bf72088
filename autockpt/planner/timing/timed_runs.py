"""How the stopwatch runs what it times: on training's threads, under the step's autocast, with
the buffers a forward updates put back, repeated while a run is short (NOTE [Measured step
time] in :mod:`autockpt.planner.timing.stopwatch`), and which of the runs counts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch

#: A run shorter than this is repeated (NOTE [Measured step time]).
REPEAT_BELOW_S = 0.05
#: At most this many runs of one measurement.
MAX_REPEATS = 3
#: A plain step is timed again while its last run took under this share of the one before,
#: up to ``MAX_SETTLING_RUNS`` runs in all (NOTE [Measured step time]).
SETTLED_SHARE, MAX_SETTLING_RUNS = 0.9, 6

_R = TypeVar("_R")


class TimedRuns:
    """The conditions every timed run shares, and the seconds spent in them.

    Args:
        buffers: the model's buffers, put back after every run (BatchNorm's statistics).
        threads: torch CPU threads to time with (training's, not planning's one).
        autocast_dtype: run under ``torch.autocast`` with this dtype (``None``: no autocast).
    """

    def __init__(
        self, buffers: Sequence[torch.Tensor], threads: int, autocast_dtype: torch.dtype | None
    ) -> None:
        self._buffers = list(buffers)
        self.threads = max(threads, 1)
        self.autocast_dtype = autocast_dtype
        #: Seconds spent in timed runs so far (repeats included).
        self.spent_s = 0.0

    def repeated(self, run: Callable[[], _R], *, at_least: int = 1) -> list[_R]:
        """``run``'s results, run ``at_least`` times and again while the runs so far took
        under ``REPEAT_BELOW_S`` (``MAX_REPEATS`` at most), each with the buffers put back."""
        results: list[_R] = []
        spent = 0.0
        while len(results) < max(MAX_REPEATS, at_least) and (
            len(results) < at_least or spent < REPEAT_BELOW_S
        ):
            started = time.perf_counter()
            with self.buffers_put_back():
                results.append(run())
            spent += time.perf_counter() - started
        self.spent_s += spent
        return results

    def settled(self, run: Callable[[], _R], *, key: Callable[[_R], float]) -> _R:
        """A plain step's run once the steps have settled (NOTE [Measured step time]): at
        least two runs (the first real step of a process maps its memory, and with malloc
        keeping freed pages, as a tuned trainer's does, later steps do not); where mapping a
        page is slow it can take a few more to settle: then more runs, and the faster of the
        last two (by ``key``, seconds)."""
        runs = self.repeated(run, at_least=2)
        first_runs = len(runs)
        while len(runs) < MAX_SETTLING_RUNS and key(runs[-1]) < SETTLED_SHARE * key(runs[-2]):
            runs += self.repeated(run)
        return median(runs if len(runs) == first_runs else runs[-2:], key=key)

    @contextlib.contextmanager
    def isolated(self) -> Iterator[None]:
        """Training's thread count, and the buffers a forward updates put back afterwards."""
        with self.training_threads(), self.buffers_put_back():
            yield

    @contextlib.contextmanager
    def training_threads(self) -> Iterator[None]:
        """Torch's CPU threads set to training's count, and set back afterwards."""
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    @contextlib.contextmanager
    def buffers_put_back(self) -> Iterator[None]:
        """The buffers' values as they were before, once the block ends."""
        saved = [buffer.detach().clone() for buffer in self._buffers]
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, value in zip(self._buffers, saved, strict=True):
                    buffer.copy_(value)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast the step runs under (none without an autocast dtype)."""
        return torch.autocast(
            "cpu", dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None
        )


def median(runs: list[_R], *, key: Callable[[_R], float]) -> _R:
    """The middle run by ``key``; of two, the faster (the other is the cold first one)."""
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def seconds(work: Callable[[], Any]) -> float:
    """How long ``work()`` took."""
    started = time.perf_counter()
    work()
    return time.perf_counter() - started
