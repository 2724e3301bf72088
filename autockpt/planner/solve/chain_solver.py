"""Stage 3: choose one option per segment so the step fits the budget at the least extra time.

It takes plain numbers, not modules, so it can be tested alone and against brute force.

NOTE [Chain memory model]
Segments run in order 0..n-1. Before segment ``i`` starts, the live bytes are

    S_i = start_bytes + sum(kept_bytes of the options chosen for segments 0..i-1)

(what earlier segments left alive for backward: all their activations when kept, only their
boundary when recomputed). While segment ``i`` runs forward the live bytes reach
``S_i + forward_bytes``, and while its backward runs (its recompute included) they reach
``S_i + backward_bytes``: segments after ``i`` have already released theirs by then, and
segments before it have not yet. The loss comes after the last segment and reaches
``S_n + loss_bytes``, its backward included (the gradient of the model's outputs is made then,
with every segment's kept bytes still alive). The optimizer step's peak, ``fixed_peak_bytes``, does not depend on the
plan. So the predicted peak of a choice ``x`` is

    max(fixed_peak_bytes, S_n(x) + loss_bytes, max_i S_i(x) + local_i(x_i)),
    local = max(forward_bytes, backward_bytes),

and the extra time is the sum of the chosen options' ``extra_s``.

NOTE [Frontier recurrence]
Going along the chain, a partial choice for segments 0..i-1 matters to the rest only through
``S_i`` and what it has cost so far. Among partial choices, one with both a larger ``S_i`` and
a larger cost can never lead to a better plan, so only the Pareto frontier of ``(S_i, cost)``
pairs is carried from segment to segment; a choice that would put any segment over the budget is
dropped when it is made. At the end the cheapest surviving choice is optimal for the chain
model: the recurrence is exact. An option may span several segments (a region recomputed as
one unit); it carries a partial choice from the frontier before its first segment to the one
after its last, so frontiers are kept per segment boundary. The same recurrence with "cost" read as "highest peak so far"
gives the smallest budget any choice can meet. A frontier larger than ``MAX_FRONTIER`` is
thinned by keeping, per band of ``S`` values, the cheapest choice, charged with the band's top
``S`` (conservative: a thinned plan may cost more than the optimum, never exceed the budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autockpt.planner.core.decisions import OptionAction

MAX_FRONTIER = 4096


@dataclass(frozen=True)
class Option:
    """One way to run a segment, in the units of NOTE [Chain memory model].

    Attributes:
        action: what it does to the positions it covers (its ``label`` is what the plan
            shows).
        kept_bytes: bytes it leaves alive for backward (added to every later ``S``).
        forward_bytes: peak above ``S_i`` during its forward.
        backward_bytes: peak above ``S_i`` during its backward.
        extra_s: seconds it adds to the step.
        span: how many consecutive segments it covers, from its own (a region recomputed as
            one unit covers several; the positions it covers get no option of their own).
    """

    action: OptionAction
    kept_bytes: int
    forward_bytes: int
    backward_bytes: int
    extra_s: float
    span: int = 1

    @property
    def label(self) -> str:
        """What the plan's table says for it (``recompute region in 4 chunks``)."""
        return self.action.label

    @property
    def local_bytes(self) -> int:
        """Highest bytes above ``S_i`` while this segment runs, forward or backward."""
        return max(self.forward_bytes, self.backward_bytes)


@dataclass(frozen=True)
class Chain:
    """A chain of segments, each with its options, and the plan-independent parts of a step.

    Attributes:
        start_bytes: live before the first segment (parameters, optimizer state, inputs).
        options: per segment, the ways it may run (at least one each).
        loss_bytes: peak above ``S_n`` while the loss runs, forward and backward (before the
            last segment's backward starts).
        fixed_peak_bytes: peak of the parts no option changes (the optimizer step).
    """

    start_bytes: int
    options: tuple[tuple[Option, ...], ...]
    loss_bytes: int = 0
    fixed_peak_bytes: int = 0


@dataclass(frozen=True)
class Solution:
    """The chosen option per segment, its predicted peak and its extra time.

    ``choice[i]`` indexes ``chain.options[i]``; it is ``-1`` for a segment covered by an
    earlier segment's option of span > 1.
    """

    choice: tuple[int, ...]
    peak_bytes: int
    extra_s: float


def evaluate(chain: Chain, choice: Sequence[int]) -> Solution:
    """Peak and extra time of one choice under NOTE [Chain memory model]."""
    assert len(choice) == len(chain.options), "one entry per segment"
    live = chain.start_bytes
    peak = chain.fixed_peak_bytes
    extra = 0.0
    position = 0
    while position < len(chain.options):
        option = chain.options[position][choice[position]]
        peak = max(peak, live + option.local_bytes)
        live += option.kept_bytes
        extra += option.extra_s
        position += option.span
    assert position == len(chain.options), "an option spans past the end of the chain"
    peak = max(peak, live + chain.loss_bytes)
    return Solution(choice=tuple(choice), peak_bytes=peak, extra_s=extra)


