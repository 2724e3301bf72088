"""Models with in-place ops plan at every budget they can meet (NOTE [In-place writes])."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from autockpt.planner.core.decisions import KEEP, SegmentAction
from autockpt.planner.measure.fake_step import FakeTrainingState, profile_step
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_positions import Profiles, unit_segments
from autockpt.planner.solve.chain_solver import minimum_peak
from autockpt.planner.timing.calibration import TimeModel
from autockpt.planner.timing.time_model import EstimatedCosts
from autockpt.planner.trace.fx_graph import Segment, TracedModel, trace_model
from autockpt.planner.trace.inplace_writes import forbidden_cuts, keep_reason
from autockpt.planner.trace.module_chain import trace_or_find_modules
from tests.helpers import tracked_step
from tests.resnet_style import ResNet18

Inputs = tuple[torch.Tensor, ...]


def _relu_stack(width: int = 64, depth: int = 6) -> nn.Module:
    """The issue's reproduction, smaller: ``Linear`` then ``ReLU(inplace=True)``, repeated."""
    return nn.Sequential(
        *[nn.Sequential(nn.Linear(width, width), nn.ReLU(inplace=True)) for _ in range(depth)]
    )


class InplaceStyles(nn.Module):
    """Every way of writing in place that torch.fx records: functional, method, through a view.

    Each write comes before anything saves the value for backward, as plain autograd needs.
    """

    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.gates = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, gate in zip(self.layers, self.gates, strict=True):
            h = layer(x)  # (B, W)
            h += 1.0  # fx records this one as h + 1.0
            h.add_(x)  # the residual, added in place
            h.view(-1).mul_(0.5)  # through a view of h
            g = torch.sigmoid_(gate(x))  # (B, W)
            x = F.relu(h, inplace=True) * g
        return x


