"""Batches gathered in a background thread while the step runs, and the time the step waits.

NOTE [Prefetching batches]
Gathering a batch is numpy fancy indexing (and, from a row cache, page reads): it releases the
GIL for most of its time, so one thread a few batches ahead overlaps it with the step's own
work. A thread, not DataLoader workers: the batches come from one seeded permutation
(``iterate_batches``), so the thread yields exactly the in-memory order, and no worker
process copies the dataset or its mappings. ``wait_s`` is the time the loop spent blocked on
the next batch; the run's summary reports it as a share of the step time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from tft.data.windows import Batch, iterate_batches

if TYPE_CHECKING:
    from autockpt.training.setup.prepare import Setup

__all__ = ["Prefetch", "epoch_batches"]

_T = TypeVar("_T")
_END = object()


class Prefetch(Generic[_T]):
    """Iterate ``source`` in a background thread, ``depth`` items ahead.

    Use it as a context manager (or call :meth:`close`) so that a loop that stops early stops
    the thread too. An exception raised by ``source`` is raised by :meth:`next` in the caller.
    """

    def __init__(self, source: Iterator[_T], depth: int = 2) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.wait_s = 0.0
        """Seconds :meth:`next` spent waiting for an item that was not ready."""
        self._thread = threading.Thread(target=self._fill, args=(source,), daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, source: Iterator[_T]) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the consuming thread
            self._put(error)
            return
        self._put(_END)

    def next(self) -> _T | None:
        """The next item, or None when ``source`` is exhausted."""
        started = time.perf_counter()
        item = self._queue.get()
        self.wait_s += time.perf_counter() - started
        if item is _END:
            self._queue.put(_END)  # later calls see the end too
            return None
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the thread (it may be blocked on a full queue) and wait for it."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Prefetch[_T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def epoch_batches(setup: Setup, epoch_index: int) -> Prefetch[Batch] | None:
    """The training batches of epoch ``epoch_index`` (0-based; None past the last), this
    rank's share of each, shuffled by the run's seed and the epoch, gathered ahead."""
    if epoch_index >= setup.config.epochs:
        return None
    batches = iterate_batches(
        setup.data.train,
        setup.global_batch_size,
        shuffle=True,
        seed=setup.config.seed + epoch_index,
        drop_last=True,
        share=(setup.world.rank, setup.world.world_size),
    )
    return Prefetch(batches)
