"""What a Plan reports from the decision the planner made: its segment rows, the seconds it
adds, and the breakdown of its peak."""

from __future__ import annotations

from autockpt.planner.measure.step_profile import StepProfile
from autockpt.planner.plan_types import PeakBreakdown, SegmentPlan
from autockpt.planner.runtime.segment_runners import SegmentAction
from autockpt.planner.solve.chain_builder import ChainBuilder, Decision, Profiles
from autockpt.planner.solve.chain_terms import kept_increments
from autockpt.planner.timing.time_model import StepCosts, timed_s


def decision_extra_s(builder: ChainBuilder, decision: Decision) -> float:
    """The seconds ``decision`` adds to the step, as the costs know them now."""
    extra_s = builder.micro_batch_s(decision.num_micro_batches)
    for action, (first, end) in zip(decision.actions, decision.spans, strict=True):
        if action.recompute:
            extra_s += recompute_s_of(builder.costs, first, end, action, decision)
    return extra_s


def segment_rows(builder: ChainBuilder, whole: Profiles, decision: Decision) -> list[SegmentPlan]:
    """Report rows: each run segment (a merged region counts as one) with its numbers."""
    kept_terms = kept_increments(whole.kept)
    plans = []
    for segment, action, reason, (first, end) in zip(
        decision.segments, decision.actions, decision.reasons, decision.spans, strict=True
    ):
        plans.append(
            SegmentPlan(
                name=segment.name,
                nodes=list(segment.node_names),
                modules=list(segment.module_paths),
                inputs=list(segment.input_names),
                outputs=list(segment.output_names),
                saved_bytes=max(sum(kept_terms[first:end]), 0),
                boundary_bytes=builder.boundary_bytes(whole, first, end),
                recompute_s=recompute_s_of(builder.costs, first, end, action, decision),
                recomputed=action.recompute,
                num_chunks=action.num_chunks,
                input_batch_dims=list(action.input_batch_dims),
                output_batch_dims=list(action.output_batch_dims),
                selective=action.selective,
                reason=reason,
            )
        )
    return plans


def recompute_s_of(
    costs: StepCosts, first: int, end: int, action: SegmentAction, decision: Decision
) -> float:
    """What the run's action adds to a step, timed where it can be; for a kept run, what a
    plain recompute of it would add (NOTE [Timed options])."""
    if not action.recompute:
        return costs.recompute_s(first, end).seconds
    chunked = action.num_chunks > 1
    return timed_s(
        costs,
        first,
        end,
        chunks=action.num_chunks,
        pieces=decision.num_micro_batches,
        input_batch_dims=action.input_batch_dims if chunked else None,
        selective=action.selective,
    )


def peak_breakdown(profile: StepProfile, context_bytes: int, headroom_bytes: int) -> PeakBreakdown:
    end_of_forward = max((s.end_bytes for s in profile.segments), default=profile.start_bytes)
    activations = max(end_of_forward - profile.start_bytes, 0)
    known = (
        profile.parameter_bytes
        + profile.gradient_bytes
        + profile.optimizer_state_bytes
        + profile.input_bytes
        + activations
    )
    return PeakBreakdown(
        parameters_bytes=profile.parameter_bytes,
        gradients_bytes=profile.gradient_bytes,
        optimizer_state_bytes=profile.optimizer_state_bytes,
        inputs_bytes=profile.input_bytes,
        activations_bytes=activations,
        transient_bytes=max(profile.peak_bytes - known, 0),
        context_bytes=context_bytes,
        headroom_bytes=headroom_bytes,
    )
