"""The fastest compiled step that fits a byte budget, found by compiling and measuring.

NOTE [Compiled plans]
``torch.compile`` does not run the step the planner measures: inductor fuses ops (saving
11-13% of the eager peak before any budget applies), frees on its own schedule, and its
partitioner picks what to recompute op by op, steered by one fraction,
``activation_memory_budget``, whose peak is not monotonic in it. A plan made on eager numbers
and then compiled does not peak where the eager prediction says (benchmarks/compile_budget.py).
So ``plan(..., compile=True)`` predicts nothing from the eager numbers: it compiles each
candidate and measures its real step, with the allocator's count (NOTE in
:mod:`autockpt.planner.measure.allocator_peak`), and times it. The candidates, cheapest first:

1. the plain model at inductor's default partition (1.0): taken if it fits;
2. the plain model at compile's own fractions (:data:`FRACTIONS`): one graph, one knob;
3. per-region budgets (NOTE [Per-region budgets]): the planner's segments that free the most
   bytes per second of recompute, by its eager counts, each a graph of its own at region
   budget 0, as many as the plain compiled step's overshoot needs; where the compiled step
   still peaks over the budget, more, by what is left over. The planner picks where memory is
   given back, inductor how, op by op and fused;
4. the eager planner's plan at the budget (its recompute, chunks and micro-batches, which only
   the planner has), compiled at 1.0; where it peaks over the budget, planned again at a
   budget lowered by the overshoot;
5. that plan compiled at the fractions too, while compiles remain.

On CUDA a budget is what ``nvidia-smi`` shows, as for an eager plan: a candidate's peak is
the CUDA context (the eager plan's ``context_bytes``) plus the bytes resident at the step's
start plus the allocator's count, which takes in what it reserves beyond its tensors (so no
headroom share is added).

The fastest candidate that fits wins, by a second timing: each is timed over
:data:`TIMED_STEPS` steps as it is compiled, but steps seconds or minutes apart on a shared
machine are not comparable (one search chose the plain step at compile 0.5, 1.08x, over a
chunked plan at 0.84x, which the same search alone chose), so the :data:`FINALISTS` fastest
that fit are timed again with the plain step, a step each in :data:`ROUNDS` rounds whose order
rotates, and the fastest of its rounds counts (:func:`retime`, as NOTE [Whole-plan timing]
does for eager plans). At most ``max_compiles`` compiles are made, and the plan's notes say
how many and how long they took, and each candidate's peak and step time. A budget no
candidate meets is refused with the lowest peak measured as the minimum, and every
candidate's peak and time in the message.

Every candidate runs on one deep copy of the model (its own weights and optimizer state, so
the user's model is never written, at the cost of the model's memory a second time while
planning). Each candidate is compiled with ``isolate_recompiles`` (its entries apart from the
others', so no candidate's compile counts against another's recompile limit: every candidate
compiles the same ``forward`` with other settings), and kept until the second timing; dynamo's
caches are reset once the search ends, which drops whatever else the process had compiled (it
compiles again on its next call).
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from autockpt.errors import ConfigError, InfeasibleBudgetError
from autockpt.planner.apply import apply
from autockpt.planner.core.units import format_bytes
from autockpt.planner.measure.allocator_peak import allocator_peak_bytes, resident_bytes
from autockpt.planner.measure.fake_step import default_loss
from autockpt.planner.measure.optimizers import give_state, make_optimizer
from autockpt.planner.plan_types import PeakBreakdown, Plan, SegmentPlan
from autockpt.planner.runtime.compiled_backend import compile_in_place
from autockpt.planner.simulate.step_profile import OptimizerSpec
from autockpt.planner.solve.whole_plan_timing import times_in_rounds
from autockpt.planner.training_step import training_step
from autockpt.progress import report_progress

__all__ = [
    "FRACTIONS",
    "MAX_COMPILES",
    "REGION_FRACTION",
    "Candidate",
    "plan_compiled",
]

FRACTIONS = (0.5, 0.25)
"""Compile's activation memory budgets tried besides its default (1.0)."""
REGION_FRACTION = 0.0
"""The region budget of a segment handed to compile's partitioner (candidate 3): it keeps at
most what checkpointing the segment would."""
MAX_COMPILES = 8
"""Compiles one search makes at most (each takes seconds to minutes on a CPU)."""
TIMED_STEPS = 3
"""Steps timed per candidate after the one that compiles; the median counts until the second
timing."""
FINALISTS = 3
"""The fastest candidates that fit timed again, side by side with the plain step."""
ROUNDS = 5
"""Rounds of the second timing: a step of each finalist and of the plain step a round."""

