"""The one re-plan policy (NOTE [Planning again]); the verification step itself is checked in
tests/planner/test_plan.py."""

from __future__ import annotations

from autockpt.planner.verify import REPLANNING, ReplanPolicy


def test_a_round_lowers_by_the_overshoot_and_by_at_least_its_least_share() -> None:
    policy = ReplanPolicy(max_rounds=3, least_share=0.1)
    # A step a little over: the least share.
    assert policy.lowered(1000, over_bytes=1) == 900
    # A step far over: the whole overshoot.
    assert policy.lowered(1000, over_bytes=250) == 750
    # Nothing known of the overshoot (CUDA out of memory): the least share.
    assert policy.lowered(1000, over_bytes=0) == 900


def test_the_planner_and_the_trainer_read_one_policy() -> None:
    from autockpt.planner import entry
    from autockpt.training.loop import replanning, train

    assert entry.REPLANNING is REPLANNING
    assert replanning.REPLANNING is REPLANNING and train.REPLANNING is REPLANNING
    assert REPLANNING.max_rounds >= 1 and 0 < REPLANNING.least_share < 1
