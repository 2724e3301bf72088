"""The plain step's segments, timed as it runs: their forward seconds, their backward seconds
(from the autograd nodes of their outputs), and the region inputs it computes, kept for timing
the regions alone (NOTE [Measured step time] in :mod:`autockpt.planner.timing.stopwatch`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autockpt.planner.core.memory_tracker import flat_tensors


class SegmentClock:
    """Timestamps of the segments of one plain step, and the region inputs it captures."""

    def __init__(self, output_names: Sequence[tuple[str, ...]]) -> None:
        self._output_names = list(output_names)
        self.forward_s = [0.0] * len(output_names)
        self._started = 0.0
        self._entries: list[tuple[float, int]] = []
        self._wanted: set[str] = set()
        self.values: dict[str, Captured] = {}

    def start(self, wanted: dict[int, tuple[str, ...]], placeholders: dict[str, Captured]) -> None:
        """Forget the last run; capture the values named in ``wanted`` in this one."""
        self.forward_s = [0.0] * len(self._output_names)
        self._entries = []
        self._wanted = {name for names in wanted.values() for name in names}
        self.values = {k: v for k, v in placeholders.items() if k in self._wanted}

    def segment_started(self, index: int) -> None:
        self._started = time.perf_counter()

    def segment_finished(self, index: int, inputs: tuple[Any, ...], outputs: Any) -> None:
        self.forward_s[index] += time.perf_counter() - self._started
        nodes = {id(t.grad_fn): t.grad_fn for t in flat_tensors(outputs) if t.grad_fn is not None}
        for node in nodes.values():
            node.register_prehook(
                lambda *_, i=index: self._entries.append((time.perf_counter(), i))
            )
        if self._wanted:
            self._keep_wanted(index, outputs)

    def _keep_wanted(self, index: int, outputs: Any) -> None:
        values = outputs if isinstance(outputs, tuple) else (outputs,)
        for name, value in zip(self._output_names[index], values, strict=False):
            if name in self._wanted:
                self.values[name] = Captured.of(value)

    def backward_seconds(self, started: float, finished: float) -> tuple[float, ...]:
        """Each segment's backward: from one of its outputs' nodes to the next segment's."""
        seconds = [0.0] * len(self.forward_s)
        entries = sorted(self._entries)
        for (at, index), (until, _) in zip(entries, [*entries[1:], (finished, -1)], strict=True):
            seconds[index] += until - max(at, started)
        return tuple(seconds)


class NoObserver:
    """Makes :func:`build_segmented_module` give every segment a runner."""

    def segment_started(self, index: int) -> None:
        return None

    def segment_finished(self, index: int, inputs: tuple[Any, ...], outputs: Any) -> None:
        return None


@dataclass(frozen=True)
class Captured:
    """A value the plain step computed, detached, and whether it needed a gradient there."""

    value: Any
    requires_grad: bool

    @classmethod
    def of(cls, value: Any) -> Captured:
        if isinstance(value, torch.Tensor):
            return cls(value.detach(), value.requires_grad)
        return cls(value, False)

    def leaf(self) -> Any:
        """The value as an input of a timed run: a fresh leaf where it needed a gradient."""
        if isinstance(self.value, torch.Tensor) and self.requires_grad:
            return self.value.detach().requires_grad_()
        return self.value


def captured(values: dict[str, Captured], name: str) -> Captured:
    """The value the plain step gave ``name``; a region input it never saw cannot be timed
    (a guess such as ``None`` would time a run that fails, or a different one)."""
    if name not in values:
        raise LookupError(f"the plain step never computed the region input {name}")
    return values[name]


def first_samples(value: Any, dim: int | None, samples: int, batch_size: int) -> Any:
    """The first ``samples`` samples of ``value`` along ``dim`` (rows per sample kept)."""
    if dim is None or not isinstance(value, torch.Tensor):
        return value
    rows = value.shape[dim] // batch_size
    return value.narrow(dim, 0, samples * rows)
