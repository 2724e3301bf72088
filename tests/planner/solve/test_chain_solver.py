"""The chain solver against brute force over every choice, on random and hand-sized chains."""

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autockpt.planner.solve.chain_solver
from autockpt.planner.core.decisions import KEEP_OPTION, RECOMPUTE_OPTION, OptionAction
from autockpt.planner.solve.chain_solver import (
    Chain,
    Option,
    Solution,
    evaluate,
    minimum_peak,
    solve,
)

FAST = settings(max_examples=200, deadline=None)

byte_counts = st.integers(min_value=0, max_value=50)
extra_seconds = st.one_of(
    st.integers(min_value=0, max_value=20).map(float),
    st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False),
)
options = st.builds(
    Option,
    action=st.just(KEEP_OPTION),
    kept_bytes=byte_counts,
    forward_bytes=byte_counts,
    backward_bytes=byte_counts,
    extra_s=extra_seconds,
)
chains = st.builds(
    Chain,
    start_bytes=byte_counts,
    options=st.lists(
        st.lists(options, min_size=1, max_size=4).map(tuple), min_size=1, max_size=6
    ).map(tuple),
    loss_bytes=byte_counts,
    fixed_peak_bytes=st.integers(min_value=0, max_value=150),
)
# Peaks of the chains above lie in 0..400; budgets range a little past both ends.
budgets = st.integers(min_value=-5, max_value=420)


def all_solutions(chain: Chain) -> list[Solution]:
    """Every choice of the chain, evaluated: the brute-force oracle."""
    return [
        evaluate(chain, choice)
        for choice in itertools.product(*(range(len(options)) for options in chain.options))
    ]


def cheapest_within(chain: Chain, budget_bytes: int) -> Solution | None:
    fitting = [s for s in all_solutions(chain) if s.peak_bytes <= budget_bytes]
    return min(fitting, key=lambda s: s.extra_s, default=None)


def with_free_first_option(chain: Chain) -> Chain:
    """The chain with option 0 free and every other option costing more than nothing."""

    def priced(index: int, option: Option) -> Option:
        extra_s = 0.0 if index == 0 else max(option.extra_s, 0.5)
        return dataclasses.replace(option, extra_s=extra_s)

    return dataclasses.replace(
        chain,
        options=tuple(
            tuple(priced(index, option) for index, option in enumerate(segment))
            for segment in chain.options
        ),
    )


@FAST
@given(chain=chains, budget_bytes=budgets)
def test_solve_matches_brute_force(chain: Chain, budget_bytes: int) -> None:
    expected = cheapest_within(chain, budget_bytes)
    solution = solve(chain, budget_bytes)
    assert (solution is None) == (expected is None)
    if solution is None or expected is None:
        return
    recomputed = evaluate(chain, solution.choice)
    assert recomputed.peak_bytes <= budget_bytes
    assert solution.peak_bytes == recomputed.peak_bytes
    assert solution.extra_s == recomputed.extra_s
    assert math.isclose(solution.extra_s, expected.extra_s)


@FAST
@given(chain=chains, shortfall_bytes=st.integers(1, 50))
def test_minimum_peak_is_the_lowest_and_nothing_fits_below_it(
    chain: Chain, shortfall_bytes: int
) -> None:
    lowest = min(s.peak_bytes for s in all_solutions(chain))
    solution = minimum_peak(chain)
    assert solution.peak_bytes == lowest
    assert evaluate(chain, solution.choice).peak_bytes == lowest
    assert solve(chain, lowest) is not None
    assert solve(chain, lowest - shortfall_bytes) is None


@FAST
@given(chain=chains.map(with_free_first_option), slack_bytes=st.integers(0, 20))
def test_budget_above_the_unplanned_peak_recomputes_nothing(chain: Chain, slack_bytes: int) -> None:
    keep_everything = (0,) * len(chain.options)
    budget_bytes = evaluate(chain, keep_everything).peak_bytes + slack_bytes
    solution = solve(chain, budget_bytes)
    assert solution is not None
    assert solution.extra_s == 0.0
    assert solution.choice == keep_everything


