"""What the trainer changes about its own process on the CPU: torch's threads and malloc's reuse.

:func:`tune_host` applies both settings when a CPU run starts and returns what it did, which the
trainer logs as the run's first event (the README says the same). A run applies them before it
plans for its budget (:func:`~autockpt.training.setup.prepare.prepare` with ``tune_host=True``): on
the CPU the planner times candidate plans on the real model (NOTE [Measured step time]), and
what it times must be the process that trains, with its threads and its malloc.

NOTE [Tuning the host process]
Two settings of the process decide much of a CPU step's time, and neither is the model's.

- Threads. torch runs each op on all physical cores, and between ops its OpenMP threads wait in
  a spin loop. A small model's ops are too short for a second thread to pay for that
  synchronisation, and on a machine whose cores are busy with anything else the spinning threads
  fight it: on the 2-core machine this was written on (shared with other work), a plain ``tiny``
  step (batch 8) took 52 ms on one thread and 179 ms on two, ``small`` 172 ms and 582 ms (the
  fastest of 30 and of 15 steps, the thread counts alternating). So a step whose tensors take less than ``SMALL_STEP_BYTES`` (the plan's unplanned
  peak) runs on one thread; a larger one keeps torch's default. ``TrainConfig.cpu_threads`` sets
  the count instead. The setting is the process's while the run lasts and is put back after it.
- Freed pages. glibc's malloc serves a block above its mmap threshold (32 MiB at most, adapting)
  with freshly mapped pages and returns them to the kernel on free, so every step pays the kernel
  for zeroing them again: on ``tft-225`` that was about half of a step's CPU time (system time).
  :func:`keep_freed_memory` raises the mmap threshold to 1 GiB and turns trimming off, so freed
  blocks stay in the process and the next step reuses them. The cost is that the process keeps
  its high-water mark of memory until it ends, which a training step reaches every step anyway.
  The setting cannot be undone for the blocks already kept; it stays for the process's life.
  Trimming is off by a threshold of -1 (mallopt(3)), not by a large one: mallopt takes an
  ``int``, so the largest threshold is 2 GiB, and a ``tft-225`` step (batch 32, 2.04 GB of
  tensors) frees more than that at the heap's top at once. With it malloc gave 5.45 GB back to
  the kernel over 10 steps, which then faulted 500-600 thousand pages (2-2.4 GB) back in every
  second or third step: 0.70-1.27 s a step, and the trainer's median moved from 0.67 to 1.25 s
  between runs. With trimming off the steps after the second fault 0-54 thousand pages and
  take 0.66-0.75 s.

Neither changes a result: a thread count changes the order of float additions in some kernels,
which is why it is decided from the plan alone (the same for every run of the same settings),
never from a timing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

import torch

from autockpt import format_bytes
from autockpt.training.options.config import TrainConfig

#: Steps whose tensors (the plan's unplanned peak) take less than this run on one CPU thread.
SMALL_STEP_BYTES = 256 * 2**20

# From glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEPT_BLOCK_BYTES = 2**30
_NEVER_TRIM = -1  # mallopt(3): "disables trimming completely"


@dataclass(frozen=True)
class HostTuning:
    """What :func:`tune_host` set, and the thread count to put back after the run."""

    threads: int
    previous_threads: int
    threads_reason: str
    keeps_freed_memory: bool

    def describe(self) -> str:
        """One line for the run's log."""
        memory = (
            "malloc keeps freed memory for the next step (mmap threshold 1 GiB, no trimming)"
            if self.keeps_freed_memory
            else "malloc left as it is (not glibc)"
        )
        return f"CPU process: {self.threads} torch thread(s), {self.threads_reason}; {memory}"

    def restore(self) -> None:
        """Put torch's thread count back (the malloc setting stays, NOTE [Tuning the host
        process])."""
        torch.set_num_threads(self.previous_threads)


def tune_host(config: TrainConfig, device: torch.device, step_bytes: int) -> HostTuning | None:
    """Apply NOTE [Tuning the host process] for a run of ``config`` whose unplanned step takes
    ``step_bytes``; None on a GPU (nothing set)."""
    if device.type != "cpu":
        return None
    previous = torch.get_num_threads()
    threads, reason = choose_threads(config, step_bytes, default=previous)
    torch.set_num_threads(threads)
    return HostTuning(
        threads=threads,
        previous_threads=previous,
        threads_reason=reason,
        keeps_freed_memory=keep_freed_memory(),
    )


def choose_threads(config: TrainConfig, step_bytes: int, *, default: int) -> tuple[int, str]:
    """The run's CPU thread count and why, from the settings and the unplanned step's bytes
    alone."""
    if config.cpu_threads is not None:
        return config.cpu_threads, "as --cpu-threads says"
    if step_bytes < SMALL_STEP_BYTES and default > 1:
        return 1, (
            f"the step's tensors take {format_bytes(step_bytes)}, too little work per op for "
            f"more threads to pay for their synchronisation (--cpu-threads N to change)"
        )
    return default, "torch's default (--cpu-threads N to change)"


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed blocks for reuse; False where libc is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return all(
        bool(mallopt(option, value))
        for option, value in (
            (_M_MMAP_THRESHOLD, _KEPT_BLOCK_BYTES),
            (_M_TRIM_THRESHOLD, _NEVER_TRIM),
        )
    )
