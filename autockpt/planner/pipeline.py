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
      second option (NOTE [Chain memory model]). Skipped when the kept step already shows no such
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

The budget a plan must meet on the CPU is tracked bytes (NOTE [Tracked bytes]). On CUDA it
is what ``nvidia-smi`` shows: the CUDA context and the caching allocator's slack come off the
budget first (``context_bytes`` and ``headroom_bytes`` in the breakdown).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from autockpt.planner.core.batch_split import batch_size_of, split_batch
from autockpt.planner.core.memory_tracker import RealSizeOracle
from autockpt.planner.core.units import Budget, format_bytes
from autockpt.planner.measure.fake_step import FakeTrainingState, profile_step
from autockpt.planner.measure.separability import Separability, analyse_separability
from autockpt.planner.measure.step_profile import LossFn, OptimizerSpec, StepProfile
from autockpt.planner.plan_types import Plan, Strategy
from autockpt.planner.report_rows import decision_extra_s, peak_breakdown, segment_rows
from autockpt.planner.runtime.segment_runners import KEEP, SegmentAction
from autockpt.planner.runtime.selective_safety import selective_segments
from autockpt.planner.solve.budget_search import BudgetSearch
from autockpt.planner.solve.chain_builder import ChainBuilder, Decision, Profiles, unit_segments
from autockpt.planner.solve.chain_solver import minimum_peak
from autockpt.planner.solve.chain_terms import recompute_lower_bound_bytes
from autockpt.planner.solve.whole_plan_timing import MAX_CANDIDATES, StepRunner, fastest_of
from autockpt.planner.timing.stopwatch import Stopwatch, can_time
from autockpt.planner.timing.time_model import (
    EstimatedCosts,
    MeasuredCosts,
    StepCosts,
    calibrate,
)
from autockpt.planner.trace.fx_graph import Segment, TracedModel
from autockpt.planner.trace.module_chain import ModuleChain, Tracing, trace_or_find_modules

#: What the CUDA context takes before any tensor (measured when a GPU is present).
DEFAULT_CUDA_CONTEXT_BYTES = 512 * 2**20
#: What the caching allocator reserves beyond the tensors it holds (rounding, fragmentation),
#: as a share of the tensor bytes.
CUDA_HEADROOM_FRACTION = 0.10
#: A fit adding more than this share of the plain step's time widens the options further.
WIDEN_PAST_SHARE = 0.10


