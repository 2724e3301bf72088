"""Stage 2: measure one training step on fake tensors, segment by segment.

NOTE [Step accounting]
One *step* is what a trainer does per batch: forward, loss, backward, optimizer step, with the
gradients set to ``None`` before the next step (the PyTorch default). Before the step starts the
parameters, the optimizer state (already created by an earlier step) and the input batch are live.
The step is run on a fake copy of the model under a
:class:`~autockpt.planner.core.memory_tracker.MemoryTracker`, so every live storage is counted at
every op, with no real memory and in a fraction of a second.

While it runs, each op is attributed to a phase (forward, loss, backward, optimizer) and, in
forward and backward, to the segment it belongs to: in forward the segment runner says which
segment is running; in backward a pre-hook on every autograd node a segment created says so.
From that the profile records, per segment: live bytes when its forward ends, the peak during
its forward and during its backward (its recompute included), and the FLOPs, bytes moved and op
count of its forward (its recompute cost).

The same routine measures any plan, so the planner's last act is to measure the plan it chose:
the predicted peak is that measurement, not the solver's estimate.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map_only
from torch.utils.flop_counter import flop_registry

from autockpt.planner.core.batch_split import batch_size_of, split_batch
from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.core.fake_mode import FakeScalars
from autockpt.planner.core.memory_tracker import (
    MemoryTracker,
    RealSizeOracle,
    flat_tensors,
    tensor_bytes,
    tensors_of,
)
from autockpt.planner.core.output_structure import output_tensors
from autockpt.planner.measure.optimizers import make_optimizer, same_kind
from autockpt.planner.runtime.planned_chain import build_module_planned
from autockpt.planner.runtime.segment_runners import (
    adopt_state_of,
    build_segmented_module,
    collect_segment_grad_fns,
)
from autockpt.planner.simulate.step_profile import (
    PHASES,
    LossFn,
    OptimizerSpec,
    SegmentProfile,
    StepProfile,
)
from autockpt.planner.simulate.step_record import StepRecording
from autockpt.planner.trace.fx_graph import Segment, TracedModel
from autockpt.planner.trace.module_chain import ModuleChain


def default_loss(output: Any) -> torch.Tensor:
    """Sum of every floating-point tensor in the model's output (dataclasses included)."""
    tensors = output_tensors(output)
    floating = [t.float().sum() for t in tensors if t.is_floating_point()]
    if not floating:
        raise ValueError("the model's output holds no floating-point tensor to take a loss of")
    return torch.stack(floating).sum()


class _StepRecorder:
    """Attributes every op of a step to a phase and a segment (NOTE [Step accounting])."""

    def __init__(
        self, num_segments: int, *, count_work: bool = True, recording: StepRecording | None = None
    ) -> None:
        self.count_work = count_work
        self.recording = recording
        self.tracker: MemoryTracker | None = None
        self.phase = "setup"
        self.current: int | None = None
        self.previous: int | None = None
        self.segments = [SegmentProfile() for _ in range(num_segments)]
        self.phase_peak = dict.fromkeys(PHASES, 0)
        self.timeline: list[tuple[int, str, int]] = []

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        assert self.tracker is not None
        now = self.tracker.current_bytes
        if self.phase != "setup":  # the step's own ops, not making its starting state
            self.timeline.append((now, self.phase, -1 if self.current is None else self.current))
            if self.recording is not None:
                self.recording.op_ran(func, (args, kwargs), out, self.phase)
        if self.phase in self.phase_peak:
            self.phase_peak[self.phase] = max(self.phase_peak[self.phase], now)
        if self.current is None:
            if self.phase == "forward" and self.previous is not None:
                # An op between segments (a module chain's rest, NOTE [Module chain]): its
                # bytes sit on top of the segment before it, as if it ran at that one's end.
                previous = self.segments[self.previous]
                previous.forward_peak_bytes = max(previous.forward_peak_bytes, now)
            elif self.phase == "backward":  # the loss's backward, before any segment's:
                self.phase_peak["loss"] = max(self.phase_peak["loss"], now)  # on top of S_n
            return
        profile = self.segments[self.current]
        if self.phase == "forward":
            profile.forward_peak_bytes = max(profile.forward_peak_bytes, now)
            profile.forward_num_ops += 1
            if self.count_work:
                profile.forward_flops += _flops(func, args, kwargs, out)
                profile.forward_moved_bytes += tensor_bytes((args, kwargs, out))
        elif self.phase == "backward":
            profile.backward_peak_bytes = max(profile.backward_peak_bytes, now)

    def segment_started(self, index: int) -> None:
        assert self.tracker is not None
        if self.recording is not None:
            self.recording.segment_started(index)
        self.current = index
        now = self.tracker.current_bytes
        profile = self.segments[index]
        profile.start_bytes = now
        profile.forward_peak_bytes = max(profile.forward_peak_bytes, now)
        if index == 0:
            # Ops before the first segment (a module chain's rest) peak on top of the start.
            profile.forward_peak_bytes = max(profile.forward_peak_bytes, self.phase_peak["forward"])
        if index > 0:
            self.segments[index - 1].end_bytes = now

    def forward_finished(self) -> None:
        """The loss is about to start: the last segment's leftovers are what is live now."""
        assert self.tracker is not None
        if self.segments:
            self.segments[-1].end_bytes = self.tracker.current_bytes

    def segment_finished(self, index: int, inputs: tuple[Any, ...], outputs: Any) -> None:
        assert self.tracker is not None
        if self.recording is not None:
            self.recording.segment_finished(index, inputs, outputs)
        profile = self.segments[index]
        profile.input_sizes = tuple(tensor_bytes(value) for value in inputs)
        profile.input_bytes = tensor_bytes(inputs)
        profile.output_bytes = tensor_bytes(outputs)
        self.current = None
        self.previous = index

        def enter_segment(*_: Any) -> None:
            if self.phase == "backward":
                self.current = index

        collect_segment_grad_fns(inputs, outputs, lambda node: node.register_prehook(enter_segment))


