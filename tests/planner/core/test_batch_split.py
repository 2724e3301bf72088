"""Cutting a batch along dim 0, nests included, and micro-batches of models that do not trace."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

import autockpt
from autockpt.planner.core.batch_split import batch_size_of, piece_sizes, split_batch
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
