"""Planning one process's step: trace, measure, widen the options in stages, solve, measure.

NOTE [Planning]
1. Trace the model into a chain of segments (:mod:`autockpt.planner.trace.fx_graph`); a model
   torch.fx cannot trace gets whole submodules as segments instead, found with forward hooks, and a
   warning (NOTE [Module chain]).
2. Measure a step on fake tensors with every segment kept
   (:mod:`autockpt.planner.measure.fake_step`). If it fits, that is the plan.
3. Widen the options in stages, each measured only when the ones before cannot fit, and after each
   solve every chain exactly (:mod:`autockpt.planner.solve.chain_solver`) and keep the cheapest that
   fits (the fastest: on the CPU the options the solver is about to choose are timed on the real
   model first, NOTE [Timed options] in :mod:`autockpt.planner.timing.time_model`):
   a. plain recompute, segment by segment: a step with every segment recomputed gives each segment's
      second option (NOTE [Chain memory model]); worked out from the kept step's record where
      the simulation models every segment (NOTE [Recompute simulated]), else measured. Skipped when the kept step already shows no such
      plan can fit (:func:`~autockpt.planner.solve.chain_terms.recompute_lower_bound_bytes`), until
      nothing fits: the refusal's minimum counts it too;
   b. regions recomputed whole, and, where :mod:`autockpt.planner.measure.separability` finds a
      region batch-separable, in chunks (scaled from the whole-region numbers);
   c. if the whole step is batch-separable, micro-batches: the step measured again at half the
      batch, every quantity fitted as ``a + c * s``, ``s`` the largest piece's share of the
      batch (counts need not divide it).
   A stage whose cheapest fit adds more than ``WIDEN_PAST_SHARE`` of the plain step's time
   does not end the search: the next stage is examined too, and the solver then chooses over
   everything examined (a budget met only by many chunks may be met faster by a few
   micro-batches). Where the planner times the real model, a fit whose sums say it adds less
   ends the search only once it is timed whole against the plain step and that agrees: on
   ``tft-225`` at half its peak, chunks whose pieces timed alone summed to 22-42% *under* the
   plain step took 1.22-1.32x of it whole, and the search had stopped before micro-batches
   (1.00x).
4. Measure the chosen plan itself on fake tensors. That measurement is the predicted peak. If
   the solver's estimate was optimistic and the plan does not fit, solve again against a budget
   lowered by the overshoot (a few rounds), then try the next stage, and fail with
   :class:`InfeasibleBudgetError` rather than hand back a plan that does not fit.
5. Where the planner times the real model, time the plans that fit whole, side by side with the
   plain step, and take the fastest (NOTE [Whole-plan timing] in
   :mod:`autockpt.planner.solve.whole_plan_timing`): the sums the solver minimised miss what only a
   whole step shows. Its timed overhead is the plan's predicted one.

NOTE [Planning in the middle of a run]
A run whose batches change shape plans again between steps (NOTE [Plans that follow the shapes of
a run]), with the optimizer's state alive in the caller's optimizer: a real copy of the model
and its optimizer run beside it, so their real runs (the scaled measurement, the calibration,
the timed runs) fit what the budget leaves once that state is counted
(:func:`live_state_bytes`). The first plan of a run sees no state yet (AdamW makes it at its
first step), and so plans as before.

NOTE [Planning's own peak]
Planning runs on the card the user said is full, so what it allocates counts as much as the step it
plans. It allocates three kinds of real tensors: the real steps of a model measured on a real copy
(NOTE [Scaled real measurement] in :mod:`autockpt.planner.measure.scaled_step`: at batches that fit
90% of the budget's usable bytes), the time model's calibration (sized to half of what the budget leaves free;
:func:`step_costs`) and, on the CPU for a traced model, the timed runs of the real model, on the
batch's leading samples whose real step fits the same 90% (NOTE [Timing at a batch that fits]).
The plan reports the peak: on CUDA the caching allocator's count of tensor bytes from the start of
planning; on the CPU, where no allocator counts, the largest of: the real steps as the planner's
tracker counted them, the calibration's tensors beside the model and batch, and the timed runs'
bound (the kept step's real bytes, measured exactly on fake tensors, read at the samples timed,
the copies the optimizer's timing makes, and a plan timed at the whole batch: its measured step
and the runs' copies beside it, NOTE [Whole-plan timing]).

In code: :func:`plan_one_process` traces (step 1), measures the kept step
(:class:`~autockpt.planner.measure.step_measurer.StepMeasurer`, step 2), sets up the step's costs
(:func:`step_costs`), and hands steps 3 to 5 to
:class:`~autockpt.planner.solve.staged_search.StagedSearch` (or, with
``use_gradient_checkpointing``, to
:func:`~autockpt.planner.solve.forced_checkpointing.forced_plan`); :func:`plan_report` turns what
was chosen into the :class:`~autockpt.planner.plan_types.Plan`.

The budget a plan must meet on the CPU is tracked bytes (NOTE [Tracked bytes]). On CUDA it
is what ``nvidia-smi`` shows: the CUDA context and the caching allocator's slack come off the
budget first (``context_bytes`` and ``headroom_bytes`` in the breakdown).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from autockpt.errors import warn_at_the_callers_line
from autockpt.planner.core.decisions import Parallelism
from autockpt.planner.core.step_budget import StepBudget
from autockpt.planner.core.units import Budget, format_bytes
from autockpt.planner.measure.inference_forward import fewest_forward_pieces
from autockpt.planner.measure.step_measurer import StepMeasurer
from autockpt.planner.plan_types import Plan, StepTimelines, Strategy
from autockpt.planner.report_rows import peak_breakdown, segment_rows, step_timeline
from autockpt.planner.simulate.step_profile import LossFn, OptimizerSpec, StepProfile
from autockpt.planner.simulate.step_spec import StepSpec
from autockpt.planner.solve.budget_search import whole_kib
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_decoding import ChosenPlan
from autockpt.planner.solve.forced_checkpointing import forced_plan
from autockpt.planner.solve.option_pricing import decision_extra_s
from autockpt.planner.solve.staged_search import StagedSearch
from autockpt.planner.timing.calibration import calibrate, calibration_peak_bytes
from autockpt.planner.timing.module_stopwatch import ModuleCosts, ModuleStopwatch
from autockpt.planner.timing.stopwatch import Stopwatch, can_time
from autockpt.planner.timing.time_model import (
    EstimatedCosts,
    MeasuredCosts,
    StepCosts,
)
from autockpt.planner.timing.timing_room import TimingRoom
from autockpt.planner.trace.autograd_regions import own_checkpoint_calls
from autockpt.planner.trace.fx_graph import TracedModel
from autockpt.planner.trace.module_chain import ModuleChain, Tracing, trace_or_find_modules
from autockpt.progress import report_progress


@dataclass(frozen=True)
class PlanRequest:
    """What :func:`autockpt.plan` was asked for besides the model, its inputs and the budget
    (its arguments of the same names, resolved: the device and the parallelism are known)."""

    loss_fn: LossFn | None
    example_targets: Sequence[torch.Tensor]
    optimizer: OptimizerSpec
    device: torch.device
    use_gradient_checkpointing: bool | None
    allow_micro_batches: bool
    allow_chunks: bool
    allow_loss_chunks: bool
    autocast_dtype: torch.dtype | None
    tracing: Tracing
    gradients_live: bool
    world_size: int
    parallelism: Parallelism
    #: The CPU threads training runs with (the real model is timed at it): a count, a function
    #: of the plain step's bytes (NOTE [Threads chosen from the plain step]), or ``None``:
    #: torch's count when ``plan()`` was called.
    cpu_threads: int | Callable[[int], int] | None = None
    #: The budget as a function of the plain step's bytes, as the device shows them, where
    #: the caller gave one (NOTE [A budget decided from the plain step]); the step budget
    #: planning starts from is then a placeholder.
    budget_of_plain: Callable[[int], Budget] | None = None


def plan_one_process(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: StepBudget,
    request: PlanRequest,
    *,
    cpu_threads: int = 1,
    traced: TracedModel | ModuleChain | None = None,
) -> Plan:
    """The plan of one process's step under ``budget`` (NOTE [Planning], in order), reported
    as one rank's peak against the budget the user gave (NOTE [One budget]). ``traced``:
    ``model`` already traced (its graph cut before the head, NOTE [Loss over positions in
    chunks]); default: traced here."""
    device = request.device
    started = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # NOTE [Planning's own peak]
    if traced is None:
        report_progress("planning: tracing the model")  # NOTE [Progress on long waits]
        # warns on the fallback to module-level segments
        traced = trace_or_find_modules(model, example_inputs, tracing=request.tracing)
    report_progress("planning: measuring the step's memory on fake tensors")
    usable_bytes = budget.usable_bytes
    # NOTE [Planning in the middle of a run]: real runs leave room for the state it holds.
    live_bytes = live_state_bytes(request.optimizer)
    spec = StepSpec(
        model,
        example_inputs,
        request.example_targets,
        request.loss_fn,
        request.optimizer,
        request.autocast_dtype,
        request.gradients_live,
    )
    measurer = StepMeasurer(traced, spec, room_bytes=usable_bytes - live_bytes)
    kept = measurer.kept
    budget, request = budget_decided(budget, request, budget.shown_bytes(kept.peak_bytes))
    usable_bytes = budget.usable_bytes
    report_progress("planning: timing the segments on the real model")
    estimated, costs = step_costs(
        measurer,
        device,
        cpu_threads=training_threads(request, budget.shown_bytes(kept.peak_bytes), cpu_threads),
        room_bytes=calibration_room(usable_bytes - live_bytes, kept),
        usable_bytes=usable_bytes - live_bytes,
    )
    builder = ChainBuilder(traced, costs, measurer.batch_size)
    notes: list[str] = [traced.note] if isinstance(traced, ModuleChain) else list(traced.notes)
    if measurer.whole_batch_reason:
        notes.append(
            "measured on a real copy at the whole batch, so planning holds about the plain "
            f"step: the step refuses a few samples ({measurer.whole_batch_reason})"
        )
    strategy: Strategy = "auto"
    forced = request.use_gradient_checkpointing
    if forced is not None:
        strategy = "checkpoint-all" if forced else "checkpoint-none"
        chosen = forced_plan(measurer, builder, recompute=forced)
        if chosen.profile.peak_bytes > usable_bytes:
            message = (
                f"use_gradient_checkpointing={forced} predicts a peak of "
                f"{format_bytes(budget.shown_bytes(chosen.profile.peak_bytes))}, over the "
                f"budget of {format_bytes(budget.read.bytes)}; let the planner decide "
                "(use_gradient_checkpointing=None)"
            )
            warn_at_the_callers_line(message)
            notes.append(message)
    else:
        if kept.peak_bytes <= usable_bytes:
            # The plain step fits, so it is the plan (it adds no time): nothing to time. The
            # search still runs, on estimates, for the minimum the plan reports.
            builder.costs = estimated
        report_progress("planning: searching for the fastest plan that fits")
        chosen = StagedSearch(
            measurer,
            builder,
            budget=budget,
            allow_chunks=request.allow_chunks,
            allow_micro_batches=request.allow_micro_batches,
            timed_costs=costs
            if isinstance(costs, (MeasuredCosts, ModuleCosts)) and builder.costs is costs
            else None,
            notes=notes,
            live_bytes=live_bytes,
        ).run()
    decision = chosen.decision
    if decision.num_micro_batches == 1 and not any(a.recompute for a in decision.actions):
        builder.costs = estimated  # nothing to time: the plain step is the plan
    # NOTE [Validation in as few pieces as fit]; FSDP's ranks gather parameters in forward.
    most = decision.num_micro_batches * max((a.num_chunks for a in decision.actions), default=1)
    fsdp = request.parallelism == "fsdp"
    pieces = None if fsdp else fewest_forward_pieces(measurer, usable_bytes, most=most)
    plan = plan_report(
        chosen,
        builder,
        budget=budget,
        device=device,
        strategy=strategy,
        kept=kept,
        notes=notes,
        planning_s=time.perf_counter() - started,
        planning_peak_bytes=planning_peak_bytes(measurer, costs, device, usable_bytes),
    )
    return plan.model_copy(update={"forward_pieces": pieces})


def budget_decided(
    budget: StepBudget, request: PlanRequest, plain_bytes: int
) -> tuple[StepBudget, PlanRequest]:
    """``budget`` decided from the plain step's ``plain_bytes`` where the request holds a
    function for it, and the request with that function spent; else both as they are.

    NOTE [A budget decided from the plain step]
    ``plan(model, inputs, budget=lambda plain: plain // 2)`` plans for half of what the step
    takes with nothing recomputed. The plain step is the first thing planning measures, so the
    budget is decided there and the search runs once; before, a caller (the demo) planned
    without a limit for that number and then again for its budget. Nothing before the plain
    step's measurement depends on the budget but the room a real copy (a model that does not
    run on fake tensors) is measured in: with a budget still undecided that model's plain step
    runs at its whole batch. A loss planned again in chunks of positions (NOTE [Loss over
    positions in chunks]) plans for the budget the loss run whole decided, not for a share of
    its own, smaller, plain step.
    """
    if request.budget_of_plain is None:
        return budget, request
    read = request.budget_of_plain(plain_bytes)
    return budget.decided(read), dataclasses.replace(request, budget_of_plain=None)


def training_threads(request: PlanRequest, unplanned_bytes: int, outside: int) -> int:
    """The CPU threads the real model is timed at: ``request.cpu_threads``, called with the
    plain step's bytes where it is a function, or ``outside`` (torch's count before planning).

    NOTE [Threads chosen from the plain step]
    A trainer that picks its thread count from the size of the step (one thread for a small
    step, NOTE [Tuning the host process] in :mod:`autockpt.training.host.host_tuning`) needs
    the plain step's peak before the planner times anything at that count. The trainer used
    to plan twice for it, once without a limit for the peak and once for the budget
    (``autockpt plan --vram-budget 8MB`` on the sample: two ``plan()`` calls, 7.0 s, in a new
    process); the function is called once the plain step is measured, inside the one
    planning, with the peak the plan reports as unplanned (one call, 5.1 s).
    """
    chosen = request.cpu_threads
    if chosen is None:
        return outside
    return chosen(unplanned_bytes) if callable(chosen) else chosen


def live_state_bytes(optimizer: OptimizerSpec) -> int:
    """Bytes of the real tensors an optimizer instance holds in its state now (NOTE [Planning
    in the middle of a run]); 0 for a name or a factory, which hold nothing yet."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return 0
    storages = {
        value.untyped_storage().data_ptr(): value.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.device.type != "meta"
    }
    return sum(storages.values())


