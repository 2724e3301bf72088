"""Where the chain's levels start: the positions at which a unit or a region begins, which of
the separability probe's entries a run of positions is, and what a run keeps alive.

The chain's positions are the segments; units and regions are runs of them (NOTE [Chain
levels] in :mod:`autockpt.planner.solve.chain_builder`). Building a chain and decoding the
solver's answer both ask these questions of the same traced model.
"""

from __future__ import annotations

from dataclasses import dataclass

from autockpt.planner.measure.separability import Separability
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_terms import kept_increments
from autockpt.planner.trace.fx_graph import Segment, TracedModel
from autockpt.planner.trace.module_chain import ModuleChain


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


class ChainPositions:
    """The units and regions of a traced model (or a module chain), by their first position."""

    def __init__(self, traced: TracedModel | ModuleChain) -> None:
        self.traced = traced
        #: ``first position -> (region index, end position)``.
        self.region_at = {start: (i, end) for i, (start, end) in enumerate(traced.regions)}
        # Units of several segments (NOTE [Chain levels]); a module chain has none.
        units = traced.units if isinstance(traced, TracedModel) else ()
        #: ``first position -> (unit index, end position)``, for units of several segments.
        self.unit_at = {start: (i, end) for i, (start, end) in enumerate(units) if end - start > 1}

    def batch_dims(
        self, first: int, end: int, separability: Separability | None
    ) -> tuple[int | None, ...] | None:
        """Where the inputs of positions ``first..end-1`` carry the batch, if the probe found
        them batch-separable (their inputs can then be cut for timing, and chunked)."""
        probed = self.probed_index(first, end)
        if probed is None or separability is None or not separability.chunkable[probed]:
            return None
        return separability.input_batch_dims[probed]

    def probed_index(self, first: int, end: int) -> int | None:
        """Which of the separability probe's entries positions ``first..end-1`` are: a region
        of a traced model, a link of a module chain (NOTE [Module chain])."""
        if isinstance(self.traced, ModuleChain):
            return first if end == first + 1 else None
        region, region_end = self.region_at.get(first, (None, None))
        return region if region_end == end else None

    def own_region(self, index: int) -> int | None:
        """The region index of segment ``index`` if that region holds it alone, else None."""
        region, end = self.region_at.get(index, (None, None))
        return region if end == index + 1 else None

    def boundary_bytes(self, whole: Profiles, first: int, end: int) -> int:
        """Bytes chain positions ``first..end-1`` keep alive when recomputed as one unit."""
        region, region_end = self.region_at.get(first, (None, None))
        if whole.regions is not None and region is not None and region_end == end:
            return max(kept_increments(whole.regions)[region], 0)
        unit, unit_end = self.unit_at.get(first, (None, None))
        if whole.units is not None and unit is not None and unit_end == end:
            return max(kept_increments(whole.units)[unit], 0)
        if whole.recomputed is not None:
            return max(kept_increments(whole.recomputed)[end - 1], 0)
        # Never measured recomputed: its inputs and outputs are what it would keep.
        segment = whole.kept.segments[end - 1]
        return segment.input_bytes + segment.output_bytes


def unit_segments(traced: TracedModel | ModuleChain) -> tuple[Segment, ...] | None:
    """The units as segments where some unit spans several segments (NOTE [Chain levels]),
    else ``None``: the units are the segments, and need no profile of their own."""
    if isinstance(traced, TracedModel) and len(traced.unit_segments) < len(traced.segments):
        return traced.unit_segments
    return None
