"""Submodules torch.fx cannot trace are named, and planned inside (NOTE [Opaque submodules])."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import autockpt
from autockpt.planner.trace.fx_graph import trace_model
from autockpt.planner.trace.opaque_modules import opaque_shares
from tests.helpers import tracked_step

#: What torch.fx says about control flow on a traced value.
FX_REASON = "symbolically traced variables cannot be used as inputs to control flow"


def _blocks(count: int, width: int) -> nn.ModuleList:
    return nn.ModuleList(
        nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        for _ in range(count)
    )


class ShapeBranch(nn.Module):
    """Residual blocks behind a branch on the input's shape: fx fails, fake tensors run."""

    def __init__(self, depth: int = 6, width: int = 64) -> None:
        super().__init__()
        self.layers = _blocks(depth, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 1:
            x = x * 2.0
        for layer in self.layers:
            x = x + layer(x)  # (B, W)
        return x


class ValueBranch(ShapeBranch):
    """A branch on the input's values: fx fails and fake tensors cannot run it either."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            x = x * 2.0
        for layer in self.layers:
            x = x + layer(x)  # (B, W)
        return x


class Wrapper(nn.Module):
    """A thin wrapper, as around a Hugging Face model: the untraceable part is all of it."""

    def __init__(self, inner: nn.Module, width: int = 64) -> None:
        super().__init__()
        self.inner = inner
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(x))  # (B, 1)


class SmallOpaquePart(nn.Module):
    """One small untraceable block before eight traceable ones."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.stem = ShapeBranch(1, width)
        self.layers = _blocks(8, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.layers:
            x = x + layer(x)  # (B, W)
        return x


def _inputs(batch_size: int = 128) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch_size, 64),)


def _plan_recording(
    model: nn.Module, budget: int, **options: object
) -> tuple[autockpt.Plan, list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plan = autockpt.plan(model, _inputs(), budget, optimizer=None, **options)  # type: ignore[arg-type]
    return plan, [str(w.message) for w in seen]


@pytest.mark.parametrize("inner", [ShapeBranch, ValueBranch])
def test_a_wrapped_untraceable_model_is_planned_as_finely_as_the_bare_one(inner):
    torch.manual_seed(0)
    bare, messages_bare = _plan_recording(inner(), 10**12)
    torch.manual_seed(0)
    wrapped, messages = _plan_recording(Wrapper(inner()), 10**12)
    assert wrapped.tracing == bare.tracing == "forward-hooks"
    inner_names = [s.name.removeprefix("inner.") for s in wrapped.segments if s.name != "head"]
    assert inner_names == [s.name for s in bare.segments]
    # Named in a warning and in the notes, with fx's reason.
    note = next(n for n in wrapped.notes if "submodule inner " in n)
    assert FX_REASON in note
    assert any(note in message for message in messages)


def test_a_wrapped_untraceable_model_trains_with_the_plain_gradients():
    model, inputs = Wrapper(ShapeBranch()), _inputs(1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unplanned = autockpt.plan(model, inputs, 10**12).unplanned_peak_bytes
        budget = int(0.7 * unplanned)
        plan = autockpt.plan(model, inputs, budget, allow_micro_batches=False)
    assert any(s.recomputed and s.name.startswith("inner.layers") for s in plan.segments)
    peak, _, gradients = tracked_step(model, inputs, plan)
    _, _, plain = tracked_step(model, inputs)
    assert peak <= budget
    assert gradients.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(gradients[name], plain[name])


def test_a_small_untraceable_part_is_kept_whole_and_named():
    model = SmallOpaquePart()
    plan, messages = _plan_recording(model, 10**12)
    assert plan.tracing == "fx"
    assert len(plan.segments) > 2
    note = next(n for n in plan.notes if "submodule stem " in n)
    assert FX_REASON in note and "planned as one piece" in note
    assert note in messages
    traced = trace_model(model, _inputs())
    assert list(traced.opaque) == ["stem"]
    assert traced.opaque["stem"] == FX_REASON


def test_opaque_shares_measure_what_a_submodule_keeps_for_backward():
    model = SmallOpaquePart()
    shares = opaque_shares(model, _inputs(), ["stem", "layers.0"])
    # One block of nine: a ninth, give or take the stem's input branch.
    assert 0.08 < shares["stem"] < 0.16
    assert shares["layers.0"] == pytest.approx(shares["stem"], rel=0.2)
    assert opaque_shares(Wrapper(ShapeBranch()), _inputs(), ["inner"])["inner"] > 0.95


class _ValueGate(nn.Module):
    """A layer that picks its activation by the sign of its output's sum."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)  # (B, 4W)
        h = torch.relu(h) if h.sum() > 0 else torch.tanh(h)
        return x + self.out(h)


class _GatedLayers(nn.Module):
    """A loop over layers that each branch on a tensor value (none runs on fake tensors)."""

    def __init__(self, depth: int = 6, width: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_ValueGate(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)  # (B, W)
        return x


def test_layers_that_branch_on_values_plan_and_refuse_in_one_error():
    # Each layer is kept whole by fx and cannot run on fake tensors: the model is measured
    # for real through forward hooks instead of dying in the fake-tensor run.
    torch.manual_seed(0)
    model, inputs = _GatedLayers(), (torch.randn(256, 64),)
    with pytest.warns(UserWarning, match="measured on real tensors"):
        unplanned = autockpt.plan(model, inputs, 10**12, optimizer=None)
    assert unplanned.tracing == "forward-hooks"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(autockpt.InfeasibleBudgetError, match="mixes samples"):
            autockpt.plan(model, inputs, 1, optimizer=None)
        plan = autockpt.plan(model, inputs, 10**12, optimizer=None, use_gradient_checkpointing=True)
        _, want_loss, want = tracked_step(model, inputs, seed=1)
        _, got_loss, got = tracked_step(model, inputs, plan, seed=1)
    assert plan.num_recomputed > 0
    torch.testing.assert_close(got_loss, want_loss)
    for name, gradient in want.items():
        torch.testing.assert_close(got[name], gradient, msg=name)
