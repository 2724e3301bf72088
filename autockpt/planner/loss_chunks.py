"""Planning the step again with the head and the loss in chunks of positions, when the plain
loss leaves no plan under the budget (NOTE [Loss over positions in chunks] in
:mod:`autockpt.planner.trace.output_head`).

The search over recompute, chunks and micro-batches (:mod:`autockpt.planner.pipeline`) runs
first, as it always did. Only when it refuses the budget, and the model's output is a linear
head whose loss adds up over positions, is the step planned a second time: the graph cut before
the head, and the head with the loss as the loss, in chunks of positions. The same search then
chooses the rest of the plan under the same budget, measured on fake tensors with the chunks in
it, so the chunks' bytes are counted, not assumed. What the chunks add to a step (the head and
the loss run once more, in backward) is priced by the time model from the head's FLOPs and
bytes; the plan reports the plain model's peak and step as its unplanned ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map_only

from autockpt.errors import InfeasibleBudgetError, TraceError
from autockpt.planner.core.fake_copies import fake_copy
from autockpt.planner.core.step_budget import StepBudget
from autockpt.planner.core.units import format_bytes
from autockpt.planner.measure.loss_positions import loss_over_positions
from autockpt.planner.pipeline import PlanRequest, plan_one_process
from autockpt.planner.plan_types import LossChunks, Plan
from autockpt.planner.runtime.chunked_loss import ChunkedLoss, LossOverPositions
from autockpt.planner.runtime.head_cut import cut_before_head_module
from autockpt.planner.timing.calibration import TimeModel, calibrate
from autockpt.planner.trace.fx_graph import TracedModel, trace_graph, trace_model
from autockpt.planner.trace.module_chain import ModuleChain, Tracing, find_module_chain
from autockpt.planner.trace.opaque_modules import weigh_opaque
from autockpt.planner.trace.output_head import (
    OutputHead,
    find_head_by_running,
    find_output_head,
)

#: The most bytes of scores one chunk makes: chunks of this size keep the loss well below the
#: rest of a step, and each is still one large matrix product.
CHUNK_SCORES_BYTES = 8 * 2**20


def plan_loss_in_chunks(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: StepBudget,
    request: PlanRequest,
    refused: InfeasibleBudgetError,
    *,
    cpu_threads: int,
) -> Plan:
    """The plan with the head and the loss in chunks of positions, after the plan without
    them refused ``budget`` with ``refused``.

    Raises:
        InfeasibleBudgetError: ``refused``, where chunks of positions do not apply, or the
            refusal with the lower minimum where they do not fit either.
    """
    if not request.allow_loss_chunks or request.loss_fn is None:
        raise refused
    cut = _cut_step(model, example_inputs, request.tracing)
    if cut is None:
        raise refused
    head, cut_model, traced = cut
    features_shape = _features_shape(cut_model, example_inputs)
    module = model.get_submodule(head.path)
    assert isinstance(module, torch.nn.Linear)
    positions = loss_over_positions(
        module, features_shape, request.example_targets, request.loss_fn
    )
    if isinstance(positions, str):
        raise refused
    scores_bytes = (
        math.prod(features_shape[:-1]) * head.logits_features * _itemsize(module, request)
    )
    num_chunks = min(features_shape[positions.dim], max(2, -(-scores_bytes // CHUNK_SCORES_BYTES)))
    chunked = ChunkedLoss(request.loss_fn, num_chunks, positions)
    try:
        result = plan_one_process(
            cut_model,
            example_inputs,
            budget,
            dataclasses.replace(
                request,
                loss_fn=chunked,
                tracing="fx" if isinstance(traced, TracedModel) else "forward-hooks",
            ),
            cpu_threads=cpu_threads,
            traced=traced,
        )
    except InfeasibleBudgetError as error:
        raise min(refused, error, key=lambda e: e.minimum_bytes) from None
    held = result.breakdown
    room_bytes = budget.usable_bytes - held.parameters_bytes - held.optimizer_state_bytes
    time_model = calibrate(  # the room plan_one_process calibrated in (NOTE [Time model])
        request.device.type,
        request.device.index,
        max_bytes=max((room_bytes - held.inputs_bytes) // 2, 0),
    )
    extra_s = _recompute_s(time_model, features_shape, head, scores_bytes, num_chunks)
    note = (
        f"the head {head.path} and the loss run in {num_chunks} chunks of positions "
        f"({format_bytes(scores_bytes / num_chunks)} of scores each, {positions.reduction}), "
        f"each recomputed in backward: the whole {format_bytes(scores_bytes)} of scores never "
        f"exist; about {extra_s * 1e3:.1f} ms a step, estimated from the head's FLOPs; run "
        "steps with autockpt.training_step"
    )
    return result.model_copy(
        update={
            "loss_chunks": _loss_chunks(head, num_chunks, positions),
            "unplanned_peak_bytes": refused.unplanned_bytes or result.unplanned_peak_bytes,
            "unplanned_step_s": max(result.unplanned_step_s - extra_s, 0.0),
            "predicted_extra_s": result.predicted_extra_s + extra_s,
            "notes": [note, *result.notes],
        }
    )


def _loss_chunks(head: OutputHead, num_chunks: int, positions: LossOverPositions) -> LossChunks:
    return LossChunks(
        head=head.path, num_chunks=num_chunks, dim=positions.dim, reduction=positions.reduction
    )


def _cut_step(
    model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], tracing: Tracing
) -> tuple[OutputHead, torch.nn.Module, TracedModel | ModuleChain] | None:
    """The model's head, the model cut before it, and its chain (its traced graph or its
    module-level segments); None where the model has no head to cut.

    As :func:`~autockpt.planner.trace.module_chain.trace_or_find_modules` chooses: torch.fx
    where it traces the model and keeps no large submodule whole (NOTE [Opaque submodules]),
    else whole submodules (:mod:`autockpt.planner.runtime.head_cut`).
    """
    if tracing != "forward-hooks" and all(isinstance(x, torch.Tensor) for x in example_inputs):
        try:
            head = find_output_head(model, trace_graph(model))
        except TraceError:
            head = "torch.fx does not trace it"
        if isinstance(head, OutputHead):
            traced = trace_model(model, example_inputs, cut_before=head)
            if (
                tracing == "fx"
                or not traced.opaque
                or not weigh_opaque(traced.graph_module, example_inputs, traced)[0]
            ):
                return head, traced.graph_module, traced
    if tracing == "fx":
        return None
    head = find_head_by_running(model, example_inputs)
    if isinstance(head, str):
        return None
    cut_model = cut_before_head_module(model, head.path, returns_cut=True)
    why = f"the model cut before its head {head.path}"
    return head, cut_model, find_module_chain(cut_model, example_inputs, why=why)


def _features_shape(
    cut_model: torch.nn.Module, example_inputs: Sequence[torch.Tensor]
) -> tuple[int, ...]:
    """The shape of the head's input at the training batch, from a forward on fake tensors."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    copied = fake_copy(cut_model, mode)
    with mode, torch.no_grad():
        inputs = tree_map_only(torch.Tensor, mode.from_tensor, list(example_inputs))
        features = copied(*inputs)[0]
    return tuple(int(size) for size in features.shape)


def _itemsize(head: torch.nn.Linear, request: PlanRequest) -> int:
    dtype = request.autocast_dtype or head.weight.dtype
    return torch.empty((), dtype=dtype).element_size()


def _recompute_s(
    time_model: TimeModel,
    features_shape: Sequence[int],
    head: OutputHead,
    scores_bytes: int,
    num_chunks: int,
) -> float:
    """Seconds the head and the loss take once more in backward, by the time model
    (NOTE [Time model]): the head's matrix product, and the loss reading and writing the
    scores a few times over."""
    rows = math.prod(features_shape[:-1])
    flops = 2.0 * rows * features_shape[-1] * head.logits_features
    return time_model.seconds(flops=flops, moved_bytes=4.0 * scores_bytes, num_ops=8.0 * num_chunks)


def chunked_loss_of(plan: Plan, loss_fn: object) -> ChunkedLoss:
    """The loss :func:`autockpt.training_step` runs for a plan with ``plan.loss_chunks``."""
    chunks = plan.loss_chunks
    assert chunks is not None
    return ChunkedLoss(
        loss_fn,  # type: ignore[arg-type]
        chunks.num_chunks,
        LossOverPositions(chunks.dim, chunks.reduction),
    )
