"""What a forward does to autograd survives planning (NOTE [Autograd in the traced graph]):
custom autograd Functions keep the backward their authors wrote, and grad-mode and autocast
regions keep their effect, in the training forward, in every gradient (None where the plain
model's is None), and after the region; the planned step stays under its budget by the
independent counter."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import autockpt
from autockpt.planner.trace.autograd_regions import CHECKPOINT_GENERATORS, USER_CHECKPOINT_META
from autockpt.planner.trace.fx_graph import trace_graph
from tests.oracle import measured_step
from tests.user_steps import GradientReversal

WIDTH = 64
BATCH = 4096


class StraightThroughClamp(torch.autograd.Function):
    """Quantization-aware training's estimator: clamp forward, the gradient passed unchanged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-0.5, 0.5)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class ScaleWithIndex(torch.autograd.Function):
    """Saves its inputs, returns two tensors, one of them marked non-differentiable; its
    backward is written by hand (halved, so that autograd's own would differ)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.save_for_backward(x, weight)
        scaled = x * weight
        index = scaled.argmax(-1)
        ctx.mark_non_differentiable(index)
        return scaled, index

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _index_grad: Any) -> tuple[torch.Tensor, ...]:
        x, weight = ctx.saved_tensors
        return 0.5 * grad * weight, 0.5 * (grad * x).sum(0)


class PairOut(torch.autograd.Function):
    """Returns two differentiable tensors; each gets a backward autograd would not give."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x.square()

    @staticmethod
    def backward(ctx: Any, grad_double: torch.Tensor, grad_square: torch.Tensor) -> torch.Tensor:
        return grad_double + grad_square  # not 2 * grad_double + 2 * x * grad_square


