"""Calibrating the time model: the rates of a device (NOTE [Time model] in
:mod:`autockpt.planner.timing.time_model`), measured once per process and room, in tensors that
fit what the budget leaves free."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class TimeModel:
    """Rates of one device (NOTE [Time model])."""

    flops_per_s: float
    bytes_per_s: float
    op_overhead_s: float
    mode_overhead_s: float = 0.0
    """What a Python dispatch mode adds to every op it sees (selective recompute's two modes)."""

    def seconds(self, *, flops: float, moved_bytes: float, num_ops: float) -> float:
        """Estimated seconds for ``num_ops`` ops doing ``flops`` and moving ``moved_bytes``."""
        return (
            num_ops * self.op_overhead_s + flops / self.flops_per_s + moved_bytes / self.bytes_per_s
        )


#: Matrix side and vector length the rates are measured with, by device type, when the budget
#: leaves room for them (the CPU's fit its caches as a model's small ops do).
CALIBRATION_SIZES = {"cpu": (384, 4_000_000), "cuda": (4096, 64_000_000)}
#: The smallest sizes calibration goes down to, however little room the budget leaves: three
#: matrices of 16 x 16 and two vectors of 1024 floats, 8 KiB (NOTE [Calibration in a small room]).
MIN_CALIBRATION_SIZES = (16, 1024)

# NOTE [Calibration in a small room]
# The calibration's tensors are held while planning runs, so they count against the budget
# like the model's own (planning stays under the budget: the tests' counter checks it). A model
# planned within half a MiB (PatchTST's small config, planned at its minimum) leaves less room
# than any fixed size, and a floor of 512 KiB took planning over its budget. The sizes go down
# with the room instead; tensors that small run an op in about the time of its overhead, so
# each timing runs the op as many times as the full size would have taken and divides: the
# rate is the one the full size would read where the tensors stay in the CPU's caches, which is
# where a model that small computes too.


def calibrate(
    device_type: str = "cpu", device_index: int | None = None, *, max_bytes: int | None = None
) -> TimeModel:
    """Measure the rates of a device once per process and room (NOTE [Time model]).

    Args:
        max_bytes: the most its tensors may take at once: on the card the user said is full,
            what the budget leaves free beside the model (``None``: the full sizes). The room is
            rounded down to a power of two, so that nearby budgets share one calibration.
    """
    return _calibrate(device_type, device_index, _rounded(max_bytes))


def calibration_peak_bytes(device_type: str, max_bytes: int | None) -> int:
    """The most bytes :func:`calibrate` holds at once within ``max_bytes`` (float32 tensors:
    three matrices, or two vectors)."""
    side, length = calibration_sizes(device_type, _rounded(max_bytes))
    return max(3 * side * side, 2 * length) * 4


def _rounded(max_bytes: int | None) -> int | None:
    return None if max_bytes is None else 1 << max(int(max_bytes), 1).bit_length() - 1


def calibration_sizes(device_type: str, max_bytes: int | None) -> tuple[int, int]:
    """The matrix side and vector length whose tensors fit ``max_bytes``: three float32
    matrices (two operands and the product) or two vectors (one and its sum) at a time."""
    side, length = CALIBRATION_SIZES["cpu" if device_type == "cpu" else "cuda"]
    if max_bytes is None:
        return side, length
    min_side, min_length = MIN_CALIBRATION_SIZES
    side = min(side, max(min_side, math.isqrt(max_bytes // 12)))
    length = min(length, max(min_length, max_bytes // 8))
    return side, length


@functools.cache
def _calibrate(device_type: str, device_index: int | None, max_bytes: int | None) -> TimeModel:
    device = (
        torch.device(device_type, device_index)
        if device_index is not None
        else torch.device(device_type)
    )
    size, length = calibration_sizes(device.type, max_bytes)
    with torch.no_grad():
        # One at a time, each freed before the next: the room is for either, not both.
        full_side, full_length = calibration_sizes(device.type, None)
        matmul_s = _seconds_on_new(
            lambda a, b: torch.mm(a, b), [(size, size)] * 2, device, (full_side // size) ** 3
        )
        add_s = _seconds_on_new(
            lambda big: big.add(1.0), [(length,)], device, full_length // length
        )
        moved_bytes = 2 * length * 4  # float32, read and written
        tiny = torch.randn(8, device=device)
        overhead_s = _median_seconds(lambda: tiny.add(1.0), device, repeats=200)
        with _PassThrough():
            in_mode_s = _median_seconds(lambda: tiny.add(1.0), device, repeats=200)
    if device.type == "cuda":
        # The caching allocator would keep what calibration used reserved, where nvidia-smi
        # shows it, on the card the plan is for.
        torch.cuda.empty_cache()
    return TimeModel(
        flops_per_s=2 * size**3 / max(matmul_s - overhead_s, 1e-9),
        bytes_per_s=moved_bytes / max(add_s - overhead_s, 1e-9),
        op_overhead_s=overhead_s,
        mode_overhead_s=max(in_mode_s - overhead_s, 0.0),
    )


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that only runs each op: what any Python mode costs per op."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        return func(*args, **(kwargs or {}))


def _seconds_on_new(
    work: Callable[..., object],
    shapes: list[tuple[int, ...]],
    device: torch.device,
    times: int = 1,
) -> float:
    """The median seconds of one ``work`` on new random tensors of ``shapes``, freed on return,
    timed ``times`` at a time (NOTE [Calibration in a small room])."""
    tensors = [torch.randn(shape, device=device) for shape in shapes]
    times = max(1, min(times, 4096))

    def repeated() -> None:
        for _ in range(times):
            work(*tensors)

    return _median_seconds(repeated, device) / times


def _median_seconds(work: Callable[[], object], device: torch.device, repeats: int = 7) -> float:
    work()
    _synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
