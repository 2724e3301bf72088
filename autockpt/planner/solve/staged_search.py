"""Steps 3 to 5 of NOTE [Planning]: the options widened in stages until a plan fits, the fit
measured, and the plans that fit timed whole where the real model is timed.

Each stage measures more profiles, and only once the ones before cannot fit (or fit at more
than ``WIDEN_PAST_SHARE`` of the plain step's time): plain recompute segment by segment, then
regions recomputed whole or in chunks, then micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from autockpt.planner.core.batch_split import split_batch
from autockpt.planner.core.units import Budget
from autockpt.planner.measure.separability import Separability, analyse_separability
from autockpt.planner.measure.step_measurer import StepMeasurer
from autockpt.planner.measure.step_profile import LossFn, StepProfile
from autockpt.planner.runtime.segment_runners import KEEP, SegmentAction
from autockpt.planner.runtime.selective_safety import selective_segments
from autockpt.planner.solve.budget_search import BudgetSearch
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_decoding import ChosenPlan, Decision
from autockpt.planner.solve.chain_positions import Profiles, unit_segments
from autockpt.planner.solve.chain_terms import recompute_lower_bound_bytes
from autockpt.planner.solve.option_pricing import decision_extra_s
from autockpt.planner.solve.whole_plan_timing import (
    MAX_CANDIDATES,
    StepRunner,
    TimedChoice,
    fastest_of,
)
from autockpt.planner.timing.time_model import MeasuredCosts
from autockpt.planner.trace.module_chain import ModuleChain

#: A fit adding more than this share of the plain step's time widens the options further.
WIDEN_PAST_SHARE = 0.10

#: A decision and its step measured on fake tensors.
Fit = tuple[Decision, StepProfile]


class StagedSearch:
    """The cheapest plan under ``usable_bytes`` of tensors, the options widened in stages.

    Args:
        measurer: the step's measurements, its kept profile already taken.
        builder: builds the chains; its costs are the ones the search prices with.
        model: the real model, for the separability probe.
        loss_fn: the loss the probe runs.
        usable_bytes: the tensor bytes a plan may take (the budget less the device's share).
        allow_chunks, allow_micro_batches: the caller's leave to split the batch.
        timed_costs: the costs that time the real model, where plans are timed whole
            (NOTE [Whole-plan timing]); ``None`` where they are not.
        notes: the plan's notes, appended to.
    """

    def __init__(
        self,
        measurer: StepMeasurer,
        builder: ChainBuilder,
        *,
        model: torch.nn.Module,
        loss_fn: LossFn | None,
        usable_bytes: int,
        allow_chunks: bool,
        allow_micro_batches: bool,
        timed_costs: MeasuredCosts | None,
        notes: list[str],
    ) -> None:
        self.measurer = measurer
        self.traced = measurer.traced
        self.builder = builder
        self.model = model
        self.loss_fn = loss_fn
        self.usable_bytes = usable_bytes
        self.allow_chunks = allow_chunks
        self.allow_micro_batches = allow_micro_batches
        self.timed_costs = timed_costs
        self.notes = notes
        self.batch_size = builder.batch_size
        self.regions = list(self.traced.region_segments)
        self.units = unit_segments(self.traced)  # NOTE [Chain levels]
        self.search = BudgetSearch(
            builder, Profiles(measurer.kept, None), self.batch_size, self._measure_decision
        )
        self.search.measure_half = self._measure_half if self.batch_size >= 2 else None

    def run(self, budget: Budget, outside: Callable[[int], int]) -> ChosenPlan:
        """The plan: the cheapest fit, timed whole where it can be.

        Raises:
            InfeasibleBudgetError: nothing fits (NOTE [Refusal]).
        """
        search = self.search
        found, stage_timed = self._fit_in_stages()
        if found is None:
            found = search.lowest_peak_fit(self.usable_bytes, self.notes)
        if found is None and search.whole.recomputed is None:
            # Skipped above as unable to fit; the refusal's minimum must count it too.
            self._plain_recompute(even_if_hopeless=True)
            found = search.lowest_peak_fit(self.usable_bytes, self.notes)
        if found is None:
            raise search.infeasible(budget, outside)
        timed_extra_s = None
        if self.timed_costs is not None:
            found, timed_extra_s = self._fastest_whole(self.timed_costs, found, stage_timed)
        decision, profile = found
        reduction = search.separability.loss_reduction if search.separability else None
        if decision.num_micro_batches > 1 and reduction:
            self.notes.append(
                f"micro-batches: the loss is the {reduction} of the samples' losses; run steps "
                f'with training_step(..., loss_reduction="{reduction}")'
            )
        return ChosenPlan(
            decision=decision,
            profile=profile,
            whole=search.whole,
            minimum_peak_bytes=search.minimum_peak_bytes(),
            timed_extra_s=timed_extra_s,
        )

    def _fit_in_stages(self) -> tuple[Fit | None, TimedChoice | None]:
        """The cheapest fit once a stage's fit adds little enough (NOTE [Planning], 3), with
        the whole-plan timing that confirmed it, if one did."""
        found: Fit | None = None
        stage_timed = None
        for widen in (self._plain_recompute, self._regions_and_chunks, self._micro_batches):
            if not widen():
                continue
            # A later stage's fit weighs every option examined so far (NOTE [Planning], 3).
            found = self.search.fit(self.usable_bytes, self.notes) or found
            plain_s = self.builder.costs.unplanned_step_s()
            if (
                found
                and decision_extra_s(self.builder.pricing, found[0]) <= WIDEN_PAST_SHARE * plain_s
            ):
                if self.timed_costs is None:
                    break
                # The sums say stop; the plan timed whole must agree (NOTE [Whole-plan timing]).
                runner = StepRunner(self.timed_costs.stopwatch)
                stage_timed = fastest_of([found], runner, plain_s)
                if stage_timed.extra_s <= WIDEN_PAST_SHARE * plain_s:
                    break
        return found, stage_timed

    def _fastest_whole(
        self, costs: MeasuredCosts, found: Fit, stage_timed: TimedChoice | None
    ) -> tuple[Fit, float | None]:
        """NOTE [Whole-plan timing]: the fastest of the plans that fit, timed whole, and the
        seconds it added (``None`` where only one plan fits and it was not timed)."""
        candidates = self.search.fitting_alternatives(self.usable_bytes, found, MAX_CANDIDATES)
        timed = stage_timed if stage_timed and stage_timed.decision == found[0] else None
        if len(candidates) > 1:
            runner = StepRunner(costs.stopwatch)
            timed = fastest_of(candidates, runner, costs.unplanned_step_s())
        if timed is None:
            return found, None
        self.notes.append(timed.note)
        return (timed.decision, timed.profile), timed.extra_s

    def _plain_recompute(self, *, even_if_hopeless: bool = False) -> bool:
        """Stage a: every segment (and every unit) recomputed, and selectively where it may."""
        kept = self.measurer.kept
        if self.usable_bytes < recompute_lower_bound_bytes(kept) and not even_if_hopeless:
            return False  # no plan of plain recomputes can fit: do not measure one
        measurer, units = self.measurer, self.units
        self.search.whole = dataclasses.replace(
            self.search.whole,
            recomputed=measurer.all_recomputed(self.traced.segments),
            units=None if units is None else measurer.all_recomputed(units),
            selective=self._all_selective(),
        )
        return True

    def _regions_and_chunks(self) -> bool:
        """Stage b: regions recomputed whole, and in chunks where the probe finds them
        batch-separable."""
        # Regions recomputed whole, chunks and micro-batches cost more profiles and a
        # probe of the real model: examined only once plain recompute cannot fit.
        # A module chain's links run in chunks, not its spans (NOTE [Module chain]).
        traced, search = self.traced, self.search
        probed = traced.segments if isinstance(traced, ModuleChain) else self.regions
        if isinstance(traced, ModuleChain) and search.whole.recomputed is None:
            self._plain_recompute(even_if_hopeless=True)  # the links' chunks scale from it
        separability = Separability.nothing(len(probed), "not allowed by the caller")
        if self.allow_chunks or self.allow_micro_batches:
            separability = analyse_separability(
                traced,
                self.measurer.example_inputs,
                probed,
                model=self.model,
                loss_fn=self.loss_fn,
                example_targets=self.measurer.example_targets,
            )
        if not self.allow_chunks:
            separability = dataclasses.replace(separability, chunkable=(False,) * len(probed))
        if self.allow_micro_batches and not separability.micro_batchable:
            self.notes.append(f"micro-batches not used: {separability.reason}")
        search.whole = dataclasses.replace(
            search.whole, regions=self.measurer.all_recomputed(self.regions)
        )
        search.separability = separability
        return True

    def _micro_batches(self) -> bool:
        """Stage c: the step at half the batch, for every micro-batch count."""
        search, measurer, segments = self.search, self.measurer, self.traced.segments
        separability = search.separability
        if not (self.allow_micro_batches and separability and separability.micro_batchable):
            return False
        if self.batch_size < 2:
            return False
        whole = search.whole
        search.half = Profiles(
            measurer.measure(segments, [KEEP] * len(segments), 2),
            None if whole.recomputed is None else measurer.all_recomputed(segments, 2),
            measurer.all_recomputed(self.regions, 2),
            None
            if self.units is None or whole.units is None
            else measurer.all_recomputed(self.units, 2),
            None if whole.selective is None else self._all_selective(2),
        )
        return True

    def _all_selective(self, num_micro_batches: int = 1) -> StepProfile | None:
        """Every segment that may be recomputed selectively so (NOTE [Selective recompute])."""
        if num_micro_batches == 1:
            self.builder.selective = selective_segments(self.traced, self.measurer.example_inputs)
        if not self.builder.selective:
            return None
        actions = [
            SegmentAction(recompute=True, selective=True) if i in self.builder.selective else KEEP
            for i in range(len(self.traced.segments))
        ]
        return self.measurer.measure(self.traced.segments, actions, num_micro_batches)

    def _measure_decision(self, decision: Decision) -> StepProfile:
        if decision.num_micro_batches == 1 and all(a == KEEP for a in decision.actions):
            return self.measurer.kept  # nothing changes: the kept step is this plan's measurement
        return self.measurer.measure(
            decision.segments, decision.actions, decision.num_micro_batches
        )

    def _measure_half(self, decision: Decision) -> StepProfile | None:
        """``decision`` measured at half the batch, for the refusal (NOTE [Refusal])."""
        half = self.batch_size // 2
        halves: list[Any] = [
            split_batch(b, 2, batch_size=self.batch_size)[0]
            for b in (self.measurer.example_inputs, self.measurer.example_targets)
        ]
        actions = [
            dataclasses.replace(a, num_chunks=min(a.num_chunks, half)) for a in decision.actions
        ]
        try:
            count = min(decision.num_micro_batches, half)
            return self.measurer.measure(decision.segments, actions, count, (halves[0], halves[1]))
        except Exception:  # the model refuses a smaller batch: the refusal estimates
            return None