def step_costs(
    measurer: StepMeasurer,
    device: torch.device,
    *,
    cpu_threads: int,
    room_bytes: int,
    usable_bytes: int,
) -> tuple[EstimatedCosts, StepCosts]:
    """The estimated costs, and the costs planning prices with: the step ``measurer`` measures
    timed on the real model where that is cheap (the caller's model's own step for a module
    chain, NOTE [Timing a module chain]), else the estimates (NOTE [Time model]).

    The time model is calibrated within ``room_bytes`` (:func:`calibration_room`); the real
    model is timed on the samples whose step fits ``usable_bytes`` (NOTE [Timing at a batch
    that fits]).
    """
    traced, kept = measurer.traced, measurer.kept
    time_model = calibrate(device.type, device.index, max_bytes=room_bytes)
    estimated = EstimatedCosts(time_model, kept)
    if not can_time(device, kept.peak_bytes):
        return estimated, estimated
    room = TimingRoom.within(traced, kept, measurer.batch_size, usable_bytes)
    if room.samples == 0:
        return estimated, EstimatedCosts(time_model, kept, source=room.untimed_reason())
    spec = measurer.spec
    if isinstance(traced, ModuleChain):
        chain_watch = ModuleStopwatch(spec, threads=cpu_threads, room=room)
        return estimated, ModuleCosts(chain_watch, estimated)
    # NOTE [The model's own checkpoints, timed]
    own = spec.model if own_checkpoint_calls(traced.graph_module.graph) else None
    stopwatch = Stopwatch(traced, spec, threads=cpu_threads, room=room, own_model=own)
    costs = MeasuredCosts(stopwatch, traced.regions, measurer.batch_size, fallback=estimated)
    return estimated, costs


