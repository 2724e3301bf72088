"""Timing the real model: its plain step segment by segment, and regions recomputed in pieces.

NOTE [Measured step time]
On a CPU the time a plan adds is not what its FLOPs say. Splitting the encoder's variable
selection of ``tft-225`` into 8 chunks measured at least as fast as 4 chunks and as the plain
step, although it recomputes more: its ``(V, B*T, H)`` tensors shrink under the size above
which the C allocator maps fresh, zeroed pages for every allocation, and smaller working sets
fit the caches. On ``tiny`` the same plans cost 1.5x, three times the FLOP estimate, in the
per-op and per-checkpoint costs of small kernels. So on the CPU the planner times what it is
about to choose, on the real model, with the parameters and batch the caller gave:

* the plain step, on the batch's leading samples whose real step fits the budget (NOTE [Timing
  at a batch that fits] in :mod:`autockpt.planner.timing.timing_room`; the whole batch where
  it fits), twice (the faster kept: the first step of a process maps
  its memory, the steady state reuses it): the forward and backward of every chain segment
  (timestamps where the segment runners start and end, and a pre-hook on the autograd nodes
  of each segment's outputs, which run first in its backward), the loss, and one optimizer
  step on copies of the parameters. That is the unplanned step time and what keeping each
  segment costs;
* a region recomputed in pieces of ``s`` samples: one piece's checkpointed forward and
  backward, on the region's inputs as the plain step produced them (kept from it, cut to ``s``
  samples along the dimensions the separability probe found). ``k`` chunks of ``m``
  micro-batches cost ``m * k`` pieces; the region's kept time is what they replace;
* with ``m`` micro-batches, the plain step of the largest piece, ``m`` times.

Each measurement runs once per ``plan()`` call and only when the solver is about to choose an option
that needs it (NOTE [Timed options] in :mod:`autockpt.planner.timing.time_model`). A run that takes
under ``REPEAT_BELOW_S`` is repeated up to ``MAX_REPEATS`` times and the median kept: the first run
of a small piece pays for pages and caches the steady state does not, and the fastest of a few short
runs on a busy host is luckier than a long run can be (with the fastest kept, pieces of a
millisecond came out cheaper against the plain step than they ran in it). A longer run runs once, as
planning time matters more than its noise. The plain step is the exception: where mapping a page is
slow it takes more than one step to settle (on a VM whose first touch of a page cost about 20 µs of
system time, the first ``tft-225`` step of a process took 15.8 s, the next ones 1.8, 3.1 and 1.8 s),
and a plain step timed unsettled made a plan that measured 1.40x against the settled plain step come
out 76% *faster* than it. So it is timed again while a run is more than ``1 - SETTLED_SHARE`` faster
than the one before, and the faster of the last two runs is kept.

Nothing of the caller's changes: gradients come from ``torch.autograd.grad`` (no ``.grad`` is
written), buffers a forward updates (BatchNorm's statistics) are put back after every run,
``plan()`` forks the RNG. The runs use the caller's thread count (planning itself runs on
one) and whatever else the process has set (glibc's malloc keeping freed pages halves a
``tft-225`` step): a trainer that tunes its process should do it before planning, so that the
plan is timed as it will train. They need the real step's memory, so they run only where that is
cheap: on the CPU, when the unplanned step takes less than half of the host's free memory;
elsewhere the estimate of NOTE [Time model] stands. A model torch.fx did not trace is timed in
whole steps only (NOTE [Timing a module chain] in
:mod:`autockpt.planner.timing.module_stopwatch`).

NOTE [The model's own checkpoints, timed]
A forward that calls ``torch.utils.checkpoint(..., use_reentrant=False)`` itself is traced through
(NOTE [Autograd in the traced graph]): the traced graph runs those blocks as plain operations, and
whether they are recomputed is the plan's to decide. But the step the user runs, and compares the
plan's with, is their own: blocks recomputed. Timed against the traced plain step, the zoo's
``self_checkpointed`` plan (4 micro-batches, nothing recomputed) was predicted at 1.42x and
measured 1.01x against the model's own step. So where the graph holds such calls, the plain step
the plan reports and times its plans against (NOTE [Whole-plan timing]) is the caller's model
itself, run whole (:meth:`Stopwatch.plain_step_s`, on the samples timed and read off the line as
the plans are); the options are still priced on the traced step, segment by segment, since those
are the segments the plan cuts. The plain step's peak stays the traced one's (the fake-tensor
measurement is of the graph), and the plan's notes say both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autockpt.planner.core.decisions import KEEP, SegmentAction
from autockpt.planner.core.memory_tracker import flat_tensors
from autockpt.planner.runtime.segment_runners import SegmentRunner, build_segmented_module
from autockpt.planner.simulate.step_spec import StepSpec
from autockpt.planner.timing.real_batch import RealBatch
from autockpt.planner.timing.segment_clock import (
    Captured,
    NoObserver,
    SegmentClock,
    captured,
    first_samples,
)
from autockpt.planner.timing.timed_runs import median
from autockpt.planner.timing.timing_room import TimingRoom, on_line
from autockpt.planner.trace.fx_graph import Segment, TracedModel


@dataclass(frozen=True)
class StepTimes:
    """Seconds of one plain (unplanned) forward and backward, by chain position.

    Attributes:
        forward_s: each segment's forward.
        backward_s: each segment's backward (from its outputs' autograd nodes on).
        loss_s: the loss's forward and its backward, and what runs outside the segments.
    """

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    loss_s: float

    @property
    def total_s(self) -> float:
        """Forward and backward of the whole step (no optimizer)."""
        return sum(self.forward_s) + sum(self.backward_s) + self.loss_s

    def kept_s(self, first: int, end: int) -> float:
        """Forward and backward of chain positions ``first..end-1``, kept."""
        return sum(self.forward_s[first:end]) + sum(self.backward_s[first:end])

    @staticmethod
    def on_line(
        low: StepTimes, low_samples: int, high: StepTimes, high_samples: int, samples: int
    ) -> StepTimes:
        """Every time read at ``samples`` off the line through two steps timed at fewer
        (NOTE [Timing at a batch that fits])."""

        def at(low_s: float, high_s: float) -> float:
            return on_line(low_s, low_samples, high_s, high_samples, samples)

        return StepTimes(
            tuple(map(at, low.forward_s, high.forward_s)),
            tuple(map(at, low.backward_s, high.backward_s)),
            at(low.loss_s, high.loss_s),
        )


def can_time(device: torch.device, unplanned_bytes: int) -> bool:
    """Whether a traced model whose plain step takes ``unplanned_bytes`` may be timed on
    ``device`` (NOTE [Measured step time])."""
    if device.type != "cpu":
        return False
    try:
        free_bytes = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no such query on this system
        return True
    return unplanned_bytes < free_bytes // 2


class Stopwatch(RealBatch):
    """Times the real model's plain step and recomputed regions (NOTE [Measured step time]).

    Args:
        traced: the traced model; its graph module shares the caller's parameters.
        spec, threads, room: as :class:`~autockpt.planner.timing.real_batch.RealBatch` takes
            them.
        own_model: the caller's model, whose own step is the plain one, where its forward
            calls torch.utils.checkpoint itself (NOTE [The model's own checkpoints, timed]);
            ``None``: the traced graph's step is.
    """

    def __init__(
        self,
        traced: TracedModel,
        spec: StepSpec,
        *,
        threads: int,
        room: TimingRoom | None = None,
        own_model: torch.nn.Module | None = None,
    ) -> None:
        super().__init__(traced.graph_module, spec, threads=threads, room=room)
        self.traced = traced
        self.own_model = own_model
        self._steps: dict[int, StepTimes] = {}  # by the samples run, as timed
        self._pieces: dict[tuple[int, int], float] = {}  # by region and samples run, as timed
        # The inputs of every region, as the plain step on the timed samples computed them.
        self._region_inputs: dict[int, tuple[Captured, ...]] = {}
        self._region_runners: dict[int, SegmentRunner] = {}
        self._clock = SegmentClock([s.output_names for s in traced.segments])
        self._plain: torch.nn.Module | None = None

    def plain_module(self) -> torch.nn.Module:
        return self.own_model or self.traced.graph_module

    def plain_step_s(self) -> float:
        """The plain step's forward, loss and backward at the whole batch: the caller's own
        step where it checkpoints itself, else the traced one's, segment by segment."""
        if self.own_model is not None:
            return self.whole_step_s(self.own_model)
        return self.plain_step().total_s

    def planned_module(
        self, segments: Sequence[Segment], actions: Sequence[SegmentAction]
    ) -> torch.nn.Module:
        return build_segmented_module(self.traced.graph_module, segments, actions)

    def plain_step(self, pieces: int = 1) -> StepTimes:
        """The plain step of the largest of ``pieces`` micro-batches of the whole batch, timed
        segment by segment (past the samples the runs use, read off a line)."""
        samples = -(-self.whole_batch_size // pieces)
        if samples <= self.batch_size:
            return self._plain_step_at(samples)
        high = self._plain_step_at(self.batch_size)  # first: it keeps the regions' inputs
        low_samples = self.room.lower_samples
        low = self._plain_step_at(low_samples)
        return StepTimes.on_line(low, low_samples, high, self.batch_size, samples)

    def _plain_step_at(self, samples: int) -> StepTimes:
        if samples not in self._steps:
            inputs = self.leading(self.inputs, samples)
            targets = self.leading(self.targets, samples)
            capture = samples == self.batch_size

            def step() -> StepTimes:
                return self._time_step(inputs, targets, capture=capture)

            self._steps[samples] = self.runs.settled(step, key=lambda times: times.total_s)
        return self._steps[samples]

    def region_piece_s(
        self, region: int, samples: int, input_batch_dims: Sequence[int | None]
    ) -> float:
        """One checkpointed forward and backward of region ``region`` on ``samples`` samples
        (past the samples the runs use, read off a line).

        Args:
            region: index into the traced model's regions.
            samples: how many samples the piece holds (the whole batch: no cut).
            input_batch_dims: per region input, the dimension carrying the batch (None: whole).
        """
        dims = tuple(input_batch_dims)
        if samples <= self.batch_size:
            return self._piece_at(region, samples, dims)
        high = self._piece_at(region, self.batch_size, dims)
        low_samples = self.room.lower_samples
        low = self._piece_at(region, low_samples, dims)
        return on_line(low, low_samples, high, self.batch_size, samples)

    def _piece_at(
        self, region: int, samples: int, input_batch_dims: tuple[int | None, ...]
    ) -> float:
        key = (region, samples)
        if key not in self._pieces:
            self._plain_step_at(self.batch_size)  # the region's inputs come from it
            inputs = self._region_inputs[region]
            if samples < self.batch_size:
                inputs = tuple(
                    Captured(first_samples(c.value, dim, samples, self.batch_size), c.requires_grad)
                    for c, dim in zip(inputs, input_batch_dims, strict=True)
                )
            runner = self._runner(region)
            runs = self.runs.repeated(lambda: self._time_piece(runner, inputs))
            self._pieces[key] = median(runs, key=float)
        return self._pieces[key]

    def _time_step(self, inputs: list[Any], targets: list[Any], *, capture: bool) -> StepTimes:
        if self._plain is None:
            segments = self.traced.segments
            self._plain = build_segmented_module(
                self.traced.graph_module, segments, [KEEP] * len(segments), observer=self._clock
            )
        clock = self._clock
        if capture:
            self._region_inputs = {}  # the last run's: not held beside this one's
        wanted = self._wanted_names() if capture else {}
        clock.start(wanted, self._placeholder_values(inputs) if capture else {})
        with self.runs.training_threads():
            started = time.perf_counter()
            with self.runs.autocast():
                output = self._plain(*inputs)
                loss = self.loss_fn(output, *targets)
            del output
            forward_done = time.perf_counter()
            if loss.requires_grad and self.parameters:
                torch.autograd.grad(loss, self.parameters, allow_unused=True)
            finished = time.perf_counter()
        if capture:
            self._region_inputs = {
                region: tuple(captured(clock.values, name) for name in names)
                for region, names in wanted.items()
            }
        forward_s = tuple(clock.forward_s)
        backward_s = clock.backward_seconds(forward_done, finished)
        loss_s = max((finished - started) - sum(forward_s) - sum(backward_s), 0.0)
        return StepTimes(forward_s, backward_s, loss_s)

    def _wanted_names(self) -> dict[int, tuple[str, ...]]:
        return {i: s.input_names for i, s in enumerate(self.traced.region_segments)}

    def _placeholder_values(self, inputs: list[Any]) -> dict[str, Captured]:
        # A placeholder past the inputs given runs with its default (a keyword argument such
        # as ``scale=0.5``): the graph's call does the same.
        graph = self.traced.graph_module.graph
        placeholders = [node for node in graph.nodes if node.op == "placeholder"]
        values = {
            node.name: Captured.of(value) for node, value in zip(placeholders, inputs, strict=False)
        }
        for node in placeholders[len(inputs) :]:
            if node.args:
                values[node.name] = Captured.of(node.args[0])
        return values

    def _runner(self, region: int) -> SegmentRunner:
        if region not in self._region_runners:
            regions = self.traced.region_segments
            module = build_segmented_module(
                self.traced.graph_module, regions, [KEEP] * len(regions), observer=NoObserver()
            )
            for node in module.graph.nodes:
                target = node.target
                if isinstance(target, SegmentRunner):
                    self._region_runners[target.index] = SegmentRunner(
                        target.index,
                        target.module,
                        SegmentAction(recompute=True),
                        target.stateful_modules,
                        None,
                    )
        return self._region_runners[region]

    def _time_piece(self, runner: SegmentRunner, inputs: tuple[Captured, ...]) -> float:
        leaves = [captured.leaf() for captured in inputs]
        wrt = [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]
        with self.runs.training_threads():
            started = time.perf_counter()
            with self.runs.autocast():
                outputs = [t for t in flat_tensors(runner(*leaves)) if t.requires_grad]
            if outputs:
                torch.autograd.grad(
                    outputs,
                    [*wrt, *self.parameters],
                    grad_outputs=[torch.ones_like(t) for t in outputs],
                    allow_unused=True,
                )
            return time.perf_counter() - started

    def held_values(self) -> list[Any]:
        """Beside the runs' copy of the samples timed, the regions' inputs kept from the
        plain step."""
        kept = [c.value for inputs in self._region_inputs.values() for c in inputs]
        return [*kept, *super().held_values()]
