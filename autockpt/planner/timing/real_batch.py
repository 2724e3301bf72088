"""The real model, batch and loss that timed runs share: which samples they use, the optimizer's
timing, and the module a plan runs as.

The two stopwatches build on it: :class:`~autockpt.planner.timing.stopwatch.Stopwatch` times a
traced model segment by segment (NOTE [Measured step time]);
:class:`~autockpt.planner.timing.module_stopwatch.ModuleStopwatch` times whole steps of a module
chain's model (NOTE [Timing a module chain]). Plans are timed whole on either (NOTE [Whole-plan
timing] in :mod:`autockpt.planner.solve.whole_plan_timing`).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from autockpt.planner.core.batch_split import batch_size_of, split_batch, take_samples
from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.core.memory_tracker import storage_bytes, tensor_bytes
from autockpt.planner.measure.fake_step import default_loss
from autockpt.planner.measure.optimizers import make_optimizer
from autockpt.planner.simulate.step_spec import StepSpec
from autockpt.planner.timing.timed_runs import TimedRuns, median, seconds
from autockpt.planner.timing.timing_room import OPTIMIZER_COPIES_PER_BYTE, TimingRoom, on_line
from autockpt.planner.trace.fx_graph import Segment


class RealBatch:
    """The caller's model, batch and loss as timed runs use them.

    Args:
        module: the module whose plain step is timed; shares the caller's parameters.
        spec: the step: its example batch is the batch timed, its loss
            ``loss_fn(output, *example_targets)`` (``None``: the sum of the outputs), one step
            of its optimizer timed, forward and loss under its autocast precision.
        threads: torch CPU threads to time with (training's, not planning's one).
        room: the samples the runs use, and the bytes the optimizer's timing may take
            (default: the whole batch, no limit); times stand for the whole batch, read off a
            line (NOTE [Timing at a batch that fits]).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        spec: StepSpec,
        *,
        threads: int,
        room: TimingRoom | None = None,
    ) -> None:
        example_inputs, example_targets = spec.example_inputs, spec.example_targets
        #: The batch the times stand for, and the leading samples of it the runs use.
        self.whole_batch_size = batch_size_of(list(example_inputs)) or 1
        self.room = room or TimingRoom.whole(self.whole_batch_size)
        self.batch_size = max(min(self.room.samples, self.whole_batch_size), 1)
        self.inputs = self._leading(list(example_inputs))
        self.targets = self._leading(list(example_targets))
        #: The caller's whole batch, for plans timed whole at it (NOTE [Whole-plan timing]).
        self.whole_inputs, self.whole_targets = list(example_inputs), list(example_targets)
        #: The most real bytes a plan timed at the whole batch held, with what the runs hold
        #: beside it (:meth:`held_bytes`); 0 where none was.
        self.whole_batch_peak_bytes = 0
        self.loss_fn = spec.loss_fn or default_loss
        self.optimizer = spec.optimizer
        self.runs = TimedRuns(list(module.buffers()), threads, spec.autocast_dtype)
        self.parameters = [p for p in module.parameters() if p.requires_grad]
        self._optimizer_s: float | None = None
        self._step_s: dict[tuple[int, int], float] = {}  # by module and samples, as timed

    @property
    def threads(self) -> int:
        """Torch CPU threads the runs are timed with."""
        return self.runs.threads

    @property
    def spent_s(self) -> float:
        """Seconds spent in timed runs so far (repeats included)."""
        return self.runs.spent_s

    def runs_said(self) -> str:
        """Where and how long the runs timed, for the plan's notes: the samples (where they
        are part of the batch) and the seconds on how many threads."""
        samples = (
            f" at {self.batch_size} of the batch's {self.whole_batch_size} samples, scaled"
            if self.batch_size < self.whole_batch_size
            else ""
        )
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return f"{samples} ({self.spent_s:.2f} s of runs on {threads})"

    def plain_module(self) -> torch.nn.Module:
        """The module a plain step runs."""
        raise NotImplementedError

    def planned_module(
        self, segments: Sequence[Segment], actions: Sequence[SegmentAction]
    ) -> torch.nn.Module:
        """The module a plan of ``actions`` on ``segments`` runs (its micro-batches aside)."""
        raise NotImplementedError

    def step_run(
        self, module: torch.nn.Module, pieces: int, samples: int | None = None
    ) -> Callable[[], float]:
        """A function timing one forward, loss and backward of ``module`` over ``pieces``
        micro-batches of the leading ``samples`` the runs use (default: all of them; more:
        the caller's whole batch). Gradients come from ``torch.autograd.grad``: no ``.grad``
        is written."""
        samples = samples or self.batch_size
        if samples > self.batch_size:  # the caller's whole batch, as training runs it
            inputs = split_batch(self.whole_inputs, pieces, batch_size=samples)
            targets = split_batch(self.whole_targets, pieces, batch_size=samples)
        else:
            inputs = split_batch(self.leading(self.inputs, samples), pieces, batch_size=samples)
            targets = split_batch(self.leading(self.targets, samples), pieces, batch_size=samples)

        def run() -> float:
            started = time.perf_counter()
            for piece_inputs, piece_targets in zip(inputs, targets, strict=True):
                with self.autocast():
                    loss = self.loss_fn(module(*piece_inputs), *piece_targets)
                if pieces > 1:
                    loss = loss * (1.0 / pieces)
                if loss.requires_grad and self.parameters:
                    torch.autograd.grad(loss, self.parameters, allow_unused=True)
                del loss
            return time.perf_counter() - started

        return run

    def whole_step_s(self, module: torch.nn.Module) -> float:
        """``module``'s forward, loss and backward at the whole batch, timed until settled
        (:meth:`TimedRuns.settled`; past the samples the runs use, read off the line through
        them and half of them)."""
        if self.batch_size >= self.whole_batch_size:
            return self._step_at(module, self.batch_size)
        low_samples = self.room.lower_samples
        return on_line(
            self._step_at(module, low_samples),
            low_samples,
            self._step_at(module, self.batch_size),
            self.batch_size,
            self.whole_batch_size,
        )

    def _step_at(self, module: torch.nn.Module, samples: int) -> float:
        key = (id(module), samples)
        if key not in self._step_s:
            run = self.step_run(module, 1, samples)
            with self.runs.training_threads():
                self._step_s[key] = self.runs.settled(run, key=float)
        return self._step_s[key]

    def optimizer_s(self) -> float:
        """One optimizer step over copies of the parameters, its state already made; over
        the leading parameters whose copies fit ``optimizer_room_bytes``, scaled by bytes."""
        if self._optimizer_s is None:
            timed = self._parameters_within_room()
            copies = [torch.nn.Parameter(p.detach().clone()) for p in timed]
            optimizer = make_optimizer(self.optimizer, copies)
            if optimizer is None or not copies:
                self._optimizer_s = 0.0
            else:
                for copy in copies:
                    copy.grad = torch.zeros_like(copy)
                with self.runs.training_threads(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    optimizer.step()  # makes its state, as an earlier training step has
                    runs = self.runs.repeated(lambda: seconds(optimizer.step))
                share = tensor_bytes(timed) / max(tensor_bytes(self.parameters), 1)
                self._optimizer_s = median(runs, key=float) / share
        return self._optimizer_s

    def _parameters_within_room(self) -> list[torch.nn.Parameter]:
        # A copy, its gradient and the step's temporaries: three times its bytes, and state.
        per_byte = OPTIMIZER_COPIES_PER_BYTE + self.room.optimizer_state_share
        chosen: list[torch.nn.Parameter] = []
        held = 0.0
        for parameter in self.parameters:
            held += per_byte * tensor_bytes(parameter)
            if held > self.room.optimizer_room_bytes:
                break
            chosen.append(parameter)
        return chosen

    def _leading(self, values: list[Any]) -> list[Any]:
        """``values`` cut to the samples the runs use (the very values at the whole batch)."""
        if self.batch_size == self.whole_batch_size:
            return values
        return take_samples(values, slice(0, self.batch_size), batch_size=self.whole_batch_size)

    def leading(self, values: list[Any], samples: int) -> list[Any]:
        """``values`` (the runs' inputs or targets) cut to their leading ``samples``: views of
        the runs' own copy, which share no storage with the caller's batch."""
        if samples == self.batch_size:
            return values
        return take_samples(values, slice(0, samples), batch_size=self.batch_size, copy=False)

    def held_values(self) -> list[Any]:
        """What the runs hold between steps beside the caller's model and batch: their copy
        of the samples timed, where that is not the caller's batch itself."""
        if self.batch_size < self.whole_batch_size:
            return [self.inputs, self.targets]
        return []

    def held_bytes(self) -> int:
        """Bytes of :meth:`held_values`, each storage counted once."""
        return storage_bytes(self.held_values())

    @contextlib.contextmanager
    def isolated(self) -> Iterator[None]:
        """Training's thread count, and the buffers a forward updates put back afterwards."""
        with self.runs.isolated():
            yield

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast the step runs under (none without an autocast dtype)."""
        return self.runs.autocast()
