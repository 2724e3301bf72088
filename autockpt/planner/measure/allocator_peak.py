"""The peak of one real step, counted by the allocator: what a compiled step holds.

Inductor's kernels allocate their buffers below the dispatcher, where the planner's tracker
cannot see them; the allocator sees every byte. On the CPU the profiler's memory events come
from it; on CUDA its own statistics do: the most bytes its tensors held, plus what it reserved
beyond them (not yet run on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from autockpt.planner.core.memory_tracker import flat_tensors, storage_bytes, tensors_of

__all__ = ["AllocatorPeak", "allocator_count", "allocator_peak_bytes", "resident_bytes"]


class AllocatorPeak:
    """What :func:`allocator_count` counted: ``peak_bytes`` once its block has ended."""

    peak_bytes: int = 0


@contextmanager
def allocator_count(device: torch.device) -> Iterator[AllocatorPeak]:
    """Count the most bytes the block holds at once above what was allocated when it began."""
    reading = AllocatorPeak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        # Blocks cached from before the block (an earlier candidate's) are not its own.
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield reading
        torch.cuda.synchronize(device)
        most_allocated = int(torch.cuda.max_memory_allocated(device))
        # What the caching allocator reserves beyond its tensors at their peak (rounding,
        # split blocks, freed blocks it keeps) is device memory the step takes as well.
        slack = max(int(torch.cuda.max_memory_reserved(device)) - most_allocated, 0)
        reading.peak_bytes = most_allocated - start + slack
        return
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        yield reading
    events = profiler.profiler.kineto_results.events()  # type: ignore[union-attr]
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    live = peak = 0
    for event in memory:
        live += event.nbytes()  # negative for a free
        peak = max(peak, live)
    reading.peak_bytes = peak


def allocator_peak_bytes(step: Callable[[], None], device: torch.device) -> int:
    """The most bytes ``step`` holds at once above what was allocated when it started."""
    with allocator_count(device) as reading:
        step()
    return reading.peak_bytes


def resident_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, batch: Iterable[Any]
) -> int:
    """Bytes alive before a step that the step needs: weights (and any gradients still held),
    buffers, optimizer state and the batch, each storage once (the budget counts everything
    the step holds)."""
    return storage_bytes([*tensors_of(model, optimizer), *flat_tensors(list(batch))])
