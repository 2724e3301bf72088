"""Every segment of a compiled plan runs compiled, at any number of segments (NOTE [A
segment's own code under torch.compile]): dynamo counts recompiles per code object, and
runners that shared theirs went eager past its eighth segment. And the compiled search
chooses among its fastest candidates by timing them again side by side. Planned models
compiled one after another in a process each run compiled too (NOTE [A planned forward's own
code under torch.compile])."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import autockpt
from autockpt.planner.compiled_search import FINALISTS, ROUNDS, Candidate, retime
from tests.helpers import MLPStack
from tests.planner.test_compile import BACKEND
from tests.styles import WIDTH

NUM_BLOCKS = 24
"""In 11 segments: past dynamo's default recompile limit (8)."""


def _every_segment_a_graph_of_its_own(num_chunks: int) -> tuple[torch.nn.Module, autockpt.Plan]:
    """Every segment of a 24-block MLP recomputed, each a region of its own (NOTE [Per-region
    budgets]), as the compiled search's third candidate makes them; in ``num_chunks`` chunks."""
    model = MLPStack(WIDTH, NUM_BLOCKS, dropout=0.0)
    x = torch.randn(64, WIDTH)
    plan = autockpt.plan(model, (x,), 10**12, use_gradient_checkpointing=True)
    segments = [
        # Each segment takes and gives one (batch, width) tensor: chunks split dim 0.
        segment.model_copy(
            update={
                "compile_fraction": 0.0,
                "num_chunks": num_chunks,
                "input_batch_dims": [0],
                "output_batch_dims": [0],
            }
        )
        for segment in plan.segments
    ]
    assert len(segments) > 8 and all(segment.recomputed for segment in segments)
    return model, plan.model_copy(update={"segments": segments})


@pytest.mark.parametrize("num_chunks", [1, 2])
def test_a_plan_of_more_than_eight_segments_compiles_every_one(num_chunks: int) -> None:
    torch.manual_seed(0)
    model, plan = _every_segment_a_graph_of_its_own(num_chunks)
    reference = copy.deepcopy(model)
    x, y = torch.randn(64, WIDTH), torch.randn(64, 1)
    planned = torch.compile(autockpt.apply(model, plan), backend=BACKEND)
    torch._dynamo.reset()
    counters.clear()
    for _ in range(2):  # the second step runs what the first compiled
        model.zero_grad(set_to_none=True)
        F.mse_loss(planned(x), y).backward()
    # No segment fell back to eager, and each is a graph of its own (a segment's chunks, of
    # one shape, run one graph each in turn).
    fallbacks = [why for why in counters["unimplemented"] if "recompile limit" in why]
    assert fallbacks == []
    assert counters["stats"]["unique_graphs"] >= len(plan.segments)
    F.mse_loss(reference(x), y).backward()
    planned_parameters = dict(model.named_parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(planned_parameters[name].grad, parameter.grad, msg=name)


def test_planned_models_compiled_in_one_process_each_run_compiled() -> None:
    """NOTE [A planned forward's own code under torch.compile]: the planned modules of one
    process shared their forward's code, and the ninth compiled ran its forward eagerly."""
    torch._dynamo.reset()
    counters.clear()
    for width in range(16, 26):  # ten planned models, each with inputs of another shape
        torch.manual_seed(width)
        model = MLPStack(width, 4, dropout=0.0)
        x, y = torch.randn(64, width), torch.randn(64, 1)
        plan = autockpt.plan(model, (x,), 10**12, use_gradient_checkpointing=True)
        planned = torch.compile(autockpt.apply(model, plan), backend=BACKEND)
        F.mse_loss(planned(x), y).backward()
    fallbacks = [why for why in counters["unimplemented"] if "recompile limit" in why]
    assert fallbacks == []


def test_the_compiled_search_chooses_by_its_second_timing() -> None:
    """The finalists and the plain step are timed again in rounds of rotating order; the
    fastest of a candidate's rounds counts (NOTE [Compiled plans]). Timings are programmed:
    the chunked plan's first steps were slowed (another process took the cores), its second
    timing is the fastest."""
    plan = autockpt.plan(MLPStack(WIDTH, 2, dropout=0.0), (torch.randn(8, WIDTH),), 10**12)
    ran: list[str] = []
    first = {"plain": 10.0, "chunked": 12.0, "recomputed": 11.0}
    again = {"plain": [10.0, 10.5], "chunked": [8.0, 9.5], "recomputed": [11.0, 11.5]}
    candidates = {}
    for name, step_s in first.items():
        candidates[name] = Candidate(
            plan, 1.0, step_s=step_s, step=lambda name=name: ran.append(name)
        )

    def step_seconds(step: Callable[[], None]) -> float:
        step()
        name = ran[-1]
        return again[name][sum(n == name for n in ran) % 2]

    plain = candidates["plain"]
    finalists = sorted(candidates.values(), key=lambda c: c.step_s)[:FINALISTS]
    retime(finalists, plain, step_seconds)
    assert len(ran) == ROUNDS * 3
    # Each round runs every one once, and the first of each round rotates.
    rounds = [ran[i : i + 3] for i in range(0, len(ran), 3)]
    assert all(sorted(r) == sorted(first) for r in rounds)
    assert len({r[0] for r in rounds}) == 3
    assert [candidates[n].step_s for n in first] == [10.0, 8.0, 11.0]
    assert min(finalists, key=lambda c: c.step_s) is candidates["chunked"]
