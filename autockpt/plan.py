"""The Plan and ``plan()``: trace, measure, solve, then measure the chosen plan.

NOTE [Planning]
1. Trace the model into a chain of segments (:mod:`autockpt.trace`).
2. Measure a step twice on fake tensors, every segment kept and every segment recomputed
   (:mod:`autockpt.measure`); each segment's options come from the pair (NOTE [Chain memory
   model]). Segments that :mod:`autockpt.separable` finds batch-separable also get chunked
   options, scaled from the recomputed one.
3. If the whole step is batch-separable, measure it again at half the batch; every quantity is
   then fitted as ``a + c / num_micro_batches`` to give the chain at 2, 4, 8, ... micro-batches.
4. Solve each chain exactly (:mod:`autockpt.solve`), keep the cheapest that fits.
5. Measure the chosen plan itself on fake tensors. That measurement is the predicted peak. If
   the solver's estimate was optimistic and the plan does not fit, solve again against a budget
   lowered by the overshoot (a few rounds), and fail with :class:`InfeasibleBudgetError` rather
   than hand back a plan that does not fit.

The budget a plan must meet on the CPU is tracked bytes (NOTE [Tracked bytes]). On CUDA it
is what ``nvidia-smi`` shows: the CUDA context and the caching allocator's slack come off the
budget first (``context_bytes`` and ``headroom_bytes`` in the breakdown).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from autockpt.errors import InfeasibleBudgetError
from autockpt.measure import (
    FakeTrainingState,
    LossFn,
    OptimizerSpec,
    StepProfile,
    profile_step,
)
from autockpt.memory import RealSizeOracle
from autockpt.segmented import SegmentAction
from autockpt.separable import Separability, analyse_separability
from autockpt.solve import Chain, Option, Solution, minimum_peak, solve
from autockpt.timing import TimeModel, calibrate
from autockpt.trace import Segment, TracedModel, trace_model
from autockpt.units import Budget, format_bytes, parse_budget

#: Chunk counts the planner may give a batch-separable segment.
CHUNK_CHOICES = (2, 4, 8, 16, 32)
#: Micro-batch counts the planner may split a batch-separable step into.
MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16, 32)
#: Rounds of re-solving when the measured plan exceeds the budget (NOTE [Planning], step 5).
MAX_REPLANS = 4
#: Real steps run to verify a plan before giving up (see ``plan(verify=...)``).
MAX_VERIFY_ROUNDS = 3
#: What the CUDA context takes before any tensor (measured when a GPU is present).
DEFAULT_CUDA_CONTEXT_BYTES = 512 * 2**20
#: What the caching allocator reserves beyond the tensors it holds (rounding, fragmentation),
#: as a share of the tensor bytes.
CUDA_HEADROOM_FRACTION = 0.10

Strategy = Literal["auto", "checkpoint-all", "checkpoint-none"]


class SegmentPlan(BaseModel):
    """One segment of the chain and what the plan does with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Readable name, from the modules the segment runs in."""
    nodes: list[str]
    """The fx nodes it covers, in order."""
    modules: list[str]
    """The module paths its nodes run in."""
    inputs: list[str]
    """The nodes whose values it reads from earlier segments."""
    outputs: list[str]
    """Its nodes whose values later segments read."""
    saved_bytes: int
    """Bytes it keeps alive for backward when kept (at the planned micro-batch size)."""
    boundary_bytes: int
    """Bytes it keeps alive when recomputed: its inputs and outputs."""
    recompute_s: float
    """Estimated seconds of one recompute of its forward."""
    recomputed: bool
    """Whether its interior is dropped after forward and rebuilt in backward."""
    num_chunks: int = 1
    """Pieces along the batch it runs in (only when recomputed)."""
    input_batch_dims: list[int | None] = []
    """Per input, the dimension split into chunks (None: passed whole to every chunk)."""
    output_batch_dims: list[int] = []
    """Per output, the dimension the chunks are joined along."""
    reason: str = ""
    """Why the planner chose this option."""


class PeakBreakdown(BaseModel):
    """What the predicted peak is made of, in bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    inputs_bytes: int
    activations_bytes: int
    """Live at the end of forward, beyond the above: what backward will need."""
    transient_bytes: int
    """The rest of the peak: workspaces, recomputed interiors, gradients in flight."""
    context_bytes: int
    """CUDA context (0 on the CPU)."""
    headroom_bytes: int
    """Budget kept back for the allocator's slack (0 on the CPU)."""


