"""The zoo (tests/zoo): every model plans at half its unplanned peak and at its reported
minimum, stays under the budget by the independent counter, and keeps the plain step's
gradients; separable ones are split along the batch, the others say what mixes samples."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch

import autockpt
from autockpt.planner.measure.fake_step import default_loss
from tests.oracle import measured_step
from tests.zoo import ZOO
from tests.zoo.case import ZooCase, randomness_off


def _params() -> list[Any]:
    return [
        pytest.param(name, marks=[pytest.mark.slow] if case.slow else [], id=name)
        for name, case in ZOO.items()
    ]


def _plan(case: ZooCase, model: torch.nn.Module, batch: Any, budget: int) -> autockpt.Plan:
    inputs, targets = batch
    options: dict[str, Any] = {}
    if case.loss_fn is not None:
        options = {"loss_fn": case.loss_fn, "example_targets": targets}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*module-level segments")
        return autockpt.plan(model, inputs, budget, **options)


def _check_step(case: ZooCase, model: torch.nn.Module, batch: Any, plan: autockpt.Plan) -> None:
    inputs, targets = batch
    options: dict[str, Any] = {
        "loss_fn": case.loss_fn or default_loss,
        "targets": targets,
        "loss_reduction": case.loss_reduction,
    }
    peak, _, _ = measured_step(model, inputs, plan, **options)
    assert peak <= plan.budget_bytes, f"{case.name}: counted {peak} over {plan.budget_bytes}"
    quiet = randomness_off(copy.deepcopy(model))
    _, want_loss, want = measured_step(quiet, inputs, **options)
    _, got_loss, got = measured_step(quiet, inputs, plan, **options)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-4, atol=1e-5)
    assert got.keys() == want.keys()
    for name in want:
        _assert_close(got[name], want[name], name)


def _assert_close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    def message(default: str) -> str:
        return f"{name}: {default}"

    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=message)


@pytest.mark.parametrize("name", _params())
def test_zoo_model_plans_at_half_and_at_its_minimum(name):
    case = ZOO[name]
    model = case.build()
    batch = case.batch(case.test_batch_size)
    unplanned = _plan(case, model, batch, 10**12).unplanned_peak_bytes
    try:
        half = _plan(case, model, batch, unplanned // 2)
    except autockpt.InfeasibleBudgetError as error:
        # Only a model whose batch cannot be split may stop above half its peak, and says why.
        assert not case.separable, str(error)
        assert "mixes samples" in str(error)
    else:
        _check_step(case, model, batch, half)
    # The refusal of a budget nothing meets gives the measured minimum, and why it is there.
    with pytest.raises(autockpt.InfeasibleBudgetError) as refusal:
        _plan(case, model, batch, 1)
    lowest = _plan(case, model, batch, refusal.value.minimum_bytes)
    _check_step(case, model, batch, lowest)
    split = lowest.num_micro_batches > 1 or any(s.num_chunks > 1 for s in lowest.segments)
    if case.separable:
        # Randomness (dropout frozen on by fx, draws by hand) must not pass for mixing.
        assert "mixes samples" not in str(refusal.value)
        assert split, lowest.notes
    else:
        assert "mixes samples, so no micro-batches" in str(refusal.value)