EagerPlanner = Callable[[int | None], Plan]
"""The eager planner at a budget in bytes; ``None`` plans the plain step (nothing recomputed)."""


@dataclass
class Candidate:
    """One compiled step tried: an eager plan (or the plain step) at one fraction."""

    plan: Plan
    fraction: float
    peak_bytes: int = 0
    step_s: float = 0.0
    compile_s: float = 0.0
    step: Callable[[], None] | None = field(default=None, repr=False)
    """The compiled step, kept for the second timing."""
    retimed: bool = False

    @property
    def name(self) -> str:
        plan = self.plan
        parts = []
        regions = [s.compile_fraction for s in plan.segments if s.compile_fraction is not None]
        if regions:
            at = ", ".join(sorted({f"{fraction:g}" for fraction in regions}))
            parts.append(f"{len(regions)} of {len(plan.segments)} graphs of their own at {at}")
        if plan.num_recomputed:
            parts.append(f"{plan.num_recomputed} of {len(plan.segments)} recomputed")
        if any(s.num_chunks > 1 for s in plan.segments):
            parts.append(f"chunks {max(s.num_chunks for s in plan.segments)}")
        if plan.num_micro_batches > 1:
            parts.append(f"{plan.num_micro_batches} micro-batches")
        what = f"planned ({', '.join(parts)})" if parts else "plain"
        return f"{what} at compile {self.fraction:g}"


def regions_to_free(plain: Plan, free_bytes: int) -> Plan | None:
    """The plain plan with segments handed to compile's partitioner, each a graph of its own at
    region budget :data:`REGION_FRACTION` (NOTE [Per-region budgets]): those that free the
    most bytes per second of recompute first (by the eager counts: what a segment keeps less
    what checkpointing it would keep), until they free ``free_bytes`` (all of them where they
    never do). None where no segment frees anything. A span of several module calls is not a
    region: a region is one call."""
    gains = {
        index: segment.saved_bytes - segment.boundary_bytes
        for index, segment in enumerate(plain.segments)
        if segment.saved_bytes > segment.boundary_bytes
        and (plain.tracing == "fx" or len(segment.modules) == 1)
    }
    order = sorted(
        gains, key=lambda i: -gains[i] / max(plain.segments[i].recompute_s, _SHORTEST_RECOMPUTE_S)
    )
    chosen: set[int] = set()
    for index in order:
        if sum(gains[i] for i in chosen) >= free_bytes:
            break
        chosen.add(index)
    if not chosen:
        return None
    segments = [
        segment.model_copy(
            update={
                "compile_fraction": REGION_FRACTION,
                "reason": f"frees about {format_bytes(gains[index])} (eager count) as a graph "
                f"of its own at region budget {REGION_FRACTION:g}: compile recomputes inside it",
            }
        )
        if index in chosen
        else segment
        for index, segment in enumerate(plain.segments)
    ]
    return plain.model_copy(update={"segments": segments})


#: A floor on a segment's recompute seconds when ranking regions (some time at zero or less).
_SHORTEST_RECOMPUTE_S = 1e-6


class _Runner:
    """Compiles and measures candidates on one copy of the model."""

    def __init__(
        self,
        model: torch.nn.Module,
        inputs: Sequence[torch.Tensor],
        targets: Sequence[torch.Tensor],
        loss_fn: Callable[..., torch.Tensor],
        optimizer_spec: OptimizerSpec,
        device: torch.device,
        context_bytes: int,
    ) -> None:
        self.model = copy.deepcopy(model).train()
        self.context_bytes = context_bytes
        self.inputs, self.targets, self.loss_fn, self.device = inputs, targets, loss_fn, device
        self.optimizer = make_optimizer(optimizer_spec, list(self.model.parameters()))
        if self.optimizer is not None:
            give_state(self.optimizer, list(self.model.parameters()))
        self.compiles = 0
        self.compile_s = 0.0

    def measure(self, candidate: Candidate) -> Candidate:
        report_progress(f"planning: compiling and timing {candidate.name}")
        runner = compile_in_place(apply(self.model, candidate.plan), candidate.fraction)

        def step() -> None:
            training_step(
                runner,
                candidate.plan,
                self.inputs,
                self.targets,
                self.loss_fn,
                loss_reduction="sum",
            )
            if self.optimizer is not None:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)

        started = time.perf_counter()
        step()  # compiles
        candidate.compile_s = time.perf_counter() - started
        self.compiles += 1
        self.compile_s += candidate.compile_s
        candidate.step_s = statistics.median(self.step_seconds(step) for _ in range(TIMED_STEPS))
        candidate.step = step
        resident = resident_bytes(self.model, self.optimizer, (*self.inputs, *self.targets))
        candidate.peak_bytes = (
            self.context_bytes + resident + allocator_peak_bytes(step, self.device)
        )
        return candidate

    def step_seconds(self, step: Callable[[], None]) -> float:
        """Seconds one run of ``step`` takes, its queued kernels included."""
        started = time.perf_counter()
        step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - started


