"""torch.compile on planned modules: plain recompute, chunks, micro-batches, BatchNorm, eval."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from tests.helpers import BatchNormNet, GatedBlocks, MLPStack
from tests.oracle import profiled_peak_bytes
from tests.styles import BATCH, WIDTH, DictBatchNet, FunctionalDropoutNet, TinyGPT

#: A backend that runs AOTAutograd (which takes the checkpointed regions apart) without
#: inductor's code generation: seconds instead of minutes.
BACKEND = "aot_eager"


def _counting_backend(regions: list[int]) -> Callable[..., Any]:
    """``aot_eager``, recording how many checkpointed regions each compiled graph holds."""
    aot_eager = torch._dynamo.lookup_backend(BACKEND)

    def backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        regions.append(
            sum("tag_activation_checkpoint" in str(node.target) for node in graph.graph.nodes)
        )
        return aot_eager(graph, example_inputs)

    return backend


def _mlp_plans() -> tuple[nn.Module, torch.Tensor, dict[str, autockpt.Plan]]:
    model, x = MLPStack(WIDTH, 6, dropout=0.0), torch.randn(128, WIDTH)
    unplanned = autockpt.plan(model, (x,), 10**12, use_gradient_checkpointing=False)
    lowest = autockpt.plan(model, (x,), unplanned.predicted_peak_bytes).minimum_feasible_bytes
    below = int(lowest * 0.85)  # only chunks or micro-batches fit here
    plans = {
        "recompute": autockpt.plan(model, (x,), 10**12, use_gradient_checkpointing=True),
        "chunks": autockpt.plan(model, (x,), below, allow_micro_batches=False),
        "micro-batches": autockpt.plan(model, (x,), below, allow_chunks=False),
    }
    assert any(s.num_chunks > 1 for s in plans["chunks"].segments)
    assert plans["micro-batches"].num_micro_batches > 1
    return model, x, plans


@pytest.fixture(scope="module")
def mlp_plans() -> tuple[nn.Module, torch.Tensor, dict[str, autockpt.Plan]]:
    return _mlp_plans()


def test_the_issues_reproduction_compiles_a_recomputing_plan():
    model, x = FunctionalDropoutNet(p=0.0), torch.randn(BATCH, WIDTH)
    plan = autockpt.plan(model, (x,), 10**12, optimizer=None, use_gradient_checkpointing=True)
    compiled = torch.compile(autockpt.apply(model, plan), backend=BACKEND)
    compiled(x).sum().backward()  # raised "SegmentRunner._contexts() missing ... 'self'"
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("kind", ["recompute", "chunks", "micro-batches"])
def test_compiled_plan_keeps_the_compiled_models_gradients(mlp_plans, kind):
    model, x, plans = mlp_plans
    plan = plans[kind]
    reference, planned_model = copy.deepcopy(model), copy.deepcopy(model)
    loss_fn = lambda out: out.square().mean()  # noqa: E731
    want = autockpt.training_step(
        torch.compile(reference, backend=BACKEND), None, (x,), (), loss_fn
    )
    regions: list[int] = []
    compiled = torch.compile(
        autockpt.apply(planned_model, plan), backend=_counting_backend(regions)
    )
    got = autockpt.training_step(compiled, plan, (x,), (), loss_fn)
    torch.testing.assert_close(got, want)
    planned_parameters = dict(planned_model.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(planned_parameters[name].grad, parameter.grad, msg=name)
    # Each recomputed segment (each chunk of it) is one checkpointed region of the graph; each
    # chunk is a graph of its own (NOTE [Chunks under torch.compile]).
    expected = sum(s.num_chunks for s in plan.segments if s.recomputed)
    if any(s.num_chunks > 1 for s in plan.segments):
        # Dynamo compiles a chunk's graph once and calls it for every chunk of its shape.
        assert regions and max(regions) == 1, regions
    else:
        assert regions and set(regions) == {expected}


def test_compiled_batchnorm_plan_updates_statistics_once():
    model, x = BatchNormNet(WIDTH), torch.randn(BATCH, WIDTH)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    plan = autockpt.plan(model, (x,), 10**12, optimizer=None, use_gradient_checkpointing=True)
    reference, planned_model = copy.deepcopy(model), copy.deepcopy(model)
    torch.compile(reference, backend=BACKEND)(x).square().mean().backward()
    compiled = torch.compile(autockpt.apply(planned_model, plan), backend=BACKEND)
    compiled(x).square().mean().backward()
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(planned_model.get_buffer(name), buffer, msg=name)
    planned_parameters = dict(planned_model.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(planned_parameters[name].grad, parameter.grad, msg=name)


def test_compiled_module_level_plan_keeps_the_compiled_models_gradients():
    model, batch = DictBatchNet(), {"x": torch.randn(BATCH, WIDTH)}
    with pytest.warns(UserWarning, match="forward hooks"):
        plan = autockpt.plan(
            model, (batch,), 10**12, optimizer=None, use_gradient_checkpointing=True
        )
    assert plan.tracing == "forward-hooks" and plan.num_recomputed > 0
    reference, planned_model = copy.deepcopy(model), copy.deepcopy(model)
    torch.compile(reference, backend=BACKEND)(batch).square().mean().backward()
    regions: list[int] = []
    compiled = torch.compile(
        autockpt.apply(planned_model, plan), backend=_counting_backend(regions)
    )
    compiled(batch).square().mean().backward()
    assert sum(regions) == plan.num_recomputed
    planned_parameters = dict(planned_model.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(planned_parameters[name].grad, parameter.grad, msg=name)


def test_compiled_planned_module_in_eval_is_the_originals_forward():
    model, x = TinyGPT(), torch.randint(0, 50, (8, 16))
    plan = autockpt.plan(model, (x,), 10**12, optimizer=None, use_gradient_checkpointing=True)
    planned = autockpt.apply(model, plan)
    regions: list[int] = []
    compiled = torch.compile(planned, backend=_counting_backend(regions))
    planned.eval()
    reference = copy.deepcopy(model).eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), reference(x))
    assert regions == [0], "eval recomputes nothing"


@pytest.mark.slow
def test_inductor_compiles_a_recomputing_plan_with_the_compiled_models_gradients(mlp_plans):
    model, x, plans = mlp_plans
    plan = plans["recompute"]
    reference, planned_model = copy.deepcopy(model), copy.deepcopy(model)
    torch.compile(reference)(x).square().mean().backward()
    torch.compile(autockpt.apply(planned_model, plan))(x).square().mean().backward()
    planned_parameters = dict(planned_model.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(planned_parameters[name].grad, parameter.grad, msg=name)


@pytest.mark.slow
def test_inductor_rebuilds_one_chunk_at_a_time_as_eager_does(fixed_time_model):
    """NOTE [Chunks under torch.compile]: in one compiled graph inductor recomputed every
    chunk before the gradients needed them, and the chunked plan peaked above its eager
    prediction (about 6.5 MiB over here, 2.6x on the TFT ``tft-225``); each chunk in a graph
    of its own keeps the compiled step under it, with the eager model's gradients. Planned
    with fixed rates: which chunk count is fastest must not depend on the machine's load."""
    torch.manual_seed(0)
    model, x, y = GatedBlocks(), torch.randn(2048, GatedBlocks.WIDTH), torch.randn(2048, 4)

    def loss_fn(output: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output["prediction"], target)

    def plan_at(budget: int, **options: Any) -> autockpt.Plan:
        return autockpt.plan(
            model, (x,), budget, loss_fn=loss_fn, example_targets=(y,), optimizer=None, **options
        )

    unplanned = plan_at(10**12, use_gradient_checkpointing=False)
    lowest = plan_at(unplanned.predicted_peak_bytes, allow_chunks=False).minimum_feasible_bytes
    plan = plan_at(int(lowest * 0.8), allow_micro_batches=False)
    assert plan.fits and all(s.num_chunks > 1 for s in plan.segments if s.recomputed)
    reference = copy.deepcopy(model)
    loss_fn(reference(x), y).backward()
    planned = autockpt.apply(model, plan)
    planned.compile()

    def step() -> None:
        loss_fn(planned(x), y).backward()

    step()  # compiles
    model.zero_grad(set_to_none=True)
    resident = sum(t.nbytes for t in (*model.parameters(), x, y))
    peak = resident + profiled_peak_bytes(step)
    assert peak <= plan.predicted_peak_bytes, (peak, plan.predicted_peak_bytes)
    planned_parameters = dict(model.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(
            planned_parameters[name].grad, parameter.grad, rtol=1e-4, atol=1e-6, msg=name
        )
