"""Steps 3 to 5 of NOTE [Planning]: the options widened in stages until a plan fits, the fit
measured, and the plans that fit timed whole where the real model is timed.

The stages (:mod:`autockpt.planner.solve.widening`) measure more profiles, each only once the
ones before cannot fit, or fit at more than ``WIDEN_PAST_SHARE`` of the plain step's time.
"""

from __future__ import annotations

from autockpt.errors import describe_error
from autockpt.planner.core.step_budget import StepBudget
from autockpt.planner.measure.step_measurer import StepMeasurer
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.budget_search import BudgetSearch
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_decoding import ChosenPlan, Decision
from autockpt.planner.solve.chain_positions import Profiles
from autockpt.planner.solve.option_pricing import decision_extra_s
from autockpt.planner.solve.whole_plan_timing import (
    MAX_CANDIDATES,
    PlanTimings,
    StepRunner,
    TimedChoice,
)
from autockpt.planner.solve.widening import Widening
from autockpt.planner.timing.module_stopwatch import ModuleCosts
from autockpt.planner.timing.time_model import MeasuredCosts

#: A fit adding more than this share of the plain step's time widens the options further.
WIDEN_PAST_SHARE = 0.10

#: A decision and its step measured on fake tensors.
Fit = tuple[Decision, StepProfile]

#: What the lowest peak covers once the search stopped after each widening stage (plain
#: recompute; regions and chunks; micro-batches), NOTE [One minimum].
MINIMUM_SEARCHED = ("recompute alone", "recompute and chunks", "every option")


