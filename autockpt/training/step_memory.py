"""Measuring one training step's peak memory, the number the trainer holds to the budget.

:class:`StepMemoryMeter` owns how a step's peak is read: tracked tensor bytes on the CPU
(:class:`~autockpt.planner.memory.MemoryTracker`), the allocator's counters on CUDA. What the
trainer does with the reading (re-planning) is in :class:`~autockpt.training.train.Trainer`.

NOTE [Enforcing the budget]
The plan predicts the peak of one step; the trainer checks it on every step. On the CPU the
measure is tracked tensor bytes: the step (forward, backward, clipping, optimizer) runs under a
:class:`~autockpt.planner.memory.MemoryTracker` that starts from the parameters, their gradients, the
optimizer state and the batch, as the planner counts them. On CUDA it is what ``nvidia-smi``
would show: ``torch.cuda.max_memory_reserved`` plus the plan's estimate of the CUDA context.
When a step goes over (CPU) or runs out of memory (CUDA, the step is retried), the trainer
re-plans at ``REPLAN_FRACTION`` of the budget it planned for, at most ``MAX_REPLANS`` times in a
run (both in :mod:`autockpt.training.train`), and logs each re-plan as an event. The tightened
budget is saved with the run, so a resumed run plans at it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from autockpt.planner.memory import MemoryTracker, tensors_of
from autockpt.planner.plan_model import Plan
from autockpt.planner.sharding import Parallelism


@dataclass
class PeakReading:
    """One step's peak in bytes, filled in when the measured block ends."""

    peak_bytes: int = 0


class StepMemoryMeter:
    """Reads the peak of a training step as NOTE [Enforcing the budget] says.

    ``model`` and ``optimizer`` are the run's (the unplanned model, whose parameters the
    planned one shares); ``plan`` is the plan the steps run, replaced with :meth:`use_plan`
    whenever the trainer re-plans.
    """

    def __init__(
        self,
        device: torch.device,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        plan: Plan,
        *,
        parallelism: Parallelism,
    ) -> None:
        self.device = device
        self.model = model
        self.optimizer = optimizer
        self.plan = plan
        self.parallelism = parallelism

    def use_plan(self, plan: Plan) -> None:
        """The steps from now on run ``plan``."""
        self.plan = plan

    @property
    def description(self) -> str:
        """What the readings are, for the run's summary."""
        return "CUDA reserved + context" if self.device.type == "cuda" else "tracked tensor bytes"

    @contextmanager
    def measure(
        self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor
    ) -> Iterator[PeakReading]:
        """Measure the peak of the block (one step on ``inputs`` and ``target``)."""
        reading = PeakReading()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            yield reading
            reading.peak_bytes = (
                torch.cuda.max_memory_reserved(self.device) + self.plan.breakdown.context_bytes
            )
            return
        initial = [_local(t) for t in tensors_of(self.model, self.optimizer)]
        with MemoryTracker(initial=[*initial, *inputs, target]) as tracker:
            if self.parallelism == "fsdp":
                # FSDP gathers parameters into storages it resizes in place, which a dispatch
                # mode does not see: the plan's gathered working set stands in for them.
                tracker.add_bytes(self.plan.breakdown.gathered_bytes)
            yield reading
        reading.peak_bytes = tracker.peak_bytes


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this rank stores (an FSDP shard's local tensor, else itself)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
