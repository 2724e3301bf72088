"""From measured profiles to the solver's chain, and from the solver's answer back to actions.

NOTE [Chain levels]
The chain's positions are the traced model's segments (NOTE [Cut points] in
:mod:`autockpt.planner.trace.cut_points`). Each position can be kept or recomputed on its own, with
the numbers of the all-kept and all-recomputed profiles (NOTE [Chain memory model]); one that writes
its own input in place is only kept (NOTE [In-place writes]). Where a unit of several segments
starts (in-place writes cut units finer), an option spans the whole unit: recompute it as one, with
the numbers of the profile in which every unit is recomputed whole, so that cutting finer never
loses a plan the units alone allowed. A segment of a traced model can also rebuild only its cheap
ops, with the numbers of the profile in which every such segment does (NOTE [Selective recompute]).
Where a region (a run of units with a small outer boundary) starts, two more kinds of option span
the whole region: recompute it as one, with the numbers of the profile in which every region is
recomputed whole, and, if the region is batch-separable, recompute it in ``k`` chunks. Chunk numbers
are scaled from the whole-region ones: interiors shrink by ``k``, the boundary and its gradient do
not; the plan's final measurement checks the result. Every option's seconds come from the step costs
of :mod:`autockpt.planner.timing.time_model`: estimated until the solver is about to choose the
option, then timed on the real model where it can be (NOTE [Timed options]).
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass

import torch.fx as fx

from autockpt.planner.measure.separability import Separability
from autockpt.planner.measure.step_profile import StepProfile
from autockpt.planner.runtime.segment_runners import KEEP, SegmentAction
from autockpt.planner.runtime.selective_recompute import SELECTIVE
from autockpt.planner.solve.chain_solver import Chain, Option, Solution
from autockpt.planner.solve.chain_terms import (
    batch_pieces,
    extrapolate,
    kept_increments,
    option_at,
    piece_share,
    profile_terms,
)
from autockpt.planner.timing.time_model import Cost, StepCosts
from autockpt.planner.trace.fx_graph import Segment, TracedModel, segments_from_node_lists
from autockpt.planner.trace.module_chain import ModuleChain, module_segments

#: Chunk counts the planner may give a batch-separable region.
CHUNK_CHOICES = (2, 4, 8, 16, 32)

_CHUNKS = re.compile(r"in (\d+) chunks$")


@dataclass(frozen=True)
class Profiles:
    """The measured steps a chain is built from (at one batch size).

    Attributes:
        kept: every segment kept.
        recomputed: every segment recomputed on its own; ``None`` when the kept profile already
            shows that plain recompute cannot fit (see :func:`recompute_lower_bound_bytes`):
            a segment then gets a plain recompute option only where it is a region of its own.
        regions: every region recomputed whole; ``None`` until region options are needed.
        units: every unit recomputed whole (NOTE [Chain levels]); ``None`` where the units
            are the segments, or until plain recompute is measured.
        selective: every segment that may be recomputed selectively so recomputed
            (NOTE [Selective recompute]); ``None`` until plain recompute is measured, or where
            no segment may.
    """

    kept: StepProfile
    recomputed: StepProfile | None
    regions: StepProfile | None = None
    units: StepProfile | None = None
    selective: StepProfile | None = None


@dataclass(frozen=True)
class Decision:
    """A solver answer turned into what to run: segments (regions merged) and their actions."""

    segments: list[Segment]
    actions: list[SegmentAction]
    reasons: list[str]
    num_micro_batches: int
    spans: list[tuple[int, int]]
    """For each segment run, the chain positions ``(first, end)`` it covers."""


class ChainBuilder:
    """Builds chains from profiles and decodes solutions (see the module docstring)."""

    def __init__(
        self, traced: TracedModel | ModuleChain, costs: StepCosts, batch_size: int
    ) -> None:
        self.traced = traced
        self.costs = costs
        self.batch_size = batch_size
        # What each estimated option's cost waits on, by (pieces, position, label, span).
        self._timings: dict[tuple[int, int, str, int], Hashable] = {}
        self._region_at = {start: (i, end) for i, (start, end) in enumerate(traced.regions)}
        # Units of several segments (NOTE [Chain levels]); a module chain has none.
        units = traced.units if isinstance(traced, TracedModel) else ()
        self._unit_at = {start: (i, end) for i, (start, end) in enumerate(units) if end - start > 1}
        #: The segments offered a selective recompute (NOTE [Selective recompute]); the
        #: planner sets them once it measures such recomputes.
        self.selective: frozenset[int] = frozenset()

    def micro_batch_s(self, num_micro_batches: int) -> float:
        """Seconds that splitting the step into ``num_micro_batches`` adds, as known now."""
        return self.costs.micro_batch_s(num_micro_batches).seconds

    def time_choice(self, chain: Chain, solution: Solution, num_micro_batches: int) -> bool:
        """Time the estimated costs ``solution`` rests on (NOTE [Timed options]).

        Returns:
            Whether anything was timed: the chains' costs changed and the solver must run again.
        """
        wanted = [self.costs.micro_batch_s(num_micro_batches).timing]
        for position, index in enumerate(solution.choice):
            if index >= 0:
                option = chain.options[position][index]
                key = (num_micro_batches, position, option.label, option.span)
                wanted.append(self._timings.get(key))
        return self.costs.take([timing for timing in wanted if timing is not None])

    def _cost_s(self, cost: Cost, pieces: int, position: int, label: str, span: int = 1) -> float:
        """``cost``'s seconds, remembering what timing would replace them (NOTE [Timed options])."""
        if cost.timing is not None:
            self._timings[(pieces, position, label, span)] = cost.timing
        return cost.seconds

    def chain(
        self,
        whole: Profiles,
        half: Profiles | None,
        num_micro_batches: int,
        separability: Separability | None,
    ) -> Chain:
        """The chain at ``num_micro_batches`` pieces (fitted from the half-batch profiles)."""
        k_terms = profile_terms(whole.kept)
        r_terms = profile_terms(whole.recomputed) if whole.recomputed is not None else None
        g_terms = profile_terms(whole.regions) if whole.regions is not None else None
        u_terms = profile_terms(whole.units) if whole.units is not None else None
        s_terms = profile_terms(whole.selective) if whole.selective is not None else None
        if num_micro_batches > 1:
            assert half is not None
            half_share = piece_share(self.batch_size, 2)
            share = piece_share(self.batch_size, num_micro_batches)
            k_terms = extrapolate(k_terms, profile_terms(half.kept), half_share, share)
            if r_terms is not None and half.recomputed is not None:
                r_terms = extrapolate(r_terms, profile_terms(half.recomputed), half_share, share)
            if g_terms is not None and half.regions is not None:
                g_terms = extrapolate(g_terms, profile_terms(half.regions), half_share, share)
            if u_terms is not None and half.units is not None:
                u_terms = extrapolate(u_terms, profile_terms(half.units), half_share, share)
            if s_terms is not None and half.selective is not None:
                s_terms = extrapolate(s_terms, profile_terms(half.selective), half_share, share)
        options = []
        for index, segment in enumerate(self.traced.segments):
            cost = self.costs.recompute_s(
                index,
                index + 1,
                pieces=num_micro_batches,
                input_batch_dims=self._batch_dims(index, index + 1, separability),
            )
            cost_s = self._cost_s(cost, num_micro_batches, index, "recompute")
            segment_options = [option_at("keep", k_terms, index, 0.0)]
            # One with a keep reason is kept whatever the budget (NOTE [In-place writes]).
            recomputable = not segment.keep_reason
            if recomputable and r_terms is not None:
                segment_options.append(option_at("recompute", r_terms, index, cost_s))
            elif recomputable and g_terms and (own := self._own_region(index)) is not None:
                # A region of one segment: the region profile recomputed it on its own.
                segment_options.append(option_at("recompute", g_terms, own, cost_s))
            if s_terms is not None and index in self.selective:
                cost = self.costs.recompute_s(index, index + 1, selective=True)
                cost_s = self._cost_s(cost, num_micro_batches, index, SELECTIVE)
                segment_options.append(option_at(SELECTIVE, s_terms, index, cost_s))
            if isinstance(self.traced, ModuleChain) and recomputable and r_terms is not None:
                # A link runs in chunks on its own (NOTE [Module chain]), never in a span.
                segment_options += self._chunk_options(
                    index,
                    index + 1,
                    segment_options[-1],
                    r_terms["io"][index],
                    num_micro_batches,
                    separability,
                )
            if u_terms is not None and index in self._unit_at:
                segment_options += self._unit_options(index, u_terms, num_micro_batches)
            if g_terms is not None and index in self._region_at:
                segment_options += self._region_options(
                    index, g_terms, num_micro_batches, separability
                )
            options.append(tuple(segment_options))
        loss = max(
            k_terms["loss"][0],
            *(t["loss"][0] for t in (r_terms, g_terms, u_terms, s_terms) if t),
        )
        return Chain(
            start_bytes=int(k_terms["start"][0]),
            options=tuple(options),
            loss_bytes=int(loss),
            fixed_peak_bytes=int(k_terms["optimizer"][0]),
        )

    def _batch_dims(
        self, first: int, end: int, separability: Separability | None
    ) -> tuple[int | None, ...] | None:
        """Where the inputs of positions ``first..end-1`` carry the batch, if the probe found
        them batch-separable (their inputs can then be cut for timing, and chunked)."""
        probed = self._probed_index(first, end)
        if probed is None or separability is None or not separability.chunkable[probed]:
            return None
        return separability.input_batch_dims[probed]

    def _probed_index(self, first: int, end: int) -> int | None:
        """Which of the separability probe's entries positions ``first..end-1`` are: a region
        of a traced model, a link of a module chain (NOTE [Module chain])."""
        if isinstance(self.traced, ModuleChain):
            return first if end == first + 1 else None
        region, region_end = self._region_at.get(first, (None, None))
        return region if region_end == end else None

    def _own_region(self, index: int) -> int | None:
        """The region index of segment ``index`` if that region holds it alone, else None."""
        region, end = self._region_at.get(index, (None, None))
        return region if end == index + 1 else None

    def _unit_options(
        self, index: int, terms: dict[str, list[float]], num_micro_batches: int
    ) -> list[Option]:
        """Recompute the unit of several segments that starts at ``index`` as one."""
        unit, end = self._unit_at[index]
        assert isinstance(self.traced, TracedModel), "only fx chains have units"
        if self.traced.unit_segments[unit].keep_reason:
            return []
        cost = self.costs.recompute_s(index, end, pieces=num_micro_batches)
        cost_s = self._cost_s(cost, num_micro_batches, index, "recompute", end - index)
        return [option_at("recompute", terms, unit, cost_s, span=end - index)]

    def boundary_bytes(self, whole: Profiles, first: int, end: int) -> int:
        """Bytes chain positions ``first..end-1`` keep alive when recomputed as one unit."""
        region, region_end = self._region_at.get(first, (None, None))
        if whole.regions is not None and region is not None and region_end == end:
            return max(kept_increments(whole.regions)[region], 0)
        unit, unit_end = self._unit_at.get(first, (None, None))
        if whole.units is not None and unit is not None and unit_end == end:
            return max(kept_increments(whole.units)[unit], 0)
        if whole.recomputed is not None:
            return max(kept_increments(whole.recomputed)[end - 1], 0)
        # Never measured recomputed: its inputs and outputs are what it would keep.
        segment = whole.kept.segments[end - 1]
        return segment.input_bytes + segment.output_bytes

    def _region_options(
        self,
        index: int,
        terms: dict[str, list[float]],
        num_micro_batches: int,
        separability: Separability | None,
    ) -> list[Option]:
        region, end = self._region_at[index]
        if self.traced.region_segments[region].keep_reason:
            return []
        span = end - index
        dims = self._batch_dims(index, end, separability)
        cost = self.costs.recompute_s(index, end, pieces=num_micro_batches, input_batch_dims=dims)
        cost_s = self._cost_s(cost, num_micro_batches, index, "recompute region", span)
        whole = option_at("recompute region", terms, region, cost_s, span=span)
        options = [whole] if span > 1 else []
        if isinstance(self.traced, ModuleChain):
            return options  # a span never runs in chunks
        return options + self._chunk_options(
            index, end, whole, terms["io"][region], num_micro_batches, separability
        )

    def _chunk_options(
        self,
        index: int,
        end: int,
        whole: Option,
        boundary: float,
        num_micro_batches: int,
        separability: Separability | None,
    ) -> list[Option]:
        """Positions ``index..end-1`` recomputed in ``k`` chunks, scaled from ``whole`` (their
        recompute as one), where the probe found them batch-separable."""
        dims = self._batch_dims(index, end, separability)
        if dims is None:
            return []
        # Every piece of the batch must split into whole samples.
        piece_sizes = {len(p) for p in batch_pieces(self.batch_size, max(num_micro_batches, 1))}
        options = []
        for chunks in CHUNK_CHOICES:
            if chunks > min(piece_sizes):
                break
            if any(size % chunks for size in piece_sizes):
                # Chunks must hold whole samples (a variable-major dim holds B * T rows).
                continue
            # Interiors shrink with the chunk; the boundary and its gradients do not.
            forward = boundary + max(whole.forward_bytes - boundary, 0) / chunks
            backward = 2 * boundary + max(whole.backward_bytes - 2 * boundary, 0) / chunks
            label = f"recompute region in {chunks} chunks"
            cost = self.costs.recompute_s(
                index, end, chunks=chunks, pieces=num_micro_batches, input_batch_dims=dims
            )
            options.append(
                Option(
                    label=label,
                    kept_bytes=whole.kept_bytes,
                    forward_bytes=int(forward),
                    backward_bytes=int(backward),
                    extra_s=self._cost_s(cost, num_micro_batches, index, label, end - index),
                    span=end - index,
                )
            )
        return options

    def kept_decision(self) -> Decision:
        """The plain step: every segment kept, one piece."""
        segments = list(self.traced.segments)
        return Decision(
            segments=segments,
            actions=[KEEP] * len(segments),
            reasons=["keep"] * len(segments),
            num_micro_batches=1,
            spans=[(i, i + 1) for i in range(len(segments))],
        )

    def decode(
        self,
        chain: Chain,
        solution: Solution,
        separability: Separability | None,
        num_micro_batches: int,
    ) -> Decision:
        """The segments to run (regions merged where an option spans them) and their actions."""
        node_lists: list[tuple[str, ...]] = []
        actions, reasons, spans = [], [], []
        position = 0
        while position < len(chain.options):
            option = chain.options[position][solution.choice[position]]
            end = position + option.span
            node_lists.append(
                tuple(n for s in self.traced.segments[position:end] for n in s.node_names)
            )
            chunks = int(match.group(1)) if (match := _CHUNKS.search(option.label)) else 1
            input_dims: tuple[int | None, ...] = ()
            output_dims: tuple[int, ...] = ()
            if chunks > 1:
                probed = self._probed_index(position, end)
                assert separability is not None and probed is not None, "chunks need the probe"
                input_dims = separability.input_batch_dims[probed]
                output_dims = separability.output_batch_dims[probed]
            actions.append(
                SegmentAction(
                    recompute=option.label != "keep",
                    num_chunks=chunks,
                    input_batch_dims=input_dims,
                    output_batch_dims=output_dims,
                    selective=option.label == SELECTIVE,
                )
            )
            reasons.append(option.label)
            spans.append((position, end))
            position = end
        if all(end - first == 1 for first, end in spans):
            segments = [self.traced.segments[first] for first, _ in spans]
        elif isinstance(self.traced, ModuleChain):
            groups = [
                [s.module_paths[0] for s in self.traced.segments[first:end]] for first, end in spans
            ]
            segments = list(module_segments(groups))
        else:
            graph: fx.Graph = self.traced.graph_module.graph
            segments = list(segments_from_node_lists(graph, node_lists))
        return Decision(segments, actions, reasons, num_micro_batches, spans)


def unit_segments(traced: TracedModel | ModuleChain) -> tuple[Segment, ...] | None:
    """The units as segments where some unit spans several segments (NOTE [Chain levels]),
    else ``None``: the units are the segments, and need no profile of their own."""
    if isinstance(traced, TracedModel) and len(traced.unit_segments) < len(traced.segments):
        return traced.unit_segments
    return None
