"""NOTE [One budget]: one value from the user's reading to the tensor bytes a step may take, and
back to what the device shows, with nothing else shifting it."""

from __future__ import annotations

import pytest
import torch

from autockpt import parse_budget
from autockpt.planner.core import step_budget
from autockpt.planner.core.step_budget import (
    CUDA_HEADROOM_FRACTION,
    DEFAULT_CUDA_CONTEXT_BYTES,
    StepBudget,
)


@pytest.fixture
def no_card(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning for a card from a machine without one: the stand-ins."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_on_the_cpu_the_budget_is_the_tensor_bytes() -> None:
    budget = StepBudget.on(parse_budget("8MB"), torch.device("cpu"))
    assert budget.usable_bytes == 8_000_000
    assert budget.shown_bytes(1234) == 1234


def test_on_cuda_the_context_and_the_allocators_share_come_off_and_back_on(
    no_card: None,
) -> None:
    budget = StepBudget.on(parse_budget("4GB"), torch.device("cuda", 0))
    assert budget.context_bytes == DEFAULT_CUDA_CONTEXT_BYTES and not budget.context_measured
    assert budget.headroom_fraction == CUDA_HEADROOM_FRACTION
    usable = budget.usable_bytes
    assert usable == int((4_000_000_000 - DEFAULT_CUDA_CONTEXT_BYTES) / 1.1)
    # What a step of exactly the usable bytes shows is the budget, to a byte of rounding.
    assert 4_000_000_000 - 2 <= budget.shown_bytes(usable) <= 4_000_000_000


def test_a_ranks_extra_states_come_off_the_usable_bytes_and_show_in_the_peak(
    no_card: None,
) -> None:
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


def test_on_a_card_the_context_is_measured_after_warming_up_its_libraries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NOTE [What the first card must measure]: stand-ins for torch.cuda's answers on a card
    # with 80 GiB, 79 GiB of it free after the warm-up, of which the allocator holds 2 MiB.
    warmed: list[torch.device] = []
    gib, mib = 2**30, 2**20
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(step_budget, "_MEASURED_CONTEXT", {})
    monkeypatch.setattr(step_budget, "_warm_up_libraries", warmed.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (79 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2 * mib)
    budget = StepBudget.on(parse_budget("4GiB"), torch.device("cuda", 1))
    again = StepBudget.on(parse_budget("4GiB"), torch.device("cuda", 1))
    assert budget.context_measured and budget.context_bytes == gib - 2 * mib
    assert again.context_bytes == budget.context_bytes
    assert warmed == [torch.device("cuda", 1)]  # once per device and process
    assert budget.usable_bytes == int((4 * gib - (gib - 2 * mib)) / (1 + CUDA_HEADROOM_FRACTION))