def plan_one_process(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: Budget,
    *,
    loss_fn: LossFn | None,
    example_targets: Sequence[torch.Tensor],
    optimizer: OptimizerSpec,
    device: torch.device,
    use_gradient_checkpointing: bool | None,
    allow_micro_batches: bool,
    allow_chunks: bool,
    autocast_dtype: torch.dtype | None,
    cpu_threads: int = 1,
    tracing: Tracing = "auto",
    gradients_live: bool = False,
) -> Plan:
    started = time.perf_counter()
    batch_size = _batch_size(example_inputs)
    traced = trace_or_find_modules(model, example_inputs, tracing=tracing)  # warns on fallback
    oracle = RealSizeOracle()
    context_bytes, headroom_fraction = device_reserve(device)
    # Tensors may take what is left after the context, less the allocator's share of it.
    usable_bytes = int((budget.bytes - context_bytes) / (1.0 + headroom_fraction))

    def outside(tensor_bytes: int) -> int:
        """What the device shows for ``tensor_bytes`` of tensors: plus context and slack."""
        return tensor_bytes + context_bytes + int(tensor_bytes * headroom_fraction)

    fake_state = FakeTrainingState(traced, optimizer=optimizer, gradients_live=gradients_live)
    # The first profile runs the optimizer; the others reuse its step peak.
    kept = profile_step(
        fake_state,
        example_inputs,
        [KEEP] * len(traced.segments),
        loss_fn=loss_fn,
        example_targets=example_targets,
        size_oracle=oracle,
        autocast_dtype=autocast_dtype,
    )
    # NOTE [Time model]: estimated, or timed on the real model where that is cheap.
    estimated = EstimatedCosts(calibrate(device.type, device.index), kept)
    costs: StepCosts = estimated
    if isinstance(traced, TracedModel) and can_time(device, kept.peak_bytes):
        stopwatch = Stopwatch(
            traced,
            example_inputs,
            loss_fn=loss_fn,
            example_targets=example_targets,
            optimizer=optimizer,
            autocast_dtype=autocast_dtype,
            threads=cpu_threads,
        )
        costs = MeasuredCosts(stopwatch, traced.regions, batch_size, fallback=estimated)
    builder = ChainBuilder(traced, costs, batch_size)

    def measure(
        segments: Sequence[Segment],
        actions: Sequence[SegmentAction],
        num_micro_batches: int = 1,
        batch: tuple[Sequence[Any], Sequence[Any]] = (example_inputs, example_targets),
    ) -> StepProfile:
        profile = profile_step(
            fake_state,
            batch[0],
            actions,
            loss_fn=loss_fn,
            example_targets=batch[1],
            num_micro_batches=num_micro_batches,
            size_oracle=oracle,
            run_optimizer=False,
            count_work=False,
            autocast_dtype=autocast_dtype,
            segments=segments,
        )
        optimizer_peak = kept.phase_peak_bytes["optimizer"]
        profile.phase_peak_bytes["optimizer"] = optimizer_peak
        profile.peak_bytes = max(profile.peak_bytes, optimizer_peak)
        return profile

    def all_recomputed(segments: Sequence[Segment], num_micro_batches: int = 1) -> StepProfile:
        # All but those kept by in-place writes (NOTE [In-place writes]).
        actions = [SegmentAction(recompute=not s.keep_reason) for s in segments]
        return measure(segments, actions, num_micro_batches)

    def all_selective(num_micro_batches: int = 1) -> StepProfile | None:
        """Every segment that may be recomputed selectively so (NOTE [Selective recompute])."""
        if num_micro_batches == 1:
            builder.selective = selective_segments(traced, example_inputs)
        if not builder.selective:
            return None
        actions = [
            SegmentAction(recompute=True, selective=True) if i in builder.selective else KEEP
            for i in range(len(traced.segments))
        ]
        return measure(traced.segments, actions, num_micro_batches)

    notes: list[str] = [traced.note] if isinstance(traced, ModuleChain) else list(traced.notes)
    timed_extra_s: float | None = None
    if use_gradient_checkpointing is not None:
        strategy: Strategy = "checkpoint-all" if use_gradient_checkpointing else "checkpoint-none"
        recomputed = all_recomputed(traced.segments)
        whole = Profiles(kept, recomputed)
        forced = list(traced.segments)
        spans = [(i, i + 1) for i in range(len(forced))]
        if (
            use_gradient_checkpointing
            and isinstance(traced, ModuleChain)
            and len(traced.regions) < len(forced)
        ):
            # NOTE [Module spans]: links recomputed one by one may save nothing; spans may.
            in_spans = all_recomputed(traced.region_segments)
            if in_spans.peak_bytes < recomputed.peak_bytes:
                forced, spans, recomputed = (
                    list(traced.region_segments),
                    list(traced.regions),
                    in_spans,
                )
        decision = Decision(
            forced,
            [
                SegmentAction(recompute=use_gradient_checkpointing and not s.keep_reason)
                for s in forced
            ],
            [
                f"kept: {s.keep_reason}"
                if use_gradient_checkpointing and s.keep_reason
                else "forced by use_gradient_checkpointing"
                for s in forced
            ],
            1,
            spans,
        )
        final = recomputed if use_gradient_checkpointing else kept
        minimum = minimum_peak(builder.chain(whole, None, 1, None)).peak_bytes
        if final.peak_bytes > usable_bytes:
            message = (
                f"use_gradient_checkpointing={use_gradient_checkpointing} predicts a peak of "
                f"{format_bytes(outside(final.peak_bytes))}, over the budget {budget.text}; "
                "let the planner decide (use_gradient_checkpointing=None)"
            )
            warnings.warn(message, stacklevel=3)
            notes.append(message)
    else:
        strategy = "auto"
        regions = list(traced.region_segments)
        if kept.peak_bytes <= usable_bytes:
            # The plain step fits, so it is the plan (it adds no time): nothing to time. The
            # search still runs, on estimates, for the minimum the plan reports.
            builder.costs = estimated

        def measure_decision(decision: Decision) -> StepProfile:
            if decision.num_micro_batches == 1 and all(a == KEEP for a in decision.actions):
                return kept  # nothing changes: the kept step is this plan's measurement
            return measure(decision.segments, decision.actions, decision.num_micro_batches)

        search = BudgetSearch(builder, Profiles(kept, None), batch_size, measure_decision)

        def measure_half(decision: Decision) -> StepProfile | None:
            """``decision`` measured at half the batch, for the refusal (NOTE [Refusal])."""
            half = batch_size // 2
            halves = [
                split_batch(b, 2, batch_size=batch_size)[0]
                for b in (example_inputs, example_targets)
            ]
            actions = [
                dataclasses.replace(a, num_chunks=min(a.num_chunks, half)) for a in decision.actions
            ]
            try:
                count = min(decision.num_micro_batches, half)
                return measure(decision.segments, actions, count, (halves[0], halves[1]))
            except Exception:  # the model refuses a smaller batch: the refusal estimates
                return None

        search.measure_half = measure_half if batch_size >= 2 else None

        units = unit_segments(traced)  # NOTE [Chain levels]

        def plain_recompute(*, even_if_hopeless: bool = False) -> bool:
            if usable_bytes < recompute_lower_bound_bytes(kept) and not even_if_hopeless:
                return False  # no plan of plain recomputes can fit: do not measure one
            search.whole = dataclasses.replace(
                search.whole,
                recomputed=all_recomputed(traced.segments),
                units=None if units is None else all_recomputed(units),
                selective=all_selective(),
            )
            return True

        def regions_and_chunks() -> bool:
            # Regions recomputed whole, chunks and micro-batches cost more profiles and a
            # probe of the real model: examined only once plain recompute cannot fit.
            # A module chain's links run in chunks, not its spans (NOTE [Module chain]).
            probed = traced.segments if isinstance(traced, ModuleChain) else regions
            if isinstance(traced, ModuleChain) and search.whole.recomputed is None:
                plain_recompute(even_if_hopeless=True)  # the links' chunks scale from it
            separability = Separability.nothing(len(probed), "not allowed by the caller")
            if allow_chunks or allow_micro_batches:
                separability = analyse_separability(
                    traced,
                    example_inputs,
                    probed,
                    model=model,
                    loss_fn=loss_fn,
                    example_targets=example_targets,
                )
            if not allow_chunks:
                separability = dataclasses.replace(separability, chunkable=(False,) * len(probed))
            if allow_micro_batches and not separability.micro_batchable:
                notes.append(f"micro-batches not used: {separability.reason}")
            search.whole = dataclasses.replace(search.whole, regions=all_recomputed(regions))
            search.separability = separability
            return True

        def micro_batches() -> bool:
            separability = search.separability
            if not (allow_micro_batches and separability and separability.micro_batchable):
                return False
            if batch_size < 2:
                return False
            search.half = Profiles(
                measure(traced.segments, [KEEP] * len(traced.segments), 2),
                None if search.whole.recomputed is None else all_recomputed(traced.segments, 2),
                all_recomputed(regions, 2),
                None if units is None or search.whole.units is None else all_recomputed(units, 2),
                None if search.whole.selective is None else all_selective(2),
            )
            return True

        timing_whole = isinstance(costs, MeasuredCosts) and builder.costs is costs
        found, stage_timed = None, None
        for widen in (plain_recompute, regions_and_chunks, micro_batches):
            if not widen():
                continue
            # A later stage's fit weighs every option examined so far (NOTE [Planning], 3).
            found = search.fit(usable_bytes, notes) or found
            plain_s = builder.costs.unplanned_step_s()
            if found and decision_extra_s(builder, found[0]) <= WIDEN_PAST_SHARE * plain_s:
                if not timing_whole:
                    break
                # The sums say stop; the plan timed whole must agree (NOTE [Whole-plan timing]).
                assert isinstance(costs, MeasuredCosts)
                stage_timed = fastest_of([found], StepRunner(costs.stopwatch), plain_s)
                if stage_timed.extra_s <= WIDEN_PAST_SHARE * plain_s:
                    break
        if found is None:
            found = search.lowest_peak_fit(usable_bytes, notes)
        if found is None and search.whole.recomputed is None:
            # Skipped above as unable to fit; the refusal's minimum must count it too.
            plain_recompute(even_if_hopeless=True)
            found = search.lowest_peak_fit(usable_bytes, notes)
        if found is None:
            raise search.infeasible(budget, outside)
        if timing_whole:
            # NOTE [Whole-plan timing]: the fastest of the plans that fit, timed whole.
            assert isinstance(costs, MeasuredCosts)
            candidates = search.fitting_alternatives(usable_bytes, found, MAX_CANDIDATES)
            timed = stage_timed if stage_timed and stage_timed.decision == found[0] else None
            if len(candidates) > 1:
                runner = StepRunner(costs.stopwatch)
                timed = fastest_of(candidates, runner, costs.unplanned_step_s())
            if timed is not None:
                found, timed_extra_s = (timed.decision, timed.profile), timed.extra_s
                notes.append(timed.note)
        decision, final = found
        reduction = search.separability.loss_reduction if search.separability else None
        if decision.num_micro_batches > 1 and reduction:
            notes.append(
                f"micro-batches: the loss is the {reduction} of the samples' losses; run steps "
                f'with training_step(..., loss_reduction="{reduction}")'
            )
        whole = search.whole
        minimum = search.minimum_peak_bytes()

    if decision.num_micro_batches == 1 and not any(a.recompute for a in decision.actions):
        builder.costs = estimated  # nothing to time: the plain step is the plan
    segment_plans = segment_rows(builder, whole, decision)
    unplanned_step_s = builder.costs.unplanned_step_s()
    extra_s = decision_extra_s(builder, decision) if timed_extra_s is None else timed_extra_s
    if builder.costs.source:
        notes.append(f"step times {builder.costs.source}")
    return Plan(
        budget_bytes=budget.bytes,
        budget_text=budget.text,
        budget_reading=budget.reading,
        device=str(device),
        strategy=strategy,
        batch_size=batch_size,
        num_micro_batches=decision.num_micro_batches,
        segments=segment_plans,
        predicted_peak_bytes=outside(final.peak_bytes),
        breakdown=peak_breakdown(
            final, context_bytes, outside(final.peak_bytes) - final.peak_bytes - context_bytes
        ),
        unplanned_peak_bytes=outside(kept.peak_bytes),
        minimum_feasible_bytes=outside(minimum),
        predicted_extra_s=extra_s,
        unplanned_step_s=unplanned_step_s,
        fits=final.peak_bytes <= usable_bytes,
        planning_s=time.perf_counter() - started,
        notes=notes,
        tracing="forward-hooks" if isinstance(traced, ModuleChain) else "fx",
    )


def _batch_size(inputs: Sequence[torch.Tensor]) -> int:
    # As micro-batches cut it (autockpt.planner.core.batch_split): dicts too.
    return batch_size_of(inputs) or 1


def device_reserve(device: torch.device) -> tuple[int, float]:
    """Context bytes and the allocator's slack (a share of tensor bytes) on ``device``."""
    if device.type != "cuda":
        return 0, 0.0
    return DEFAULT_CUDA_CONTEXT_BYTES, CUDA_HEADROOM_FRACTION