class WritesItsInput(nn.Module):
    """Scales its input batch in place before anything else: the input is made before every
    cut, so the segment that writes it can only be kept."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.body = _relu_stack(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return self.body(x)


class UntraceableInplace(nn.Module):
    """A forward fx cannot trace, whose module chain has ``ReLU(inplace=True)`` links that
    write the output of the block before them."""

    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            for _ in range(depth)
        )
        self.activations = nn.ModuleList(nn.ReLU(inplace=True) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 1:  # control flow on a traced value: fx fails, fake tensors run
            x = x * 2.0
        for block, activation in zip(self.blocks, self.activations, strict=True):
            x = activation(block(x))  # (B, W)
        return x


def _small_resnet() -> tuple[nn.Module, Inputs]:
    return ResNet18(width=8, num_classes=10), (torch.randn(8, 3, 32, 32),)


MODELS: dict[str, Callable[[], tuple[nn.Module, Inputs]]] = {
    "relu-stack": lambda: (_relu_stack(), (torch.randn(256, 64),)),
    "styles": lambda: (InplaceStyles(), (torch.randn(256, 64),)),
    "writes-its-input": lambda: (WritesItsInput(), (torch.randn(256, 64),)),
    "untraceable": lambda: (UntraceableInplace(), (torch.randn(256, 64),)),
    "resnet": _small_resnet,
}


def _plan(model: nn.Module, inputs: Inputs, budget: int | str, **options: object) -> autockpt.Plan:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*module-level segments")
        warnings.filterwarnings("ignore", message="torch.fx cannot trace submodule")
        return autockpt.plan(model, inputs, budget, **options)  # type: ignore[arg-type]


def _fresh(inputs: Inputs) -> Inputs:
    """A copy of the inputs for each run: a model may write its input in place."""
    return tuple(x.clone() for x in inputs)


def _half_or_minimum(model: nn.Module, inputs: Inputs) -> tuple[autockpt.Plan, int]:
    """The plan at half the unplanned peak or, if that is below every plan, at the minimum
    the refusal reports; with the budget it was made for. Without micro-batches, so that
    segments recompute."""
    unplanned = _plan(model, _fresh(inputs), 10**12).unplanned_peak_bytes
    try:
        budget = unplanned // 2
        return _plan(model, _fresh(inputs), budget, allow_micro_batches=False), budget
    except autockpt.InfeasibleBudgetError as error:
        budget = error.minimum_bytes
        return _plan(model, _fresh(inputs), budget, allow_micro_batches=False), budget


def _assert_same_gradients(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")


def test_the_issue_reproduction_plans_in_every_mode():
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(512, 512), nn.ReLU(inplace=True)) for _ in range(8)]
    )
    inputs = (torch.randn(256, 512),)
    plans = {
        forced: autockpt.plan(
            model, inputs, budget="1GB", optimizer=None, use_gradient_checkpointing=forced
        )
        for forced in (None, True, False)
    }
    assert all(plan.fits for plan in plans.values())
    # Forced recompute recomputes every piece but those that write their input in place.
    recomputed = [s.recomputed for s in plans[True].segments]
    kept = [s.reason.startswith("kept: ") for s in plans[True].segments]
    assert any(recomputed) and any(kept)
    assert recomputed == [not k for k in kept]


@pytest.mark.parametrize(
    "name",
    [
        "relu-stack",
        pytest.param("styles", marks=pytest.mark.slow),
        pytest.param("writes-its-input", marks=pytest.mark.slow),
        pytest.param("untraceable", marks=pytest.mark.slow),
    ],
)
def test_plans_at_half_or_its_minimum_with_the_plain_gradients(name):
    model, inputs = MODELS[name]()
    plan, budget = _half_or_minimum(model, inputs)
    assert plan.fits and any(s.recomputed for s in plan.segments)
    peak, loss, gradients = tracked_step(model, _fresh(inputs), plan)
    _, plain_loss, plain_gradients = tracked_step(model, _fresh(inputs))
    assert peak <= budget
    torch.testing.assert_close(loss, plain_loss)
    _assert_same_gradients(gradients, plain_gradients)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relu-stack", "styles", "untraceable"])
def test_plans_at_every_budget_from_the_minimum_to_the_unplanned_peak(name):
    model, inputs = MODELS[name]()
    unplanned = _plan(model, inputs, 10**12).unplanned_peak_bytes
    with pytest.raises(autockpt.InfeasibleBudgetError) as refused:
        _plan(model, inputs, 1)
    minimum = refused.value.minimum_bytes
    _, _, plain_gradients = tracked_step(model, inputs)
    for share in (0.0, 0.25, 0.5, 0.75):
        budget = int(minimum + share * (unplanned - minimum))
        plan = _plan(model, inputs, budget)
        peak, _, gradients = tracked_step(model, inputs, plan)
        assert peak <= budget, share
        _assert_same_gradients(gradients, plain_gradients)


def _traced(name: str) -> TracedModel:
    model, inputs = MODELS[name]()
    traced = trace_model(model, inputs)
    assert isinstance(traced, TracedModel)
    return traced


@pytest.mark.parametrize("name", ["relu-stack", "styles", "resnet"])
def test_units_and_regions_never_start_at_an_in_place_write(name):
    traced = _traced(name)
    # Every run that may be recomputed as one (a unit, a region) may be recomputed.
    assert all(not s.keep_reason for s in traced.unit_segments)
    assert all(not s.keep_reason for s in traced.region_segments)
    # The finer segments cut just before the writes, and those pieces are kept.
    kept_only = [s for s in traced.segments if s.keep_reason]
    assert kept_only
    graph_nodes = {n.name: n for n in traced.graph_module.graph.nodes}
    for segment in kept_only:
        first = graph_nodes[segment.node_names[0]]
        assert segment.keep_reason.startswith(first.name)


def test_a_written_model_input_keeps_the_segment_that_writes_it():
    traced = _traced("writes-its-input")
    assert traced.segments[0].keep_reason == "mul_ writes in place to its input x"
    assert traced.unit_segments[0].keep_reason == "mul_ writes in place to its input x"
    assert all(not s.keep_reason for s in traced.unit_segments[1:])
    plan = _plan(*MODELS["writes-its-input"](), 10**12, use_gradient_checkpointing=True)
    assert [s.recomputed for s in plan.segments][0] is False
    assert plan.segments[0].reason.startswith("kept: mul_ writes in place")


def test_untraceable_model_keeps_links_that_write_their_input():
    model, inputs = MODELS["untraceable"]()
    with pytest.warns(UserWarning, match="module-level segments"):
        chain = trace_or_find_modules(model, inputs)
    reasons = {s.name: s.keep_reason for s in chain.segments}
    assert reasons["blocks.0"] == ""
    assert reasons["activations.0"] == (
        "aten.relu_.default writes in place to an input of activations.0"
    )


def test_forbidden_cuts_keep_a_value_and_its_write_in_one_segment():
    positions = {"a": 0, "b": 1, "c": 2, "d": 3}
    # c writes a (made at 0): no cut at 1 or 2; d writes the input x: no cut up to 3.
    assert forbidden_cuts(positions, {"c": ("a",)}, ["x"]) == {1, 2}
    assert forbidden_cuts(positions, {"d": ("x",)}, ["x"]) == {0, 1, 2, 3}
    # A write to a parameter or buffer (no compute node, no input) forbids nothing.
    assert forbidden_cuts(positions, {"c": ("weight",)}, ["x"]) == set()
    # keep_reason: a segment whose input is written at or after its start is kept.
    writes = {"c": ("a",)}
    assert (
        keep_reason(["b", "c"], ["a"], positions, writes, {}) == "c writes in place to its input a"
    )
    assert keep_reason(["b"], ["a"], positions, writes, {}) == "c writes in place to its input a"
    assert keep_reason(["d"], ["c"], positions, writes, {}) == ""
    # Through a view: the view's storage belongs to a.
    assert keep_reason(["c"], ["v"], positions, writes, {"v": "a"}) != ""


def test_resnet_at_half_or_its_minimum_trains_like_the_plain_model():
    model, inputs = _small_resnet()
    plan, budget = _half_or_minimum(model, inputs)
    assert any(s.recomputed for s in plan.segments)
    peak, _, _ = tracked_step(model, inputs, plan)
    assert peak <= budget
    planned_model, plain_model = copy.deepcopy(model), copy.deepcopy(model)
    autockpt.training_step(autockpt.apply(planned_model, plan), plan, inputs, (), _sum)
    autockpt.training_step(plain_model, None, inputs, (), _sum)
    # Every gradient, parameter by parameter, and BatchNorm's statistics updated once.
    for (name, got), want in zip(
        planned_model.named_parameters(), plain_model.parameters(), strict=True
    ):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(got.grad, want.grad, msg=lambda m, n=name: f"{n}: {m}")
    got_state, want_state = planned_model.state_dict(), plain_model.state_dict()
    buffers = [name for name, _ in model.named_buffers()]
    assert any(name.endswith("running_mean") for name in buffers)
    for name in buffers:
        torch.testing.assert_close(
            got_state[name], want_state[name], msg=lambda m, n=name: f"{n}: {m}"
        )


def _sum(output: torch.Tensor) -> torch.Tensor:
    return output.sum()


def test_resnet_stem_is_cut_between_batchnorm_and_its_in_place_relu():
    traced = _traced("resnet")
    by_nodes = {s.node_names: s for s in traced.segments}
    # Recompute the convolution and BatchNorm, keep the ReLU's output the pooling saves.
    assert not by_nodes[("conv1", "bn1")].keep_reason
    assert by_nodes[("relu", "maxpool")].keep_reason == "relu writes in place to its input bn1"
    stem_unit = next(u for u in traced.unit_segments if u.node_names[0] == "conv1")
    assert stem_unit.node_names[:4] == ("conv1", "bn1", "relu", "maxpool")


def _minimum_of_chain(traced: TracedModel, inputs: Inputs) -> int:
    """The solver's lowest peak over ``traced``'s chain, from its profiles (no regions)."""
    state = FakeTrainingState(traced, optimizer=None)
    kept = profile_step(state, inputs, [KEEP] * len(traced.segments))

    def recomputed(segments: Sequence[Segment]) -> StepProfile:
        actions = [SegmentAction(recompute=not s.keep_reason) for s in segments]
        return profile_step(state, inputs, actions, segments=segments)

    units = unit_segments(traced)
    profiles = Profiles(kept, recomputed(traced.segments), None, units and recomputed(units))
    builder = ChainBuilder(traced, EstimatedCosts(TimeModel(1e12, 1e10, 1e-6), kept), 8)
    return minimum_peak(builder.chain(profiles, None, 1, None)).peak_bytes


@pytest.mark.slow
def test_cuts_before_in_place_writes_lower_the_resnet_minimum():
    model, inputs = _small_resnet()
    traced = trace_model(model, inputs)
    units = traced.unit_segments
    coarse = dataclasses.replace(
        traced, segments=units, units=tuple((i, i + 1) for i in range(len(units)))
    )
    finer = _minimum_of_chain(traced, inputs)
    assert finer < 0.98 * _minimum_of_chain(coarse, inputs)
    # The refusal's minimum is a measured plan over the finer chain.
    with pytest.raises(autockpt.InfeasibleBudgetError) as refused:
        autockpt.plan(model, inputs, 1, optimizer=None, allow_micro_batches=False)
    assert refused.value.minimum_bytes <= 1.01 * finer


class FunctionalBatchNorm(nn.Module):
    """BatchNorm written out with ``F.batch_norm``: its statistics are buffers the traced graph
    reads (``get_attr``) and batch_norm writes in place."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.register_buffer("running_mean", torch.zeros(width))
        self.register_buffer("running_var", torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, self.training
        )


