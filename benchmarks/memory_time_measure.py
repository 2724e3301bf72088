"""Measuring the strategies of the memory/time benchmark: peak memory, step time, failures.

Memory is one untimed step per strategy: tracked tensor bytes on the CPU, the allocator's peaks
(as if the strategy were alone on the device) on CUDA. Timed steps synchronise the device. A
compile can be cut off by a time limit, and an out-of-memory or a compile error marks the
strategy failed instead of ending the run.
"""

from __future__ import annotations

import gc
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from memory_time_strategies import Strategy, Workload

import autockpt


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def cuda_context_bytes(device: torch.device) -> int:
    """Device memory in use that the caching allocator does not hold: the context (and any
    other process on the card)."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def measure_memory(strategy: Strategy, work: Workload, context_bytes: int) -> None:
    strategy.optimizer.zero_grad(set_to_none=True)
    own = [*autockpt.tensors_of(strategy.model, strategy.optimizer), *work.inputs, work.target]
    if work.device.type == "cuda":
        strategy.measured = _cuda_peaks(strategy, work, own, context_bytes)
        return
    if strategy.compile_budget is not None:
        return  # compiled code allocates outside the dispatcher: nothing to count
    with autockpt.MemoryTracker(initial=own) as tracker:
        strategy.step(work)
    strategy.measured = {"tracked_bytes": tracker.peak_bytes}


def _cuda_peaks(
    strategy: Strategy, work: Workload, own: list[torch.Tensor], context_bytes: int
) -> dict[str, int]:
    """Peaks of one step as if this strategy were alone on the device.

    ``memory_allocated`` before the step holds every strategy's model; only this one's
    parameters, optimizer state and batch (``own``) belong to the step, so the rest is taken
    off the peak. The cache is emptied first, so the reserved peak is this step's.
    """
    device = work.device
    gc.collect()
    torch.cuda.empty_cache()
    _sync(device)
    own_bytes = _storage_bytes(own)
    allocated_before = torch.cuda.memory_allocated(device)
    reserved_before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    strategy.step(work)
    _sync(device)
    allocated = own_bytes + torch.cuda.max_memory_allocated(device) - allocated_before
    reserved = own_bytes + torch.cuda.max_memory_reserved(device) - reserved_before
    return {
        "max_allocated_bytes": allocated,
        "max_reserved_bytes": reserved,
        "context_bytes": context_bytes,
        "visible_bytes": reserved + context_bytes,
    }


def timed_step(strategy: Strategy, work: Workload) -> float:
    _sync(work.device)
    started = time.perf_counter()
    strategy.step(work)
    _sync(work.device)
    return time.perf_counter() - started


def _compile_within(strategy: Strategy, work: Workload, seconds: float) -> None:
    started = time.perf_counter()
    with time_limit(seconds):
        strategy.step(work)
    strategy.notes.append(f"first step, compiling: {time.perf_counter() - started:.1f} s")


def _timed_into(strategy: Strategy, work: Workload) -> None:
    strategy.step_s.append(timed_step(strategy, work))


class CompileTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CompileTimeout` after ``seconds`` (main thread, POSIX; None: no limit)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise CompileTimeout(f"still compiling after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_guarded(strategy: Strategy, work: Workload, action: Callable[[], Any]) -> bool:
    """Run ``action``; an out-of-memory (or a compile error) marks the strategy failed."""
    try:
        action()
        return True
    except torch.OutOfMemoryError:
        strategy.failed = "out of memory"
    except Exception as error:  # noqa: BLE001 - compile and step failures are reported, not fatal
        if strategy.compile_budget is None:
            raise
        strategy.failed = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    strategy.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if work.device.type == "cuda":
        torch.cuda.empty_cache()
    return False
