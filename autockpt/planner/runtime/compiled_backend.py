"""Inductor with its partitioner at a chosen activation memory budget, for the whole step or
for one region of it.

NOTE [Per-region budgets]
Compile's knob, ``activation_memory_budget``, is one fraction for a whole graph: the
partitioner recomputes ops anywhere in the step to meet it, and its peak is not monotonic in
it. A graph takes one budget, so regions with budgets of their own are cut off by graph
breaks, as torch 2.13's ``torch.autograd.graph.region_activation_memory_budget`` asks. A planner
segment given a fraction (``SegmentPlan.compile_fraction``) runs through :func:`in_own_graph`:
a graph break before it, its ops traced under an annotation carrying the fraction, a graph
break after. So the planner chooses *where* memory is given back (its segments, by what they
hold) and compile's partitioner chooses *how*, op by op inside the segment, with fusion: at 0
it keeps what checkpointing the segment would keep, but may keep a cheaper cut than the
segment's inputs and recompute only what is cheap to recompute. The rest of the step stays in
the graphs between, at the plan's own fraction. Each break costs a graph boundary (no fusion
across it, tensors materialised there), which is why a single graph at one fraction stays a
candidate.

The fraction reaches the partitioner through the backend, not through
``region_activation_memory_budget`` itself: :func:`inductor_at` reads the annotation off the
graph dynamo hands it and compiles that graph at that fraction. torch's own reader rejects a
graph where any forward op lacks the annotation, and inductor adds one of its own to every
graph with random ops (``inductor_seeds``, for dropout), so the TFT, or any model with dropout,
could not have a region budget that way. Outside a compiled call, and where dynamo runs a
region's frame eagerly (it cannot trace it whole), the annotation is inert: the segment runs
as it is, and the search's measurement shows that it gave nothing back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.fx.traceback as fx_traceback

__all__ = [
    "compile_in_place",
    "graph_of_its_own",
    "in_own_graph",
    "inductor_at",
    "region_fraction_of",
]

_Result = TypeVar("_Result")

#: The key of a region's fraction in ``node.meta["custom"]`` (NOTE [Per-region budgets]).
REGION_KEY = "autockpt_region_activation_memory_budget"


def inductor_at(fraction: float) -> Callable[..., Any]:
    """A dynamo backend: inductor with ``torch._functorch.config.activation_memory_budget`` at
    ``fraction`` (1.0 is inductor's default partition) while it compiles, or at a region's own
    fraction for a graph traced in :func:`in_own_graph`.

    The setting is read when the joint graph is partitioned, which happens inside the backend
    call, so patching it there applies it to this module's graphs only, whatever the rest of
    the process compiles.
    """
    from torch._inductor.compile_fx import compile_fx

    def backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        own = region_fraction_of(graph)
        budget = own if own is not None else fraction
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return compile_fx(graph, example_inputs)

    return backend


def region_fraction_of(graph: torch.fx.GraphModule) -> float | None:
    """The region fraction :func:`in_own_graph` annotated ``graph``'s ops with; None if none."""
    for node in graph.graph.nodes:
        custom = node.meta.get("custom")
        if isinstance(custom, dict) and REGION_KEY in custom:
            return float(custom[REGION_KEY])
    return None


def compile_in_place(module: torch.nn.Module, fraction: float) -> torch.nn.Module:
    """Compile ``module``'s calls with :func:`inductor_at` ``fraction`` and return it.

    ``nn.Module.compile`` compiles the call in place, unlike ``torch.compile(module)``, whose
    wrapper prefixes every ``state_dict`` key with ``_orig_mod.``: the planned module keeps the
    user's keys.
    """
    # Isolated: its recompiles are its own, not those of every module compiled before it
    # (the compiled search compiles one planned module a candidate).
    module.compile(backend=inductor_at(fraction), isolate_recompiles=True)
    return module


def in_own_graph(fraction: float | None, run: Callable[[], _Result]) -> _Result:
    """``run()``, traced by dynamo as a graph of its own that :func:`inductor_at` compiles at
    activation memory budget ``fraction`` (NOTE [Per-region budgets]); plainly when
    ``fraction`` is None or nothing is being compiled."""
    if fraction is None or not torch.compiler.is_compiling():
        return run()
    torch._dynamo.graph_break()
    with fx_traceback.annotate({REGION_KEY: float(fraction)}):
        result = run()
    torch._dynamo.graph_break()
    return result


def graph_of_its_own(run: Callable[..., _Result], *args: Any) -> _Result:
    """``run(*args)``; while compiling, as a graph of its own (a graph break before it and one
    after), so that its backward is a compiled call of its own too, which the autograd engine
    runs when the gradients reach it (NOTE [Chunks under torch.compile])."""
    if not torch.compiler.is_compiling():
        return run(*args)
    torch._dynamo.graph_break()
    result = run(*args)
    torch._dynamo.graph_break()
    return result
