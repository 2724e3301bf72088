"""The Plan and ``plan()``: trace, measure, solve, then measure the chosen plan.

NOTE [Planning]
1. Trace the model into a chain of segments (:mod:`autockpt.trace`); a model torch.fx cannot
   trace gets whole submodules as segments instead, found with forward hooks, and a warning
   (NOTE [Module chain]).
2. Measure a step on fake tensors with every segment kept (:mod:`autockpt.measure`). If it
   fits, that is the plan.
3. Widen the options in stages, each measured only when the ones before cannot fit, and after
   each solve every chain exactly (:mod:`autockpt.solve`) and keep the cheapest that fits:
   a. plain recompute, segment by segment: a step with every segment recomputed gives each
      segment's second option (NOTE [Chain memory model]). Skipped when the kept step
      already shows no such plan can fit (:func:`~autockpt.chain.recompute_lower_bound_bytes`);
   b. regions recomputed whole, and, where :mod:`autockpt.separable` finds a region
      batch-separable, in chunks (scaled from the whole-region numbers);
   c. if the whole step is batch-separable, micro-batches: the step measured again at half the
      batch, every quantity fitted as ``a + c * s``, ``s`` the largest piece's share of the
      batch (counts need not divide it).
4. Measure the chosen plan itself on fake tensors. That measurement is the predicted peak. If
   the solver's estimate was optimistic and the plan does not fit, solve again against a budget
   lowered by the overshoot (a few rounds), then try the next stage, and fail with
   :class:`InfeasibleBudgetError` rather than hand back a plan that does not fit.

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
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from autockpt.chain import (
    ChainBuilder,
    Decision,
    Profiles,
    kept_increments,
    micro_batch_counts,
    recompute_lower_bound_bytes,
)
from autockpt.errors import InfeasibleBudgetError
from autockpt.host import cyclic_gc_paused, one_cpu_thread
from autockpt.measure import (
    FakeTrainingState,
    LossFn,
    OptimizerSpec,
    StepProfile,
    profile_step,
)
from autockpt.memory import RealSizeOracle, flat_tensors
from autockpt.module_chain import ModuleChain, trace_or_find_modules
from autockpt.segmented import KEEP, SegmentAction
from autockpt.separable import Separability, analyse_separability
from autockpt.sharding import Parallelism, RankShare, fsdp_unit_paths, parameter_layouts, rank_share
from autockpt.solve import Chain, Solution, minimum_peak, solve
from autockpt.timing import calibrate
from autockpt.trace import Segment
from autockpt.units import Budget, format_bytes, parse_budget

#: Rounds of re-solving when the measured plan exceeds the budget (NOTE [Planning], step 4).
MAX_REPLANS = 4
#: Real steps run to verify a plan before giving up (see ``plan(verify=...)``).
MAX_VERIFY_ROUNDS = 3
#: What the CUDA context takes before any tensor (measured when a GPU is present).
DEFAULT_CUDA_CONTEXT_BYTES = 512 * 2**20
#: What the caching allocator reserves beyond the tensors it holds (rounding, fragmentation),
#: as a share of the tensor bytes.
CUDA_HEADROOM_FRACTION = 0.10

Strategy = Literal["auto", "checkpoint-all", "checkpoint-none"]
Tracing = Literal["fx", "forward-hooks"]


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
    """The batch: inputs and, when given, the targets."""
    activations_bytes: int
    """Live at the end of forward, beyond the above: what backward will need."""
    transient_bytes: int
    """The rest of the peak: workspaces, recomputed interiors, gradients in flight."""
    context_bytes: int
    """CUDA context (0 on the CPU)."""
    headroom_bytes: int
    """Budget kept back for the allocator's slack (0 on the CPU)."""
    gathered_bytes: int = 0
    """FSDP: parameters (and gradients) gathered whole while their unit runs; see
    NOTE [Per-rank accounting]. The other parts are one rank's (its shards under FSDP)."""


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
    tracing: Tracing = "fx"
    """How the segments were found: ``"fx"``, runs of traced graph nodes; ``"forward-hooks"``,
    whole submodules (``SegmentPlan.modules`` holds each one's path; NOTE [Module chain])."""
    world_size: int = 1
    """Ranks training together; the budget, the peak and the breakdown are one rank's."""
    parallelism: Parallelism = "single"
    """How the ranks share the work: ``single``, ``ddp`` or ``fsdp`` (NOTE [Per-rank accounting])."""

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
    example_targets: Sequence[torch.Tensor] = (),
    optimizer: OptimizerSpec = "adamw",
    device: torch.device | str | None = None,
    use_gradient_checkpointing: bool | None = None,
    allow_micro_batches: bool = True,
    allow_chunks: bool = True,
    verify: bool | None = None,
    autocast_dtype: torch.dtype | None = None,
    world_size: int = 1,
    parallelism: Parallelism | None = None,
) -> Plan:
    """Plan a training step of ``model`` that fits ``budget`` (NOTE [Planning]).

    The model is left as it was: parameters, gradients, buffers, train/eval mode and the RNG
    state are unchanged (measurement runs on fake copies).

    Args:
        model: any ``nn.Module``. One torch.fx cannot trace (or that takes a dict) is planned
            with module-level segments found with forward hooks, with a warning
            (NOTE [Module chain]).
        example_inputs: a tuple of positional inputs at the training batch size (a dict of
            tensors may be one of them).
        budget: bytes as an ``int``, or ``"4GB"``, ``"3.5GiB"``, ``"800MB"``, ``"auto"``, or a
            :class:`~autockpt.units.Budget` already read.
        loss_fn: ``loss_fn(output, *example_targets) -> scalar``; default: the sum of the
            outputs.
        example_targets: what the loss compares against, at the training batch size (the
            training targets). A training loop holds them through the step like the inputs,
            so they count towards the peak. Needs ``loss_fn``.
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
        world_size: ranks training together, each on its own ``example_inputs`` batch. The
            budget is per rank, and so are the predicted peak and its breakdown.
        parallelism: ``"single"``, ``"ddp"`` (every rank holds the whole model) or ``"fsdp"``
            (FSDP2: parameters, gradients and optimizer state split over the ranks, gathered
            per unit); default ``"single"`` for one rank, else ``"ddp"``. The planner adds
            the per-rank difference to the measured step (NOTE [Per-rank accounting]);
            ``verify`` defaults to off unless ``"single"`` (a check step is one process).

    Returns:
        The plan: which segments recompute (and in how many chunks), how many micro-batches,
        the predicted peak and its breakdown.

    Raises:
        BudgetError: the budget cannot be read.
        InfeasibleBudgetError: no plan fits (the message gives the minimum and the levers).
        TraceError: neither torch.fx nor forward hooks find segments in the model.

    Example:
        >>> plan = autockpt.plan(model, (x,), budget="4GB")
        >>> model = autockpt.apply(model, plan)
    """
    if example_targets and loss_fn is None:
        raise ValueError(
            "example_targets were given without a loss_fn to compare them with; pass "
            "loss_fn=lambda output, *targets: ..."
        )
    resolved_device = _resolve_device(model, device)
    rng_devices = [resolved_device.index or 0] if resolved_device.type == "cuda" else []
    read = budget if isinstance(budget, Budget) else parse_budget(budget, device=resolved_device)
    parallelism = parallelism or ("single" if world_size == 1 else "ddp")
    share = rank_share(
        parameter_layouts(
            model,
            optimizer=optimizer,
            unit_paths=fsdp_unit_paths(model) if parallelism == "fsdp" else (),
        ),
        world_size=world_size,
        parallelism=parallelism,
    )
    if verify is None:
        verify = resolved_device.type == "cuda" and parallelism == "single"
    target = read
    notes: list[str] = []
    for _ in range(MAX_VERIFY_ROUNDS):
        # Calibration and probes draw random numbers; the caller's RNG stream must not move.
        with torch.random.fork_rng(devices=rng_devices), cyclic_gc_paused(), one_cpu_thread():
            result = _per_rank(
                _plan_shifted(
                    model,
                    example_inputs,
                    target,
                    loss_fn=loss_fn,
                    example_targets=example_targets,
                    optimizer=optimizer,
                    device=resolved_device,
                    use_gradient_checkpointing=use_gradient_checkpointing,
                    allow_micro_batches=allow_micro_batches,
                    allow_chunks=allow_chunks,
                    autocast_dtype=autocast_dtype,
                    share=share,
                ),
                share,
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

        check = verify_plan(
            model,
            result,
            example_inputs,
            loss_fn=loss_fn,
            example_targets=example_targets,
            optimizer=optimizer,
        )
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


def _plan_shifted(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: Budget,
    *,
    share: RankShare,
    **options: Any,
) -> Plan:
    """:func:`_plan` for one process, against the budget less one rank's difference.

    NOTE [Per-rank accounting] in :mod:`autockpt.sharding`: one rank's tensors are the one
    process's plus ``share.offset_bytes``, so the step may take the budget less that (and less
    the allocator's share of it on CUDA). The plan that comes back is the one process's;
    :func:`_per_rank` turns it into one rank's.
    """
    if share.offset_bytes == 0:
        return _plan(model, example_inputs, budget, **options)
    offset = _outside_offset(share, options["device"])
    shifted = Budget(bytes=budget.bytes - offset, text=budget.text, reading=budget.reading)
    try:
        if shifted.bytes <= 0:
            raise InfeasibleBudgetError("", budget_bytes=shifted.bytes, minimum_bytes=1)
        return _plan(model, example_inputs, shifted, **options)
    except InfeasibleBudgetError as error:
        minimum = max(error.minimum_bytes, 0) + offset
        raise InfeasibleBudgetError(
            f"budget {budget.text} ({format_bytes(budget.bytes)}) per rank is below the minimum "
            f"{format_bytes(minimum)} of one of {share.world_size} ranks under "
            f"{share.parallelism} (states per rank: parameters "
            f"{format_bytes(share.parameters_bytes)}, gradients "
            f"{format_bytes(share.gradients_bytes)}, optimizer state "
            f"{format_bytes(share.optimizer_state_bytes)}); raise the budget to at least "
            f"{format_bytes(minimum * 1.05)}, lower the batch size"
            + (" or use more ranks" if share.parallelism == "fsdp" else " or use --strategy fsdp"),
            budget_bytes=budget.bytes,
            minimum_bytes=minimum,
        ) from None


def _outside_offset(share: RankShare, device: torch.device) -> int:
    """``share.offset_bytes`` as the device shows it: plus the allocator's share on CUDA."""
    _, headroom_fraction = _reserve(device)
    return share.offset_bytes + int(share.offset_bytes * headroom_fraction)


def _per_rank(result: Plan, share: RankShare) -> Plan:
    """One process's plan (from :func:`_plan_shifted`) as one rank's: the peaks move by the
    offset, the breakdown shows the rank's states (NOTE [Per-rank accounting])."""
    if share.parallelism == "single":
        return result
    offset = _outside_offset(share, torch.device(result.device))
    peak = result.predicted_peak_bytes + offset
    old = result.breakdown
    _, headroom_fraction = _reserve(torch.device(result.device))
    tensors = peak - old.context_bytes
    headroom = tensors - int(tensors / (1.0 + headroom_fraction))
    known = (
        share.parameters_bytes
        + share.gradients_bytes
        + share.optimizer_state_bytes
        + share.gathered_bytes
        + old.inputs_bytes
        + old.activations_bytes
        + old.context_bytes
        + headroom
    )
    breakdown = old.model_copy(
        update={
            "parameters_bytes": share.parameters_bytes,
            "gradients_bytes": share.gradients_bytes,
            "optimizer_state_bytes": share.optimizer_state_bytes,
            "gathered_bytes": share.gathered_bytes,
            "transient_bytes": max(peak - known, 0),
            "headroom_bytes": headroom,
        }
    )
    return result.model_copy(
        update={
            "predicted_peak_bytes": peak,
            "unplanned_peak_bytes": result.unplanned_peak_bytes + offset,
            "minimum_feasible_bytes": result.minimum_feasible_bytes + offset,
            "breakdown": breakdown,
            "world_size": share.world_size,
            "parallelism": share.parallelism,
        }
    )


def _plan(
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
) -> Plan:
    started = time.perf_counter()
    batch_size = _batch_size(example_inputs)
    traced = trace_or_find_modules(model, example_inputs)  # warns when it falls back
    oracle = RealSizeOracle()
    builder = ChainBuilder(traced, calibrate(device.type, device.index), batch_size)
    context_bytes, headroom_fraction = _reserve(device)
    # Tensors may take what is left after the context, less the allocator's share of it.
    usable_bytes = int((budget.bytes - context_bytes) / (1.0 + headroom_fraction))

    def outside(tensor_bytes: int) -> int:
        """What the device shows for ``tensor_bytes`` of tensors: plus context and slack."""
        return tensor_bytes + context_bytes + int(tensor_bytes * headroom_fraction)

    fake_state = FakeTrainingState(traced, optimizer=optimizer)
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

    def measure(
        segments: Sequence[Segment], actions: Sequence[SegmentAction], num_micro_batches: int = 1
    ) -> StepProfile:
        profile = profile_step(
            fake_state,
            example_inputs,
            actions,
            loss_fn=loss_fn,
            example_targets=example_targets,
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
        return measure(segments, [SegmentAction(recompute=True)] * len(segments), num_micro_batches)

    notes: list[str] = [traced.note] if isinstance(traced, ModuleChain) else []
    if use_gradient_checkpointing is not None:
        strategy: Strategy = "checkpoint-all" if use_gradient_checkpointing else "checkpoint-none"
        recomputed = all_recomputed(traced.segments)
        whole = Profiles(kept, recomputed)
        decision = Decision(
            list(traced.segments),
            [SegmentAction(recompute=use_gradient_checkpointing)] * len(traced.segments),
            ["forced by use_gradient_checkpointing"] * len(traced.segments),
            1,
            [(i, i + 1) for i in range(len(traced.segments))],
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

        def measure_decision(decision: Decision) -> StepProfile:
            if decision.num_micro_batches == 1 and all(a == KEEP for a in decision.actions):
                return kept  # nothing changes: the kept step is this plan's measurement
            return measure(decision.segments, decision.actions, decision.num_micro_batches)

        search = _Search(builder, Profiles(kept, None), batch_size, measure_decision)

        def plain_recompute() -> bool:
            if usable_bytes < recompute_lower_bound_bytes(kept):
                return False  # no plan of plain recomputes can fit: do not measure one
            search.whole = Profiles(kept, all_recomputed(traced.segments))
            return True

        def regions_and_chunks() -> bool:
            # Regions recomputed whole, chunks and micro-batches cost more profiles and a
            # probe of the real model: examined only once plain recompute cannot fit.
            separability = Separability.nothing(len(regions), "not allowed by the caller")
            if allow_chunks or allow_micro_batches:
                separability = analyse_separability(traced, example_inputs, regions)
            if not allow_chunks:
                separability = dataclasses.replace(separability, chunkable=(False,) * len(regions))
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
            )
            return True

        found = None
        for widen in (plain_recompute, regions_and_chunks, micro_batches):
            if widen() and (found := search.fit(usable_bytes, notes)):
                break
        if found is None:
            found = search.lowest_peak_fit(usable_bytes, notes)
        if found is None:
            raise search.infeasible(budget, outside)
        decision, final = found
        whole = search.whole
        minimum = search.minimum_peak_bytes()

    segment_plans = _segment_plans(builder, whole, decision)
    unplanned_step_s = 3 * sum(builder.recompute_s(kept, i) for i in range(len(traced.segments)))
    extra_s = sum(p.recompute_s for p in segment_plans if p.recomputed)
    extra_s += builder.micro_batch_s(kept, decision.num_micro_batches)
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
        tracing="forward-hooks" if isinstance(traced, ModuleChain) else "fx",
    )


class _Search:
    """The solver over every micro-batch count the profiles so far allow."""

    def __init__(
        self,
        builder: ChainBuilder,
        whole: Profiles,
        batch_size: int,
        measure: Callable[[Decision], StepProfile],
    ) -> None:
        self.builder = builder
        self.whole = whole
        self.half: Profiles | None = None
        self.separability: Separability | None = None
        self.batch_size = batch_size
        self._measure = measure
        self._measured: dict[tuple[Any, ...], StepProfile] = {}
        self.lowest_measured_bytes: int | None = None

    def measure(self, decision: Decision) -> StepProfile:
        """The decision's step measured on fake tensors (once per distinct decision)."""
        key = (decision.num_micro_batches, tuple(decision.spans), tuple(decision.reasons))
        if key not in self._measured:
            self._measured[key] = self._measure(decision)
        return self._measured[key]

    def chains(self) -> list[tuple[int, Chain]]:
        counts = micro_batch_counts(self.batch_size, self.half is not None)
        return [
            (count, self.builder.chain(self.whole, self.half, count, self.separability))
            for count in counts
        ]

    def cheapest(self, budget_bytes: int) -> Decision | None:
        """The least extra time over micro-batch counts, or None when nothing fits."""
        best: tuple[float, int, Chain, Solution] | None = None
        for count, chain in self.chains():
            solution = solve(chain, budget_bytes)
            if solution is None:
                continue
            total = solution.extra_s + self.builder.micro_batch_s(self.whole.kept, count)
            if best is None or total < best[0]:
                best = (total, count, chain, solution)
        if best is None:
            return None
        _, count, chain, solution = best
        return self.builder.decode(chain, solution, self.separability, count)

    def fit(self, usable_bytes: int, notes: list[str]) -> tuple[Decision, StepProfile] | None:
        """The cheapest decision whose measured step fits, with that measurement
        (NOTE [Planning], step 4), or None when none of the options so far fits."""
        decision = self.cheapest(usable_bytes)
        if decision is None:
            return None
        final = self.measure(decision)
        target = usable_bytes
        for _ in range(MAX_REPLANS):
            if final.peak_bytes <= usable_bytes:
                return decision, final
            # The chain model was optimistic: aim lower by what the measurement showed.
            target -= final.peak_bytes - usable_bytes
            retry = self.cheapest(target)
            if retry is None:
                break
            decision, final = retry, self.measure(retry)
            notes.append("re-planned: the measured plan was over the budget")
        if final.peak_bytes <= usable_bytes:
            return decision, final
        return self.lowest_peak_fit(usable_bytes, notes)

    def lowest_peak_fit(
        self, usable_bytes: int, notes: list[str]
    ) -> tuple[Decision, StepProfile] | None:
        """Last resort: the lowest-peak choice at each micro-batch count, measured; the first
        that fits. Also records the lowest measured peak, a budget planning is sure to meet:
        the chain model's own minimum can be optimistic, or pessimistic."""
        for lowest in self.lowest_peak_decisions():
            candidate = self.measure(lowest)
            if (
                self.lowest_measured_bytes is None
                or candidate.peak_bytes < self.lowest_measured_bytes
            ):
                self.lowest_measured_bytes = candidate.peak_bytes
            if candidate.peak_bytes <= usable_bytes:
                notes.append("took the lowest-peak plan: the cheaper ones measured over")
                return lowest, candidate
        return None

    def lowest_peak_decisions(self) -> list[Decision]:
        return [
            self.builder.decode(chain, minimum_peak(chain), self.separability, count)
            for count, chain in self.chains()
        ]

    def minimum_peak_bytes(self) -> int:
        return min(minimum_peak(chain).peak_bytes for _, chain in self.chains())

    def infeasible(self, budget: Budget, outside: Callable[[int], int]) -> InfeasibleBudgetError:
        """The error for a budget below every plan, with the minimum and the lever (after
        :meth:`lowest_peak_fit` found nothing, so the minimum is a measured one)."""
        lowest = self.lowest_measured_bytes
        minimum = outside(lowest if lowest is not None else self.minimum_peak_bytes())
        # Rounded up to whole KiB: a real step can hold a few bytes of scalars more than the
        # measured one (4 to 8 bytes seen with micro-batches), which must not tip it over.
        minimum = -(-minimum // 1024) * 1024
        kept = self.whole.kept
        # Parameters, their gradients and the optimizer state do not shrink with the batch.
        fixed = outside(2 * kept.parameter_bytes + kept.optimizer_state_bytes)
        per_sample = max(minimum - fixed, 1) / max(self.batch_size, 1)
        fitting_batch = math.floor((budget.bytes - fixed) / per_sample)
        if fixed >= budget.bytes:
            lever = (
                f"parameters, gradients and optimizer state alone take {format_bytes(fixed)}; "
                "raise the budget or use a smaller model"
            )
        elif 1 <= fitting_batch < self.batch_size:
            lever = f"lower the batch size to about {fitting_batch} or raise the budget"
        else:
            lever = f"raise the budget to at least {format_bytes(minimum * 1.05)}"
        return InfeasibleBudgetError(
            f"budget {budget.text} ({format_bytes(budget.bytes)}) is below the minimum "
            f"{format_bytes(minimum)} for batch {self.batch_size}; {lever}",
            budget_bytes=budget.bytes,
            minimum_bytes=minimum,
        )


def _segment_plans(builder: ChainBuilder, whole: Profiles, decision: Decision) -> list[SegmentPlan]:
    """Report rows: each run segment (a merged region counts as one) with its numbers."""
    kept_terms = kept_increments(whole.kept)
    plans = []
    for segment, action, reason, (first, end) in zip(
        decision.segments, decision.actions, decision.reasons, decision.spans, strict=True
    ):
        plans.append(
            SegmentPlan(
                name=segment.name,
                nodes=list(segment.node_names),
                modules=list(segment.module_paths),
                inputs=list(segment.input_names),
                outputs=list(segment.output_names),
                saved_bytes=max(sum(kept_terms[first:end]), 0),
                boundary_bytes=builder.boundary_bytes(whole, first, end),
                recompute_s=sum(builder.recompute_s(whole.kept, i) for i in range(first, end)),
                recomputed=action.recompute,
                num_chunks=action.num_chunks,
                input_batch_dims=list(action.input_batch_dims),
                output_batch_dims=list(action.output_batch_dims),
                reason=reason,
            )
        )
    return plans


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
    sizes = [x.shape[0] for x in flat_tensors(list(inputs)) if x.dim() > 0]  # dicts too
    return max(sizes) if sizes else 1


def _reserve(device: torch.device) -> tuple[int, float]:
    """Context bytes and the allocator's slack (a share of tensor bytes) on ``device``."""
    if device.type != "cuda":
        return 0, 0.0
    return DEFAULT_CUDA_CONTEXT_BYTES, CUDA_HEADROOM_FRACTION