class StagedSearch:
    """The cheapest plan under ``budget``'s usable bytes of tensors, the options widened in
    stages.

    Args:
        measurer: the step's measurements, its kept profile already taken.
        builder: builds the chains; its costs are the ones the search prices with.
        budget: the budget, whose usable bytes a plan's tensors may take (NOTE [One budget]).
        allow_chunks, allow_micro_batches: the caller's leave to split the batch.
        timed_costs: the costs that time the real model, where plans are timed whole
            (NOTE [Whole-plan timing]; a module chain's, NOTE [Timing a module chain]);
            ``None`` where they are not.
        notes: the plan's notes, appended to.
    """

    def __init__(
        self,
        measurer: StepMeasurer,
        builder: ChainBuilder,
        *,
        budget: StepBudget,
        allow_chunks: bool,
        allow_micro_batches: bool,
        timed_costs: MeasuredCosts | ModuleCosts | None,
        notes: list[str],
        live_bytes: int = 0,
    ) -> None:
        self.builder = builder
        self.budget = budget
        self.usable_bytes = usable_bytes = budget.usable_bytes
        # NOTE [Planning in the middle of a run]: a plan run whole for real sits beside it.
        self.real_room_bytes = usable_bytes - live_bytes
        self.timed_costs = timed_costs
        self.notes = notes
        self.stages_reached = 0
        """How many of the widening stages the search ran (NOTE [One minimum])."""
        self.timing_failed = False
        """Whether running a plan whole failed; nothing is timed whole after that."""
        self.timings = PlanTimings()
        """The plans timed whole so far, each timed once (NOTE [Whole-plan timing])."""
        self.search = BudgetSearch(
            builder,
            Profiles(measurer.kept, None),
            builder.batch_size,
            lambda d: measurer.planned(d.segments, d.actions, d.num_micro_batches),
        )
        if builder.batch_size >= 2:
            self.search.measure_half = lambda d: measurer.at_half_batch(
                d.segments, d.actions, d.num_micro_batches
            )
        self.widening = Widening(
            measurer,
            builder,
            self.search,
            usable_bytes=usable_bytes,
            allow_chunks=allow_chunks,
            allow_micro_batches=allow_micro_batches,
            notes=notes,
        )

    def run(self) -> ChosenPlan:
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
            self.widening.plain_recompute(even_if_hopeless=True)
            found = search.lowest_peak_fit(self.usable_bytes, self.notes)
        self.notes.extend(search.measure.failures)
        if found is None:
            raise search.infeasible(self.budget)
        runner = self._runner()
        timed = self._fastest_whole(runner, found, stage_timed) if runner is not None else None
        if timed is not None:
            found = (timed.decision, timed.profile)
        decision, profile = found
        reduction = search.separability.loss_reduction if search.separability else None
        if decision.num_micro_batches > 1 and reduction:
            self.notes.append(
                f"micro-batches: the loss is the {reduction} of the samples' losses; run steps "
                f'with training_step(..., loss_reduction="{reduction}")'
            )
        # NOTE [One minimum]: the minimum of the options examined is measured as a refusal's
        # is: the chain model's estimate can be under it, and a budget it named was refused.
        return ChosenPlan(
            decision=decision,
            profile=profile,
            whole=search.whole,
            minimum_peak_bytes=search.measured_minimum_bytes(),
            timed_extra_s=timed.extra_s if timed is not None else None,
            timed_plain_s=timed.plain_s if timed is not None else None,
            minimum_searched=MINIMUM_SEARCHED[self.stages_reached - 1],
        )

    def _fit_in_stages(self) -> tuple[Fit | None, TimedChoice | None]:
        """The cheapest fit once a stage's fit adds little enough (NOTE [Planning], 3), with
        the whole-plan timing that confirmed it, if one did."""
        found: Fit | None = None
        stage_timed = None
        for reached, widen in enumerate(self.widening.stages(), start=1):
            self.stages_reached = reached
            if not widen():
                continue
            # A later stage's fit weighs every option examined so far (NOTE [Planning], 3).
            found = self.search.fit(self.usable_bytes, self.notes) or found
            plain_s = self.builder.costs.unplanned_step_s()
            if (
                found
                and decision_extra_s(self.builder.pricing, found[0]) <= WIDEN_PAST_SHARE * plain_s
            ):
                runner = self._runner()
                if runner is None:
                    break
                # The sums say stop; the plan timed whole must agree (NOTE [Whole-plan timing]).
                whole = runner.fits_whole(found[1], self.real_room_bytes)
                if not whole and not runner.can_run(found[0]):
                    break  # neither at the whole batch nor on the samples timed: the sums stand
                stage_timed = self._timed([found], runner, at_whole_batch=whole)
                if stage_timed is None:
                    break  # timing failed: the sums stand
                if stage_timed.extra_s <= WIDEN_PAST_SHARE * stage_timed.plain_s:
                    break
        return found, stage_timed

    def _runner(self) -> StepRunner | None:
        """Runs plans whole on the real model, where plans are timed whole and timing has not
        failed."""
        if self.timing_failed or self.timed_costs is None:
            return None
        runs = self.timed_costs.whole_runs()
        return StepRunner(runs) if runs is not None else None

    def _timed(
        self, candidates: list[Fit], runner: StepRunner, *, at_whole_batch: bool
    ) -> TimedChoice | None:
        """The fastest of the candidates timed whole (:class:`PlanTimings`), or ``None`` where
        running them fails (a model that refuses a piece of its batch): the plan's notes say
        so, the sums stand and nothing is timed whole again."""
        try:
            optimizer_s = runner.stopwatch.optimizer_s()
            return self.timings.fastest(
                candidates, runner, optimizer_s, at_whole_batch=at_whole_batch
            )
        except Exception as error:  # noqa: BLE001 - a plan that cannot be timed is estimated
            self.timing_failed = True
            self.notes.append(
                f"timing the plans whole failed ({describe_error(error)[:160]}): the solver's "
                "sums stand for the plan's step time"
            )
            return None

    def _fastest_whole(
        self, runner: StepRunner, found: Fit, stage_timed: TimedChoice | None
    ) -> TimedChoice | None:
        """NOTE [Whole-plan timing]: the fastest of the plans that fit, timed whole (``None``
        where only one plan fits and it was not timed: ``found`` stands)."""
        timed = stage_timed if stage_timed and stage_timed.decision == found[0] else None
        whole = runner.fits_whole(found[1], self.real_room_bytes)
        candidates: list[Fit] = []
        if whole:
            # Timed at the whole batch, every candidate alike (NOTE [Whole-plan timing]).
            candidates = [
                fit
                for fit in self.search.fitting_alternatives(
                    self.usable_bytes, found, MAX_CANDIDATES
                )
                if runner.fits_whole(fit[1], self.real_room_bytes)
            ]
        elif runner.can_run(found[0]):
            candidates = self.search.fitting_alternatives(
                self.usable_bytes, found, MAX_CANDIDATES, runnable=runner.can_run
            )
        # At the whole batch even one plan is timed: its time is then the plan's own, where
        # the sums stand otherwise; they do not for a module chain, which has no timed sums
        # (NOTE [Timing a module chain]), nor against a model's own checkpointed step.
        sums_stand = self.timed_costs is not None and self.timed_costs.sums_stand
        if len(candidates) > 1 or (candidates and timed is None and (whole or not sums_stand)):
            timed = self._timed(candidates, runner, at_whole_batch=whole)
        if timed is not None:
            self.notes.append(timed.note)
        return timed
