"""The budget search: the solver run over every micro-batch count the profiles allow.

:class:`BudgetSearch` holds the profiles measured so far (NOTE [Planning] in
:mod:`autockpt.planner.pipeline`), solves each chain exactly
(:mod:`autockpt.planner.solve.chain_solver`), measures the cheapest decision on fake tensors and
re-solves when the chain model was optimistic. When nothing fits it builds the
:class:`~autockpt.errors.InfeasibleBudgetError` (NOTE [Refusal] in
:mod:`autockpt.planner.solve.refusal`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from autockpt.errors import InfeasibleBudgetError, describe_error
from autockpt.planner.core.step_budget import StepBudget
from autockpt.planner.measure.separability import Separability
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_decoding import Decision, decode, kept_decision
from autockpt.planner.solve.chain_positions import Profiles
from autockpt.planner.solve.chain_solver import (
    Chain,
    Solution,
    lowest_peak_choices,
    minimum_peak,
    solve,
)
from autockpt.planner.solve.chain_terms import micro_batch_counts
from autockpt.planner.solve.refusal import infeasible_error

#: The peak a decision that failed to measure counts at: above any budget.
UNMEASURABLE_PEAK_BYTES = 2**62
#: Rounds of re-solving when the measured plan exceeds the budget (NOTE [Planning], step 4).
MAX_REPLANS = 4
#: Most rounds of "solve, time what the choice rests on, solve again" (NOTE [Timed options]):
#: each round times something new and there is only so much to time, but a bound keeps a
#: cost source that keeps reporting new timings from looping.
MAX_TIMING_ROUNDS = 16
#: How far past the lowest measured peak a chain estimate may be and still be measured for a
#: plan's minimum (:meth:`BudgetSearch.measured_minimum_bytes`).
ESTIMATE_SLACK = 1.05


class MeasuredDecisions:
    """Each distinct decision's step measured once on fake tensors, and the lowest-peak plan
    measured so far: a budget planning is sure to meet (NOTE [Refusal]).

    A decision whose measurement fails (the model's own error in one of its options) counts as
    measured at ``unmeasurable``, a peak no budget meets, so the search goes on without it; a
    line in ``failures`` names it.
    """

    def __init__(
        self, measure: Callable[[Decision], StepProfile], unmeasurable: StepProfile
    ) -> None:
        self._measure = measure
        self._unmeasurable = unmeasurable
        self._measured: dict[tuple[Any, ...], StepProfile] = {}
        #: The lowest-peak decision measured as a candidate, with its step.
        self.lowest: tuple[Decision, StepProfile] | None = None
        #: A line per decision that failed to measure, for the plan's notes.
        self.failures: list[str] = []

    def __call__(self, decision: Decision) -> StepProfile:
        key = _key(decision)
        if key not in self._measured:
            try:
                self._measured[key] = self._measure(decision)
            except Exception as error:
                actions = ", ".join(r for r in decision.reasons if r != "keep") or "keep"
                self.failures.append(
                    f"plan not offered ({actions}; {decision.num_micro_batches} micro-batches): "
                    f"measuring it failed ({describe_error(error)})"
                )
                self._measured[key] = self._unmeasurable
        return self._measured[key]

    def candidate(self, decision: Decision) -> StepProfile:
        """``decision``'s step, remembered if it peaks lower than every candidate before."""
        profile = self(decision)
        if self.lowest is None or profile.peak_bytes < self.lowest[1].peak_bytes:
            self.lowest = (decision, profile)
        return profile


class BudgetSearch:
    """The solver over every micro-batch count the profiles so far allow."""

    def __init__(
        self,
        builder: ChainBuilder,
        whole: Profiles,
        batch_size: int,
        measure: Callable[[Decision], StepProfile],
    ) -> None:
        self.builder = builder
        self.whole = whole
        self.half: Profiles | None = None
        self.separability: Separability | None = None
        self.batch_size = batch_size
        #: Every decision measured so far, and the lowest peak among the candidates.
        self.measure = MeasuredDecisions(
            measure, dataclasses.replace(whole.kept, peak_bytes=UNMEASURABLE_PEAK_BYTES)
        )
        #: Measures a decision at half the batch, for the refusal's per-sample part
        #: (NOTE [Refusal]); None when the caller gives no way to.
        self.measure_half: Callable[[Decision], StepProfile | None] | None = None

    def _decode(self, chain: Chain, solution: Solution, num_micro_batches: int) -> Decision:
        return decode(self.builder.positions, chain, solution, self.separability, num_micro_batches)

    def chains(self) -> list[tuple[int, Chain]]:
        counts = micro_batch_counts(self.batch_size, self.half is not None)
        return [
            (count, self.builder.chain(self.whole, self.half, count, self.separability))
            for count in counts
        ]

    def cheapest(self, budget_bytes: int) -> Decision | None:
        """The least extra time over micro-batch counts, or None when nothing fits. The costs
        the choice rests on are timed first, and the choice made again (NOTE [Timed options])."""
        for timing_round in range(MAX_TIMING_ROUNDS):
            ranked = self._ranked_solutions(budget_bytes)
            if not ranked:
                return None
            _, count, chain, solution = ranked[0]
            last_round = timing_round == MAX_TIMING_ROUNDS - 1
            if last_round or not self.builder.pricing.time_choice(chain, solution, count):
                return self._decode(chain, solution, count)
        raise AssertionError("unreachable: the last round returns")

    def fit(self, usable_bytes: int, notes: list[str]) -> tuple[Decision, StepProfile] | None:
        """The cheapest decision whose measured step fits, with that measurement
        (NOTE [Planning], step 4), or None when none of the options so far fits."""
        decision = self.cheapest(usable_bytes)
        if decision is None:
            return None
        final = self.measure(decision)
        target = usable_bytes
        for _ in range(MAX_REPLANS):
            if final.peak_bytes <= usable_bytes:
                return decision, final
            # The chain model was optimistic: aim lower by what the measurement showed.
            target -= final.peak_bytes - usable_bytes
            retry = self.cheapest(target)
            if retry is None:
                break
            decision, final = retry, self.measure(retry)
            notes.append("re-planned: the measured plan was over the budget")
        if final.peak_bytes <= usable_bytes:
            return decision, final
        return self.lowest_peak_fit(usable_bytes, notes)

    def fitting_alternatives(
        self,
        usable_bytes: int,
        chosen: tuple[Decision, StepProfile],
        limit: int,
        runnable: Callable[[Decision], bool] = lambda _: True,
    ) -> list[tuple[Decision, StepProfile]]:
        """``chosen`` and the cheapest solution at each other micro-batch count, by the
        estimate, whose measured step fits: up to ``limit`` plans (NOTE [Whole-plan timing]).
        A decision ``runnable`` refuses is not measured (a step on fake tensors costs a few
        tenths of a second where a whole-plan timing could not run it anyway)."""
        found = [chosen]
        seen = {_key(chosen[0])}
        for _, count, chain, solution in self._ranked_solutions(usable_bytes):
            decision = self._decode(chain, solution, count)
            if len(found) >= limit or _key(decision) in seen or not runnable(decision):
                continue
            seen.add(_key(decision))
            profile = self.measure(decision)
            if profile.peak_bytes <= usable_bytes:
                found.append((decision, profile))
        return found

    def _ranked_solutions(self, budget_bytes: int) -> list[tuple[float, int, Chain, Solution]]:
        """The solver's choice at each micro-batch count where one fits, cheapest first, each
        with its extra seconds (the micro-batches' included)."""
        ranked = []
        for count, chain in self.chains():
            solution = solve(chain, budget_bytes)
            if solution is not None:
                total = solution.extra_s + self.builder.pricing.micro_batch_s(count)
                ranked.append((total, count, chain, solution))
        return sorted(ranked, key=lambda r: r[0])

    def lowest_peak_fit(
        self, usable_bytes: int, notes: list[str]
    ) -> tuple[Decision, StepProfile] | None:
        """Last resort: the lowest-peak choice at each micro-batch count, measured; the first
        that fits. Also records the lowest measured peak, a budget planning is sure to meet:
        the chain model's own minimum can be optimistic, or pessimistic. The plain step is a
        candidate too: where recompute and chunks add more than they save (parameters dominate,
        in-place writes forbid the cuts that would help), nothing lower exists."""
        for lowest in [kept_decision(self.builder.traced), *self.lowest_peak_decisions()]:
            candidate = self.measure.candidate(lowest)
            if candidate.peak_bytes <= usable_bytes:
                notes.append("took the lowest-peak plan: the cheaper ones measured over")
                return lowest, candidate
        return None

    def lowest_peak_decisions(self) -> list[Decision]:
        return [
            self._decode(chain, choice, count)
            for count, chain in self.chains()
            for choice in lowest_peak_choices(chain)
        ]

    def minimum_peak_bytes(self) -> int:
        return min(minimum_peak(chain).peak_bytes for _, chain in self.chains())

    def measured_minimum_bytes(self) -> int:
        """The lowest peak measured, as a refusal finds it (NOTE [One minimum]), over the
        options the search examined so far: each micro-batch count's lowest-peak choices in
        the order of the chain model's estimate, until the next estimate is past the lowest
        measured by more than the model misses by (its estimates run under the measured
        peaks), so a few steps on fake tensors, not two a count."""
        ranked = sorted(self.chains(), key=lambda c: (minimum_peak(c[1]).peak_bytes, -c[0]))
        for count, chain in ranked:
            lowest = self.measure.lowest
            estimate = minimum_peak(chain).peak_bytes
            if lowest is not None and estimate > lowest[1].peak_bytes * ESTIMATE_SLACK:
                break
            for choice in lowest_peak_choices(chain):
                self.measure.candidate(self._decode(chain, choice, count))
        assert self.measure.lowest is not None  # measured just now
        return self.measure.lowest[1].peak_bytes

    def infeasible(self, budget: StepBudget) -> InfeasibleBudgetError:
        """The error for a budget below every plan, with the minimum, what bounds it and the
        levers that work (after :meth:`lowest_peak_fit` found nothing, so the minimum is a
        measured one; NOTE [Refusal])."""
        lowest = self.measure.lowest
        outside = budget.shown_bytes
        minimum = whole_kib(outside(lowest[1].peak_bytes if lowest else self.minimum_peak_bytes()))
        kept = self.whole.kept
        half = None
        if lowest is not None and self.measure_half is not None:
            measured = self.measure_half(lowest[0])
            half = outside(measured.peak_bytes) if measured is not None else None
        # Parameters, their gradients and the optimizer state do not shrink with the batch.
        fixed = 2 * kept.parameter_bytes + kept.optimizer_state_bytes
        error = infeasible_error(
            budget=budget.read,
            minimum_bytes=minimum,
            fixed_bytes=outside(fixed) - budget.context_bytes,
            context_bytes=budget.context_bytes,
            batch_size=self.batch_size,
            separability=self.separability,
            micro_batches_tried=self.half is not None,
            lowest=lowest,
            half_minimum_bytes=half,
        )
        error.unplanned_bytes = outside(kept.peak_bytes)
        return error


def whole_kib(minimum_bytes: int) -> int:
    """A minimum rounded up to whole KiB, as plans and refusals name it: a real step can hold
    a few bytes of scalars more than the measured one (4 to 8 bytes seen with micro-batches),
    which must not tip a budget of that number over."""
    return -(-minimum_bytes // 1024) * 1024


def _key(decision: Decision) -> tuple[Any, ...]:
    """What tells two decisions apart."""
    return (decision.num_micro_batches, tuple(decision.spans), tuple(decision.reasons))
