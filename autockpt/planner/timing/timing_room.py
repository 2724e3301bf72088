"""How many samples the stopwatch may time the real model at, so that planning fits the budget.

NOTE [Timing at a batch that fits]
On the CPU the planner times the real model (NOTE [Measured step time] in
:mod:`autockpt.planner.timing.stopwatch`). Timed at the whole batch, every run holds the very step
that does not fit: planning five dilated convolutions at half their peak held 41.6 MiB of real
tensors for a 19.8 MiB budget. So the runs use the batch's leading ``b`` samples, the most whose
plain step fits ``ROOM_SHARE`` of the budget's usable bytes (the share real copies are measured
within, NOTE [Scaled real measurement]):

- *The bytes of a run at* ``b`` *samples* are read off the kept step, measured exactly on fake
  tensors at the whole batch ``B``. The parameters, the caller's batch and a whole set of
  gradients are there at any ``b``; everything else the step's real bytes hold (its activations,
  and, counted in full, the copy of the ``b`` samples the runs use) is taken to grow in
  proportion to the samples. That is an upper bound for what grows in proportion or slower,
  which activations do; the share left out of the room is the margin for what does not.
- *The regions' inputs.* The first plain step keeps every region's inputs for the regions' pieces
  to be timed on (NOTE [Measured step time]); an input the step itself would have freed after
  its forward is held past it. Their bytes, read off the kept step by name (the batch's own
  tensors left out: they are held anyway), are counted in full on top: five dilated
  convolutions' step held 5.97 MB real at the whole batch, 7.03 MB with its regions' inputs.
- *What a run stands for.* A plain step, a micro-batch of ``s`` samples or a region's piece of
  ``s`` samples with ``s <= b`` is timed at its true size. One of more samples is timed at ``b``
  and at ``b // 2``, and its seconds read off the line through the two at ``s`` (each segment's
  forward and backward and the loss on a line of its own). Scaled in proportion from ``b``
  alone, the fixed cost of every op would grow with the batch: timed at 1 of 8 samples, the
  plain step came out as eight one-sample steps, so eight micro-batches cost nothing by the sums
  and were chosen. A whole plan timed side by side with the plain step (NOTE [Whole-plan
  timing]) runs at ``b`` and at ``b // 2`` samples, each plan's time read off its own line at
  ``B``. A plan whose micro-batches and chunks need more than ``b // 2`` samples is timed at the
  whole batch instead, where its own step fits (NOTE [Whole-plan timing]); else the solver's sums
  stand for it. Fewer than ``MIN_TIMED_SAMPLES`` samples give no line: nothing is timed.
- *The optimizer step* is timed over copies of the leading parameters whose copies, gradients
  and state fit the same room beside the parameters and the batch, its seconds scaled by bytes.
- *Where not even one sample fits*, nothing is timed: the estimates of NOTE [Time model] stand,
  and the plan's notes say why.

The line is exact for work that grows in proportion to the batch and for a fixed cost per op; it
misses what changes with the batch otherwise (a working set that falls out of a cache past some
size, pages the allocator maps afresh for large tensors: NOTE [Measured step time]).
"""

from __future__ import annotations

from dataclasses import dataclass

from autockpt.planner.measure.scaled_step import ROOM_SHARE, real_step_bytes
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.trace.fx_graph import TracedModel
from autockpt.planner.trace.module_chain import ModuleChain

#: The fewest samples worth timing at: fewer, and a step's fixed cost cannot be told from
#: what grows with the batch (NOTE [Timing at a batch that fits]).
MIN_TIMED_SAMPLES = 2
#: What an optimizer step's timing holds per parameter byte copied, beside the state: the
#: copy, its gradient and the step's temporaries.
OPTIMIZER_COPIES_PER_BYTE = 3.0


