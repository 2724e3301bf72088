"""Stopwatch runs made up by a test, so that which plan is timed fastest is known without a clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import nn

from autockpt.planner.timing.stopwatch import StepTimes, Stopwatch
from autockpt.planner.timing.timing_room import TimingRoom
from autockpt.planner.trace.fx_graph import TracedModel
from autockpt.planner.trace.module_chain import trace_or_find_modules
from tests.helpers import MLPStack


class FakeTimes:
    """Stands in for the stopwatch's runs: every segment 1 s forward and 2 s backward, and a
    region in ``k`` chunks ``EXTRA_S[k]`` slower than kept (8 chunks faster than kept)."""

    EXTRA_S = {2: 0.3, 4: 0.2, 8: -0.1, 16: 0.4, 32: 0.5}

    def __init__(self, num_segments: int, regions: Sequence[tuple[int, int]], batch: int) -> None:
        self.num_segments = num_segments
        self.regions = regions
        self.batch = batch
        self.timed: list[tuple[int, int]] = []

    def plain_step(self, pieces: int = 1) -> StepTimes:
        share = 1.0 / pieces
        return StepTimes((share,) * self.num_segments, (2 * share,) * self.num_segments, 0.5)

    def region_piece_s(self, region: int, samples: int, dims: Sequence[int | None]) -> float:
        self.timed.append((region, samples))
        first, end = self.regions[region]
        chunks = self.batch // samples
        kept = 3.0 * (end - first)
        return (kept + self.EXTRA_S.get(chunks, 0.0)) / chunks


def mlp_with_fake_times(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[nn.Module, tuple[torch.Tensor], TracedModel | Any, FakeTimes]:
    """An MLP whose stopwatch gives :class:`FakeTimes` (and 0.25 s for the optimizer)."""
    model, inputs = MLPStack(128, 6, 0.0), (torch.randn(256, 128),)
    traced = trace_or_find_modules(model, inputs)
    fake = FakeTimes(len(traced.segments), traced.regions, 256)
    monkeypatch.setattr(Stopwatch, "plain_step", fake.plain_step)
    monkeypatch.setattr(Stopwatch, "region_piece_s", fake.region_piece_s)
    monkeypatch.setattr(Stopwatch, "optimizer_s", lambda self: 0.25)
    # The made-up times stand for the whole batch: the runs use it, nothing is scaled.
    monkeypatch.setattr(TimingRoom, "within", classmethod(lambda cls, *args: cls.whole(256)))
    return model, inputs, traced, fake