class Plan(BaseModel):
    """What to recompute, how to split the batch, and the predicted peak: the planner's answer.

    Save with ``plan.model_dump_json()``, reload with ``Plan.model_validate_json(text)``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget_bytes: int
    budget_text: str
    budget_reading: str
    device: str
    strategy: Strategy
    batch_size: int
    num_micro_batches: int = 1
    """Pieces the batch is split into, with gradients accumulated (see ``training_step``)."""
    segments: list[SegmentPlan]
    predicted_peak_bytes: int
    """Measured peak of the planned step on fake tensors, plus context and headroom."""
    breakdown: PeakBreakdown
    unplanned_peak_bytes: int
    """The same for the step with nothing recomputed, in one piece."""
    minimum_feasible_bytes: int
    """The smallest budget the options examined meet, by the planner's model (an estimate).
    Chunks and micro-batches are only examined when plain recompute cannot fit, so above that
    this is the minimum of plain recompute; an infeasible budget examines everything."""
    predicted_extra_s: float
    """Estimated seconds the plan adds to a step."""
    unplanned_step_s: float
    """Estimated seconds of a plain step (forward + backward)."""
    fits: bool
    planning_s: float
    notes: list[str] = []

    @property
    def num_recomputed(self) -> int:
        """How many segments are recomputed."""
        return sum(segment.recomputed for segment in self.segments)


def plan(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: str | int | Budget = "auto",
    *,
    loss_fn: LossFn | None = None,
    optimizer: OptimizerSpec = "adamw",
    device: torch.device | str | None = None,
    use_gradient_checkpointing: bool | None = None,
    allow_micro_batches: bool = True,
    allow_chunks: bool = True,
    verify: bool | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> Plan:
    """Plan a training step of ``model`` that fits ``budget`` (NOTE [Planning]).

    The model is left as it was: parameters, gradients, buffers, train/eval mode and the RNG
    state are unchanged (measurement runs on fake copies).

    Args:
        model: any ``nn.Module`` torch.fx can trace.
        example_inputs: a tuple of positional inputs at the training batch size.
        budget: bytes as an ``int``, or ``"4GB"``, ``"3.5GiB"``, ``"800MB"``, ``"auto"``, or a
            :class:`~autockpt.units.Budget` already read.
        loss_fn: ``loss_fn(output) -> scalar``; default: the sum of the outputs.
        optimizer: ``"adamw"``, ``"sgd"``, ``None`` or an optimizer instance, to count its state.
        device: where training will run; default: where the model's parameters are.
        use_gradient_checkpointing: ``None`` plans automatically, ``True`` recomputes every
            segment, ``False`` none. Forced modes still report the predicted peak and warn
            when it exceeds the budget.
        allow_micro_batches: let the plan split the batch into micro-batches (needs a loss
            that is a mean or a sum over samples; see ``training_step``).
        allow_chunks: let the plan run batch-separable segments in chunks. Chunks and
            micro-batches keep gradients equal with dropout off; with dropout on each piece
            draws its own masks, so turn both off where bit-for-bit dropout equality with the
            unplanned model matters (plain recompute keeps it).
        verify: run one real planned step and compare its peak with the prediction; if it
            is over the budget, plan again against a budget lowered by the overshoot (up to
            ``MAX_VERIFY_ROUNDS`` times). Default: on CUDA only (on the CPU the prediction is
            measured with the very kernels the step runs). Needs the model and inputs on the
            device.
        autocast_dtype: the mixed-precision dtype training runs at (``torch.bfloat16``,
            ``torch.float16``): the step is measured under ``torch.autocast`` with it.

    Returns:
        The plan: which segments recompute (and in how many chunks), how many micro-batches,
        the predicted peak and its breakdown.

    Raises:
        BudgetError: the budget cannot be read.
        InfeasibleBudgetError: no plan fits (the message gives the minimum and the levers).
        TraceError: torch.fx cannot trace the model.

    Example:
        >>> plan = autockpt.plan(model, (x,), budget="4GB")
        >>> model = autockpt.apply(model, plan)
    """
    resolved_device = _resolve_device(model, device)
    rng_devices = [resolved_device.index or 0] if resolved_device.type == "cuda" else []
    read = budget if isinstance(budget, Budget) else parse_budget(budget, device=resolved_device)
    if verify is None:
        verify = resolved_device.type == "cuda"
    target = read
    notes: list[str] = []
    for _ in range(MAX_VERIFY_ROUNDS):
        # Calibration and probes draw random numbers; the caller's RNG stream must not move.
        with torch.random.fork_rng(devices=rng_devices):
            result = _plan(
                model,
                example_inputs,
                target,
                loss_fn=loss_fn,
                optimizer=optimizer,
                device=resolved_device,
                use_gradient_checkpointing=use_gradient_checkpointing,
                allow_micro_batches=allow_micro_batches,
                allow_chunks=allow_chunks,
                autocast_dtype=autocast_dtype,
            )
        result = result.model_copy(
            update={
                "budget_bytes": read.bytes,
                "budget_text": read.text,
                "budget_reading": read.reading,
                "fits": result.predicted_peak_bytes <= read.bytes,
            }
        )
        if not verify or use_gradient_checkpointing is not None:
            return result.model_copy(update={"notes": [*notes, *result.notes]})
        from autockpt.verify import verify_plan  # verify imports apply, which imports plan

        check = verify_plan(model, result, example_inputs, loss_fn=loss_fn, optimizer=optimizer)
        notes.append(
            f"verified: a real step peaked at {format_bytes(check.reserved_peak_bytes)}, "
            f"{format_bytes(check.predicted_peak_bytes)} predicted"
        )
        if check.within_budget:
            return result.model_copy(update={"notes": [*notes, *result.notes]})
        overshoot = check.reserved_peak_bytes - read.bytes
        lowered = target.bytes - overshoot
        notes.append(f"re-planned: the real step was {format_bytes(overshoot)} over the budget")
        if lowered <= 0:
            break
        target = Budget(bytes=lowered, text=read.text, reading=read.reading)
    raise InfeasibleBudgetError(
        f"budget {read.text} could not be kept on {resolved_device}: real steps stayed over it "
        "after re-planning; raise the budget or lower the batch size",
        budget_bytes=read.bytes,
        minimum_bytes=read.bytes,
    )


def _plan(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: Budget,
    *,
    loss_fn: LossFn | None,
    optimizer: OptimizerSpec,
    device: torch.device,
    use_gradient_checkpointing: bool | None,
    allow_micro_batches: bool,
    allow_chunks: bool,
    autocast_dtype: torch.dtype | None,
) -> Plan:
    started = time.perf_counter()
    resolved_device = device
    read = budget
    batch_size = _batch_size(example_inputs)
    traced = trace_model(model, example_inputs)
    oracle = RealSizeOracle()
    time_model = calibrate(resolved_device.type, resolved_device.index)
    context_bytes, headroom_fraction = _reserve(resolved_device)
    # Tensors may take what is left after the context, less the allocator's share of it.
    usable_bytes = int((read.bytes - context_bytes) / (1.0 + headroom_fraction))

    def outside(tensor_bytes: int) -> int:
        """What the device shows for ``tensor_bytes`` of tensors: plus context and slack."""
        return tensor_bytes + context_bytes + int(tensor_bytes * headroom_fraction)

    num_segments = len(traced.segments)
    fake_state = FakeTrainingState(traced, optimizer=optimizer)
    # The first profile runs the optimizer; the others reuse its step peak.
    kept = profile_step(
        fake_state,
        example_inputs,
        [SegmentAction()] * num_segments,
        loss_fn=loss_fn,
        size_oracle=oracle,
        autocast_dtype=autocast_dtype,
    )

    def measure(actions: Sequence[SegmentAction], num_micro_batches: int = 1) -> StepProfile:
        if num_micro_batches == 1 and all(a == SegmentAction() for a in actions):
            return kept
        profile = profile_step(
            fake_state,
            example_inputs,
            actions,
            loss_fn=loss_fn,
            num_micro_batches=num_micro_batches,
            size_oracle=oracle,
            run_optimizer=False,
            autocast_dtype=autocast_dtype,
        )
        optimizer_peak = kept.phase_peak_bytes["optimizer"]
        profile.phase_peak_bytes["optimizer"] = optimizer_peak
        profile.peak_bytes = max(profile.peak_bytes, optimizer_peak)
        return profile

    recomputed = measure([SegmentAction(recompute=True)] * num_segments)
    notes: list[str] = []
    builder = _ChainBuilder(traced, time_model, batch_size)

    if use_gradient_checkpointing is not None:
        strategy: Strategy = "checkpoint-all" if use_gradient_checkpointing else "checkpoint-none"
        actions = [SegmentAction(recompute=use_gradient_checkpointing)] * num_segments
        final = recomputed if use_gradient_checkpointing else kept
        num_micro_batches = 1
        reasons = ["forced by use_gradient_checkpointing"] * num_segments
        minimum = minimum_peak(builder.chain(kept, recomputed, None, 1)).peak_bytes
        if final.peak_bytes > usable_bytes:
            message = (
                f"use_gradient_checkpointing={use_gradient_checkpointing} predicts a peak of "
                f"{format_bytes(final.peak_bytes + context_bytes)}, over the budget "
                f"{read.text}; let the planner decide (use_gradient_checkpointing=None)"
            )
            warnings.warn(message, stacklevel=2)
            notes.append(message)
    else:
        strategy = "auto"
        # Plain recompute first: chunks and micro-batches only pay off where it cannot fit,
        # and finding out whether they are allowed costs a probe on the real model.
        separability = Separability.nothing(num_segments, "plain recompute fits")
        halves: tuple[StepProfile, StepProfile] | None = None

        def infeasible() -> InfeasibleBudgetError:
            return _infeasible(
                read, builder, kept, recomputed, halves, separability, batch_size, outside
            )

        choice = _choose(builder, kept, recomputed, None, separability, batch_size, usable_bytes)
        if choice is None and (allow_chunks or allow_micro_batches):
            separability = analyse_separability(traced, example_inputs)
            if not allow_chunks:
                separability = dataclasses.replace(separability, chunkable=(False,) * num_segments)
            if not separability.micro_batchable:
                notes.append(f"micro-batches not used: {separability.reason}")
            choice = _choose(
                builder, kept, recomputed, None, separability, batch_size, usable_bytes
            )
            can_split = allow_micro_batches and separability.micro_batchable and batch_size >= 2
            if can_split and choice is None:
                # Micro-batches are measured only when needed: two profiles of a half batch.
                halves = (
                    measure([SegmentAction()] * num_segments, 2),
                    measure([SegmentAction(recompute=True)] * num_segments, 2),
                )
                choice = _choose(
                    builder, kept, recomputed, halves, separability, batch_size, usable_bytes
                )
        if choice is None:
            raise infeasible()
        actions, num_micro_batches, reasons = choice
        final = measure(actions, num_micro_batches)
        target = usable_bytes
        for _ in range(MAX_REPLANS):
            if final.peak_bytes <= usable_bytes:
                break
            target -= final.peak_bytes - usable_bytes
            choice = _choose(builder, kept, recomputed, halves, separability, batch_size, target)
            if choice is None:
                break
            actions, num_micro_batches, reasons = choice
            final = measure(actions, num_micro_batches)
            notes.append("re-planned: the measured plan was over the budget")
        if final.peak_bytes > usable_bytes:
            # Last resort: the lowest-peak choice at each micro-batch count, measured.
            for count in _micro_batch_counts(batch_size, halves is not None):
                chain = builder.chain(kept, recomputed, halves, count, separability)
                lowest = _actions_of(chain, minimum_peak(chain), separability)
                candidate = measure(lowest[0], count)
                if candidate.peak_bytes <= usable_bytes:
                    actions, reasons = lowest
                    num_micro_batches, final = count, candidate
                    notes.append("took the lowest-peak plan: the cheaper ones measured over")
                    break
        if final.peak_bytes > usable_bytes:
            raise infeasible()
        minimum = min(
            minimum_peak(builder.chain(kept, recomputed, halves, m, separability)).peak_bytes
            for m in _micro_batch_counts(batch_size, halves is not None)
        )

    chain_m = builder.chain(kept, recomputed, None, 1)
    segments = [
        _segment_plan(segment, options, action, reason, builder.recompute_s(kept, segment.index))
        for segment, options, action, reason in zip(
            traced.segments, chain_m.options, actions, reasons, strict=True
        )
    ]
    unplanned_step_s = 3 * sum(builder.recompute_s(kept, i) for i in range(num_segments))
    extra_s = sum(
        builder.recompute_s(kept, i) * (1 if a.recompute else 0) for i, a in enumerate(actions)
    ) + builder.micro_batch_s(kept, num_micro_batches)
    return Plan(
        budget_bytes=read.bytes,
        budget_text=read.text,
        budget_reading=read.reading,
        device=str(resolved_device),
        strategy=strategy,
        batch_size=batch_size,
        num_micro_batches=num_micro_batches,
        segments=segments,
        predicted_peak_bytes=outside(final.peak_bytes),
        breakdown=_breakdown(
            final, context_bytes, outside(final.peak_bytes) - final.peak_bytes - context_bytes
        ),
        unplanned_peak_bytes=outside(kept.peak_bytes),
        minimum_feasible_bytes=outside(minimum),
        predicted_extra_s=extra_s,
        unplanned_step_s=unplanned_step_s,
        fits=final.peak_bytes <= usable_bytes,
        planning_s=time.perf_counter() - started,
        notes=notes,
    )


class _ChainBuilder:
    """Turns measured profiles into the solver's chain (NOTE [Chain memory model])."""

    def __init__(self, traced: TracedModel, time_model: TimeModel, batch_size: int) -> None:
        self.traced = traced
        self.time_model = time_model
        self.batch_size = batch_size

    def recompute_s(self, profile: StepProfile, index: int) -> float:
        segment = profile.segments[index]
        return self.time_model.seconds(
            flops=segment.forward_flops,
            moved_bytes=segment.forward_moved_bytes,
            num_ops=segment.forward_num_ops,
        )

    def micro_batch_s(self, profile: StepProfile, num_micro_batches: int) -> float:
        """Per-op overhead paid again by every extra micro-batch (forward and backward)."""
        num_ops = sum(s.forward_num_ops for s in profile.segments)
        return 3 * (num_micro_batches - 1) * num_ops * self.time_model.op_overhead_s

    def chain(
        self,
        kept: StepProfile,
        recomputed: StepProfile,
        halves: tuple[StepProfile, StepProfile] | None,
        num_micro_batches: int,
        separability: Separability | None = None,
    ) -> Chain:
        """The chain at ``num_micro_batches`` pieces (fitted from the halves when > 1)."""
        k_terms = _terms(kept)
        r_terms = _terms(recomputed)
        if num_micro_batches > 1:
            assert halves is not None
            k_terms = _extrapolate(k_terms, _terms(halves[0]), num_micro_batches)
            r_terms = _extrapolate(r_terms, _terms(halves[1]), num_micro_batches)
        options = []
        for index in range(len(self.traced.segments)):
            keep = _option("keep", k_terms, index, 0.0)
            cost_s = self.recompute_s(kept, index)
            again = _option("recompute", r_terms, index, cost_s)
            segment_options = [keep, again]
            if separability is not None and separability.chunkable[index]:
                segment_options += self._chunked(again, kept, index, r_terms, num_micro_batches)
            options.append(tuple(segment_options))
        return Chain(
            start_bytes=int(k_terms["start"][0]),
            options=tuple(options),
            loss_bytes=int(max(k_terms["loss"][0], r_terms["loss"][0])),
            fixed_peak_bytes=int(k_terms["optimizer"][0]),
        )

    def _chunked(
        self,
        again: Option,
        kept: StepProfile,
        index: int,
        terms: dict[str, list[float]],
        num_micro_batches: int,
    ) -> list[Option]:
        batch = self.batch_size // max(num_micro_batches, 1)
        boundary = terms["io"][index]
        ops = kept.segments[index].forward_num_ops
        options = []
        for chunks in CHUNK_CHOICES:
            if chunks > batch:
                break
            if batch % chunks:
                # Pieces must hold whole samples (a variable-major dim holds B * T rows).
                continue
            # Interiors shrink with the chunk; the boundary and its gradients do not.
            forward = boundary + max(again.forward_bytes - boundary, 0) / chunks
            backward = 2 * boundary + max(again.backward_bytes - 2 * boundary, 0) / chunks
            overhead = 2 * (chunks - 1) * ops * self.time_model.op_overhead_s
            options.append(
                Option(
                    label=f"recompute in {chunks} chunks",
                    kept_bytes=again.kept_bytes,
                    forward_bytes=int(forward),
                    backward_bytes=int(backward),
                    extra_s=again.extra_s + overhead,
                )
            )
        return options