def keep_or_recompute(recompute_s: float) -> tuple[Option, Option]:
    """Keep 20 bytes of activations, or keep a 2-byte boundary and pay ``recompute_s``."""
    return (
        Option(KEEP_OPTION, kept_bytes=20, forward_bytes=20, backward_bytes=25, extra_s=0.0),
        Option(
            RECOMPUTE_OPTION, kept_bytes=2, forward_bytes=20, backward_bytes=25, extra_s=recompute_s
        ),
    )


# S_i = 10 + what segments before i keep; the peak is max(S_i + 25, S_3 + 5).
#   keep, keep, keep:           S = 10, 30, 50, 70  -> peak 75, cost 0
#   keep, recompute, keep:      S = 10, 30, 32, 52  -> peak 57, cost 1
#   recompute, keep, keep:      S = 10, 12, 32, 52  -> peak 57, cost 3
#   recompute, recompute, keep: S = 10, 12, 14, 34  -> peak 39, cost 4 (the lowest possible)
# Recomputing segment 2 never helps: its own backward still runs at S_2 + 25.
THREE_SEGMENTS = Chain(
    start_bytes=10,
    options=(keep_or_recompute(3.0), keep_or_recompute(1.0), keep_or_recompute(2.0)),
    loss_bytes=5,
)


@pytest.mark.parametrize(
    ("budget_bytes", "choice", "peak_bytes", "extra_s"),
    [
        (100, (0, 0, 0), 75, 0.0),
        (75, (0, 0, 0), 75, 0.0),
        (74, (0, 1, 0), 57, 1.0),
        (57, (0, 1, 0), 57, 1.0),
        (56, (1, 1, 0), 39, 4.0),
        (39, (1, 1, 0), 39, 4.0),
    ],
)
def test_three_segment_chain_by_hand(
    budget_bytes: int, choice: tuple[int, ...], peak_bytes: int, extra_s: float
) -> None:
    assert solve(THREE_SEGMENTS, budget_bytes) == Solution(choice, peak_bytes, extra_s)


def test_three_segment_chain_below_its_minimum() -> None:
    # (1, 1, 1) reaches the same lowest peak, so only the peak is pinned down here.
    assert minimum_peak(THREE_SEGMENTS).peak_bytes == 39
    assert solve(THREE_SEGMENTS, 38) is None


def test_fixed_peak_and_loss_bound_every_choice() -> None:
    free = Option(KEEP_OPTION, kept_bytes=0, forward_bytes=0, backward_bytes=0, extra_s=0.0)
    optimizer_bound = Chain(start_bytes=0, options=((free,),), fixed_peak_bytes=100)
    assert solve(optimizer_bound, 99) is None
    assert solve(optimizer_bound, 100) == Solution((0,), 100, 0.0)
    loss_bound = Chain(start_bytes=10, options=((free,),), loss_bytes=30)
    assert minimum_peak(loss_bound).peak_bytes == 40
    assert solve(loss_bound, 39) is None


# Five segments, each able to keep 0..3 units at a cost that falls as it keeps more: the
# frontier of (live bytes, cost) after a few segments is far wider than four states.
WIDE_CHAIN = Chain(
    start_bytes=5,
    options=tuple(
        tuple(
            Option(
                OptionAction(recompute=kept < 3, num_chunks=1 + kept),
                kept_bytes=kept * (3 + segment),
                forward_bytes=10,
                backward_bytes=12 + segment,
                extra_s=(3 - kept) * (1.0 + 0.1 * segment),
            )
            for kept in range(4)
        )
        for segment in range(5)
    ),
    loss_bytes=4,
)