def retime(
    finalists: Sequence[Candidate],
    plain: Candidate,
    step_seconds: Callable[[Callable[[], None]], float],
) -> None:
    """Time ``finalists`` and ``plain`` again, a step each in :data:`ROUNDS` rounds whose order
    rotates, and set each one's ``step_s`` to the fastest of its rounds (NOTE [Compiled
    plans]): a noisy moment slows a round's steps alike, and none always follows one other."""
    timed = [plain, *(c for c in finalists if c is not plain)]
    steps = [c.step for c in timed if c.step is not None]
    assert len(steps) == len(timed), "a finalist keeps its compiled step"
    runs = [functools.partial(step_seconds, step) for step in steps]
    for candidate, seconds in zip(timed, times_in_rounds(runs, ROUNDS, ROUNDS, 0.0), strict=True):
        candidate.step_s = min(seconds)
        candidate.retimed = True


def _try_regions(
    plain_plan: Plan,
    plain_peak_bytes: int,
    budget_bytes: int,
    attempt: Callable[[Plan, float], Candidate | None],
) -> None:
    """Candidate 3 of NOTE [Compiled plans]: segments in graphs of their own at region budget
    0, chosen to free the plain compiled step's overshoot, more while the compiled step still
    peaks over the budget and each try peaks lower than the last."""
    free_bytes = plain_peak_bytes - budget_bytes
    lowest_bytes = plain_peak_bytes
    tried: list[list[SegmentPlan]] = []
    for _ in range(3):
        plan = regions_to_free(plain_plan, free_bytes)
        if plan is None or plan.segments in tried:
            return
        tried.append(plan.segments)
        candidate = attempt(plan, 1.0)
        if candidate is None or candidate.peak_bytes <= budget_bytes:
            return
        # NOTE: where graphs of their own peak no lower than one graph (the breaks cost the
        # fusion across them more than the regions give back: the TFT's 6 segments at 0 peak
        # 6.14 MiB against 5.68 in one graph), more of them will not either: the compiles left
        # go to the eager planner's plans.
        if candidate.peak_bytes >= lowest_bytes:
            return
        lowest_bytes = candidate.peak_bytes
        # The regions freed less compiled than the eager count said: free the rest too.
        free_bytes += candidate.peak_bytes - budget_bytes


def _try_eager_plans(
    eager_plan: EagerPlanner,
    budget_bytes: int,
    attempt: Callable[[Plan, float], Candidate | None],
    notes: list[str],
) -> None:
    """Candidates 4 and 5 of NOTE [Compiled plans]: the eager plan at the budget, planned
    again lower while its compiled step peaks over it, then at compile's fractions."""
    target = budget_bytes
    planned: Candidate | None = None
    for _ in range(3):
        try:
            eager = eager_plan(target)
        except InfeasibleBudgetError as error:
            notes.append(
                f"the eager planner refused {format_bytes(target)} (its minimum "
                f"{format_bytes(error.minimum_bytes)})"
            )
            break
        planned = attempt(eager, 1.0)
        if planned is None or planned.peak_bytes <= budget_bytes:
            break
        # Compiled, the plan peaked above the budget: plan again lower by the overshoot.
        target = int(target * budget_bytes / planned.peak_bytes) - 1
    if planned is None or planned.peak_bytes <= budget_bytes:
        return
    for fraction in FRACTIONS:
        at_fraction = attempt(planned.plan, fraction)
        if at_fraction is None or at_fraction.peak_bytes <= budget_bytes:
            return


