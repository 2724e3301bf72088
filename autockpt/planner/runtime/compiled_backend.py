"""Inductor with its partitioner at a chosen activation memory budget, for the whole step or
for one region of it.

NOTE [Per-region budgets]
Compile's knob, ``activation_memory_budget``, is one fraction for a whole graph: the
partitioner recomputes ops anywhere in the step to meet it, and its peak is not monotonic in
it. torch 2.13's ``torch.autograd.graph.region_activation_memory_budget`` sets the fraction of
the graph traced under it; a graph takes one budget, so regions with their own are cut off by
graph breaks. A planner segment given a fraction (``SegmentPlan.compile_fraction``) runs
through :func:`in_own_graph`: a graph break before it, its ops under the region budget, a graph
break after. So the planner chooses *where* memory is given back (its segments, by what they
hold) and compile's partitioner chooses *how*, op by op inside the segment, with fusion: at 0
it keeps what checkpointing the segment would keep, but may keep a cheaper cut than the
segment's inputs and recompute only what is cheap to recompute. The rest of the step stays in
the graphs between, at the plan's own fraction. Each break costs a graph boundary (no fusion
across it, tensors materialised there), which is why a single graph at one fraction stays a
candidate. Outside a compiled call the segment runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["compile_in_place", "in_own_graph", "inductor_at"]

_Result = TypeVar("_Result")


def inductor_at(fraction: float) -> Callable[..., Any]:
    """A dynamo backend: inductor with ``torch._functorch.config.activation_memory_budget`` at
    ``fraction`` (1.0 is inductor's default partition) while it compiles.

    The setting is read when the joint graph is partitioned, which happens inside the backend
    call, so patching it there applies it to this module's graphs only, whatever the rest of
    the process compiles.
    """
    from torch._inductor.compile_fx import compile_fx

    def backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        with torch._functorch.config.patch(activation_memory_budget=fraction):
            return compile_fx(graph, example_inputs)

    return backend


def compile_in_place(module: torch.nn.Module, fraction: float) -> torch.nn.Module:
    """Compile ``module``'s calls with :func:`inductor_at` ``fraction`` and return it.

    ``nn.Module.compile`` compiles the call in place, unlike ``torch.compile(module)``, whose
    wrapper prefixes every ``state_dict`` key with ``_orig_mod.``: the planned module keeps the
    user's keys.
    """
    module.compile(backend=inductor_at(fraction))
    return module


def in_own_graph(fraction: float | None, run: Callable[[], _Result]) -> _Result:
    """``run()``, traced by dynamo as a graph of its own at activation memory budget
    ``fraction`` (NOTE [Per-region budgets]); plainly when ``fraction`` is None or nothing is
    being compiled."""
    if fraction is None or not torch.compiler.is_compiling():
        return run()
    torch._dynamo.graph_break()
    with torch.autograd.graph.region_activation_memory_budget(fraction):
        result = run()
    torch._dynamo.graph_break()
    return result
