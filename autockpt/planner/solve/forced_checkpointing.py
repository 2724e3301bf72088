"""``use_gradient_checkpointing=True/False``: every segment recomputed, or none, whatever the
budget. The plan still reports its measured peak and the minimum the planner could reach."""

from __future__ import annotations

from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.measure.step_measurer import StepMeasurer
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_decoding import ChosenPlan, Decision
from autockpt.planner.solve.chain_positions import Profiles
from autockpt.planner.solve.chain_solver import minimum_peak
from autockpt.planner.trace.module_chain import ModuleChain


def forced_plan(measurer: StepMeasurer, builder: ChainBuilder, *, recompute: bool) -> ChosenPlan:
    """Every segment recomputed (``recompute``), but those kept by in-place writes, or none.

    On a module chain, recomputing its spans whole replaces recomputing each link where that
    peaks lower (NOTE [Module spans]: links recomputed one by one may save nothing).
    """
    traced = measurer.traced
    kept = measurer.kept
    every = [SegmentAction(recompute=not s.keep_reason) for s in traced.segments]
    # The plan's own step is measured; a simulated one serves the chain's minimum only
    # (NOTE [Recompute simulated]).
    recomputed = (
        measurer.measure(traced.segments, every)
        if recompute
        else measurer.all_recomputed(traced.segments)
    )
    whole = Profiles(kept, recomputed)
    forced = list(traced.segments)
    spans = [(i, i + 1) for i in range(len(forced))]
    if recompute and isinstance(traced, ModuleChain) and len(traced.regions) < len(forced):
        in_spans = measurer.all_recomputed(traced.region_segments)
        if in_spans.peak_bytes < recomputed.peak_bytes:
            forced, spans, recomputed = list(traced.region_segments), list(traced.regions), in_spans
    decision = Decision(
        forced,
        [SegmentAction(recompute=recompute and not s.keep_reason) for s in forced],
        [
            f"kept: {s.keep_reason}"
            if recompute and s.keep_reason
            else "forced by use_gradient_checkpointing"
            for s in forced
        ],
        1,
        spans,
    )
    return ChosenPlan(
        decision=decision,
        profile=recomputed if recompute else kept,
        whole=whole,
        minimum_peak_bytes=minimum_peak(builder.chain(whole, None, 1, None)).peak_bytes,
    )
