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

import torch

from autockpt.planner.core.batch_split import batch_size_of, split_batch
from autockpt.planner.core.memory_tracker import RealSizeOracle
from autockpt.planner.measure.fake_step import FakeTrainingState, profile_step
from autockpt.planner.measure.step_profile import LossFn, OptimizerSpec, StepProfile
from autockpt.planner.runtime.segment_runners import KEEP, SegmentAction
from autockpt.planner.trace.fx_graph import Segment, TracedModel
from autockpt.planner.trace.module_chain import ModuleChain


class StepMeasurer:
    """Measures the step of ``traced`` on its example batch, planned with any actions.

    Attributes:
        kept: the step with every segment kept, measured on construction (the optimizer run).
    """

    def __init__(
        self,
        traced: TracedModel | ModuleChain,
        example_inputs: Sequence[Any],
        *,
        loss_fn: LossFn | None,
        example_targets: Sequence[Any],
        optimizer: OptimizerSpec,
        autocast_dtype: torch.dtype | None,
        gradients_live: bool,
    ) -> None:
        self.traced = traced
        self.example_inputs = example_inputs
        self.example_targets = example_targets
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.autocast_dtype = autocast_dtype
        self.batch_size = batch_size_of(example_inputs) or 1  # as micro-batches cut it
        self.oracle = RealSizeOracle()
        self.fake_state = FakeTrainingState(
            traced, optimizer=optimizer, gradients_live=gradients_live
        )
        self.kept = profile_step(
            self.fake_state,
            example_inputs,
            [KEEP] * len(traced.segments),
            loss_fn=loss_fn,
            example_targets=example_targets,
            size_oracle=self.oracle,
            autocast_dtype=autocast_dtype,
        )

    def measure(
        self,
        segments: Sequence[Segment],
        actions: Sequence[SegmentAction],
        num_micro_batches: int = 1,
        batch: tuple[Sequence[Any], Sequence[Any]] | None = None,
    ) -> StepProfile:
        """The step run as ``segments`` with ``actions``, on ``batch`` (inputs, targets)
        or the example batch; the optimizer's peak is the kept step's."""
        inputs, targets = batch or (self.example_inputs, self.example_targets)
        profile = profile_step(
            self.fake_state,
            inputs,
            actions,
            loss_fn=self.loss_fn,
            example_targets=targets,
            num_micro_batches=num_micro_batches,
            size_oracle=self.oracle,
            run_optimizer=False,
            count_work=False,
            autocast_dtype=self.autocast_dtype,
            segments=segments,
        )
        optimizer_peak = self.kept.phase_peak_bytes["optimizer"]
        profile.phase_peak_bytes["optimizer"] = optimizer_peak
        profile.peak_bytes = max(profile.peak_bytes, optimizer_peak)
        return profile

    def all_recomputed(
        self, segments: Sequence[Segment], num_micro_batches: int = 1
    ) -> StepProfile:
        """Every one of ``segments`` recomputed, but those kept by in-place writes (NOTE
        [In-place writes])."""
        actions = [SegmentAction(recompute=not s.keep_reason) for s in segments]
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
            for b in (self.example_inputs, self.example_targets)
        )
        halved = [dataclasses.replace(a, num_chunks=min(a.num_chunks, half)) for a in actions]
        try:
            count = min(num_micro_batches, half)
            return self.measure(segments, halved, count, (inputs, targets))
        except Exception:  # the model refuses a smaller batch: the refusal estimates
            return None
