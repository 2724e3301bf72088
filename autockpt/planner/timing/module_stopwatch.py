"""Timing a module chain's model: its plain step and its plans, each as a whole step.

NOTE [Timing a module chain]
A model torch.fx cannot trace is planned on a chain of its submodules (NOTE [Module chain]). Its
segments' times cannot be taken apart from a run of the model the way a traced graph's are
(:mod:`autockpt.planner.timing.stopwatch` puts timestamps between the graph's segments and keeps
their inputs to time regions on), so the solver prices its options with the time model's
estimates (NOTE [Time model]). On the CPU those estimates missed the zoo's module-level plans by up
to 67 points of the plain step: ``dict_batch``'s three blocks in two chunks each were estimated to
add 41% and added 108%. What can be timed is what a user runs: the model's own ``forward``, and
the planned module (:func:`~autockpt.planner.runtime.planned_chain.build_module_planned`), each a
whole forward, loss and backward, on the batch's leading samples whose plain step fits the budget
(NOTE [Timing at a batch that fits]; no region's inputs are kept). So on the CPU, where the model's
plain step takes under half of the host's free memory:

- the plain step's seconds (:meth:`ModuleStopwatch.plain_step_s`, settled as a traced model's
  is, and with the optimizer step timed the same way) are what the search's stages weigh a fit's
  added time against;
- the plans that fit are timed whole side by side with the plain step (NOTE [Whole-plan timing]),
  and the fastest is the plan, its timed overhead the predicted one, reported beside the plain
  step of the same rounds.

A plan alone in the search is timed against the plain step too, where a traced model's sums would
stand: the module chain has no timed sums. Where timing the real model fails (a model that refuses
a smaller batch), the estimates stand and the plan's notes say why.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch

from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.core.fake_copies import parameter_sharing_copy
from autockpt.planner.runtime.planned_chain import build_module_planned
from autockpt.planner.simulate.step_spec import StepSpec
from autockpt.planner.timing.real_batch import RealBatch
from autockpt.planner.timing.time_model import Cost, EstimatedCosts, guarded, timing_failed
from autockpt.planner.timing.timing_room import TimingRoom
from autockpt.planner.trace.fx_graph import Segment


class ModuleStopwatch(RealBatch):
    """Times whole steps of the caller's model and of its module-level plans (NOTE [Timing a
    module chain]).

    Args:
        spec: the step; its model, the caller's, the one the chain was found on, is timed on a
            copy sharing its parameters' memory.
        threads, room: as :class:`~autockpt.planner.timing.real_batch.RealBatch` takes them.
    """

    def __init__(
        self,
        spec: StepSpec,
        *,
        threads: int,
        room: TimingRoom | None = None,
    ) -> None:
        # A copy, as the chain's real measurements take: a forward that writes its own
        # Python state (a counter, a cache) must not write the caller's.
        copied = parameter_sharing_copy(spec.model)
        super().__init__(copied, spec, threads=threads, room=room)
        self.model = copied

    def plain_module(self) -> torch.nn.Module:
        return self.model

    def held_values(self) -> list[Any]:
        """Beside the runs' copy of the samples timed, the model copy's own buffers (its
        parameters share the caller's memory)."""
        return [*self.model.buffers(), *super().held_values()]

    def planned_module(
        self, segments: Sequence[Segment], actions: Sequence[SegmentAction]
    ) -> torch.nn.Module:
        return build_module_planned(self.model, segments, actions)

    def plain_step_s(self) -> float:
        """The plain step's forward, loss and backward at the whole batch."""
        return self.whole_step_s(self.model)


class ModuleCosts:
    """A module chain's costs: its options estimated, its plain step timed (NOTE [Timing a
    module chain]).

    Args:
        stopwatch: times the caller's model.
        estimated: the estimates the options are priced with, and the plain step where
            timing fails.
    """

    def __init__(self, stopwatch: ModuleStopwatch, estimated: EstimatedCosts) -> None:
        self.stopwatch = stopwatch
        self.estimated = estimated
        self.failure = ""

    @property
    def source(self) -> str:
        if self.failure:
            return timing_failed(self.failure)
        return (
            "of the plain step and of whole plans timed on the real model"
            f"{self.stopwatch.runs_said()}, the options' estimated"
        )

    def unplanned_step_s(self) -> float:
        def timed() -> float:
            return self.stopwatch.plain_step_s() + self.stopwatch.optimizer_s()

        return guarded(self, timed, self.estimated.unplanned_step_s)

    @property
    def sums_stand(self) -> bool:
        """Never: the options are estimates (NOTE [Timing a module chain])."""
        return False

    def whole_runs(self) -> ModuleStopwatch | None:
        """Where plans are timed whole: the stopwatch, unless timing has failed."""
        return None if self.failure else self.stopwatch

    def recompute_s(
        self,
        first: int,
        end: int,
        *,
        chunks: int = 1,
        pieces: int = 1,
        input_batch_dims: Sequence[int | None] | None = None,
        selective: bool = False,
    ) -> Cost:
        return self.estimated.recompute_s(
            first,
            end,
            chunks=chunks,
            pieces=pieces,
            input_batch_dims=input_batch_dims,
            selective=selective,
        )

    def micro_batch_s(self, pieces: int) -> Cost:
        return self.estimated.micro_batch_s(pieces)

    def take(self, timings: Iterable[Hashable]) -> bool:
        return False