def _terms(profile: StepProfile) -> dict[str, list[float]]:
    """Per-segment increments of a profile (NOTE [Chain memory model])."""
    kept, forward, backward, io = [], [], [], []
    previous_end = profile.start_bytes
    for segment in profile.segments:
        kept.append(float(segment.end_bytes - previous_end))
        forward.append(float(max(segment.forward_peak_bytes - previous_end, 0)))
        backward.append(float(max(segment.backward_peak_bytes - previous_end, 0)))
        io.append(float(segment.input_bytes + segment.output_bytes))
        previous_end = segment.end_bytes
    return {
        "start": [float(profile.start_bytes)],
        "kept": kept,
        "forward": forward,
        "backward": backward,
        "io": io,
        "loss": [float(max(profile.phase_peak_bytes.get("loss", 0) - previous_end, 0))],
        "optimizer": [float(profile.phase_peak_bytes.get("optimizer", 0))],
    }


def _extrapolate(
    whole: dict[str, list[float]], half: dict[str, list[float]], num_micro_batches: int
) -> dict[str, list[float]]:
    """Fit ``a + c / m`` through m = 1 and m = 2 and read it at ``num_micro_batches``."""
    fitted = {}
    for key, values in whole.items():
        fitted[key] = [
            max(2 * h - w, 0.0) + 2 * (w - h) / num_micro_batches
            for w, h in zip(values, half[key], strict=True)
        ]
    # Optimizer state and parameters do not shrink with the batch; from two pieces on, the
    # gradients are live before each piece starts, as in the half-batch profile.
    fitted["optimizer"] = whole["optimizer"]
    fitted["start"] = half["start"]
    return fitted


