"""Forwards with plain Python arguments that decide a branch (NOTE [Python arguments])."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch import nn

import autockpt
from autockpt.planner.trace.fx_graph import trace_graph
from autockpt.planner.trace.python_arguments import specialized_arguments
from tests.oracle import measured_step

WIDTH = 128
BATCH = 2048


class FlaggedStack(nn.Module):
    """Six ``Linear`` + ``relu`` layers; a Python flag picks the output's sign."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(6))

    def forward(
        self, x: torch.Tensor, scale: float = 1.0, flag: bool = True, label: str | None = None
    ) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x)) * scale  # (B, W)
        if label is not None:
            x = x + 1.0
        return x if flag else -x


def _model_and_batch() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return FlaggedStack(), (torch.randn(BATCH, WIDTH),)


def test_the_graph_holds_the_defaults_and_is_called_like_the_model():
    model, (x,) = _model_and_batch()
    graph = trace_graph(model)
    assert specialized_arguments(graph) == {"scale": 1.0, "flag": True, "label": None}
    called = {str(n.target) for n in graph.nodes if n.op == "call_function"}
    assert not any("assert" in target for target in called), called
    module = torch.fx.GraphModule(model, graph)
    assert list(inspect.signature(module.forward).parameters) == ["x", "scale", "flag", "label"]
    torch.testing.assert_close(module(x, flag=True), model(x))


def test_recompute_lowers_the_minimum_well_under_the_unplanned_peak():
    model, inputs = _model_and_batch()
    unplanned = autockpt.plan(model, inputs, 10**12, optimizer=None)
    assert unplanned.tracing == "fx"
    with pytest.raises(autockpt.InfeasibleBudgetError) as refused:
        autockpt.plan(model, inputs, 1, optimizer=None, allow_micro_batches=False)
    assert refused.value.minimum_bytes < 0.6 * unplanned.unplanned_peak_bytes
    forced = autockpt.plan(model, inputs, 10**12, optimizer=None, use_gradient_checkpointing=True)
    assert forced.predicted_peak_bytes < 0.8 * unplanned.unplanned_peak_bytes


def test_a_plan_at_half_keeps_the_gradients_and_its_measured_peak():
    model, inputs = _model_and_batch()
    unplanned_bytes, _, plain = measured_step(model, inputs)
    budget = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes // 2
    # Recompute (in chunks: half is below what whole recomputes reach), not micro-batches:
    # the traced graph at the argument's default is what runs again.
    plan = autockpt.plan(model, inputs, budget, allow_micro_batches=False)
    assert plan.tracing == "fx" and plan.num_recomputed > 0
    peak_bytes, _, planned = measured_step(model, inputs, plan)
    assert peak_bytes <= budget < unplanned_bytes
    assert planned.keys() == plain.keys()
    for name, gradient in plain.items():
        torch.testing.assert_close(planned[name], gradient, msg=name)


def test_a_call_with_another_value_runs_the_models_own_forward_with_a_warning():
    model, inputs = _model_and_batch()
    plan = autockpt.plan(model, inputs, 10**12, optimizer=None, use_gradient_checkpointing=True)
    planned = autockpt.apply(model, plan).train()
    x = inputs[0][:8]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(planned(x, 1.0, flag=True), model(x))
    with pytest.warns(UserWarning, match=r"flag=False.*traced with flag=True"):
        flipped = planned(x, flag=False)
    torch.testing.assert_close(flipped, model(x, flag=False))
    with pytest.warns(UserWarning, match=r"scale=1"):
        planned(x, scale=1)  # an int is not the float the graph holds


def test_example_inputs_that_give_a_constant_another_value_are_not_traced_with_the_default():
    model, (x,) = _model_and_batch()
    with pytest.warns(UserWarning, match="scale=0.5"):
        plan = autockpt.plan(model, (x, 0.5), 10**12, optimizer=None)
    assert plan.tracing == "forward-hooks"


class _KeywordBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(
        self,
        x: torch.Tensor,
        *,
        scale: float,
        gated: bool,
        bias: torch.Tensor | None,
        mode: str,
        extras: dict[str, dict[str, torch.Tensor]],
    ) -> torch.Tensor:
        h = torch.tanh(self.up(x)) * extras["gate"]["weight"]  # (B, 2W)
        if gated:
            h = h * torch.sigmoid(h)
        if bias is not None:
            h = h + bias
        h = self.down(h) if mode == "down" else h[:, :WIDTH]
        return x + scale * h  # (B, W)


class KeywordEverything(nn.Module):
    """Blocks called with keyword arguments of every kind: float, bool, None, str and a
    nested dict of tensors; the root passes its own keyword defaults on."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_KeywordBlock() for _ in range(4))
        self.gate = nn.Parameter(torch.ones(2 * WIDTH))

    def forward(
        self, x: torch.Tensor, *, scale: float = 0.5, gated: bool = True, mode: str = "down"
    ) -> torch.Tensor:
        extras = {"gate": {"weight": self.gate}}
        for block in self.blocks:
            x = block(x, scale=scale, gated=gated, bias=None, mode=mode, extras=extras)
        return x


def test_keyword_arguments_of_every_kind_plan_and_keep_the_gradients():
    torch.manual_seed(0)
    model, inputs = KeywordEverything(), (torch.randn(BATCH, WIDTH),)
    unplanned_bytes, _, plain = measured_step(model, inputs)
    budget = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes // 2
    plan = autockpt.plan(model, inputs, budget, allow_micro_batches=False, allow_chunks=False)
    assert plan.tracing == "fx"
    assert not any("timing the real model failed" in note for note in plan.notes), plan.notes
    peak_bytes, _, planned = measured_step(model, inputs, plan)
    assert peak_bytes <= budget < unplanned_bytes
    for name, gradient in plain.items():
        torch.testing.assert_close(planned[name], gradient, msg=name)
