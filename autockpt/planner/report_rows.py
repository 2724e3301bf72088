"""What a Plan reports from the decision the planner made: its segment rows, the breakdown of
its peak and its bytes across the step (the seconds it adds:
:mod:`autockpt.planner.solve.option_pricing`)."""

from __future__ import annotations

from collections.abc import Sequence

from autockpt.planner.plan_types import PeakBreakdown, SegmentPlan, StepTimeline
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_decoding import Decision
from autockpt.planner.solve.chain_positions import Profiles
from autockpt.planner.solve.chain_terms import kept_increments
from autockpt.planner.solve.option_pricing import recompute_s_of


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
                boundary_bytes=builder.positions.boundary_bytes(whole, first, end),
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


def peak_breakdown(
    profile: StepProfile, context_bytes: int, headroom_bytes: int, *, context_measured: bool
) -> PeakBreakdown:
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
        context_measured=context_measured,
    )


#: Points a :class:`~autockpt.planner.plan_types.StepTimeline` keeps at most.
TIMELINE_POINTS = 400


def step_timeline(profile: StepProfile, recomputed: Sequence[bool]) -> StepTimeline | None:
    """``profile``'s bytes across the step, down to ``TIMELINE_POINTS`` points, each the
    highest of its ops; ``recomputed`` says which of its segments recompute. None where the
    profile has no timeline (read off a line, NOTE [Scaled real measurement])."""
    ops = profile.timeline
    if not ops:
        return None
    per_point = -(-len(ops) // TIMELINE_POINTS)
    heights: list[int] = []
    phases: list[tuple[str, int, int]] = []
    shaded: list[tuple[int, int]] = []
    for index, start in enumerate(range(0, len(ops), per_point)):
        # The point is its highest op: its bytes, and the phase and segment it ran in.
        top, phase, segment = max(ops[start : start + per_point], key=lambda op: op[0])
        heights.append(top)
        if phases and phases[-1][0] == phase:
            phases[-1] = (phase, phases[-1][1], index)
        else:
            phases.append((phase, index, index))
        inside = phase == "backward" and 0 <= segment < len(recomputed) and recomputed[segment]
        if inside and shaded and shaded[-1][1] == index - 1:
            shaded[-1] = (shaded[-1][0], index)
        elif inside:
            shaded.append((index, index))
    return StepTimeline(bytes=heights, phases=phases, recomputed=shaded)
