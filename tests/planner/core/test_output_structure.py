"""The planned module returns what the model returns, and plan()'s loss_fn sees that type."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import autockpt
from autockpt.planner.core.output_structure import flatten_output
from tests.styles import (
    BATCH,
    OUTPUT_KINDS,
    WIDTH,
    ModelOutputLike,
    OutputNet,
    Pair,
    RegressionOutput,
    output_tensors,
)

EXPECTED_TYPES = {
    "tensor": torch.Tensor,
    "tuple": tuple,
    "dict": dict,
    "namedtuple": Pair,
    "dataclass": RegressionOutput,
    "model_output": ModelOutputLike,
}


def _loss(output: Any) -> torch.Tensor:
    return torch.stack([t.float().sum() for t in output_tensors(output)]).sum()


@pytest.mark.parametrize("kind", OUTPUT_KINDS)
def test_planned_module_returns_the_original_type_in_training_and_eval(kind):
    model, x = OutputNet(kind), (torch.randn(BATCH, WIDTH), torch.randn(BATCH))
    seen: list[type] = []

    def loss_fn(output: Any) -> torch.Tensor:
        seen.append(type(output))
        return _loss(output)

    plan = autockpt.plan(
        model, x, 10**12, loss_fn=loss_fn, optimizer=None, use_gradient_checkpointing=True
    )
    # On fake tensors a bare tensor is a FakeTensor; containers are the model's own types.
    want_type = torch.Tensor if kind == "tensor" else type(model(*x))
    assert seen and all(issubclass(t, want_type) for t in seen), seen
    planned = autockpt.apply(model, plan)
    torch.manual_seed(1)
    want = model(*x)
    torch.manual_seed(1)
    got = planned(*x)
    assert type(got) is type(want) and isinstance(got, EXPECTED_TYPES[kind])
    for a, b in zip(output_tensors(got), output_tensors(want), strict=True):
        assert torch.equal(a, b)
    if kind == "dict":
        assert got["step"] == 3 and list(got) == list(want)
    if kind == "tuple":
        assert isinstance(got[1], list) and got[1][1] is None
    if kind == "dataclass":
        assert got.label == "regression" and got.norm is not None
    if kind == "model_output":
        assert list(got.keys()) == ["loss", "logits", "hidden_states"]
    planned.eval()
    model.eval()
    with torch.no_grad():
        assert type(planned(*x)) is type(model(*x))


def test_model_output_loss_attribute_reaches_the_loss_function_in_plan_and_training():
    # The third reproduction: loss_fn=lambda out: out.loss on a ModelOutput.
    model = OutputNet("model_output")
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH)
    plan = autockpt.plan(
        model,
        (x, y),
        10**12,
        loss_fn=lambda out: out.loss,
        optimizer=None,
        use_gradient_checkpointing=True,
    )
    planned = autockpt.apply(copy.deepcopy(model), plan)
    reference = copy.deepcopy(model)
    torch.manual_seed(2)
    loss = autockpt.training_step(planned, plan, (x, y), (), lambda out: out.loss)
    torch.manual_seed(2)
    want = reference(x, y).loss
    want.backward()
    torch.testing.assert_close(loss, want.detach())
    planned_grads = dict(planned.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(planned_grads[name].grad, parameter.grad)


@pytest.mark.parametrize("kind", ["dataclass", "model_output", "namedtuple"])
def test_default_loss_sums_the_tensors_inside_any_output_type(kind):
    model, x = OutputNet(kind), (torch.randn(BATCH, WIDTH), torch.randn(BATCH))
    plan = autockpt.plan(model, x, 10**12, optimizer=None)
    assert plan.predicted_peak_bytes > 0


def test_flatten_output_keeps_constants_and_rebuilds_nested_containers():
    value = {"a": (torch.ones(1), [None, 2.5]), "b": Pair(torch.zeros(1), torch.ones(2))}
    leaves, structure = flatten_output(value)
    assert len(leaves) == structure.num_leaves == 3
    rebuilt = structure.rebuild([leaf * 2 for leaf in leaves])
    assert isinstance(rebuilt["b"], Pair) and rebuilt["a"][1] == [None, 2.5]
    assert torch.equal(rebuilt["b"].hidden, torch.full((2,), 2.0))
