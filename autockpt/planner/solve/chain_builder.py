"""From measured profiles to the solver's chain: each position's options and their numbers.

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
not; the plan's final measurement checks the result. Every option's seconds come from
:mod:`autockpt.planner.solve.option_pricing` (NOTE [Timed options]); where units and regions start,
from :mod:`autockpt.planner.solve.chain_positions`; the solver's answer is turned back into segments
and actions by :mod:`autockpt.planner.solve.chain_decoding`.
"""

from __future__ import annotations

from autockpt.planner.core.decisions import (
    KEEP_OPTION,
    RECOMPUTE_OPTION,
    REGION_OPTION,
    SELECTIVE_OPTION,
    OptionAction,
)
from autockpt.planner.measure.separability import Separability
from autockpt.planner.solve.chain_positions import ChainPositions, Profiles
from autockpt.planner.solve.chain_solver import Chain, Option
from autockpt.planner.solve.chain_terms import (
    batch_pieces,
    extrapolate,
    option_at,
    piece_share,
    profile_terms,
)
from autockpt.planner.solve.option_pricing import OptionPricing
from autockpt.planner.timing.time_model import StepCosts
from autockpt.planner.trace.fx_graph import Segment, TracedModel
from autockpt.planner.trace.module_chain import ModuleChain

#: Chunk counts the planner may give a batch-separable region.
CHUNK_CHOICES = (2, 4, 8, 16, 32)

#: A profile's per-position terms (:func:`~autockpt.planner.solve.chain_terms.profile_terms`).
Terms = dict[str, list[float]]


