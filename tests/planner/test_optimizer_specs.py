"""``plan(optimizer=...)``: every way a user names the optimizer they train with is counted as
that optimizer's state (the one factory, ``measure/optimizers.make_optimizer``)."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import autockpt
from autockpt.errors import ConfigError

BUDGET = 10**9


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def _state_bytes(model: nn.Module, optimizer: object) -> int:
    plan = autockpt.plan(model, (torch.randn(8, 16),), BUDGET, optimizer=optimizer)  # type: ignore[arg-type]
    return plan.breakdown.optimizer_state_bytes


def _parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_fused_optimizer_is_planned_with_the_state_it_keeps() -> None:
    """Fused kernels refuse the planner's meta stand-ins; planning used to end there."""
    model = _model()
    fused = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    assert _state_bytes(model, fused) == _state_bytes(model, "adamw")
    assert _state_bytes(model, fused) >= 2 * _parameter_bytes(model)


@pytest.mark.parametrize(
    ("factory", "moments"),
    [
        (functools.partial(torch.optim.SGD, lr=0.1), 0),
        (functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), 1),
        (functools.partial(torch.optim.AdamW, lr=3e-4, fused=True), 2),
        (torch.optim.Adagrad, 1),
    ],
    ids=["sgd", "sgd-momentum", "adamw-fused", "adagrad-class"],
)
def test_a_factory_is_counted_as_what_it_makes(factory: object, moments: int) -> None:
    model = _model()
    state = _state_bytes(model, factory)
    parameters = _parameter_bytes(model)
    # The moments shaped like the parameters, and a step count per parameter at most.
    assert (
        moments * parameters
        <= state
        <= moments * parameters + 4 * 8 * len(list(model.parameters()))
    )


def test_a_factory_that_makes_no_optimizer_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        _state_bytes(_model(), lambda parameters: parameters)
    message = str(caught.value)
    assert "\n" not in message and "returned list, not a torch.optim.Optimizer" in message


def test_adamw_on_fake_cuda_parameters_is_measured_with_the_foreach_kernels():
    # On a card AdamW runs its foreach kernels (a temporary for every parameter at once);
    # torch chooses them by the parameters' types, which fake tensors are not.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autockpt.planner.measure.fake_step import FakeTrainingState, _optimizer_with_state

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        parameters = [torch.nn.Parameter(torch.empty(512, 512, device="cuda")) for _ in range(8)]
    state = FakeTrainingState.__new__(FakeTrainingState)
    state.parameters, state.mode = parameters, mode
    state.optimizer, settings = _optimizer_with_state("adamw", parameters)
    with mode:
        extra = state._step_extra_bytes(settings)
    parameter_bytes = sum(p.numel() * p.element_size() for p in parameters)
    assert extra >= parameter_bytes, (extra, parameter_bytes)