def _flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    count = flop_registry.get(func.overloadpacket)
    if count is None:
        return 0
    try:
        return int(count(*args, **kwargs, out_val=out))
    except Exception:  # a FLOP formula that does not cover this overload: count it as 0
        return 0


class FakeTrainingState:
    """A fake copy of the model and its optimizer, as they are after one training step.

    Made once per planning call and shared by every profile: copying a large graph module
    and creating the optimizer state is a good part of a profile's cost. Profiles leave it as
    they found it, up to values (gradients are set back to ``None``; fake values carry no
    meaning).

    Args:
        traced: the traced model, or the module chain of one that does not trace (measured
            on a real copy when its ``fake_mode`` is ``None``; NOTE [Module chain]).
        optimizer: what optimizer state to count (see :func:`~autockpt.planner.measure.optimizers.make_optimizer`).
        gradients_live: every gradient is alive from the start of the step, as in the steady
            state of micro-batches (a loop that accumulates, or zeroes after the forward).
    """

    def __init__(
        self,
        traced: TracedModel | ModuleChain,
        *,
        optimizer: OptimizerSpec = "adamw",
        gradients_live: bool = False,
    ) -> None:
        self.traced = traced
        self.gradients_live = gradients_live
        self.mode = traced.fake_mode
        self.model = traced.fake_module
        self.parameters = list(self.model.parameters())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Outside the fake mode: the state lives on meta tensors.
            self.optimizer, settings = _optimizer_with_state(optimizer, self.parameters)
            self.step_extra_bytes = 0
            if self.optimizer is not None:
                with _inside(self.mode):
                    self.step_extra_bytes = self._step_extra_bytes(settings)
        self.parameter_bytes = sum(p.untyped_storage().nbytes() for p in self.parameters)
        self.optimizer_state_bytes = sum(
            t.untyped_storage().nbytes()
            for state in (self.optimizer.state.values() if self.optimizer else [])
            for t in state.values()
            if isinstance(t, torch.Tensor)
        )

    def _step_extra_bytes(self, foreach_settings: list[Any]) -> int:
        """Bytes the optimizer step allocates on top of parameters, gradients and state.

        NOTE [Optimizer step]: the per-parameter implementation (PyTorch's default on the
        CPU) updates one parameter at a time and frees its temporaries before the next, so its
        extra peak is that of the largest parameter alone: one small step is measured instead
        of a few ops per parameter. The multi-tensor (foreach) implementation, the default on
        CUDA, holds temporaries for all parameters at once, so all of them are measured.
        """
        trainable = [p for p in self.parameters if p.requires_grad]
        if self.optimizer is None or not trainable:
            return 0
        on_cuda = all(p.device.type == "cuda" for p in trainable)
        foreach = any(s is True or (s is None and on_cuda) for s in foreach_settings)
        chosen = trainable if foreach else [max(trainable, key=lambda p: p.numel())]
        if self.mode is None:
            # A real copy shares the model's parameter memory (NOTE [Scaled real
            # measurement]): a step over it would write the model. Meta stand-ins count alike.
            chosen = [
                torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=True)
                for p in chosen
            ]
        probe = same_kind(self.optimizer, chosen)
        if foreach:
            # torch picks foreach kernels by the parameters' types, and a fake tensor is not one
            # it picks them for: left to choose, the probe took the per-parameter path a real
            # CUDA step does not take, and missed its copy of every parameter's moments.
            for group in probe.param_groups:
                if "foreach" in group:
                    group["foreach"] = True
        for parameter in chosen:
            parameter.grad = torch.zeros_like(parameter)
        probe.step()  # create its state
        held = [*chosen, *(p.grad for p in chosen if p.grad is not None)]
        held += [
            t for st in probe.state.values() for t in st.values() if isinstance(t, torch.Tensor)
        ]
        with MemoryTracker(initial=held) as tracker:
            before = tracker.current_bytes
            probe.step()
        for parameter in chosen:
            parameter.grad = None
        return max(tracker.peak_bytes - before, 0)


