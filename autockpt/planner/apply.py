"""Stage 4: turn a model and its Plan into the planned model."""

from __future__ import annotations

import torch
import torch.fx as fx

from autockpt.errors import PlanMismatchError
from autockpt.planner.module_chain import apply_module_plan
from autockpt.planner.plan_model import Plan
from autockpt.planner.segmented import SegmentAction, adopt_state_of, build_segmented_module
from autockpt.planner.trace import COMPUTE_OPS, segments_from_node_lists, trace_graph


def apply(model: torch.nn.Module, plan: Plan) -> torch.nn.Module:
    """The planned model: same call signature, same ``state_dict()`` keys, shared parameters.

    Segments the plan recomputes run under non-reentrant ``torch.utils.checkpoint`` with the
    RNG state preserved (NOTE [Segment runners]); an optimizer built on ``model``'s parameters
    trains the planned model. Micro-batches are not part of the module: run steps with
    :func:`autockpt.training_step`, which reads them from the plan.

    Args:
        model: the model the plan was made for.
        plan: from :func:`autockpt.plan` (or reloaded from its JSON).

    Returns:
        The planned module: a ``torch.fx.GraphModule``, or for a plan of module-level
        segments (``plan.tracing == "forward-hooks"``) a shallow copy of ``model`` whose
        recomputed submodules run checkpointed.

    Raises:
        PlanMismatchError: the plan was made for a different model.
    """
    if plan.tracing == "forward-hooks":
        # Module-level segments (NOTE [Module chain]): a shallow copy with checkpointed links.
        return apply_module_plan(
            model,
            [segment.modules[0] for segment in plan.segments],
            [segment.recomputed for segment in plan.segments],
        )
    graph = trace_graph(model)
    graph_module = fx.GraphModule(model, graph, class_name=f"Planned{type(model).__name__}")
    compute_names = [n.name for n in graph.nodes if n.op in COMPUTE_OPS]
    planned_names = [name for segment in plan.segments for name in segment.nodes]
    if planned_names != compute_names:
        raise PlanMismatchError(
            f"the plan covers {len(planned_names)} operations but {type(model).__name__} has "
            f"{len(compute_names)} (or they differ); re-plan for this model with autockpt.plan"
        )
    segments = segments_from_node_lists(graph, [segment.nodes for segment in plan.segments])
    actions = [
        SegmentAction(
            recompute=segment.recomputed,
            num_chunks=segment.num_chunks,
            input_batch_dims=tuple(segment.input_batch_dims),
            output_batch_dims=tuple(segment.output_batch_dims),
        )
        for segment in plan.segments
    ]
    planned = build_segmented_module(graph_module, segments, actions)
    adopt_state_of(planned, model)
    planned.train(model.training)
    return planned
