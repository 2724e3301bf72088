"""``plan()`` never dies with someone else's error: an option whose measurement raises is left
out with a note naming it, and an error no option can route around comes back as one
:class:`autockpt.PlanningError` line."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import autockpt
from tests.oracle import measured_step


def not_in_backward(x: torch.Tensor) -> torch.Tensor:
    """``x``, or an error when called inside a backward (a recompute), as some custom kernels
    fail there."""
    if torch._C._current_graph_task_id() != -1:
        raise RuntimeError("custom kernel: not reentrant in backward")
    return x


# Called as it runs, not read once while torch.fx traces.
torch.fx.wrap("not_in_backward")


class RaisesOnRecompute(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(not_in_backward(x)))


class Model(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.first = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.fragile = RaisesOnRecompute(width)
        self.last = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.fragile(self.first(x)))


def _plan(model: nn.Module, x: torch.Tensor, budget: int, **options) -> autockpt.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autockpt.plan(model, (x,), budget, **options)


@pytest.mark.parametrize("tracing", ["auto", "forward-hooks"])
def test_an_option_whose_recompute_raises_is_left_out_and_named(tracing):
    torch.manual_seed(0)
    model, x = Model(), torch.randn(512, 64)
    plain = _plan(model, x, 10**12, tracing=tracing)
    budget = int(0.7 * plain.unplanned_peak_bytes)
    plan = _plan(model, x, budget, tracing=tracing)
    assert any("measuring it failed (RuntimeError: custom kernel" in n for n in plan.notes), (
        plan.notes
    )
    assert not any(s.recomputed and "fragile" in s.modules for s in plan.segments)
    peak, _, got = measured_step(model, (x,), plan)
    assert peak <= budget
    _, _, want = measured_step(model, (x,))
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name)


def test_forcing_a_recompute_that_raises_is_one_planning_error():
    model, x = Model(), torch.randn(64, 64)
    with pytest.raises(autockpt.PlanningError, match="RuntimeError: custom kernel") as caught:
        _plan(model, x, 10**12, use_gradient_checkpointing=True)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value.__cause__, RuntimeError)
