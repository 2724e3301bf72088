"""Reading memory budgets: ``"4GB"``, ``"3.5GiB"``, ``"800MB"``, ``4_000_000_000``, ``"auto"``.

Units are parsed here, at the edge; everything after this speaks plain ``int`` bytes named
``*_bytes``. ``GB``/``MB``/``KB`` are powers of 10 (as disk and card makers print them),
``GiB``/``MiB``/``KiB`` powers of 2 (as ``nvidia-smi`` prints them), a bare number is bytes.
``auto`` is the free memory of the device less a margin.
"""

from __future__ import annotations

import re
from fractions import Fraction

import torch
from pydantic import BaseModel, ConfigDict

from autockpt.errors import BudgetError

_UNIT_BYTES: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BUDGET_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")

#: Share of the free device memory that ``auto`` leaves untouched, for other processes and
#: for allocator growth the plan does not see.
AUTO_MARGIN_FRACTION = 0.10


class Budget(BaseModel):
    """A memory budget as read from the user.

    Attributes:
        bytes: the budget in bytes.
        text: what the user wrote.
        reading: how it was read, for printing ("4GB = 4,000,000,000 bytes (3.73 GiB)").
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bytes: int
    text: str
    reading: str

    def lowered_to(self, num_bytes: int) -> Budget:
        """This budget, asked for at ``num_bytes`` instead: what a run plans again for after a
        step went over (NOTE [Planning again] in :mod:`autockpt.planner.verify`)."""
        return Budget(
            bytes=num_bytes,
            text=self.text,
            reading=f"{self.reading}, planned for {format_bytes(num_bytes)} after a step went over",
        )


def format_bytes(num_bytes: float) -> str:
    """Human-readable size in powers of two, e.g. ``1.50 GiB``; negative sizes keep their sign."""
    sign = "-" if num_bytes < 0 else ""
    size = abs(float(num_bytes))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{sign}{size:.0f} {unit}" if unit == "B" else f"{sign}{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def parse_budget(value: str | int, *, device: torch.device | str | None = None) -> Budget:
    """Read a budget string or byte count.

    Args:
        value: ``"4GB"``, ``"3.5GiB"``, ``"800MB"``, ``"4000000000"``, an ``int`` of bytes,
            or ``"auto"``.
        device: the device ``auto`` refers to; ``auto`` needs a CUDA device.

    Returns:
        The budget in bytes with the text and how it was read.

    Raises:
        BudgetError: the value is empty, negative, zero, has an unknown unit, or is ``auto``
            without a CUDA device.

    Example:
        >>> parse_budget("4GB").bytes
        4000000000
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BudgetError(f"budget {value!r} is not a size; write it like 4GB, 3.5GiB or 800MB")
    if isinstance(value, int):
        if value <= 0:
            raise BudgetError(f"budget {value} bytes must be positive; write it like 4GB or 3.5GiB")
        return Budget(
            bytes=value, text=str(value), reading=f"{value:,} bytes ({format_bytes(value)})"
        )
    text = value.strip()
    if not text:
        raise BudgetError("budget is empty; write it like 4GB, 3.5GiB, 800MB or auto")
    if text.lower() == "auto":
        return _auto_budget(text, device)
    if text.startswith("-"):
        raise BudgetError(f"budget {text!r} is negative; write a positive size like 4GB")
    match = _BUDGET_PATTERN.match(text)
    if match is None or match.group(2).lower() not in _UNIT_BYTES:
        raise BudgetError(
            f"budget {text!r} is not a size; write it like 4GB, 3.5GiB or 800MB "
            "(GB/MB are powers of 10, GiB/MiB powers of 2, a bare number is bytes)"
        )
    number, unit = match.group(1), match.group(2)
    # Fraction, not float: "4.1GB" must be 4,100,000,000 bytes exactly.
    num_bytes = int(Fraction(number) * _UNIT_BYTES[unit.lower()])
    if num_bytes <= 0:
        raise BudgetError(f"budget {text!r} is zero; write a positive size like 4GB")
    return Budget(
        bytes=num_bytes,
        text=text,
        reading=f"{text} = {num_bytes:,} bytes ({format_bytes(num_bytes)})",
    )


def read_unless_auto(value: str | int | Budget) -> Budget | str:
    """``value`` read now (a typo fails where it is given), or ``"auto"`` kept to be read
    once the device is known (NOTE [One budget] in :mod:`autockpt.planner.core.step_budget`)."""
    if isinstance(value, Budget):
        return value
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return parse_budget(value)


def _auto_budget(text: str, device: torch.device | str | None) -> Budget:
    resolved = torch.device(device) if device is not None else None
    if resolved is None or resolved.type != "cuda" or not torch.cuda.is_available():
        raise BudgetError(
            "budget 'auto' reads the free memory of a CUDA device, and none is in use; "
            "give a size such as 4GB, or train with --device cuda on a machine with a GPU"
        )
    free_bytes, total_bytes = torch.cuda.mem_get_info(resolved)
    num_bytes = int(free_bytes * (1.0 - AUTO_MARGIN_FRACTION))
    return Budget(
        bytes=num_bytes,
        text=text,
        reading=(
            f"auto = {1 - AUTO_MARGIN_FRACTION:.0%} of the {format_bytes(free_bytes)} free "
            f"of {format_bytes(total_bytes)} on {resolved} = {num_bytes:,} bytes"
        ),
    )
