"""How long ops take on a device: a FLOP-plus-bytes estimate calibrated by micro-benchmarks.

NOTE [Time model]
The seconds of a piece of work are estimated as

    num_ops * op_overhead_s + flops / flops_per_s + moved_bytes / bytes_per_s

with the three rates measured on the target device when the planner first needs them (a
matrix product for ``flops_per_s``, an elementwise add on a large tensor for ``bytes_per_s``,
many tiny ops for ``op_overhead_s``; about a tenth of a second on a CPU, cached per device).
It is not exact, but it ranks actions the right way round: recomputing a GRN costs its FLOPs
and bytes again, splitting work into more pieces costs the per-op overhead again.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TimeModel:
    """Rates of one device (NOTE [Time model])."""

    flops_per_s: float
    bytes_per_s: float
    op_overhead_s: float

    def seconds(self, *, flops: float, moved_bytes: float, num_ops: float) -> float:
        """Estimated seconds for ``num_ops`` ops doing ``flops`` and moving ``moved_bytes``."""
        return (
            num_ops * self.op_overhead_s + flops / self.flops_per_s + moved_bytes / self.bytes_per_s
        )


@functools.cache
def calibrate(device_type: str = "cpu", device_index: int | None = None) -> TimeModel:
    """Measure the rates of a device once per process (NOTE [Time model])."""
    device = (
        torch.device(device_type, device_index)
        if device_index is not None
        else torch.device(device_type)
    )
    with torch.no_grad():
        size = 384 if device.type == "cpu" else 4096
        a = torch.randn(size, size, device=device)
        b = torch.randn(size, size, device=device)
        matmul_s = _median_seconds(lambda: torch.mm(a, b), device)
        big = torch.randn(4_000_000 if device.type == "cpu" else 64_000_000, device=device)
        add_s = _median_seconds(lambda: big.add(1.0), device)
        tiny = torch.randn(8, device=device)
        overhead_s = _median_seconds(lambda: tiny.add(1.0), device, repeats=200)
    return TimeModel(
        flops_per_s=2 * size**3 / max(matmul_s - overhead_s, 1e-9),
        bytes_per_s=2 * big.numel() * big.element_size() / max(add_s - overhead_s, 1e-9),
        op_overhead_s=overhead_s,
    )


def _median_seconds(work: object, device: torch.device, repeats: int = 7) -> float:
    assert callable(work)
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
