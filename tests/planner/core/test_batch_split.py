"""Cutting a batch along dim 0, nests included, and micro-batches of models that do not trace."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

import autockpt
from autockpt.planner.core.batch_split import (
    batch_size_of,
    carrying_leaves,
    flagged_batch_size,
    piece_sizes,
    split_batch,
)
from tests.zoo.untraceable import DictBatchModel, OwnLossLM, _dict_batch, _labelled_ids


def test_every_tensor_that_carries_the_batch_is_cut_in_nests_too():
    x, mask, scale, y = torch.randn(5, 3), torch.ones(5, 2), torch.randn(3), torch.randn(5)
    values = ({"x": x, "parts": [mask, (scale, 7)]}, y)
    assert batch_size_of(values) == 5
    pieces = split_batch(values, 2)
    assert len(pieces) == 2
    first, second = pieces
    torch.testing.assert_close(first[0]["x"], x[:3])
    torch.testing.assert_close(second[0]["parts"][0], mask[3:])
    torch.testing.assert_close(second[1], y[3:])
    # What carries no batch goes whole to every piece.
    assert first[0]["parts"][1][0] is scale and second[0]["parts"][1][1] == 7
    assert piece_sizes(values, 2) == [3, 2]


def test_targets_are_cut_by_the_inputs_batch():
    inputs, targets = (torch.randn(4, 2),), (torch.randn(4), torch.randn(2))
    pieces = split_batch(targets, 2, batch_size=batch_size_of(inputs))
    assert [p[0].shape[0] for p in pieces] == [2, 2]
    assert all(p[1] is targets[1] for p in pieces)


def test_one_piece_is_the_values_themselves():
    x = torch.randn(4, 2)
    (only,) = split_batch((x,), 1)
    assert only[0] is x


def _plan(model: nn.Module, inputs: tuple[Any, ...], budget: int, **options: Any) -> autockpt.Plan:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*module-level segments")
        return autockpt.plan(model, inputs, budget, **options)


def _gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_dict_batch_runs_in_micro_batches_with_the_gradients_of_one_piece():
    model = DictBatchModel(dropout=0.0)
    inputs, _ = _dict_batch(12)

    def loss_fn(output: dict[str, torch.Tensor]) -> torch.Tensor:
        return output["y"].sum()

    plan = _plan(model, inputs, 10**12, loss_fn=loss_fn)
    assert plan.tracing == "forward-hooks"
    split = plan.model_copy(update={"num_micro_batches": 5})
    autockpt.training_step(model, None, inputs, (), loss_fn, loss_reduction="sum")
    want = _gradients(model)
    model.zero_grad(set_to_none=True)
    planned = autockpt.apply(model, split)
    autockpt.training_step(planned, split, inputs, (), loss_fn, loss_reduction="sum")
    for name, gradient in _gradients(model).items():
        torch.testing.assert_close(gradient, want[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_model_that_does_not_trace_and_averages_its_own_loss_gets_micro_batches():
    model = OwnLossLM(dropout=0.0)
    inputs, _ = _labelled_ids(16)

    def loss_fn(output: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return output[0]

    unplanned = _plan(model, inputs, 10**12, loss_fn=loss_fn).unplanned_peak_bytes
    # Below what recompute alone reaches: only micro-batches get there (chunks of its MLPs
    # would too, so they are left out).
    recompute_only = _plan(
        model, inputs, unplanned, loss_fn=loss_fn, allow_micro_batches=False
    ).minimum_feasible_bytes
    plan = _plan(model, inputs, int(recompute_only * 0.9), loss_fn=loss_fn, allow_chunks=False)
    assert plan.num_micro_batches > 1
    assert any('loss_reduction="mean"' in note for note in plan.notes)
    autockpt.training_step(model, None, inputs, (), loss_fn)
    want = _gradients(model)
    model.zero_grad(set_to_none=True)
    autockpt.training_step(autockpt.apply(model, plan), plan, inputs, (), loss_fn)
    for name, gradient in _gradients(model).items():
        torch.testing.assert_close(gradient, want[name], rtol=1e-4, atol=1e-6, msg=name)


class _SharedWeights(nn.Module):
    """``forward(x, weights)``: ``x`` (B, 8) per sample, ``weights`` (4,) shared by every
    sample, read through their mean (so a piece of them gives a wrong value, not an error)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * weights.mean()


def _squared_error(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


def test_a_last_batch_the_size_of_a_shared_tensor_is_cut_as_the_plan_was():
    # NOTE [The batch's leaves, as planned]: at 4 samples the shared (4,) weights look like
    # the batch by their size; the plan, made at 16, knows they are not.
    torch.manual_seed(0)
    model = _SharedWeights()
    weights = torch.rand(4) + 0.5
    plan = autockpt.plan(
        model,
        (torch.randn(16, 8), weights),
        10**12,
        loss_fn=_squared_error,
        example_targets=(torch.randn(16, 8),),
    )
    assert plan.batch_leaves is not None
    assert (plan.batch_leaves.inputs, plan.batch_leaves.targets) == ([True, False], [True])
    split = plan.model_copy(update={"num_micro_batches": 2})
    last, targets = (torch.randn(4, 8), weights), (torch.randn(4, 8),)
    autockpt.training_step(model, None, last, targets, _squared_error)
    want = _gradients(model)
    model.zero_grad(set_to_none=True)
    autockpt.training_step(autockpt.apply(model, split), split, last, targets, _squared_error)
    for name, gradient in _gradients(model).items():
        torch.testing.assert_close(gradient, want[name], rtol=1e-5, atol=1e-6, msg=name)
    # A plan that recorded nothing (saved before) cuts by the sizes: the weights too.
    first, _ = split_batch(last, 2)
    assert first[1].shape == (2,)


def test_flags_hold_only_for_a_batch_of_the_same_structure():
    x, shared = torch.randn(6, 3), torch.randn(6)
    structure, flags = carrying_leaves(({"x": x, "shared": torch.randn(3)},), 6)
    assert flags == [True, False]
    assert flagged_batch_size(({"x": x[:2], "shared": shared},), structure, flags) == 2
    # Keys in another order, another container, or flagged leaves that disagree: no answer.
    assert flagged_batch_size(({"shared": shared, "x": x},), structure, flags) is None
    assert flagged_batch_size(([x, shared],), structure, flags) is None
    two_flagged = carrying_leaves(({"x": x, "shared": shared},), 6)
    assert flagged_batch_size(({"x": x, "shared": shared[:2]},), *two_flagged) is None
    assert flagged_batch_size((), *carrying_leaves((), 6), size=6) == 6
