"""A budget no plan can meet: the refusal says what bounds the minimum and offers only levers
that work (NOTE [Refusal])."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import autockpt
from autockpt.planner.solve.refusal import infeasible_error
from tests.zoo.feedforward import FunctionalDropoutMLP


class NormalisedMLP(nn.Module):
    """Linear layers with BatchNorm between: nothing may split its batch."""

    def __init__(self, width: int, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *(
                nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.GELU())
                for _ in range(depth)
            )
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def _refusal(model: nn.Module, inputs: tuple[torch.Tensor, ...], budget: int) -> str:
    with pytest.raises(autockpt.InfeasibleBudgetError) as caught:
        autockpt.plan(model, inputs, budget)
    message = str(caught.value)
    assert "\n" not in message
    assert "raise the budget to at least" in message
    assert caught.value.bound and f": {caught.value.bound}; " in message
    # NOTE [One minimum]: the floor named and the budget to raise to are one number.
    floor = re.search(r"below the minimum (\S+ \S+) for batch", message)
    raise_to = re.search(r"raise the budget to at least (\S+ \S+)", message)
    assert floor and raise_to and floor.group(1) == raise_to.group(1), message
    assert floor.group(1) == autockpt.format_bytes(caught.value.minimum_bytes)
    return message


def test_the_refusal_names_what_mixes_samples_and_where_the_peak_is():
    model = NormalisedMLP(width=64)
    inputs = (torch.randn(512, 64),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    message = _refusal(model, inputs, unplanned // 10)
    assert "BatchNorm1d at layers.0.1 mixes samples" in message
    assert "so no micro-batches" in message
    assert re.search(
        r"the peak is (in the (forward|backward) of \S+|the loss|the optimizer)", message
    )
    assert "parameters, gradients and optimizer state take" in message


def test_a_smaller_batch_is_offered_only_when_it_fits_and_then_it_does():
    model = NormalisedMLP(width=32)
    inputs = (torch.randn(512, 32),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    budget = unplanned // 3
    message = _refusal(model, inputs, budget)
    match = re.search(r"lower the batch size to about (\d+)", message)
    assert match, message
    smaller = int(match.group(1))
    assert 2 <= smaller < 512
    plan = autockpt.plan(model, (inputs[0][:smaller],), budget)
    assert plan.predicted_peak_bytes <= budget


def test_no_smaller_batch_is_offered_when_the_weights_dominate():
    # 4 x 1 MiB of weights, and activations of a few KiB a sample.
    model = NormalisedMLP(width=512)
    inputs = (torch.randn(16, 512),)
    unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
    message = _refusal(model, inputs, int(unplanned * 0.9))
    assert "lower the batch size" not in message
    assert "a smaller batch saves only about" in message


def test_a_step_already_in_single_sample_micro_batches_offers_no_smaller_batch():
    model = FunctionalDropoutMLP(depth=4)
    inputs = (torch.randn(8, 32, 32),)
    message = _refusal(model, inputs, 1024)
    assert "the lowest plan already runs 8 micro-batches" in message
    assert "lower the batch size" not in message
    assert "mixes samples" not in message


@pytest.mark.parametrize(
    ("budget_mib", "lever"),
    [
        # 100 MiB at batch 16, 96 MiB at batch 8: 0.5 MiB a sample.
        (97.0, "lower the batch size to about 10 or raise the budget"),
        # Batch 1 would need 92.5 MiB: a batch of 1 is no lever.
        (92.6, "a smaller batch saves only about 512.00 KiB a sample; raise the budget"),
        (40.0, "they alone exceed the budget"),
    ],
)
def test_the_batch_lever_comes_from_the_measured_per_sample_part(budget_mib, lever):
    mib = 2**20
    error = infeasible_error(
        budget=autockpt.parse_budget(int(budget_mib * mib)),
        minimum_bytes=100 * mib,
        fixed_bytes=50 * mib,
        batch_size=16,
        separability=None,
        micro_batches_tried=False,
        lowest=None,
        half_minimum_bytes=96 * mib,
    )
    assert lever in str(error)
    assert error.minimum_bytes == 100 * mib


def test_the_minimum_is_never_above_the_plain_step_when_nothing_lowers_it():
    # Parameters and gradients dominate and in-place ReLUs keep little for backward: every
    # recompute or chunk adds more than it saves. The plain step is then the lowest plan, and
    # a budget just under it must be refused with the plain step's peak as the minimum (once
    # reported 12% above it, from the lowest recomputing plan), and a true reason.
    torch.manual_seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(512, 512), nn.ReLU(inplace=True)) for _ in range(8)]
    )
    inputs = (torch.randn(256, 512),)
    unplanned = autockpt.plan(model, inputs, 10**12, optimizer=None).unplanned_peak_bytes
    with pytest.raises(autockpt.InfeasibleBudgetError) as refused:
        autockpt.plan(model, inputs, unplanned - 1, optimizer=None)
    assert unplanned - 1 < refused.value.minimum_bytes <= unplanned + 1024
    assert "micro-batches do not lower it" in str(refused.value)
    assert "; , so" not in str(refused.value)
