"""Values read off fake tensors (NOTE [Values read off fake tensors]): a healthy step's value
for a fake tensor, the real value for a real one, and the planner measures a loss that reads
them."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

import autockpt
from autockpt.planner.core.fake_mode import FakeScalars


def test_a_fake_tensor_reads_as_a_healthy_step_s_value_and_a_real_one_as_itself() -> None:
    three, nan = torch.tensor(3.0), torch.tensor(float("nan"))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        # An op's output: torch 2.15 keeps a one-element tensor made fake as a constant whose
        # value reads without FakeScalars, as a step's loss is not.
        loss = mode.from_tensor(torch.full((4,), 7.5)).mean()
        with pytest.raises(DataDependentOutputException):
            loss.item()
        with FakeScalars():
            assert loss.item() == 1.0 and float(loss) == 1.0
            assert torch.isfinite(loss).item() is True
            assert bool(loss > 0)
            assert int(mode.from_tensor(torch.tensor(4)).item()) == 1
            assert torch.equal(loss, loss)
            assert three.item() == 3.0  # a real tensor: its value
            assert math.isnan(nan.item())


def test_a_loss_that_checks_its_value_and_logs_it_plans() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(4)))
    x, y = torch.randn(512, 32), torch.randn(512, 32)
    history: list[float] = []

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(output, target)
        if not torch.isfinite(loss).item():
            raise FloatingPointError("loss is not finite")
        history.append(loss.item())
        return loss

    unplanned = autockpt.plan(model, (x,), 10**12, loss_fn=loss_fn, example_targets=(y,))
    plan = autockpt.plan(
        model, (x,), unplanned.unplanned_peak_bytes // 2, loss_fn=loss_fn, example_targets=(y,)
    )
    assert plan.fits and plan.tracing == "fx"