def _option(label: str, terms: dict[str, list[float]], index: int, extra_s: float) -> Option:
    return Option(
        label=label,
        kept_bytes=int(terms["kept"][index]),
        forward_bytes=int(terms["forward"][index]),
        backward_bytes=int(terms["backward"][index]),
        extra_s=extra_s,
    )


def _micro_batch_counts(batch_size: int, possible: bool) -> list[int]:
    if not possible:
        return [1]
    return [m for m in MICRO_BATCH_CHOICES if m <= batch_size and batch_size % m == 0]


def _choose(
    builder: _ChainBuilder,
    kept: StepProfile,
    recomputed: StepProfile,
    halves: tuple[StepProfile, StepProfile] | None,
    separability: Separability,
    batch_size: int,
    budget_bytes: int,
) -> tuple[list[SegmentAction], int, list[str]] | None:
    """Cheapest (actions, micro-batches, reasons) over every micro-batch count, or None."""
    best: tuple[float, int, Solution, Chain] | None = None
    for count in _micro_batch_counts(batch_size, halves is not None):
        chain = builder.chain(kept, recomputed, halves, count, separability)
        solution = solve(chain, budget_bytes)
        if solution is None:
            continue
        total = solution.extra_s + builder.micro_batch_s(kept, count)
        if best is None or total < best[0]:
            best = (total, count, solution, chain)
    if best is None:
        return None
    _, count, solution, chain = best
    actions, reasons = _actions_of(chain, solution, separability)
    return actions, count, reasons


