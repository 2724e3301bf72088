"""What a chain's options and a decision cost in seconds, as the step costs know them now.

Every option's seconds come from the step costs of :mod:`autockpt.planner.timing.time_model`:
estimated until the solver is about to choose the option, then timed on the real model where it
can be (NOTE [Timed options]). :class:`OptionPricing` remembers which timing would replace each
estimate, so that the solver's choice can be timed and solved again.
"""

from __future__ import annotations

from collections.abc import Hashable

from autockpt.planner.core.decisions import OptionAction, SegmentAction
from autockpt.planner.solve.chain_decoding import Decision
from autockpt.planner.solve.chain_solver import Chain, Solution
from autockpt.planner.timing.time_model import Cost, StepCosts, timed_s


class OptionPricing:
    """The seconds of each option, and what timing each estimate waits on."""

    def __init__(self, costs: StepCosts) -> None:
        self.costs = costs
        # What each estimated option's cost waits on, by (pieces, position, action, span).
        self._timings: dict[tuple[int, int, OptionAction, int], Hashable] = {}

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
                key = (num_micro_batches, position, option.action, option.span)
                wanted.append(self._timings.get(key))
        return self.costs.take([timing for timing in wanted if timing is not None])

    def cost_s(
        self, cost: Cost, pieces: int, position: int, action: OptionAction, span: int = 1
    ) -> float:
        """``cost``'s seconds, remembering what timing would replace them (NOTE [Timed options])."""
        if cost.timing is not None:
            self._timings[(pieces, position, action, span)] = cost.timing
        return cost.seconds


def decision_extra_s(pricing: OptionPricing, decision: Decision) -> float:
    """The seconds ``decision`` adds to the step, as the costs know them now."""
    extra_s = pricing.micro_batch_s(decision.num_micro_batches)
    for action, (first, end) in zip(decision.actions, decision.spans, strict=True):
        if action.recompute:
            extra_s += recompute_s_of(pricing.costs, first, end, action, decision)
    return extra_s


def recompute_s_of(
    costs: StepCosts, first: int, end: int, action: SegmentAction, decision: Decision
) -> float:
    """What the run's action adds to a step, timed where it can be; for a kept run, what a
    plain recompute of it would add (NOTE [Timed options])."""
    if not action.recompute:
        return costs.recompute_s(first, end).seconds
    chunked = action.num_chunks > 1
    return timed_s(
        costs,
        first,
        end,
        chunks=action.num_chunks,
        pieces=decision.num_micro_batches,
        input_batch_dims=action.input_batch_dims if chunked else None,
        selective=action.selective,
    )