class UserStyleNet(nn.Module):
    """Blocks before and after a middle that does one thing to autograd (``kind``)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.before = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
        self.middle = nn.Linear(WIDTH, WIDTH)
        self.after = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.before(x))
        if self.kind == "gradient reversal":
            h = self.middle(GradientReversal.apply(h, 1.0))
        elif self.kind == "straight-through":
            h = self.middle(StraightThroughClamp.apply(3 * h))
        elif self.kind == "saved, non-differentiable":
            h, index = ScaleWithIndex.apply(h, self.scale)
            h = self.middle(h) + 0.01 * index.unsqueeze(-1).float()
        elif self.kind == "two outputs":
            doubled, squared = PairOut.apply(h)
            h = self.middle(doubled) * squared
        elif self.kind == "no-grad teacher":
            with torch.no_grad():
                teacher = self.middle(h)  # frozen: no gradient, as the plain model
            h = h + teacher
        elif self.kind == "set_grad_enabled":
            with torch.set_grad_enabled(False):
                teacher = self.middle(h)
            h = h * teacher.sigmoid()
        elif self.kind == "enable_grad inside no_grad":
            with torch.no_grad():
                frozen = h * 2
                with torch.enable_grad():
                    live = self.middle(h)
            h = frozen + live
        elif self.kind == "inference_mode":
            with torch.inference_mode():
                teacher = self.middle(h).sum(-1, keepdim=True)
            h = h + teacher.clone()
        elif self.kind == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = self.middle(h)
            h = h.float()
        return self.after(h)


KINDS = [
    "gradient reversal",
    "straight-through",
    "saved, non-differentiable",
    "two outputs",
    "no-grad teacher",
    "set_grad_enabled",
    "enable_grad inside no_grad",
    "inference_mode",
    "autocast",
]


def _plan(model: nn.Module, x: torch.Tensor, budget: int) -> autockpt.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autockpt.plan(model, (x,), budget)


@pytest.mark.parametrize("kind", KINDS)
def test_planned_model_keeps_what_forward_does_to_autograd(kind: str, fixed_time_model) -> None:
    model = UserStyleNet(kind)
    x = torch.randn(BATCH, WIDTH)
    unplanned = _plan(model, x, 10**12).unplanned_peak_bytes
    plan = _plan(model, x, unplanned // 2)
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    peak, _, _ = measured_step(model, (x,), plan)
    assert peak <= plan.budget_bytes, f"counted {peak} over {plan.budget_bytes}"

    # The training forward, exactly the plain one's (bfloat16 where the region asks for it).
    planned = autockpt.apply(copy.deepcopy(model), plan)
    torch.testing.assert_close(planned(x), model(x), rtol=0, atol=0)

    _, want_loss, want = measured_step(model, (x,))
    _, got_loss, got = measured_step(model, (x,), plan)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-3)
    # A parameter the plain step gives no gradient (a frozen teacher) gets none planned.
    assert got.keys() == want.keys()
    # bfloat16 gradients summed over micro-batches round differently from the whole batch's.
    tolerance = {"rtol": 2e-2, "atol": 1e-1} if kind == "autocast" else {"rtol": 1e-4, "atol": 1e-3}
    for name in want:
        torch.testing.assert_close(
            got[name], want[name], **tolerance, msg=lambda m, n=name: f"{n}: {m}"
        )

    planned.eval()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(planned(x[:16]), model(x[:16]), rtol=0, atol=0)
    assert torch.is_grad_enabled(), "a region left gradients off after the step"


def test_a_function_is_one_call_and_a_region_switches_modes_in_the_graph() -> None:
    graph = trace_graph(UserStyleNet("gradient reversal"))
    called = [str(node.target) for node in graph.nodes if node.op == "call_function"]
    assert any("apply_GradientReversal" in name for name in called)
    # Its forward's view_as is not traced: the call is a leaf.
    assert not any(node.target == "view_as" for node in graph.nodes)
    teacher = trace_graph(UserStyleNet("no-grad teacher"))
    names = [getattr(n.target, "__name__", "") for n in teacher.nodes if n.op == "call_function"]
    assert names.count("enter_grad_mode") == 1 and names.count("exit_grad_mode") == 1


def test_the_tracer_leaves_torch_as_it_found_it() -> None:
    apply = torch.autograd.Function.__dict__["apply"]
    enter = torch.no_grad.__dict__["__enter__"]
    trace_graph(UserStyleNet("no-grad teacher"))
    with pytest.raises(autockpt.TraceError):
        # A failing trace, too.
        trace_graph(_Failing())
    assert torch.autograd.Function.__dict__["apply"] is apply
    assert torch.no_grad.__dict__["__enter__"] is enter
    x = torch.ones(2, requires_grad=True)
    assert GradientReversal.apply(x, 1.0).grad_fn is not None


class _Failing(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            raise RuntimeError("fails while tracing")


class _OwnCheckpoints(nn.Module):
    """Checkpoints two of its three blocks itself, as torch advises (use_reentrant=False)."""

    def __init__(self, reentrant: bool = False) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + checkpoint(self.blocks[0], x, use_reentrant=self.reentrant)
        x = x + self.blocks[1](x).relu()
        return x + checkpoint(self.blocks[2], x, use_reentrant=self.reentrant)


def test_the_plan_says_the_models_own_checkpoints_are_traced_through() -> None:
    """NOTE [Autograd in the traced graph]: fx runs a non-reentrant checkpoint's function as
    plain operations, so the plain step the plan reports is the model's without them."""
    model, x = _OwnCheckpoints(), torch.randn(256, WIDTH)
    plan = _plan(model, x, 10**12)
    said = [n for n in plan.notes if "torch.utils.checkpoint" in n]
    assert len(said) == 1 and "(2 calls, use_reentrant=False)" in said[0], plan.notes
    graph = trace_graph(model)
    marked = [n.meta.get(USER_CHECKPOINT_META) for n in graph.nodes]
    # Each call's own operations, and nothing between or after them.
    targets = {
        m: [str(n.target) for n in graph.nodes if n.meta.get(USER_CHECKPOINT_META) == m]
        for m in (1, 2)
    }
    assert targets == {1: ["blocks.0"], 2: ["blocks.2"]}, targets
    assert marked.count(None) == len(marked) - 2
    # The reentrant kind is a Function, kept as one call: nothing to say beside that.
    reentrant = _plan(_OwnCheckpoints(reentrant=True), x, 10**12)
    assert not any("torch.utils.checkpoint itself" in n for n in reentrant.notes)
    assert any("CheckpointFunction" in n for n in reentrant.notes), reentrant.notes
    # Tracing leaves torch's checkpoint as it found it: it still checkpoints.
    for name in CHECKPOINT_GENERATORS:
        if name in torch.utils.checkpoint.__dict__:
            assert torch.utils.checkpoint.__dict__[name].__module__ == "torch.utils.checkpoint"