# A frontier entry: (S_i, cost, highest peak so far, choice so far).
_State = tuple[int, float, int, tuple[int, ...]]


def solve(chain: Chain, budget_bytes: int) -> Solution | None:
    """The choice of least extra time whose predicted peak fits ``budget_bytes``.

    Implements NOTE [Frontier recurrence].

    Returns:
        The optimal solution, or ``None`` when no choice fits.
    """
    return _frontier(chain, budget_bytes, minimise_peak=False)


def minimum_peak(chain: Chain) -> Solution:
    """The cheapest choice with the lowest predicted peak (the smallest budget any plan meets)."""
    lowest = _frontier(chain, None, minimise_peak=True)
    assert lowest is not None, "without a budget some choice always exists"
    return solve(chain, lowest.peak_bytes) or lowest


#: Estimates within this share of the lowest peak count as that peak when a minimum is measured.
NEAR_TIE_SHARE = 0.002


def lowest_peak_choices(chain: Chain) -> list[Solution]:
    """The choices a minimum is measured on: the cheapest within a near tie of the lowest
    predicted peak (:data:`NEAR_TIE_SHARE`), and
    the one the peak-minimising recurrence itself ends on where that is another. Choices the
    chain model puts at one peak can measure far apart (498,768 and 565,840 bytes for one
    estimate of 498,760 on an MLP at 32 micro-batches), and which is cheapest follows the
    segments' measured times; measuring both keeps a refusal's minimum from following them."""
    lowest = _frontier(chain, None, minimise_peak=True)
    assert lowest is not None, "without a budget some choice always exists"
    # Near ties count as ties: the profiles the estimates rest on may be simulated, a few
    # hundred bytes off the measured ones (NOTE [Recompute simulated]).
    near = lowest.peak_bytes + int(lowest.peak_bytes * NEAR_TIE_SHARE)
    cheapest = solve(chain, near) or lowest
    return [cheapest] if cheapest.choice == lowest.choice else [cheapest, lowest]


def _frontier(chain: Chain, budget_bytes: int | None, *, minimise_peak: bool) -> Solution | None:
    limit = float("inf") if budget_bytes is None else budget_bytes
    if chain.fixed_peak_bytes > limit:
        return None
    count = len(chain.options)
    # states[i]: partial choices that decide every segment before position i.
    states: list[list[_State]] = [[] for _ in range(count + 1)]
    states[0] = [(chain.start_bytes, 0.0, chain.fixed_peak_bytes, ())]
    for position in range(count):
        if not states[position]:
            continue
        for live, cost, peak, choice in _pareto(states[position]):
            for index, option in enumerate(chain.options[position]):
                end = position + option.span
                local_peak = live + option.local_bytes
                if end > count or local_peak > limit:
                    continue
                new_peak = max(peak, local_peak)
                new_cost = float(new_peak) if minimise_peak else cost + option.extra_s
                covered = (-1,) * (option.span - 1)
                states[end].append(
                    (live + option.kept_bytes, new_cost, new_peak, (*choice, index, *covered))
                )
        states[position] = []
    if not states[count]:
        return None
    states_done = _pareto(states[count])
    finished = []
    for live, cost, peak, choice in states_done:
        final_peak = max(peak, live + chain.loss_bytes)
        if final_peak <= limit:
            final_cost = float(final_peak) if minimise_peak else cost
            finished.append((final_cost, final_peak, choice))
    if not finished:
        return None
    cost, peak, choice = min(finished)
    return Solution(choice=choice, peak_bytes=peak, extra_s=evaluate(chain, choice).extra_s)


def _pareto(states: list[_State]) -> list[_State]:
    """Keep the states that no other state beats on both live bytes and cost."""
    states.sort(key=lambda s: (s[0], s[1], s[2]))
    kept: list[_State] = []
    best_cost = float("inf")
    for state in states:
        if state[1] < best_cost:
            kept.append(state)
            best_cost = state[1]
    if len(kept) <= MAX_FRONTIER:
        return kept
    return _thin(kept)


def _thin(states: list[_State]) -> list[_State]:
    """Conservatively merge states into ``MAX_FRONTIER`` bands of live bytes."""
    low, high = states[0][0], states[-1][0]
    width = max((high - low) // MAX_FRONTIER + 1, 1)
    bands: dict[int, _State] = {}
    for live, cost, peak, choice in states:
        band = (live - low) // width
        top = low + (band + 1) * width - 1
        current = bands.get(band)
        if current is None or cost < current[1]:
            bands[band] = (max(top, live), cost, peak, choice)
    return sorted(bands.values())