def _actions_of(
    chain: Chain, solution: Solution, separability: Separability
) -> tuple[list[SegmentAction], list[str]]:
    actions, reasons = [], []
    for index, picked in enumerate(solution.choice):
        option = chain.options[index][picked]
        chunks = int(option.label.split()[2]) if "chunks" in option.label else 1
        actions.append(
            SegmentAction(
                recompute=option.label != "keep",
                num_chunks=chunks,
                input_batch_dims=separability.input_batch_dims[index] if chunks > 1 else (),
                output_batch_dims=separability.output_batch_dims[index] if chunks > 1 else (),
            )
        )
        reasons.append(option.label)
    return actions, reasons


def _infeasible(
    read: Budget,
    builder: _ChainBuilder,
    kept: StepProfile,
    recomputed: StepProfile,
    halves: tuple[StepProfile, StepProfile] | None,
    separability: Separability,
    batch_size: int,
    outside: Callable[[int], int],
) -> InfeasibleBudgetError:
    tensor_minimum = min(
        minimum_peak(builder.chain(kept, recomputed, halves, m, separability)).peak_bytes
        for m in _micro_batch_counts(batch_size, halves is not None)
    )
    minimum = outside(tensor_minimum)
    # Parameters, their gradients and the optimizer state do not shrink with the batch.
    fixed = 2 * kept.parameter_bytes + kept.optimizer_state_bytes
    per_sample = max(minimum - outside(fixed), 1) / max(batch_size, 1)
    fitting_batch = math.floor((read.bytes - outside(fixed)) / per_sample)
    if outside(fixed) >= read.bytes:
        lever = (
            f"parameters, gradients and optimizer state alone take {format_bytes(fixed)}; "
            "raise the budget or use a smaller model"
        )
    elif 1 <= fitting_batch < batch_size:
        lever = f"lower the batch size to {fitting_batch} or raise the budget"
    else:
        lever = f"raise the budget to at least {format_bytes(minimum * 1.05)}"
    return InfeasibleBudgetError(
        f"budget {read.text} ({format_bytes(read.bytes)}) is below the minimum "
        f"{format_bytes(minimum)} for batch {batch_size}; {lever}",
        budget_bytes=read.bytes,
        minimum_bytes=minimum,
    )