@dataclass(frozen=True)
class TimingRoom:
    """Where the real model's timed runs fit (NOTE [Timing at a batch that fits]).

    Attributes:
        samples: the leading samples the runs use (0: none fits, nothing is timed).
        batch_size: the whole batch the times stand for.
        step_bytes: the most real bytes a run at ``samples`` holds, as read off the kept step
            (the caller's parameters and batch included).
        optimizer_room_bytes: bytes the optimizer's timing may take in copies and state.
        optimizer_state_share: the optimizer's state bytes per parameter byte.
        held_bytes: the caller's parameters and batch, held through planning.
        trained_bytes: the bytes of the parameters that get gradients.
    """

    samples: int
    batch_size: int
    step_bytes: int
    optimizer_room_bytes: int
    optimizer_state_share: float
    held_bytes: int
    trained_bytes: int

    @classmethod
    def within(
        cls,
        traced: TracedModel | ModuleChain,
        kept: StepProfile,
        batch_size: int,
        usable_bytes: int,
    ) -> TimingRoom:
        """The room for timed runs of ``traced``'s step, measured as ``kept`` at
        ``batch_size`` samples, under ``usable_bytes``."""
        held = kept.parameter_bytes + kept.input_bytes
        fixed = held + kept.gradient_bytes
        # Everything else the real step holds, grown in proportion to its samples (the copy
        # of the leading samples the runs use included, as the caller's batch is not), and
        # the regions' inputs the first step keeps.
        grows = real_step_bytes(kept) - kept.parameter_bytes + region_input_bytes(traced, kept)
        grows_per_sample = max(grows, 1) / batch_size
        allowed = ROOM_SHARE * usable_bytes
        samples = max(min(int((allowed - fixed) // grows_per_sample), batch_size), 0)
        if samples < min(MIN_TIMED_SAMPLES, batch_size):
            samples = 0
        return cls(
            samples=samples,
            batch_size=batch_size,
            step_bytes=int(fixed + grows_per_sample * samples),
            optimizer_room_bytes=max(int(allowed - held), 0),
            optimizer_state_share=kept.optimizer_state_bytes / max(kept.parameter_bytes, 1),
            held_bytes=held,
            trained_bytes=kept.gradient_bytes,
        )

    @property
    def optimizer_bytes(self) -> int:
        """The most bytes the optimizer's timing holds, the caller's parameters and batch
        included."""
        per_byte = OPTIMIZER_COPIES_PER_BYTE + self.optimizer_state_share
        return self.held_bytes + min(self.optimizer_room_bytes, int(per_byte * self.trained_bytes))

    @classmethod
    def whole(cls, batch_size: int) -> TimingRoom:
        """Room for runs at the whole batch, with no limit on the optimizer's copies."""
        return cls(
            samples=batch_size,
            batch_size=batch_size,
            step_bytes=0,
            optimizer_room_bytes=2**62,
            optimizer_state_share=0.0,
            held_bytes=0,
            trained_bytes=0,
        )

    @property
    def lower_samples(self) -> int:
        """The second point of the line a time past the samples timed is read off: half of
        them (the samples themselves where the runs use the whole batch)."""
        return self.samples if self.samples >= self.batch_size else self.samples // 2

    def untimed_reason(self) -> str:
        """How step times were found where nothing fits ("" where something does)."""
        if self.samples > 0:
            return ""
        return (
            f"estimated: a real step of {MIN_TIMED_SAMPLES} samples would not fit the budget, "
            "so the real model was not timed"
        )


def on_line(low_s: float, low: int, high_s: float, high: int, samples: int) -> float:
    """Seconds at ``samples`` read off the line through ``low_s`` at ``low`` samples and
    ``high_s`` at ``high``: a fixed part and a part per sample, neither below zero (noise can
    tilt a line through two short runs either way; then the time is taken as all fixed or all
    in proportion)."""
    if high <= low:
        return high_s * samples / max(high, 1)
    per_sample = max((high_s - low_s) / (high - low), 0.0)
    fixed = high_s - per_sample * high
    if fixed < 0:
        return high_s * samples / high
    return fixed + per_sample * samples


def region_input_bytes(traced: TracedModel | ModuleChain, kept: StepProfile) -> int:
    """Bytes of every region's inputs in the step ``kept`` measures, each counted once, the
    graph's placeholders (the batch) left out; none for a module chain, whose runs keep no
    region's inputs (only whole steps are timed, NOTE [Timing a module chain])."""
    if isinstance(traced, ModuleChain):
        return 0
    placeholders = {n.name for n in traced.graph_module.graph.nodes if n.op == "placeholder"}
    sizes: dict[str, int] = {}
    for (first, end), region in zip(traced.regions, traced.region_segments, strict=True):
        wanted = set(region.input_names) - placeholders
        for segment, profile in zip(
            traced.segments[first:end], kept.segments[first:end], strict=True
        ):
            for name, size in zip(segment.input_names, profile.input_sizes, strict=False):
                if name in wanted:
                    sizes[name] = size
    return sum(sizes.values())
