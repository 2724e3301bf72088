"""Selective recompute: only the cheap ops run again, matrix products are kept, gradients match."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import autockpt
from autockpt.planner import pipeline
from autockpt.planner.core.decisions import SELECTIVE
from autockpt.planner.runtime.selective_recompute import may_recompute_selectively
from autockpt.planner.runtime.selective_safety import selective_segments
from autockpt.planner.trace.module_chain import trace_or_find_modules
from tests.conftest import FIXED_TIME_MODEL
from tests.helpers import MLPStack
from tests.oracle import measured_step
from tests.styles import BATCH, WIDTH, TinyGPT


class OpCounter(TorchDispatchMode):
    """Counts aten ops by name (``addmm``, ``gelu``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _with_every_segment(plan: autockpt.Plan, *, selective: bool) -> autockpt.Plan:
    segments = [
        s.model_copy(update={"recomputed": True, "selective": selective}) for s in plan.segments
    ]
    return plan.model_copy(update={"segments": segments})


def _backward_counts(model: nn.Module, plan: autockpt.Plan | None, x: torch.Tensor) -> Counter[str]:
    runner = autockpt.apply(copy.deepcopy(model), plan) if plan is not None else model
    loss = runner(x).square().sum()
    counter = OpCounter()
    with counter:
        loss.backward()
    return counter.counts


def test_a_selective_recompute_runs_the_cheap_ops_again_but_not_the_matrix_products():
    model, x = MLPStack(WIDTH, 4, dropout=0.0), torch.randn(BATCH, WIDTH)
    plan = autockpt.plan(model, (x,), 10**12, use_gradient_checkpointing=False)
    plain = _backward_counts(model, None, x)
    whole = _backward_counts(model, _with_every_segment(plan, selective=False), x)
    selective = _backward_counts(model, _with_every_segment(plan, selective=True), x)
    # A plain recompute runs every Linear's forward again; a selective one none of them.
    assert whole["addmm"] > plain["addmm"]
    assert selective["addmm"] == plain["addmm"]
    # The GELUs are rebuilt in both.
    assert selective["gelu"] == whole["gelu"] > plain["gelu"]


def test_a_selective_plan_keeps_the_gradients_with_dropout_on():
    torch.manual_seed(0)
    model = TinyGPT(p=0.2)
    ids = torch.randint(0, 50, (8, 16))
    plan = autockpt.plan(model, (ids,), 10**12, use_gradient_checkpointing=False)
    selective = _with_every_segment(plan, selective=True)
    _, want_loss, want = measured_step(model, (ids,), seed=3)
    _, got_loss, got = measured_step(model, (ids,), selective, seed=3)
    torch.testing.assert_close(got_loss, want_loss)
    for name, gradient in want.items():
        torch.testing.assert_close(got[name], gradient, msg=name)
    reloaded = autockpt.Plan.model_validate_json(selective.model_dump_json())
    assert all(s.selective for s in reloaded.segments)


class WidePointwise(nn.Module):
    """Blocks whose cheap tail (GELU, tanh, a product) outweighs their one matrix product."""

    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(x)
            x = x + torch.tanh(nn.functional.gelu(h)) * torch.sigmoid(h)
        return x


def test_the_planner_recomputes_cheap_ops_where_that_fits_and_the_peak_holds(fixed_time_model):
    model, x = WidePointwise(), torch.randn(512, 64)
    options: dict[str, Any] = {"allow_micro_batches": False, "allow_chunks": False}
    unplanned = autockpt.plan(model, (x,), 10**12, **options).unplanned_peak_bytes
    plan = autockpt.plan(model, (x,), int(unplanned * 0.8), **options)
    assert any(s.selective for s in plan.segments), [s.reason for s in plan.segments]
    assert {s.reason for s in plan.segments if s.selective} == {SELECTIVE}
    peak, _, got = measured_step(model, (x,), plan)
    assert peak <= plan.budget_bytes
    assert abs(peak - plan.predicted_peak_bytes) <= 0.02 * plan.predicted_peak_bytes
    _, _, want = measured_step(model, (x,))
    for name, gradient in want.items():
        torch.testing.assert_close(got[name], gradient, msg=name)


def test_a_costly_dispatch_mode_makes_a_plain_recompute_the_cheaper_one(monkeypatch):
    # The same model and budget, on a device where a Python dispatch mode costs 1 ms an op.
    slow_mode = dataclasses.replace(FIXED_TIME_MODEL, mode_overhead_s=1e-3)
    monkeypatch.setattr(pipeline, "calibrate", lambda *_args, **_kwargs: slow_mode)
    monkeypatch.setattr(pipeline, "can_time", lambda *_args, **_kwargs: False)
    model, x = WidePointwise(), torch.randn(512, 64)
    options: dict[str, Any] = {"allow_micro_batches": False, "allow_chunks": False}
    unplanned = autockpt.plan(model, (x,), 10**12, **options).unplanned_peak_bytes
    plan = autockpt.plan(model, (x,), int(unplanned * 0.8), **options)
    assert plan.num_recomputed and not any(s.selective for s in plan.segments)


class WritesAfterProduct(nn.Module):
    """``h = linear(x); h.mul_(2)``: a stored product written in place (never selective)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.first = nn.Linear(width, width)
        self.second = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        h.mul_(2.0)
        return self.second(torch.tanh(h))


def test_a_segment_that_writes_in_place_is_never_recomputed_selectively():
    model, x = WritesAfterProduct(), torch.randn(BATCH, 32)
    traced = trace_or_find_modules(model, (x,))
    writing = [s for s in traced.segments if any("mul_" in n for n in s.node_names)]
    assert writing
    assert not any(may_recompute_selectively(traced, s) for s in writing)
    assert any(may_recompute_selectively(traced, s) for s in traced.segments)


class GRUNet(nn.Module):
    """A GRU between two Linears: the GRU writes its gate products in place, through views."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.gru = nn.GRU(width, width)
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(torch.tanh(self.embed(x)))  # (T, B, W)
        return self.head(out)


def test_a_segment_whose_products_are_written_through_views_is_never_selective():
    # A selective recompute of nn.GRU gave gradients off by up to 0.8, and torch said nothing.
    model, x = GRUNet(), torch.randn(12, 6, 8)
    traced = trace_or_find_modules(model, (x,))
    allowed = selective_segments(traced, (x,))
    gru = [s.index for s in traced.segments if any(n.startswith("gru") for n in s.node_names)]
    assert gru and not allowed.intersection(gru)
    assert allowed, "the Linears around it may be"


def test_a_compiled_selective_plan_keeps_the_compiled_models_gradients():
    model, x = MLPStack(WIDTH, 4, dropout=0.0), torch.randn(BATCH, WIDTH)
    plan = autockpt.plan(model, (x,), 10**12, use_gradient_checkpointing=False)
    selective = _with_every_segment(plan, selective=True)
    reference, planned = copy.deepcopy(model), copy.deepcopy(model)
    torch.compile(reference, backend="aot_eager")(x).square().sum().backward()
    compiled = torch.compile(autockpt.apply(planned, selective), backend="aot_eager")
    compiled(x).square().sum().backward()
    planned_parameters = dict(planned.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(planned_parameters[name].grad, parameter.grad, msg=name)