def plan_compiled(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget_bytes: int,
    eager_plan: EagerPlanner,
    *,
    loss_fn: Callable[..., torch.Tensor] | None,
    example_targets: Sequence[torch.Tensor],
    optimizer: OptimizerSpec,
    device: torch.device,
    max_compiles: int = MAX_COMPILES,
) -> Plan:
    """The fastest compiled step found that fits ``budget_bytes`` (NOTE [Compiled plans]).

    Raises:
        InfeasibleBudgetError: no candidate's measured peak fits; the minimum is the lowest.
        ConfigError: ``max_compiles`` below 1.
    """
    if max_compiles < 1:
        raise ConfigError(f"max_compiles={max_compiles} must be 1 or more")
    started = time.perf_counter()
    with warnings.catch_warnings():
        # The forced plain plan warns that it is over the budget: the search knows.
        warnings.simplefilter("ignore")
        plain_plan = eager_plan(None)
    runner = _Runner(
        model,
        example_inputs,
        example_targets,
        loss_fn or default_loss,
        optimizer,
        device,
        plain_plan.breakdown.context_bytes,
    )
    tried: list[Candidate] = []
    notes: list[str] = []

    def attempt(plan: Plan, fraction: float) -> Candidate | None:
        if runner.compiles >= max_compiles:
            return None
        candidate = runner.measure(Candidate(plan, fraction))
        tried.append(candidate)
        return candidate

    def fitting() -> list[Candidate]:
        return [c for c in tried if c.peak_bytes <= budget_bytes]

    plain = attempt(plain_plan, 1.0)
    assert plain is not None
    if not fitting():
        for fraction in FRACTIONS:
            attempt(plain_plan, fraction)
        _try_regions(plain_plan, plain.peak_bytes, budget_bytes, attempt)
        _try_eager_plans(eager_plan, budget_bytes, attempt, notes)
    fits = fitting()
    finalists = sorted(fits, key=lambda c: c.step_s)[:FINALISTS]
    if len(finalists) > 1:
        report_progress(f"planning: timing the {len(finalists)} fastest compiled steps again")
        retime(finalists, plain, runner.step_seconds)
    for candidate in tried:
        candidate.step = None  # the compiled modules go with the search
    torch._dynamo.reset()
    search_s = time.perf_counter() - started
    lines = "; ".join(_line(c, plain) for c in tried)
    notes.append(
        f"compiled search: {runner.compiles} compiles in {runner.compile_s:.1f} s "
        f"({search_s:.1f} s in all): {lines}"
    )
    if not fits:
        lowest = min(c.peak_bytes for c in tried)
        raise InfeasibleBudgetError(
            f"budget {format_bytes(budget_bytes)} is below every compiled step tried "
            f"({len(tried)}, the lowest peaked at {format_bytes(lowest)} by the allocator); "
            f"give at least {format_bytes(lowest)}, a smaller batch, or plan without compile "
            f"(tried: {lines})",
            budget_bytes=budget_bytes,
            minimum_bytes=lowest,
        )
    chosen = min(finalists, key=lambda c: c.step_s)
    return _compiled_plan(chosen, plain, tried, plain_plan, search_s, notes)


def _line(candidate: Candidate, plain: Candidate) -> str:
    """A candidate's peak and time, as the notes and a refusal give them."""
    timing = "fastest of the second timing" if candidate.retimed else "median of its first steps"
    return (
        f"{candidate.name}: {format_bytes(candidate.peak_bytes)} by the allocator, "
        f"{candidate.step_s * 1e3:.1f} ms a step ({candidate.step_s / plain.step_s:.2f}x plain "
        f"compiled, {timing}), compiled in {candidate.compile_s:.1f} s"
    )


def _compiled_plan(
    chosen: Candidate,
    plain: Candidate,
    tried: list[Candidate],
    plain_plan: Plan,
    search_s: float,
    notes: list[str],
) -> Plan:
    """The chosen candidate's eager plan with the compiled step's measured figures."""
    base = chosen.plan
    breakdown = base.breakdown
    held = (
        breakdown.context_bytes
        + breakdown.parameters_bytes
        + breakdown.gradients_bytes
        + breakdown.optimizer_state_bytes
        + breakdown.inputs_bytes
    )
    return base.model_copy(
        update={
            "budget_bytes": plain_plan.budget_bytes,
            "budget_text": plain_plan.budget_text,
            "budget_reading": plain_plan.budget_reading,
            "compile_fraction": chosen.fraction,
            "predicted_peak_bytes": chosen.peak_bytes,
            "unplanned_peak_bytes": plain.peak_bytes,
            "minimum_feasible_bytes": min(c.peak_bytes for c in tried),
            "predicted_extra_s": chosen.step_s - plain.step_s,
            "unplanned_step_s": plain.step_s,
            "fits": True,
            "planning_s": base.planning_s + search_s,
            # The eager breakdown's parts the step holds from the start (the CUDA context
            # among them), and the rest of the measured compiled peak as activations:
            # inductor's buffers are not attributed, and the allocator's slack is in the count.
            "breakdown": PeakBreakdown(
                **{
                    **breakdown.model_dump(),
                    "activations_bytes": max(chosen.peak_bytes - held, 0),
                    "transient_bytes": 0,
                    "headroom_bytes": 0,
                }
            ),
            "timeline": None,
            "notes": [f"chosen: {chosen.name}", *notes, *base.notes],
        }
    )
