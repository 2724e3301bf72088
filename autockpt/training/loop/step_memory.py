"""Measuring a training step's peak memory, the number the trainer holds to the budget.

:class:`StepMemoryMeter` owns which steps are measured and how: tracked tensor bytes on the CPU
(:class:`~autockpt.planner.core.memory_tracker.MemoryTracker`), the allocator's counters on CUDA.
What the trainer does with a reading (re-planning) is in :class:`~autockpt.training.loop.train.Trainer`.

NOTE [Enforcing the budget]
The plan predicts the peak of one step; the trainer checks it. On CUDA the measure is what
``nvidia-smi`` would show: ``torch.cuda.max_memory_reserved`` plus the plan's estimate of the
CUDA context. The allocator keeps those counters anyway, so every CUDA step is measured.

On the CPU the measure is tracked tensor bytes: the step (forward, backward, clipping, optimizer)
runs under a :class:`~autockpt.planner.core.memory_tracker.MemoryTracker` that starts from the
parameters, their gradients, the optimizer state and the batch, as the planner counts them. The
tracker is a Python dispatch mode that sees every op: it made a tiny TFT step 3.9x slower than a
plain loop (45 ms against 11.7 ms). Tracked bytes are a function of the plan and the shapes alone
(the same ops allocate the same sizes in the same order; dropout draws new values, not new sizes),
so the CPU measures a sample of the steps and loses nothing a measured step would have shown:

- the first ``STEPS_MEASURED_AFTER_CHANGE`` steps after every plan (the first one, each re-plan,
  the plan a resumed run makes) and after any change of the batch's shapes: the first step
  creates AdamW's state, the second is the first with it in place;
- then every ``memory_check_every``-th step of the run (``TrainConfig``), a standing check;
- none at all when no budget is given: there is nothing to enforce.

Steps not measured are recorded with ``peak_bytes`` null and ``peak_measured`` false; the
epoch records and the summary say how many steps were measured.

On CUDA a budget smaller than the card also caps the process: the caching allocator is told to
hold no more than the budget less the plan's context estimate
(``set_per_process_memory_fraction``), so a step that would go over runs out of memory at the
budget and takes the retry path below, instead of running over it on a larger card and being
seen only afterwards.

When a measured step goes over (CPU) or runs out of memory (CUDA, the step is retried), the
trainer plans again as NOTE [Planning again] in :mod:`autockpt.planner.verify` says (lower by
the overshoot and by at least a tenth of the budget it planned for, at most three times in a
run: the policy ``plan(verify=True)`` follows too), and logs each re-plan as an event. The
tightened budget is saved with the run, so a resumed run plans at it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from autockpt import MemoryTracker, Parallelism, Plan, tensors_of
from autockpt.planner.core.step_budget import allocator_slack, context_beside_allocator
from autockpt.planner.measure.allocator_peak import allocator_count, resident_bytes

#: Steps measured on the CPU after every plan and after every change of the batch's shapes.
STEPS_MEASURED_AFTER_CHANGE = 2


@dataclass
class PeakReading:
    """One step's peak: ``peak_bytes`` is filled in when a measured block ends, and stays None
    on a step the schedule of NOTE [Enforcing the budget] skips."""

    measured: bool
    peak_bytes: int | None = None


class StepMemoryMeter:
    """Measures the peaks of training steps as NOTE [Enforcing the budget] says.

    Args:
        device: where the steps run.
        model: the run's (unplanned) model, whose parameters the planned one shares.
        optimizer: the run's optimizer.
        plan: the plan the steps run, replaced with :meth:`use_plan` on every re-plan.
        parallelism: how the ranks share the model.
        budget_bytes: the budget enforced; None on the CPU turns measuring off.
        check_every: on the CPU, measure every ``check_every``-th step besides the first
            steps after a plan or a change of shapes.
    """

    def __init__(
        self,
        device: torch.device,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        plan: Plan,
        *,
        parallelism: Parallelism,
        budget_bytes: int | None,
        check_every: int,
    ) -> None:
        assert check_every >= 1, "TrainConfig checks memory_check_every"
        self.device = device
        self.model = model
        self.optimizer = optimizer
        self.plan = plan
        self.parallelism = parallelism
        self.budget_bytes = budget_bytes
        self.check_every = check_every
        self._steps_since_change = 0
        self._shapes: tuple[torch.Size, ...] | None = None
        self.cap_fraction = (
            cap_process_memory(device, budget_bytes - plan.breakdown.context_bytes)
            if device.type == "cuda" and budget_bytes is not None
            else None
        )
        """The share of the card the allocator may hold (NOTE [Enforcing the budget])."""
        self.context_bytes: int | None = None
        """CUDA: the context and the libraries' workspaces, measured after the first measured
        step (NOTE [What the first card must measure]); None until then and on the CPU."""
        self.slack: float | None = None
        """CUDA: the largest share the allocator reserved beyond what it allocated, over the
        steps measured."""

    def use_plan(self, plan: Plan) -> None:
        """The steps from now on run ``plan``; the next ones are measured."""
        self.plan = plan
        self._steps_since_change = 0

    @property
    def measures_anything(self) -> bool:
        """False on the CPU without a budget: no step is measured."""
        return self.device.type == "cuda" or self.budget_bytes is not None

    @property
    def description(self) -> str:
        """What the readings are, for the run's summary."""
        if self.device.type == "cuda":
            return "CUDA reserved + context, every step"
        if self.budget_bytes is None:
            return "not measured: no budget to enforce"
        if self.check_every == 1:
            return "tracked tensor bytes, every step"
        return (
            f"tracked tensor bytes, sampled: every {self.check_every}th step and the first "
            f"{STEPS_MEASURED_AFTER_CHANGE} after each plan or change of shapes"
        )

    def is_due(self, step: int, shapes: tuple[torch.Size, ...]) -> bool:
        """Whether global step ``step`` (counted from 1), on a batch of ``shapes``, is measured;
        call it once per step, in order."""
        if shapes != self._shapes:
            self._shapes = shapes
            self._steps_since_change = 0
        self._steps_since_change += 1
        if self.device.type == "cuda":
            return True
        if self.budget_bytes is None:
            return False
        return (
            self._steps_since_change <= STEPS_MEASURED_AFTER_CHANGE or step % self.check_every == 0
        )

    @contextmanager
    def measure(
        self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor, *, step: int
    ) -> Iterator[PeakReading]:
        """Measure the peak of the block (global step ``step`` on ``inputs`` and ``target``)
        when the schedule says so; otherwise run it untouched."""
        shapes = tuple(t.shape for t in (*inputs, target))
        reading = PeakReading(measured=self.is_due(step, shapes))
        if not reading.measured:
            yield reading
            return
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            yield reading
            reserved = torch.cuda.max_memory_reserved(self.device)
            reading.peak_bytes = reserved + self.plan.breakdown.context_bytes
            self._read_card(reserved)
            return
        if self.plan.compile_fraction is not None:
            # A compiled plan: inductor's buffers are invisible to a dispatch mode (under
            # one the step would even run eagerly), so the allocator counts (NOTE [Compiled
            # plans]), from the bytes the step starts with, as the plan's search counted.
            resident = resident_bytes(self.model, self.optimizer, (*inputs, target))
            with allocator_count(self.device) as counted:
                yield reading
            reading.peak_bytes = resident + counted.peak_bytes
            return
        initial = [_local(t) for t in tensors_of(self.model, self.optimizer)]
        with MemoryTracker(initial=[*initial, *inputs, target]) as tracker:
            if self.parallelism == "fsdp":
                # FSDP gathers parameters into storages it resizes in place, which a dispatch
                # mode does not see: the plan's gathered working set stands in for them.
                tracker.add_bytes(self.plan.breakdown.gathered_bytes)
            yield reading
        reading.peak_bytes = tracker.peak_bytes

    def _read_card(self, reserved_peak_bytes: int) -> None:
        """Keep the step's slack and, after the first step (the libraries' workspaces made),
        the context the card shows beyond the allocator's blocks."""
        slack = allocator_slack(reserved_peak_bytes, torch.cuda.max_memory_allocated(self.device))
        self.slack = slack if self.slack is None else max(self.slack, slack)
        if self.context_bytes is None:
            self.context_bytes = context_beside_allocator(self.device)


def cap_process_memory(device: torch.device, allocator_bytes: int) -> float | None:
    """Cap the caching allocator on ``device`` at ``allocator_bytes`` where the card is larger
    (NOTE [Enforcing the budget]); the share set, or ``None`` where the card is no larger."""
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = max(allocator_bytes, 0) / total
    if fraction >= 1.0:
        return None
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this rank stores (an FSDP shard's local tensor, else itself)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