def test_thinned_frontier_is_conservative(monkeypatch: pytest.MonkeyPatch) -> None:
    thinned_sizes: list[int] = []
    thin = autockpt.planner.solve.chain_solver._thin

    def counting_thin(states: list) -> list:
        thinned_sizes.append(len(states))
        return thin(states)

    monkeypatch.setattr(autockpt.planner.solve.chain_solver, "MAX_FRONTIER", 4)
    monkeypatch.setattr(autockpt.planner.solve.chain_solver, "_thin", counting_thin)
    budget_bytes = 60  # between the lowest peak (21) and the unplanned one (84)
    solution = solve(WIDE_CHAIN, budget_bytes)
    expected = cheapest_within(WIDE_CHAIN, budget_bytes)
    assert thinned_sizes and max(thinned_sizes) > 4
    assert solution is not None and expected is not None
    assert evaluate(WIDE_CHAIN, solution.choice).peak_bytes <= solution.peak_bytes
    assert solution.peak_bytes <= budget_bytes
    assert solution.extra_s >= expected.extra_s or math.isclose(solution.extra_s, expected.extra_s)
    assert minimum_peak(WIDE_CHAIN).peak_bytes >= min(
        s.peak_bytes for s in all_solutions(WIDE_CHAIN)
    )


@FAST
@given(chain=chains, budget_bytes=budgets)
def test_thinned_frontier_never_exceeds_the_budget(chain: Chain, budget_bytes: int) -> None:
    expected = cheapest_within(chain, budget_bytes)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autockpt.planner.solve.chain_solver, "MAX_FRONTIER", 4)
        solution = solve(chain, budget_bytes)
        lowest = minimum_peak(chain)
    assert evaluate(chain, lowest.choice).peak_bytes <= lowest.peak_bytes
    if solution is None:
        return
    assert expected is not None
    assert evaluate(chain, solution.choice).peak_bytes <= solution.peak_bytes <= budget_bytes
    assert solution.extra_s >= expected.extra_s or math.isclose(solution.extra_s, expected.extra_s)


@st.composite
def spanning_chains(draw: st.DrawFn) -> Chain:
    """Chains where some options cover several segments (a region recomputed as one)."""
    count = draw(st.integers(min_value=1, max_value=5))
    rows = []
    for position in range(count):
        row = list(draw(st.lists(options, min_size=1, max_size=3)))
        if position < count - 1 and draw(st.booleans()):
            span = draw(st.integers(min_value=2, max_value=count - position))
            row.append(dataclasses.replace(draw(options), span=span))
        rows.append(tuple(row))
    return Chain(
        start_bytes=draw(byte_counts),
        options=tuple(rows),
        loss_bytes=draw(byte_counts),
        fixed_peak_bytes=draw(st.integers(min_value=0, max_value=150)),
    )


def spanning_solutions(chain: Chain) -> list[Solution]:
    """Every choice of a chain with spanning options, evaluated (covered positions get -1)."""
    found: list[Solution] = []

    def extend(position: int, choice: tuple[int, ...]) -> None:
        if position == len(chain.options):
            found.append(evaluate(chain, choice))
            return
        for index, option in enumerate(chain.options[position]):
            end = position + option.span
            if end <= len(chain.options):
                extend(end, (*choice, index, *(-1,) * (option.span - 1)))

    extend(0, ())
    return found


@FAST
@given(spanning_chains(), budgets)
def test_solve_matches_brute_force_with_spanning_options(chain: Chain, budget_bytes: int) -> None:
    fitting = [s for s in spanning_solutions(chain) if s.peak_bytes <= budget_bytes]
    got = solve(chain, budget_bytes)
    if not fitting:
        assert got is None
        return
    assert got is not None
    assert evaluate(chain, got.choice).peak_bytes <= budget_bytes
    assert math.isclose(got.extra_s, min(s.extra_s for s in fitting), abs_tol=1e-9)
    assert minimum_peak(chain).peak_bytes == min(s.peak_bytes for s in spanning_solutions(chain))


def test_an_options_label_names_its_action() -> None:
    """The plan's table shows each segment's option by its action's label; decoding reads the
    action itself (NOTE: no label is parsed back)."""
    assert KEEP_OPTION.label == "keep"
    assert RECOMPUTE_OPTION.label == "recompute"
    assert OptionAction(recompute=True, selective=True).label == "recompute cheap ops"
    assert OptionAction(recompute=True, region=True).label == "recompute region"
    chunked = OptionAction(recompute=True, num_chunks=4, region=True)
    assert chunked.label == "recompute region in 4 chunks"
    option = Option(chunked, kept_bytes=1, forward_bytes=2, backward_bytes=3, extra_s=0.0)
    assert option.label == chunked.label and option.action.num_chunks == 4
