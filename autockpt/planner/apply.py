"""Stage 4: turn a model and its Plan into the planned model."""

from __future__ import annotations

import torch

from autockpt.errors import PlanMismatchError
from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.plan_types import Plan
from autockpt.planner.runtime.compiled_backend import compile_in_place
from autockpt.planner.runtime.head_cut import cut_before_head_module
from autockpt.planner.runtime.planned_chain import apply_module_plan
from autockpt.planner.runtime.planned_graph import planned_module
from autockpt.planner.trace.fx_graph import COMPUTE_OPS, segments_from_node_lists, trace_graph
from autockpt.planner.trace.output_head import OutputHead, cut_before_head, find_output_head


def apply(model: torch.nn.Module, plan: Plan) -> torch.nn.Module:
    """The planned model: the user's model, running the plan while it trains.

    It is a shallow copy of ``model``, an instance of the same class, sharing its submodules,
    parameters and buffers: same call signature, same ``state_dict()`` keys (and
    ``load_state_dict`` on either loads both), and an optimizer built on ``model``'s
    parameters trains it. ``train()`` and ``eval()`` act on it as on the original. While it
    trains with gradients enabled it runs the traced graph, with the segments the plan
    recomputes under non-reentrant ``torch.utils.checkpoint`` with the RNG state preserved
    (NOTE [Segment runners]); in eval mode, under ``torch.no_grad()`` or
    ``torch.inference_mode()`` it runs the model's own ``forward``: the original's outputs,
    bit for bit, and no recompute (NOTE [The planned module]). It returns what the model
    returns (dataclass, NamedTuple, dict subclass, tuple, tensor; NOTE [Output structure]).
    ``copy.deepcopy`` and ``torch.compile`` work on it.

    Hooks on the original's submodules: in eval (the model's own forward) all fire. While
    training, those on modules the tracer keeps whole (``nn.Linear``, ``nn.Dropout``,
    ``nn.LSTM``, ...) fire, again when a recomputed segment reruns them in backward, and those
    on modules it traces through (the model's own blocks, ``nn.Sequential``) do not. Hooks on
    the planned module itself fire on every call. A plan of module-level segments
    (``plan.tracing == "forward-hooks"``) runs the model's own forward always: every hook fires.

    Micro-batches and a loss in chunks of positions (``plan.loss_chunks``) are not part of the
    module: run steps with :func:`autockpt.training_step`, which reads them from the plan.
    Called directly while it trains, a plan with ``loss_chunks`` returns the model's output
    whole (NOTE [Loss over positions in chunks]).

    Args:
        model: the model the plan was made for.
        plan: from :func:`autockpt.plan` (or reloaded from its JSON).

    Returns:
        The planned module: for a traced plan a shallow copy of ``model`` whose ``forward``
        dispatches as above; for a plan of module-level segments a shallow copy of ``model``
        whose recomputed submodules run checkpointed.

    Raises:
        PlanMismatchError: the plan was made for a different model.

    Example:
        >>> planned = autockpt.apply(model, plan)
        >>> loss = autockpt.training_step(planned, plan, (x,), (y,), loss_fn)
        >>> planned.eval(); prediction = planned(x)   # the model's own forward
    """
    actions = [
        SegmentAction(
            recompute=segment.recomputed,
            num_chunks=segment.num_chunks,
            input_batch_dims=tuple(segment.input_batch_dims),
            output_batch_dims=tuple(segment.output_batch_dims),
            selective=segment.selective,
            region_fraction=segment.compile_fraction,
        )
        for segment in plan.segments
    ]
    planned = _planned(model, plan, actions)
    if plan.compile_fraction is not None:
        # NOTE [Compiled plans]: the plan was measured compiled; it runs compiled.
        compile_in_place(planned, plan.compile_fraction)
    return planned


def _submodule(model: torch.nn.Module, path: str) -> torch.nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _planned(model: torch.nn.Module, plan: Plan, actions: list[SegmentAction]) -> torch.nn.Module:
    if plan.tracing == "forward-hooks":
        # Module-level segments (NOTE [Module chain]): a shallow copy with checkpointed links.
        planned = apply_module_plan(model, [segment.modules for segment in plan.segments], actions)
        if plan.loss_chunks is None:
            return planned
        head_path = plan.loss_chunks.head
        if not isinstance(_submodule(model, head_path), torch.nn.Linear):
            raise PlanMismatchError(
                f"the plan runs {head_path} with the loss in chunks, but "
                f"{type(model).__name__} has no nn.Linear there; re-plan for this model with "
                "autockpt.plan"
            )
        # NOTE [Loss over positions in chunks]: the head left to training_step.
        return cut_before_head_module(planned, head_path, plan.loss_chunks.leaf, returns_cut=False)
    graph = trace_graph(model)
    head: OutputHead | None = None
    if plan.loss_chunks is not None:
        # NOTE [Loss over positions in chunks]: the graph ends before the head.
        found = find_output_head(model, graph)
        if isinstance(found, str) or found.path != plan.loss_chunks.head:
            raise PlanMismatchError(
                f"the plan runs {plan.loss_chunks.head} with the loss in chunks, but "
                f"{type(model).__name__}'s output is not that layer's; re-plan for this model "
                "with autockpt.plan"
            )
        head = found
        graph = cut_before_head(graph, head)
    compute_names = [n.name for n in graph.nodes if n.op in COMPUTE_OPS]
    planned_names = [name for segment in plan.segments for name in segment.nodes]
    if planned_names != compute_names:
        raise PlanMismatchError(
            f"the plan covers {len(planned_names)} operations but {type(model).__name__} has "
            f"{len(compute_names)} (or they differ); re-plan for this model with autockpt.plan"
        )
    segments = segments_from_node_lists(graph, [segment.nodes for segment in plan.segments])
    return planned_module(model, graph, segments, actions, head=head)