def _optimizer_with_state(
    spec: OptimizerSpec, parameters: Sequence[torch.nn.Parameter]
) -> tuple[torch.optim.Optimizer | None, list[Any]]:
    """The optimizer over meta stand-ins of ``parameters``, with its state created as a
    previous step would have, and each group's ``foreach`` setting as the caller gave it.

    Only the state's sizes are ever read. Meta kernels create it three to four times faster
    than fake ones (a quarter of a second of a ``tft-225`` plan). The state is created with
    the foreach implementation where there is one (a few ops instead of a few per parameter).
    """
    stand_ins = [
        torch.nn.Parameter(
            torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=p.requires_grad
        )
        for p in parameters
    ]
    optimizer = make_optimizer(spec, stand_ins)
    if optimizer is None:
        return None, []
    for stand_in in stand_ins:
        if stand_in.requires_grad:
            stand_in.grad = torch.zeros_like(stand_in)
    settings = [group.get("foreach") for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        if "foreach" in group:
            group["foreach"] = True
    optimizer.step()
    for group, setting in zip(optimizer.param_groups, settings, strict=True):
        if "foreach" in group:
            group["foreach"] = setting
    optimizer.zero_grad(set_to_none=True)
    return optimizer, settings


def profile_step(
    state: FakeTrainingState,
    example_inputs: Sequence[torch.Tensor],
    actions: Sequence[SegmentAction],
    *,
    loss_fn: LossFn | None = None,
    example_targets: Sequence[torch.Tensor] = (),
    num_micro_batches: int = 1,
    size_oracle: RealSizeOracle | None = None,
    run_optimizer: bool = True,
    count_work: bool = True,
    autocast_dtype: torch.dtype | None = None,
    segments: Sequence[Segment] | None = None,
    recording: StepRecording | None = None,
) -> StepProfile:
    """Measure one training step of the traced model planned with ``actions``, on fake tensors.

    Args:
        state: the fake model and optimizer (see :class:`FakeTrainingState`).
        example_inputs: one batch of positional inputs, tensors or nests of them (on fake
            tensors only shapes and dtypes are used).
        actions: one per segment.
        loss_fn: ``loss_fn(output, *example_targets) -> scalar``; default: sum of the outputs.
        example_targets: what the loss compares against (the training targets): live, like
            the inputs, from the start of the step.
        num_micro_batches: split the batch into this many pieces along dim 0, with a backward
            per piece and the gradients accumulated. One piece is measured, in the steady
            state: with every gradient already live, as an earlier piece leaves them.
        size_oracle: sizes ops whose fake kernels under-report.
        run_optimizer: run the optimizer step too. Its peak does not depend on the plan, and
            simulating it can be a third of the work, so the planner runs it once.
        count_work: count each segment's forward FLOPs and bytes moved (the time model's
            inputs); they do not depend on the plan, so the planner counts them once.
        autocast_dtype: run forward and loss under ``torch.autocast`` with this dtype.
        segments: the chain ``actions`` apply to; default: the traced model's segments.
        recording: writes the step's record as it runs (NOTE [One record, many plans]).

    Returns:
        The step's profile (NOTE [Step accounting]); with micro-batches, of one piece.
    """
    loss_fn = loss_fn or default_loss
    segments = state.traced.segments if segments is None else segments
    recorder = _StepRecorder(len(segments), count_work=count_work, recording=recording)
    with _inside(mode := state.mode), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = state.traced
        if isinstance(traced, ModuleChain):
            planned = build_module_planned(traced.fake_module, segments, actions, observer=recorder)
        else:
            planned = build_segmented_module(
                traced.fake_module, segments, actions, observer=recorder
            )
            adopt_state_of(planned, traced.fake_module)
        inputs = list(example_inputs)
        targets = list(example_targets)
        if mode is not None:
            inputs = tree_map_only(torch.Tensor, mode.from_tensor, inputs)
            targets = tree_map_only(torch.Tensor, mode.from_tensor, targets)
        tracker = MemoryTracker(
            initial=[
                *tensors_of(state.model, state.optimizer),
                *flat_tensors(inputs),
                *flat_tensors(targets),
            ],
            observer=recorder.on_op,
            size_oracle=size_oracle,
            listener=None if recording is None else recording.storage_counted,
        )
        recorder.tracker = tracker
        profile = StepProfile(
            start_bytes=tracker.current_bytes,
            parameter_bytes=state.parameter_bytes,
            optimizer_state_bytes=state.optimizer_state_bytes,
            input_bytes=tracker.current_bytes - state.parameter_bytes - state.optimizer_state_bytes,
        )
        with tracker:
            piece = _first_micro_batch(inputs, num_micro_batches, inputs)
            target_piece = _first_micro_batch(targets, num_micro_batches, inputs)
            if num_micro_batches > 1 or state.gradients_live:
                # The steady state of accumulation: an earlier piece left every gradient live.
                for parameter in state.parameters:
                    if parameter.requires_grad:
                        parameter.grad = torch.zeros_like(parameter)
                        tracker.register(parameter.grad)
                tracker.reset_peak()
                profile.start_bytes = tracker.current_bytes
            device_type = next((x.device.type for x in flat_tensors(inputs)), "cpu")
            with torch.autocast(
                device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                recorder.phase = "forward"
                output = planned(*piece)
                recorder.forward_finished()
                recorder.phase = "loss"
                # NOTE [Values read off fake tensors]: a loss may read a value (.item()).
                with FakeScalars() if mode is not None else contextlib.nullcontext():
                    loss = loss_fn(output, *target_piece)
                if num_micro_batches > 1:
                    # As ``training_step`` does: each piece's loss is scaled by its share of
                    # the batch (the scaled scalar and its gradient are live bytes too).
                    loss = loss * (1.0 / num_micro_batches)
                del output
            recorder.phase = "backward"
            loss.backward()
            del loss
            recorder.current = None
            profile.gradient_bytes = sum(
                p.grad.untyped_storage().nbytes() for p in state.parameters if p.grad is not None
            )
            recorder.phase = "optimizer"
            if run_optimizer and state.optimizer is not None:
                # See NOTE [Optimizer step].
                step_peak = tracker.current_bytes + state.step_extra_bytes
                recorder.phase_peak["optimizer"] = step_peak
                recorder.timeline.append((step_peak, "optimizer", -1))
                tracker.peak_bytes = max(tracker.peak_bytes, step_peak)
            for parameter in state.parameters:
                parameter.grad = None
        profile.segments = recorder.segments
        profile.timeline = recorder.timeline
        profile.phase_peak_bytes = dict(recorder.phase_peak)
        profile.peak_bytes = tracker.peak_bytes
    return profile


def _inside(mode: FakeTensorMode | None) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext() if mode is None else mode  # a real copy: NOTE [Module chain]


def _first_micro_batch(values: Sequence[Any], pieces: int, inputs: Sequence[Any]) -> list[Any]:
    # As training_step cuts the batch of ``inputs``: nests too.
    return split_batch(values, pieces, batch_size=batch_size_of(inputs))[0]
