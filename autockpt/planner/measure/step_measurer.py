"""One process's training step measured on fake tensors again and again, as planning asks.

Planning (NOTE [Planning] in :mod:`autockpt.planner.pipeline`) measures many variants of one
step: every segment kept, every one recomputed, a chosen plan, the step at half the batch. They
share the fake copy of the model and its optimizer, the real-size oracle and the loss. Only the
first, every segment kept, runs the optimizer: its peak does not depend on what the forward
recomputes, so the others take it from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from autockpt.errors import describe_error
from autockpt.planner.core.batch_split import (
    batch_size_of,
    piece_sizes,
    split_batch,
    take_samples,
)
from autockpt.planner.core.decisions import KEEP, SegmentAction
from autockpt.planner.core.fake_copies import storages
from autockpt.planner.core.memory_tracker import RealSizeOracle
from autockpt.planner.measure.fake_step import FakeTrainingState, profile_step
from autockpt.planner.measure.scaled_step import (
    ScaledBatches,
    real_step_bytes,
    scaled_batches,
    scaled_profile,
)
from autockpt.planner.simulate.recompute_simulation import (
    recurrent_segments,
    simulated_profile,
    unsure_segments,
)
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.simulate.step_record import StepRecord, StepRecording
from autockpt.planner.simulate.step_spec import StepSpec
from autockpt.planner.trace.fx_graph import Segment, TracedModel
from autockpt.planner.trace.module_chain import ModuleChain


class StepMeasurer:
    """Measures the step ``spec`` describes, run as ``traced``, on its example batch, planned
    with any actions.

    On a real copy (a model that does not run on fake tensors) with ``room_bytes`` given,
    steps whose whole batch would not fit run at smaller batches and are scaled (NOTE [Scaled
    real measurement]).

    Attributes:
        spec: the step: the caller's model, example batch, loss, optimizer and precision.
        kept: the step with every segment kept, measured on construction (the optimizer run).
        scaled: the batches real steps are measured at, or ``None``: the whole batch.
        batch_bytes: the bytes of the example batch, inputs and targets.
        planning_peak_bytes: the most real bytes a measured real step held, the caller's
            batch included (0 on fake tensors).
        whole_batch_reason: why a real copy is measured at the whole batch although it does
            not fit (the step refused a few samples: a loss that closes over the whole batch's
            labels, say), or ``""``.
    """

    def __init__(
        self,
        traced: TracedModel | ModuleChain,
        spec: StepSpec,
        *,
        room_bytes: int | None = None,
    ) -> None:
        self.traced = traced
        self.spec = spec
        example_inputs, example_targets = spec.example_inputs, spec.example_targets
        self.batch_size = batch_size_of(example_inputs) or 1  # as micro-batches cut it
        self.oracle = RealSizeOracle()
        self.fake_state = FakeTrainingState(
            traced, optimizer=spec.optimizer, gradients_live=spec.gradients_live
        )
        self.planning_peak_bytes = 0
        self.room_bytes = room_bytes if room_bytes is not None else 2**62
        self.scaled: ScaledBatches | None = None
        self.whole_batch_reason = ""
        self.batch_bytes = sum(
            {id(s): s.nbytes() for s in storages((example_inputs, example_targets))}.values()
        )
        kept = [KEEP] * len(traced.segments)
        if traced.fake_mode is None and room_bytes is not None:
            # NOTE [Scaled real measurement]
            try:
                self.scaled = scaled_batches(
                    lambda samples: self._run(
                        self._leading((example_inputs, example_targets), samples), kept, 1
                    ),
                    self.batch_size,
                    room_bytes=room_bytes,
                    held_bytes=self.batch_bytes,
                )
            except Exception as error:  # a model that refuses a few samples: measured whole
                self.scaled = None
                self.whole_batch_reason = describe_error(error)
        batch = (example_inputs, example_targets)
        #: The kept step's record, by micro-batch count, with the step it was taken beside
        #: (NOTE [One record, many plans]); none where the step is not measured on fake
        #: tensors of a traced model.
        self.records: dict[int, tuple[StepRecord, StepProfile]] = {}
        # What the simulation does not model, read off the graph once for every recording.
        self._unsure: set[int] | None = None
        self._recurrent: set[int] = set()
        if isinstance(traced, TracedModel) and traced.fake_mode is not None:
            self._unsure, self._recurrent = unsure_segments(traced), recurrent_segments(traced)
        recording = self._recording()
        if recording is not None:
            self.kept = self._run(batch, kept, 1, first=True, recording=recording)
            self.records[1] = (recording.record, self.kept)
        else:
            self.kept = self._profile(batch, kept, 1, first=True)

    @property
    def record(self) -> StepRecord | None:
        """The kept step's record at the whole batch, if it was recorded."""
        return self.records[1][0] if 1 in self.records else None

    def _recording(self) -> StepRecording | None:
        """A recording for a kept step of the traced model on fake tensors, else ``None``."""
        if self._unsure is None:
            return None
        segments = self.traced.segments
        recording = StepRecording(
            [s.input_names for s in segments],
            [s.output_names for s in segments],
            under_autocast=self.spec.autocast_dtype is not None,
        )
        recording.record.unsure |= self._unsure
        recording.record.needs_own_backward |= self._recurrent
        return recording

    def measure(
        self,
        segments: Sequence[Segment],
        actions: Sequence[SegmentAction],
        num_micro_batches: int = 1,
        batch: tuple[Sequence[Any], Sequence[Any]] | None = None,
    ) -> StepProfile:
        """The step run as ``segments`` with ``actions``, on ``batch`` (inputs, targets)
        or the example batch; the optimizer's peak is the kept step's."""
        # The kept step at a micro-batch count is recorded: the recomputed ones at that count
        # are then simulated from it (NOTE [One record, many plans]).
        recording = (
            self._recording()
            if batch is None
            and all(a == KEEP for a in actions)
            and tuple(segments) == tuple(self.traced.segments)
            else None
        )
        batch = batch or (self.spec.example_inputs, self.spec.example_targets)
        profile = self._profile(
            batch, actions, num_micro_batches, segments=segments, recording=recording
        )
        optimizer_peak = self.kept.phase_peak_bytes["optimizer"]
        profile.phase_peak_bytes["optimizer"] = optimizer_peak
        profile.timeline.append((optimizer_peak, "optimizer", -1))
        profile.peak_bytes = max(profile.peak_bytes, optimizer_peak)
        if recording is not None:
            self.records[num_micro_batches] = (recording.record, profile)
        return profile

    def _profile(
        self,
        batch: tuple[Sequence[Any], Sequence[Any]],
        actions: Sequence[SegmentAction],
        num_micro_batches: int,
        *,
        segments: Sequence[Segment] | None = None,
        first: bool = False,
        recording: StepRecording | None = None,
    ) -> StepProfile:
        """The step on ``batch``: measured whole, or, on a real copy whose pieces would not
        fit, at two smaller batches and read off their line (NOTE [Scaled real measurement]);
        ``recording`` records a step measured whole on fake tensors."""
        scaled = self.scaled
        size = piece_sizes(batch[0], num_micro_batches)[0]
        if scaled is not None:
            chunks = max((a.num_chunks for a in actions), default=1)
            low = max(scaled.low, chunks)
            high = max(scaled.high, 2 * low)
            if high < size:
                low_profile, high_profile = (
                    self._run(
                        self._leading(batch, samples * num_micro_batches),
                        actions,
                        num_micro_batches,
                        segments=segments,
                        first=first,
                    )
                    for samples in (low, high)
                )
                profile = scaled_profile(low_profile, high_profile, low, high, size)
                if real_step_bytes(profile) > self.room_bytes:
                    return profile
                # It fits the budget by the line, margin included: measured whole, it is
                # exact (step 3).
        return self._run(
            batch, actions, num_micro_batches, segments=segments, first=first, recording=recording
        )

    def _run(
        self,
        batch: tuple[Sequence[Any], Sequence[Any]],
        actions: Sequence[SegmentAction],
        num_micro_batches: int,
        *,
        segments: Sequence[Segment] | None = None,
        first: bool = False,
        recording: StepRecording | None = None,
    ) -> StepProfile:
        """One measured step on ``batch``; the first runs the optimizer and counts the work
        (and, given ``recording``, is recorded: NOTE [One record, many plans])."""
        inputs, targets = batch
        profile = profile_step(
            self.fake_state,
            inputs,
            actions,
            loss_fn=self.spec.loss_fn,
            example_targets=targets,
            num_micro_batches=num_micro_batches,
            # Real tensors report their real sizes: no zeros run beside them.
            size_oracle=self.oracle if self.traced.fake_mode is not None else None,
            run_optimizer=first,
            count_work=first,
            autocast_dtype=self.spec.autocast_dtype,
            segments=segments,
            recording=recording,
        )
        if self.traced.fake_mode is None:
            # A real step: what it held, and the caller's batch beside a smaller one.
            outside = self.batch_bytes if inputs is not self.spec.example_inputs else 0
            self.planning_peak_bytes = max(
                self.planning_peak_bytes, real_step_bytes(profile) + outside
            )
        return profile

    def _leading(
        self, batch: tuple[Sequence[Any], Sequence[Any]], samples: int
    ) -> tuple[list[Any], list[Any]]:
        """The first ``samples`` samples of ``batch`` (inputs, targets)."""
        inputs, targets = batch
        size = batch_size_of(inputs) or self.batch_size
        cut = slice(0, samples)
        return (
            take_samples(inputs, cut, batch_size=size),
            take_samples(targets, cut, batch_size=size),
        )

    def all_recomputed(
        self, segments: Sequence[Segment], num_micro_batches: int = 1
    ) -> StepProfile:
        """Every one of ``segments`` recomputed, but those kept by in-place writes (NOTE
        [In-place writes])."""
        actions = [SegmentAction(recompute=not s.keep_reason) for s in segments]
        if num_micro_batches in self.records:
            # NOTE [One record, many plans]: worked out from the kept step where it can be.
            record, kept = self.records[num_micro_batches]
            simulated = simulated_profile(
                record,
                kept,
                self.traced.segments,
                segments,
                [a.recompute for a in actions],
            )
            if simulated is not None:
                return simulated
        return self.measure(segments, actions, num_micro_batches)

    def planned(
        self,
        segments: Sequence[Segment],
        actions: Sequence[SegmentAction],
        num_micro_batches: int = 1,
    ) -> StepProfile:
        """The step as a plan runs it: the kept step itself where the plan changes nothing."""
        if num_micro_batches == 1 and all(a == KEEP for a in actions):
            return self.kept
        return self.measure(segments, actions, num_micro_batches)

    def at_half_batch(
        self,
        segments: Sequence[Segment],
        actions: Sequence[SegmentAction],
        num_micro_batches: int = 1,
    ) -> StepProfile | None:
        """The step as a plan runs it on half the batch, its chunks and micro-batches no more
        than half holds (for the refusal, NOTE [Refusal]); ``None`` where the model refuses a
        smaller batch."""
        half = self.batch_size // 2
        inputs, targets = (
            split_batch(b, 2, batch_size=self.batch_size)[0]
            for b in (self.spec.example_inputs, self.spec.example_targets)
        )
        halved = [dataclasses.replace(a, num_chunks=min(a.num_chunks, half)) for a in actions]
        try:
            count = min(num_micro_batches, half)
            return self.measure(segments, halved, count, (inputs, targets))
        except Exception:  # the model refuses a smaller batch: the refusal estimates
            return None
