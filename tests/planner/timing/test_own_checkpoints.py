"""A model that checkpoints itself is timed against its own step (NOTE [The model's own
checkpoints, timed])."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import autockpt
from autockpt.planner.timing.real_batch import RealBatch
from autockpt.planner.timing.stopwatch import Stopwatch


class CheckpointsItself(nn.Module):
    """Residual blocks the forward runs under non-reentrant torch.utils.checkpoint."""

    def __init__(self, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return x


def test_the_plain_step_is_the_models_own_and_plans_are_timed_against_it(monkeypatch):
    """Made-up whole-step times: the model's own step (its blocks recomputing) 2 s, the
    traced graph's 1 s, every plan 2.1 s. The plan reports the model's own step and adds
    0.1 s to it, not 1.1 s to the traced one."""
    torch.manual_seed(0)
    model, inputs = CheckpointsItself(), (torch.randn(64, 16, 32),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes

    def made_up(
        self: RealBatch, module: torch.nn.Module, pieces: int, samples: int | None = None
    ) -> Callable[[], float]:
        assert isinstance(self, Stopwatch)
        seconds = 2.0 if module is model else 1.0 if module is self.traced.graph_module else 2.1
        return lambda: seconds

    monkeypatch.setattr(RealBatch, "step_run", made_up)
    monkeypatch.setattr(RealBatch, "optimizer_s", lambda self: 0.25)
    plan = autockpt.plan(model, inputs, unplanned // 2)
    assert plan.tracing == "fx"
    assert plan.unplanned_step_s == pytest.approx(2.25)
    assert plan.predicted_extra_s == pytest.approx(0.1)
    assert any("the plain step is the model's own" in n for n in plan.notes), plan.notes
    assert any("torch.utils.checkpoint itself (4 calls" in n for n in plan.notes)