class ChainBuilder:
    """Builds the solver's chain from profiles (see the module docstring)."""

    def __init__(
        self, traced: TracedModel | ModuleChain, costs: StepCosts, batch_size: int
    ) -> None:
        self.traced = traced
        self.batch_size = batch_size
        self.positions = ChainPositions(traced)
        self.pricing = OptionPricing(costs)
        #: The segments offered a selective recompute (NOTE [Selective recompute]); the
        #: planner sets them once it measures such recomputes.
        self.selective: frozenset[int] = frozenset()

    @property
    def costs(self) -> StepCosts:
        """The step costs the options are priced with (estimated, or timed where it can be)."""
        return self.pricing.costs

    @costs.setter
    def costs(self, costs: StepCosts) -> None:
        self.pricing.costs = costs

    def chain(
        self,
        whole: Profiles,
        half: Profiles | None,
        num_micro_batches: int,
        separability: Separability | None,
    ) -> Chain:
        """The chain at ``num_micro_batches`` pieces (fitted from the half-batch profiles)."""
        terms = self._terms(whole, half, num_micro_batches)
        options = tuple(
            tuple(self._options(index, segment, terms, num_micro_batches, separability))
            for index, segment in enumerate(self.traced.segments)
        )
        kept = terms["kept"]
        assert kept is not None
        loss = max(t["loss"][0] for t in terms.values() if t)
        return Chain(
            start_bytes=int(kept["start"][0]),
            options=options,
            loss_bytes=int(loss),
            fixed_peak_bytes=int(kept["optimizer"][0]),
        )

    def _terms(
        self, whole: Profiles, half: Profiles | None, num_micro_batches: int
    ) -> dict[str, Terms | None]:
        """Each profile's terms at ``num_micro_batches`` pieces, by the profile's field name."""
        names = ("kept", "recomputed", "regions", "units", "selective")
        terms: dict[str, Terms | None] = {}
        for name in names:
            profile = getattr(whole, name)
            terms[name] = profile_terms(profile) if profile is not None else None
        if num_micro_batches == 1:
            return terms
        assert half is not None
        half_share = piece_share(self.batch_size, 2)
        share = piece_share(self.batch_size, num_micro_batches)
        for name in names:
            at_half, whole_terms = getattr(half, name), terms[name]
            if whole_terms is not None and at_half is not None:
                terms[name] = extrapolate(whole_terms, profile_terms(at_half), half_share, share)
        return terms

    def _options(
        self,
        index: int,
        segment: Segment,
        terms: dict[str, Terms | None],
        num_micro_batches: int,
        separability: Separability | None,
    ) -> list[Option]:
        """What chain position ``index`` may do: keep, recompute (alone, selectively, in chunks),
        or start a unit or region recomputed as one."""
        k_terms, r_terms, g_terms = terms["kept"], terms["recomputed"], terms["regions"]
        u_terms, s_terms = terms["units"], terms["selective"]
        assert k_terms is not None
        cost = self.costs.recompute_s(
            index,
            index + 1,
            pieces=num_micro_batches,
            input_batch_dims=self.positions.batch_dims(index, index + 1, separability),
        )
        cost_s = self.pricing.cost_s(cost, num_micro_batches, index, RECOMPUTE_OPTION)
        segment_options = [option_at(KEEP_OPTION, k_terms, index, 0.0)]
        # One with a keep reason is kept whatever the budget (NOTE [In-place writes]).
        recomputable = not segment.keep_reason
        if recomputable and r_terms is not None:
            segment_options.append(option_at(RECOMPUTE_OPTION, r_terms, index, cost_s))
        elif recomputable and g_terms and (own := self.positions.own_region(index)) is not None:
            # A region of one segment: the region profile recomputed it on its own.
            segment_options.append(option_at(RECOMPUTE_OPTION, g_terms, own, cost_s))
        if s_terms is not None and index in self.selective:
            cost = self.costs.recompute_s(index, index + 1, selective=True)
            cost_s = self.pricing.cost_s(cost, num_micro_batches, index, SELECTIVE_OPTION)
            segment_options.append(option_at(SELECTIVE_OPTION, s_terms, index, cost_s))
        if (
            isinstance(self.traced, ModuleChain)
            and recomputable
            and not segment.state_note  # each chunk would write the object again
            and r_terms is not None
        ):
            # A link runs in chunks on its own (NOTE [Module chain]), never in a span.
            segment_options += self._chunk_options(
                index,
                index + 1,
                segment_options[-1],
                r_terms["io"][index],
                num_micro_batches,
                separability,
            )
        if u_terms is not None and index in self.positions.unit_at:
            segment_options += self._unit_options(index, u_terms, num_micro_batches)
        if g_terms is not None and index in self.positions.region_at:
            segment_options += self._region_options(index, g_terms, num_micro_batches, separability)
        return segment_options

    def _unit_options(
        self, index: int, terms: dict[str, list[float]], num_micro_batches: int
    ) -> list[Option]:
        """Recompute the unit of several segments that starts at ``index`` as one."""
        unit, end = self.positions.unit_at[index]
        assert isinstance(self.traced, TracedModel), "only fx chains have units"
        if self.traced.unit_segments[unit].keep_reason:
            return []
        cost = self.costs.recompute_s(index, end, pieces=num_micro_batches)
        span = end - index
        cost_s = self.pricing.cost_s(cost, num_micro_batches, index, RECOMPUTE_OPTION, span)
        return [option_at(RECOMPUTE_OPTION, terms, unit, cost_s, span=span)]

    def _region_options(
        self,
        index: int,
        terms: dict[str, list[float]],
        num_micro_batches: int,
        separability: Separability | None,
    ) -> list[Option]:
        region, end = self.positions.region_at[index]
        if self.traced.region_segments[region].keep_reason:
            return []
        span = end - index
        dims = self.positions.batch_dims(index, end, separability)
        cost = self.costs.recompute_s(index, end, pieces=num_micro_batches, input_batch_dims=dims)
        cost_s = self.pricing.cost_s(cost, num_micro_batches, index, REGION_OPTION, span)
        whole = option_at(REGION_OPTION, terms, region, cost_s, span=span)
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
        dims = self.positions.batch_dims(index, end, separability)
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
            action = OptionAction(recompute=True, num_chunks=chunks, region=True)
            cost = self.costs.recompute_s(
                index, end, chunks=chunks, pieces=num_micro_batches, input_batch_dims=dims
            )
            options.append(
                Option(
                    action=action,
                    kept_bytes=whole.kept_bytes,
                    forward_bytes=int(forward),
                    backward_bytes=int(backward),
                    extra_s=self.pricing.cost_s(
                        cost, num_micro_batches, index, action, end - index
                    ),
                    span=end - index,
                )
            )
        return options
