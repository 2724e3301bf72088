"""Per-region budgets (NOTE [Per-region budgets]): a planner segment compiled as a graph of its
own at ``region_activation_memory_budget``, and the compiled search's choice of those segments.

The peaks are the test's own count of the allocator (the profiler's memory events, summed
by the oracle); the gradients are compared with the plain eager model's, parameter by parameter.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from torch import nn

import autockpt
from autockpt.plan_report import print_plan
from autockpt.planner.compiled_search import (
    REGION_FRACTION,
    Candidate,
    _try_regions,
    regions_to_free,
)
from tests.helpers import GatedBlocks
from tests.oracle import profiled_peak_bytes

BATCH, WIDTH = 1024, GatedBlocks.WIDTH


def loss_fn(output: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output["prediction"], target)


@pytest.fixture(scope="module")
def workload() -> tuple[nn.Module, torch.Tensor, torch.Tensor, autockpt.Plan]:
    torch.manual_seed(0)
    model, x, y = GatedBlocks(), torch.randn(BATCH, WIDTH), torch.randn(BATCH, 4)
    plain = autockpt.plan(model, (x,), 10**12, loss_fn=loss_fn, example_targets=(y,))
    assert plain.num_recomputed == 0
    return model, x, y, plain


def _compiled(plain: autockpt.Plan, regions: set[int]) -> autockpt.Plan:
    segments = [
        s.model_copy(update={"compile_fraction": REGION_FRACTION}) if i in regions else s
        for i, s in enumerate(plain.segments)
    ]
    return plain.model_copy(update={"segments": segments, "compile_fraction": 1.0})


def _step_peak_and_gradients(
    model: nn.Module, plan: autockpt.Plan, x: torch.Tensor, y: torch.Tensor
) -> tuple[int, dict[str, torch.Tensor]]:
    """The most bytes one compiled step's forward and backward hold above its start, by the
    allocator, and the gradients it left."""
    torch._dynamo.reset()
    planned = autockpt.apply(model, plan)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        autockpt.training_step(planned, plan, (x,), (y,), loss_fn)

    step()  # compiles
    peak = profiled_peak_bytes(step)
    gradients = {name: p.grad.clone() for name, p in model.named_parameters()}
    assert list(planned.state_dict()) == list(model.state_dict())
    torch._dynamo.reset()
    return peak, gradients


def test_segments_in_graphs_of_their_own_give_memory_back_with_the_same_gradients(
    workload,
) -> None:
    model, x, y, plain = workload
    reference = copy.deepcopy(model)
    loss_fn(reference(x), y).backward()
    all_segments = set(range(len(plain.segments)))
    one_graph, _ = _step_peak_and_gradients(model, _compiled(plain, set()), x, y)
    regional, gradients = _step_peak_and_gradients(model, _compiled(plain, all_segments), x, y)
    # Each block keeps its 4x-wide interior under the default partition; at region budget 0
    # it keeps its input, so the step holds well under three quarters of it.
    assert regional < 0.75 * one_graph, (regional, one_graph)
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(gradients[name], parameter.grad, rtol=1e-4, atol=1e-6)

    planned = autockpt.apply(model, _compiled(plain, all_segments))
    planned.eval()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(planned(x), model(x), rtol=1e-5, atol=1e-6)
    model.train()
    torch._dynamo.reset()


def test_a_region_with_dropout_gets_its_budget(workload) -> None:
    """Inductor adds a seed op of its own to a graph with random ops; the region's budget
    must reach that graph all the same (torch's own region annotation rejects it)."""
    _, x, y, _ = workload
    torch.manual_seed(0)
    model = GatedBlocks(dropout=0.1)
    plain = autockpt.plan(model, (x,), 10**12, loss_fn=loss_fn, example_targets=(y,))
    one_graph, _ = _step_peak_and_gradients(model, _compiled(plain, set()), x, y)
    every = set(range(len(plain.segments)))
    regional, gradients = _step_peak_and_gradients(model, _compiled(plain, every), x, y)
    assert regional < 0.75 * one_graph, (regional, one_graph)
    assert all(torch.isfinite(g).all() for g in gradients.values())


def test_regions_are_chosen_by_bytes_freed_per_second_until_the_overshoot_is_freed(
    workload,
) -> None:
    _, _, _, plain = workload
    gains = [s.saved_bytes - s.boundary_bytes for s in plain.segments]
    assert sum(g > 0 for g in gains) >= 3, gains
    cheapest = max(
        range(len(gains)), key=lambda i: gains[i] / max(plain.segments[i].recompute_s, 1e-6)
    )

    one = regions_to_free(plain, 1)
    assert one is not None
    assert [i for i, s in enumerate(one.segments) if s.compile_fraction is not None] == [cheapest]
    assert one.segments[cheapest].compile_fraction == REGION_FRACTION
    assert not any(s.recomputed for s in one.segments)

    more = regions_to_free(plain, gains[cheapest] + 1)
    assert more is not None
    assert sum(s.compile_fraction is not None for s in more.segments) == 2

    every = regions_to_free(plain, 10**15)
    assert every is not None
    assert all(
        (s.compile_fraction is not None) == (g > 0)
        for s, g in zip(every.segments, gains, strict=True)
    )

    nothing_frees = plain.model_copy(
        update={"segments": [s.model_copy(update={"saved_bytes": 0}) for s in plain.segments]}
    )
    assert regions_to_free(nothing_frees, 1) is None


def test_region_tries_stop_when_graphs_of_their_own_peak_no_lower(workload) -> None:
    """Where regions cost more (broken fusion) than they free, the compiles left go to the
    eager planner's plans: one region try, not three."""
    _, _, _, plain = workload
    # An overshoot about one segment's eager count: later tries hand over more.
    largest_gain = max(s.saved_bytes - s.boundary_bytes for s in plain.segments)
    plain_peak = 10_000_000
    budget = plain_peak - largest_gain

    def tries(peaks: list[int]) -> list[Candidate]:
        made: list[Candidate] = []

        def attempt(plan: autockpt.Plan, fraction: float) -> Candidate:
            made.append(Candidate(plan, fraction, peak_bytes=peaks[len(made)]))
            return made[-1]

        _try_regions(plain, plain_peak, budget, attempt)
        return made

    assert len(tries([plain_peak + 1, 0, 0])) == 1
    lowering = tries([plain_peak - 1, plain_peak - 2, plain_peak - 3])
    assert len(lowering) >= 2
    # Each try hands more segments over than the last.
    handed = [sum(s.compile_fraction is not None for s in c.plan.segments) for c in lowering]
    assert handed == sorted(set(handed)), handed
    assert len(tries([budget, 0, 0])) == 1


def test_the_report_gives_each_segment_its_compile_budget(workload) -> None:
    _, _, _, plain = workload
    out = io.StringIO()
    plan = _compiled(plain, {0})
    print_plan(Console(file=out, width=200, highlight=False), plan, budget_given=True)
    text = out.getvalue()
    assert "own graph, compile recomputes" in text
    assert "1 segments in graphs of their own" in text
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert rows[0].rstrip("│ ").endswith(f"{REGION_FRACTION:g}"), rows[0]
    assert rows[1].rstrip("│ ").endswith("1"), rows[1]
    reloaded = autockpt.Plan.model_validate_json(plan.model_dump_json())
    assert reloaded.segments[0].compile_fraction == REGION_FRACTION
