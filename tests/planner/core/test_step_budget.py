"""NOTE [One budget]: one value from the user's reading to the tensor bytes a step may take, and
back to what the device shows, with nothing else shifting it."""

from __future__ import annotations

import torch

from autockpt import parse_budget
from autockpt.planner.core.step_budget import (
    CUDA_HEADROOM_FRACTION,
    DEFAULT_CUDA_CONTEXT_BYTES,
    StepBudget,
)


def test_on_the_cpu_the_budget_is_the_tensor_bytes() -> None:
    budget = StepBudget.on(parse_budget("8MB"), torch.device("cpu"))
    assert budget.usable_bytes == 8_000_000
    assert budget.shown_bytes(1234) == 1234


def test_on_cuda_the_context_and_the_allocators_share_come_off_and_back_on() -> None:
    budget = StepBudget.on(parse_budget("4GB"), torch.device("cuda", 0))
    assert budget.context_bytes == DEFAULT_CUDA_CONTEXT_BYTES
    assert budget.headroom_fraction == CUDA_HEADROOM_FRACTION
    usable = budget.usable_bytes
    assert usable == int((4_000_000_000 - DEFAULT_CUDA_CONTEXT_BYTES) / 1.1)
    # What a step of exactly the usable bytes shows is the budget, to a byte of rounding.
    assert 4_000_000_000 - 2 <= budget.shown_bytes(usable) <= 4_000_000_000


def test_a_ranks_extra_states_come_off_the_usable_bytes_and_show_in_the_peak() -> None:
    one = StepBudget.on(parse_budget("4GB"), torch.device("cuda", 0))
    rank = StepBudget.on(parse_budget("4GB"), torch.device("cuda", 0), rank_offset_bytes=10**8)
    shown_offset = 10**8 + int(10**8 * CUDA_HEADROOM_FRACTION)
    assert rank.rank_offset_shown_bytes == shown_offset
    assert abs(one.usable_bytes - rank.usable_bytes - 10**8) <= 1  # one rounding at most
    assert rank.shown_bytes(5000) == one.shown_bytes(5000) + shown_offset


def test_lowering_aims_lower_and_still_reports_what_the_user_gave() -> None:
    read = parse_budget("8MB")
    lowered = StepBudget.on(read, torch.device("cpu")).lowered(6_000_000)
    assert lowered.read == read and lowered.target_bytes == 6_000_000
    assert lowered.usable_bytes == 6_000_000


def test_a_run_plans_again_for_its_own_budget_lowered() -> None:
    read = parse_budget("8MB")
    again = read.lowered_to(6_000_000)
    assert again.bytes == 6_000_000 and again.text == "8MB"
    assert again.reading.startswith(read.reading) and "5.72 MiB" in again.reading
