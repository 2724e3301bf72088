"""Step 3 of NOTE [Planning]: the options widened in stages, each stage measuring the profiles
its options need, and only once the ones before cannot fit (or fit too slowly).

a. plain recompute, segment by segment (and unit by unit, and selectively where a segment may);
b. regions recomputed whole, and in chunks where the probe finds them batch-separable;
c. micro-batches: the step at half the batch, every quantity fitted between the two.

A profile that fails to measure (a model whose recompute raises, say) is not offered: its options
are left out and a note names it (:meth:`Widening.tried`). Each stage writes what it measured
into the :class:`~autockpt.planner.solve.budget_search.
BudgetSearch`, which then solves over everything examined so far.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from autockpt.errors import describe_error
from autockpt.planner.core.decisions import KEEP, SegmentAction
from autockpt.planner.measure.separability import Separability, analyse_separability
from autockpt.planner.measure.step_measurer import StepMeasurer
from autockpt.planner.runtime.selective_safety import selective_segments
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.budget_search import BudgetSearch
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_positions import Profiles, unit_segments
from autockpt.planner.solve.chain_terms import recompute_lower_bound_bytes
from autockpt.planner.trace.module_chain import ModuleChain


class Widening:
    """The stages that widen a :class:`BudgetSearch`'s options (see the module docstring).

    Args:
        measurer: the step's measurements, its kept profile already taken.
        builder: builds the chains; it learns here which segments may be selective.
        search: what each stage's profiles go into.
        usable_bytes: the tensor bytes a plan may take.
        allow_chunks, allow_micro_batches: the caller's leave to split the batch.
        notes: the plan's notes, appended to.
    """

    def __init__(
        self,
        measurer: StepMeasurer,
        builder: ChainBuilder,
        search: BudgetSearch,
        *,
        usable_bytes: int,
        allow_chunks: bool,
        allow_micro_batches: bool,
        notes: list[str],
    ) -> None:
        self.measurer = measurer
        self.traced = measurer.traced
        self.builder = builder
        self.search = search
        self.usable_bytes = usable_bytes
        self.allow_chunks = allow_chunks
        self.allow_micro_batches = allow_micro_batches
        self.notes = notes
        self.regions = list(self.traced.region_segments)
        self.units = unit_segments(self.traced)  # NOTE [Chain levels]
        self._failed: set[str] = set()

    def stages(self) -> tuple[Callable[[], bool], ...]:
        """The stages in order; each returns whether it gave the search anything new."""
        return (self.plain_recompute, self.regions_and_chunks, self.micro_batches)

    def plain_recompute(self, *, even_if_hopeless: bool = False) -> bool:
        """Stage a: every segment (and every unit) recomputed, and selectively where it may."""
        kept = self.measurer.kept
        if self.usable_bytes < recompute_lower_bound_bytes(kept) and not even_if_hopeless:
            return False  # no plan of plain recomputes can fit: do not measure one
        measurer, units = self.measurer, self.units
        self.search.whole = dataclasses.replace(
            self.search.whole,
            recomputed=self.tried(
                "recompute", lambda: measurer.all_recomputed(self.traced.segments)
            ),
            units=None
            if units is None
            else self.tried("units recomputed whole", lambda: measurer.all_recomputed(units)),
            selective=self.tried("selective recompute", self._all_selective),
        )
        return True

    def regions_and_chunks(self) -> bool:
        """Stage b: regions recomputed whole, and in chunks where the probe finds them
        batch-separable."""
        # Regions recomputed whole, chunks and micro-batches cost more profiles and a
        # probe of the real model: examined only once plain recompute cannot fit.
        # A module chain's links run in chunks, not its spans (NOTE [Module chain]).
        traced, search = self.traced, self.search
        probed = traced.segments if isinstance(traced, ModuleChain) else self.regions
        if isinstance(traced, ModuleChain) and search.whole.recomputed is None:
            self.plain_recompute(even_if_hopeless=True)  # the links' chunks scale from it
        separability = Separability.nothing(len(probed), "not allowed by the caller")
        if self.allow_chunks or self.allow_micro_batches:
            spec = self.measurer.spec  # the real model, probed
            separability = analyse_separability(
                traced,
                spec.example_inputs,
                probed,
                model=spec.model,
                loss_fn=spec.loss_fn,
                example_targets=spec.example_targets,
            )
        if not self.allow_chunks:
            separability = dataclasses.replace(separability, chunkable=(False,) * len(probed))
        if self.allow_micro_batches and not separability.micro_batchable:
            self.notes.append(f"micro-batches not used: {separability.reason}")
        search.whole = dataclasses.replace(
            search.whole,
            regions=self.tried(
                "regions recomputed whole", lambda: self.measurer.all_recomputed(self.regions)
            ),
        )
        search.separability = separability
        return True

    def micro_batches(self) -> bool:
        """Stage c: the step at half the batch, for every micro-batch count."""
        search, measurer, segments = self.search, self.measurer, self.traced.segments
        separability = search.separability
        if not (self.allow_micro_batches and separability and separability.micro_batchable):
            return False
        if self.builder.batch_size < 2:
            return False
        whole = search.whole
        kept = self.tried(
            "micro-batches", lambda: measurer.measure(segments, [KEEP] * len(segments), 2)
        )
        if kept is None:
            return False

        def at_half(name: str, measure: Callable[[], StepProfile | None]) -> StepProfile | None:
            return None if getattr(whole, name) is None else self.tried(name, measure)

        units = self.units
        search.half = Profiles(
            kept,
            at_half("recomputed", lambda: measurer.all_recomputed(segments, 2)),
            at_half("regions", lambda: measurer.all_recomputed(self.regions, 2)),
            None if units is None else at_half("units", lambda: measurer.all_recomputed(units, 2)),
            at_half("selective", lambda: self._all_selective(2)),
        )
        return True

    def tried(self, what: str, measure: Callable[[], StepProfile | None]) -> StepProfile | None:
        """``measure()``, or ``None`` with a note where it fails: the options it would give
        are left out, and the plan is made from the others (a model's own error, such as a
        recompute that raises, never ends planning)."""
        if what in self._failed:
            return None
        try:
            return measure()
        except Exception as error:
            self._failed.add(what)
            self.notes.append(f"{what} not offered: measuring it failed ({describe_error(error)})")
            return None

    def _all_selective(self, num_micro_batches: int = 1) -> StepProfile | None:
        """Every segment that may be recomputed selectively so (NOTE [Selective recompute])."""
        if num_micro_batches == 1:
            self.builder.selective = selective_segments(
                self.traced, self.measurer.spec.example_inputs
            )
        if not self.builder.selective:
            return None
        actions = [
            SegmentAction(recompute=True, selective=True) if i in self.builder.selective else KEEP
            for i in range(len(self.traced.segments))
        ]
        return self.measurer.measure(self.traced.segments, actions, num_micro_batches)