class KeptWholeNorm(nn.Module):
    """A block fx cannot trace, kept whole (one node), with a BatchNorm inside it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 1:
            x = self.linear(x)  # (B, W)
        return self.norm(x)


class NormStyles(nn.Module):
    """Functional BatchNorms, then blocks kept whole that hold BatchNorms."""

    def __init__(self, width: int = 64, depth: int = 3) -> None:
        super().__init__()
        self.functional = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), FunctionalBatchNorm(width), nn.GELU())
            for _ in range(depth)
        )
        self.kept_whole = nn.ModuleList(KeptWholeNorm(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.functional:
            x = block(x)
        for block in self.kept_whole:
            x = x + block(x)
        return x


def test_batchnorm_statistics_written_in_place_are_written_once_under_recompute():
    model, inputs = NormStyles(), (torch.randn(128, 64),)
    plan = _plan(model, inputs, 10**12, use_gradient_checkpointing=True)
    recomputed = {m for s in plan.segments if s.recomputed for m in s.modules}
    assert any(m.startswith("functional") for m in recomputed)
    assert any(m.startswith("kept_whole") for m in recomputed)
    planned_model, plain_model = copy.deepcopy(model), copy.deepcopy(model)
    autockpt.training_step(autockpt.apply(planned_model, plan), plan, inputs, (), _sum)
    autockpt.training_step(plain_model, None, inputs, (), _sum)
    got, want = planned_model.state_dict(), plain_model.state_dict()
    for name, _ in model.named_buffers():
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")