def _segment_plan(
    segment: Segment,
    options: tuple[Option, ...],
    action: SegmentAction,
    reason: str,
    recompute_s: float,
) -> SegmentPlan:
    keep, again = options[0], options[1]
    return SegmentPlan(
        name=segment.name,
        nodes=list(segment.node_names),
        modules=list(segment.module_paths),
        inputs=list(segment.input_names),
        outputs=list(segment.output_names),
        saved_bytes=max(keep.kept_bytes, 0),
        boundary_bytes=max(again.kept_bytes, 0),
        recompute_s=recompute_s,
        recomputed=action.recompute,
        num_chunks=action.num_chunks,
        input_batch_dims=list(action.input_batch_dims),
        output_batch_dims=list(action.output_batch_dims),
        reason=reason,
    )


def _breakdown(profile: StepProfile, context_bytes: int, headroom_bytes: int) -> PeakBreakdown:
    end_of_forward = max((s.end_bytes for s in profile.segments), default=profile.start_bytes)
    activations = max(end_of_forward - profile.start_bytes, 0)
    known = (
        profile.parameter_bytes
        + profile.gradient_bytes
        + profile.optimizer_state_bytes
        + profile.input_bytes
        + activations
    )
    return PeakBreakdown(
        parameters_bytes=profile.parameter_bytes,
        gradients_bytes=profile.gradient_bytes,
        optimizer_state_bytes=profile.optimizer_state_bytes,
        inputs_bytes=profile.input_bytes,
        activations_bytes=activations,
        transient_bytes=max(profile.peak_bytes - known, 0),
        context_bytes=context_bytes,
        headroom_bytes=headroom_bytes,
    )


def _resolve_device(model: torch.nn.Module, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _batch_size(inputs: Sequence[torch.Tensor]) -> int:
    sizes = [x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0]
    return max(sizes) if sizes else 1


def _reserve(device: torch.device) -> tuple[int, float]:
    """Context bytes and the allocator's slack (a share of tensor bytes) on ``device``."""
    if device.type != "cuda":
        return 0, 0.0
    return DEFAULT_CUDA_CONTEXT_BYTES, CUDA_HEADROOM_FRACTION