def planning_peak_bytes(
    measurer: StepMeasurer, costs: StepCosts, device: torch.device, usable_bytes: int
) -> int:
    """The most memory planning held on ``device`` (NOTE [Planning's own peak])."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    kept = measurer.kept
    held = kept.parameter_bytes + measurer.batch_bytes
    calibration = calibration_peak_bytes(device.type, calibration_room(usable_bytes, kept))
    peak = max(measurer.planning_peak_bytes, held + calibration)
    if isinstance(costs, (MeasuredCosts, ModuleCosts)) and costs.stopwatch.spent_s > 0:
        # The plain step at the samples timed (gradients through autograd.grad, as many
        # bytes as .grad), and one optimizer step over copies of parameters and their state.
        # And a plan timed whole at the whole batch, beside the runs' copies (NOTE
        # [Whole-plan timing]).
        room = costs.stopwatch.room
        peak = max(
            peak, room.step_bytes, room.optimizer_bytes, costs.stopwatch.whole_batch_peak_bytes
        )
    return peak


def calibration_room(usable_bytes: int, kept: StepProfile) -> int:
    """Bytes the time model's calibration may take: half of what the budget leaves beside the
    model's parameters, optimizer state and batch."""
    return max((usable_bytes - kept.start_bytes) // 2, 0)


def plan_report(
    chosen: ChosenPlan,
    builder: ChainBuilder,
    *,
    budget: StepBudget,
    device: torch.device,
    strategy: Strategy,
    kept: StepProfile,
    notes: list[str],
    planning_s: float,
    planning_peak_bytes: int,
) -> Plan:
    """What was chosen, as the :class:`Plan` the caller reads: its rows, peaks and seconds."""
    decision, final = chosen.decision, chosen.profile
    segment_plans = segment_rows(builder, chosen.whole, decision)
    # A plan timed whole is reported beside the plain step of the same rounds (NOTE
    # [Whole-plan timing]).
    unplanned_step_s = (
        builder.costs.unplanned_step_s() if chosen.timed_plain_s is None else chosen.timed_plain_s
    )
    extra_s = (
        decision_extra_s(builder.pricing, decision)
        if chosen.timed_extra_s is None
        else chosen.timed_extra_s
    )
    if builder.costs.source:
        notes.append(f"step times {builder.costs.source}")
    predicted = budget.shown_bytes(final.peak_bytes)
    plain_timeline = step_timeline(kept, [False] * len(kept.segments))
    planned_timeline = step_timeline(final, [a.recompute for a in decision.actions])
    return Plan(
        budget_bytes=budget.read.bytes,
        budget_text=budget.read.text,
        budget_reading=budget.read.reading,
        device=str(device),
        strategy=strategy,
        batch_size=builder.batch_size,
        num_micro_batches=decision.num_micro_batches,
        segments=segment_plans,
        predicted_peak_bytes=predicted,
        breakdown=peak_breakdown(
            final,
            budget.context_bytes,
            predicted - final.peak_bytes - budget.context_bytes,
            context_measured=budget.context_measured,
        ),
        unplanned_peak_bytes=budget.shown_bytes(kept.peak_bytes),
        minimum_feasible_bytes=whole_kib(budget.shown_bytes(chosen.minimum_peak_bytes)),
        minimum_searched=chosen.minimum_searched,
        predicted_extra_s=extra_s,
        unplanned_step_s=unplanned_step_s,
        fits=predicted <= budget.read.bytes,
        planning_s=planning_s,
        planning_peak_bytes=planning_peak_bytes,
        timeline=StepTimelines(plain=plain_timeline, planned=planned_timeline)
        if plain_timeline is not None and planned_timeline is not None
        else None,
        notes=notes,
        tracing="forward-hooks" if isinstance(builder.traced, ModuleChain) else "fx",
    )
