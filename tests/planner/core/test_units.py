"""parse_budget and format_bytes: units read at the edge, plain int bytes after."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autockpt.errors import AutockptError, BudgetError
from autockpt.planner.core.units import format_bytes, parse_budget

UNIT_FACTORS = {"GB": 10**9, "GiB": 2**30, "MB": 10**6, "MiB": 2**20}


@pytest.mark.parametrize(
    ("value", "expected_bytes"),
    [
        ("4GB", 4_000_000_000),
        ("3.5GiB", 3_758_096_384),  # 3.5 * 2**30
        ("800MB", 800_000_000),
        ("1.5gb", 1_500_000_000),
        ("2mib", 2 * 2**20),
        ("  2GB ", 2_000_000_000),
        ("2 GB", 2_000_000_000),
        ("1000", 1000),
        (".5KB", 500),
        (4_000_000_000, 4_000_000_000),
        (1, 1),
    ],
)
def test_parse_budget_reads_units(value: str | int, expected_bytes: int) -> None:
    assert parse_budget(value).bytes == expected_bytes


def test_decimal_fractions_are_not_truncated_by_float_rounding() -> None:
    # 4.1 * 1e9 is 4099999999.9999995 in binary floating point.
    assert parse_budget("4.1GB").bytes == 4_100_000_000


def test_budget_keeps_the_text_and_says_how_it_was_read() -> None:
    budget = parse_budget("  4GB ")
    assert budget.text == "4GB"
    assert "4,000,000,000 bytes" in budget.reading
    assert "3.73 GiB" in budget.reading
    assert "4,000,000,000 bytes" in parse_budget(4_000_000_000).reading


def test_budget_is_immutable() -> None:
    budget = parse_budget("1GB")
    with pytest.raises(ValueError, match="frozen"):
        budget.bytes = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("4XB", "is not a size"),
        ("-1GB", "is negative"),
        ("0", "is zero"),
        ("0.0GB", "is zero"),
        ("", "is empty"),
        ("   ", "is empty"),
        ("GB", "is not a size"),
        ("1.2.3GB", "is not a size"),
        ("1e9", "is not a size"),
        ("four GB", "is not a size"),
        (0, "must be positive"),
        (-5, "must be positive"),
        (True, "is not a size"),
        (None, "is not a size"),
        (4.0, "is not a size"),
    ],
)
def test_bad_budgets_raise_budget_error(value: object, fragment: str) -> None:
    with pytest.raises(BudgetError, match=fragment) as caught:
        parse_budget(value)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, AutockptError)
    assert "4GB" in str(caught.value)  # every message shows a size that would work
    assert "\n" not in str(caught.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="'auto' works when CUDA is available")
@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
def test_auto_without_cuda_says_what_to_do(device: str | None) -> None:
    with pytest.raises(BudgetError) as caught:
        parse_budget("auto", device=device)
    message = str(caught.value)
    assert "CUDA" in message
    assert "give a size such as 4GB" in message
    assert "--device cuda" in message


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (5 * 2**20, "5.00 MiB"),
        (1.5 * 2**30, "1.50 GiB"),
        (4_000_000_000, "3.73 GiB"),
        (2**40, "1024.00 GiB"),
        (-2048, "-2.00 KiB"),
    ],
)
def test_format_bytes(num_bytes: float, text: str) -> None:
    assert format_bytes(num_bytes) == text


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=1), unit=st.sampled_from(sorted(UNIT_FACTORS)))
def test_whole_numbers_of_any_unit_are_exact(n: int, unit: str) -> None:
    assert parse_budget(f"{n}{unit}").bytes == n * UNIT_FACTORS[unit]
