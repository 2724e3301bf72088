"""From the solver's answer back to what to run: the segments (regions merged where an option
spans them) and each one's action; and what planning chose in the end, for the report."""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from autockpt.planner.core.decisions import KEEP, SegmentAction
from autockpt.planner.measure.separability import Separability
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_positions import ChainPositions, Profiles
from autockpt.planner.solve.chain_solver import Chain, Solution
from autockpt.planner.trace.fx_graph import Segment, TracedModel, segments_from_node_lists
from autockpt.planner.trace.module_chain import ModuleChain, module_segments


@dataclass(frozen=True)
class Decision:
    """A solver answer turned into what to run: segments (regions merged) and their actions."""

    segments: list[Segment]
    actions: list[SegmentAction]
    reasons: list[str]
    num_micro_batches: int
    spans: list[tuple[int, int]]
    """For each segment run, the chain positions ``(first, end)`` it covers."""


def kept_decision(traced: TracedModel | ModuleChain) -> Decision:
    """The plain step: every segment kept, one piece."""
    segments = list(traced.segments)
    return Decision(
        segments=segments,
        actions=[KEEP] * len(segments),
        reasons=["keep"] * len(segments),
        num_micro_batches=1,
        spans=[(i, i + 1) for i in range(len(segments))],
    )


def decode(
    positions: ChainPositions,
    chain: Chain,
    solution: Solution,
    separability: Separability | None,
    num_micro_batches: int,
) -> Decision:
    """The segments to run (regions merged where an option spans them) and their actions."""
    traced = positions.traced
    node_lists: list[tuple[str, ...]] = []
    actions, reasons, spans = [], [], []
    position = 0
    while position < len(chain.options):
        option = chain.options[position][solution.choice[position]]
        end = position + option.span
        node_lists.append(tuple(n for s in traced.segments[position:end] for n in s.node_names))
        chunks = option.action.num_chunks
        input_dims: tuple[int | None, ...] = ()
        output_dims: tuple[int, ...] = ()
        if chunks > 1:
            probed = positions.probed_index(position, end)
            assert separability is not None and probed is not None, "chunks need the probe"
            input_dims = separability.input_batch_dims[probed]
            output_dims = separability.output_batch_dims[probed]
        actions.append(
            SegmentAction(
                recompute=option.action.recompute,
                num_chunks=chunks,
                input_batch_dims=input_dims,
                output_batch_dims=output_dims,
                selective=option.action.selective,
            )
        )
        reasons.append(option.label)
        spans.append((position, end))
        position = end
    if all(end - first == 1 for first, end in spans):
        segments = [traced.segments[first] for first, _ in spans]
    elif isinstance(traced, ModuleChain):
        groups = [[s.module_paths[0] for s in traced.segments[first:end]] for first, end in spans]
        segments = list(module_segments(groups))
    else:
        graph: fx.Graph = traced.graph_module.graph
        segments = list(segments_from_node_lists(graph, node_lists))
    return Decision(segments, actions, reasons, num_micro_batches, spans)


@dataclass(frozen=True)
class ChosenPlan:
    """What planning chose, with what the plan's report reads.

    Attributes:
        decision: the segments to run and their actions.
        profile: the decision's step measured on fake tensors: its peak is the predicted one.
        whole: the whole-batch profiles the report's rows read.
        minimum_peak_bytes: the lowest peak planning found (tensor bytes).
        timed_extra_s: the seconds the plan added when timed whole against the plain step
            (NOTE [Whole-plan timing]); ``None`` where it was not timed whole.
        timed_plain_s: the plain step's seconds in the same rounds, its optimizer step
            added; ``None`` where the plan was not timed whole.
        minimum_searched: which options the minimum is the lowest of (NOTE [One minimum]).
    """

    decision: Decision
    profile: StepProfile
    whole: Profiles
    minimum_peak_bytes: int
    timed_extra_s: float | None = None
    timed_plain_s: float | None = None
    minimum_searched: str = "every option"
