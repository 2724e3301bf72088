"""Planning the step with the loss run whole, and again with the head and the loss in chunks of
positions (NOTE [Loss over positions in chunks] in :mod:`autockpt.planner.trace.output_head`).

The search over recompute, chunks and micro-batches (:mod:`autockpt.planner.pipeline`) runs
first, as it always did. Where it refuses the budget, or fits it only by recomputing or
splitting something, and the model's output is a linear head whose scores are at least
``SCORES_SHARE`` of the plain peak and whose loss adds up over positions, the step is planned a
second time: the graph (or the model) cut before the head, and the head with the loss as the
loss, in chunks of positions; the plan that adds less time is the plan. The same search then
chooses the rest of the plan under the same budget, measured on fake tensors with the chunks in
it, so the chunks' bytes are counted, not assumed. What the chunks add to a step (each reads and
writes the weight's gradient once more; the scores are computed once, NOTE [Gradients in
forward]) is priced by the time model; the plan reports the plain model's peak and step as its
unplanned ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch.utils._pytree import tree_map_only

from autockpt.errors import InfeasibleBudgetError, TraceError
from autockpt.planner.core.fake_copies import fake_copy
from autockpt.planner.core.fake_mode import PlanningFakeMode
from autockpt.planner.core.output_structure import OutputSlot
from autockpt.planner.core.step_budget import StepBudget
from autockpt.planner.core.units import format_bytes
from autockpt.planner.measure.loss_positions import loss_over_positions
from autockpt.planner.pipeline import PlanRequest, budget_decided, plan_one_process
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

#: The most bytes of scores one chunk makes, and the fewest chunks: chunks of this size keep
#: the loss well below the rest of a step, and each is still one large matrix product.
CHUNK_SCORES_BYTES = 8 * 2**20
MIN_LOSS_CHUNKS = 16
#: The least share of the plain step's peak the head's scores take for the step to be planned
#: with them in chunks too: below it chunks could not change the plan, and planning twice
#: would only cost time.
SCORES_SHARE = 0.1


def plan_step(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: StepBudget,
    request: PlanRequest,
    *,
    cpu_threads: int,
) -> Plan:
    """The plan of one process's step: with the loss run whole, and, where the model's head
    makes at least ``SCORES_SHARE`` of its plain peak and that plan recomputes, chunks or
    splits something (or fits nothing), also with the head and the loss in chunks of
    positions; the one that adds less time (NOTE [Loss over positions in chunks]).

    Raises:
        InfeasibleBudgetError: neither fits; the refusal with the lower minimum.
    """
    try:
        whole = plan_one_process(model, example_inputs, budget, request, cpu_threads=cpu_threads)
    except InfeasibleBudgetError as refused:
        # NOTE [A budget decided from the plain step]: the budget the loss run whole planned for.
        budget, request = budget_decided(budget, request, refused.unplanned_bytes)
        try:
            chunked = _chunked_plan(
                model, example_inputs, budget, request, refused.unplanned_bytes, cpu_threads
            )
        except InfeasibleBudgetError as error:
            raise min(refused, error, key=lambda e: e.minimum_bytes) from None
        if chunked is None:
            raise
        if isinstance(chunked, str):
            raise InfeasibleBudgetError(
                f"{refused}; {chunked}",
                budget_bytes=refused.budget_bytes,
                minimum_bytes=refused.minimum_bytes,
                bound=refused.bound,
                unplanned_bytes=refused.unplanned_bytes,
            ) from None
        return chunked
    plain = whole.num_micro_batches == 1 and not any(
        segment.recomputed for segment in whole.segments
    )
    if plain:
        return whole
    budget, request = budget_decided(budget, request, whole.unplanned_peak_bytes)
    try:
        chunked = _chunked_plan(
            model, example_inputs, budget, request, whole.unplanned_peak_bytes, cpu_threads
        )
    except InfeasibleBudgetError:
        return whole
    if isinstance(chunked, str):
        return whole.model_copy(update={"notes": [*whole.notes, chunked]})
    if chunked is None or chunked.predicted_extra_s >= whole.predicted_extra_s:
        return whole
    note = (
        f"with the loss run whole the plan adds about {whole.predicted_extra_s * 1e3:.0f} ms "
        f"a step ({whole.num_recomputed} of {len(whole.segments)} segments recomputed)"
    )
    return chunked.model_copy(update={"notes": [*chunked.notes, note]})


def _chunked_plan(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: StepBudget,
    request: PlanRequest,
    unplanned_bytes: int,
    cpu_threads: int,
) -> Plan | str | None:
    """The plan with the head and the loss in chunks of positions; None where the model has
    no head, or its scores are a small part of the plain peak ``unplanned_bytes``; the note
    line saying why where the loss does not add up over positions (or reads more than the
    scores).

    Raises:
        InfeasibleBudgetError: no plan fits with them either.
    """
    if (
        not request.allow_loss_chunks
        or request.loss_fn is None
        or request.use_gradient_checkpointing is not None  # a forced plan is what was asked
    ):
        return None
    try:
        cut = _cut_step(model, example_inputs, request.tracing)
        if cut is None:
            return None
        head, cut_model, traced = cut
        features_shape = _features_shape(cut_model, example_inputs)
    except Exception:  # noqa: BLE001 - the model's own, run without its head
        # The forward reads its head's output itself (a loss computed from ``labels`` inside
        # it, Hugging Face's way): cut before the head it does not run, and nothing of it can
        # be chunked here (the Trainer callback splits such a loss, NOTE [The model's own loss
        # in chunks]).
        return None
    module = model.get_submodule(head.path)
    assert isinstance(module, torch.nn.Linear)
    scores_bytes = (
        math.prod(features_shape[:-1]) * head.logits_features * _itemsize(module, request)
    )
    if scores_bytes < SCORES_SHARE * unplanned_bytes:
        return None
    positions = loss_over_positions(
        module, features_shape, request.example_targets, request.loss_fn, head.slot
    )
    if isinstance(positions, str):
        return (
            f"the head {head.path} and the loss not in chunks of positions: {positions}; a "
            "loss(output, labels) of the head's scores alone, a sum or mean over positions "
            "(labels where the scores are, or a position on), is run in chunks"
        )
    num_chunks = min(
        positions.terms(features_shape),
        max(MIN_LOSS_CHUNKS, -(-scores_bytes // CHUNK_SCORES_BYTES)),
    )
    chunked = ChunkedLoss(request.loss_fn, num_chunks, positions, head.slot)
    chain: TracedModel | ModuleChain = traced or find_module_chain(
        cut_model, example_inputs, why=f"the model cut before its head {head.path}"
    )
    result = plan_one_process(
        cut_model,
        example_inputs,
        budget,
        dataclasses.replace(
            request,
            loss_fn=chunked,
            tracing="fx" if isinstance(chain, TracedModel) else "forward-hooks",
        ),
        cpu_threads=cpu_threads,
        traced=chain,
    )
    held = result.breakdown
    room_bytes = budget.usable_bytes - held.parameters_bytes - held.optimizer_state_bytes
    time_model = calibrate(  # the room plan_one_process calibrated in (NOTE [Time model])
        request.device.type,
        request.device.index,
        max_bytes=max((room_bytes - held.inputs_bytes) // 2, 0),
    )
    extra_s = _chunks_s(time_model, features_shape, head, num_chunks)
    shifted = f", labels {positions.shift} on" if positions.shift else ""
    note = (
        f"the head {head.path} and the loss run in {num_chunks} chunks of positions "
        f"({format_bytes(scores_bytes / num_chunks)} of scores each, {positions.reduction}"
        f"{shifted}), "
        f"each chunk's gradients taken in forward: the whole {format_bytes(scores_bytes)} of "
        f"scores never exist; about {extra_s * 1e3:.1f} ms a step, estimated (NOTE [Time "
        "model]); run steps with autockpt.training_step"
    )
    return result.model_copy(
        update={
            # Measured on the model cut before its head (NOTE [Validation in as few pieces
            # as fit]): not the forward validation runs.
            "forward_pieces": None,
            "loss_chunks": _loss_chunks(head, num_chunks, positions),
            "unplanned_peak_bytes": unplanned_bytes or result.unplanned_peak_bytes,
            "unplanned_step_s": max(result.unplanned_step_s - extra_s, 0.0),
            "predicted_extra_s": result.predicted_extra_s + extra_s,
            "notes": [note, *result.notes],
        }
    )


def _loss_chunks(head: OutputHead, num_chunks: int, positions: LossOverPositions) -> LossChunks:
    return LossChunks(
        head=head.path,
        num_chunks=num_chunks,
        dim=positions.dim,
        reduction=positions.reduction,
        shift=positions.shift,
        leaf=head.leaf,
    )


def _cut_step(
    model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], tracing: Tracing
) -> tuple[OutputHead, torch.nn.Module, TracedModel | None] | None:
    """The model's head, the model cut before it, and its traced graph (``None`` for
    module-level segments, found later); None where the model has no head to cut.

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
            try:
                traced: TracedModel | None = trace_model(model, example_inputs, cut_before=head)
            except TraceError:  # a submodule kept whole that does not run on fake tensors
                traced = None
            if traced is not None and (
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
    # Its module chain is found once the loss is known to chunk: finding it runs the model.
    return head, cut_before_head_module(model, head.path, head.leaf, returns_cut=True), None


def _features_shape(
    cut_model: torch.nn.Module, example_inputs: Sequence[torch.Tensor]
) -> tuple[int, ...]:
    """The shape of the head's input at the training batch, from a forward on fake tensors."""
    mode = PlanningFakeMode()
    copied = fake_copy(cut_model, mode)
    with mode, torch.no_grad():
        inputs = tree_map_only(torch.Tensor, mode.from_tensor, list(example_inputs))
        features = copied(*inputs)[0]
    return tuple(int(size) for size in features.shape)


def _itemsize(head: torch.nn.Linear, request: PlanRequest) -> int:
    dtype = request.autocast_dtype or head.weight.dtype
    return torch.empty((), dtype=dtype).element_size()


def _chunks_s(
    time_model: TimeModel, features_shape: Sequence[int], head: OutputHead, num_chunks: int
) -> float:
    """Seconds the chunks add to a step, by the time model (NOTE [Time model]): the scores are
    computed once either way (NOTE [Gradients in forward]), but each chunk reads and writes the
    weight's gradient buffer once more, and runs its few ops."""
    weight_bytes = 4.0 * features_shape[-1] * head.logits_features
    return time_model.seconds(
        flops=0.0, moved_bytes=2.0 * weight_bytes * num_chunks, num_ops=10.0 * num_chunks
    )


def chunked_loss_of(plan: Plan, loss_fn: object, slot: OutputSlot | None) -> ChunkedLoss:
    """The loss :func:`autockpt.training_step` runs for a plan with ``plan.loss_chunks``,
    the scores put in ``slot`` of the model's output for ``loss_fn``."""
    chunks = plan.loss_chunks
    assert chunks is not None
    return ChunkedLoss(
        loss_fn,  # type: ignore[arg-type]
        chunks.num_chunks,
        LossOverPositions(chunks.dim, chunks.reduction, chunks.shift),
        slot,
    )
