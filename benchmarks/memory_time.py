"""Memory and step time of one TFT training step under each checkpointing strategy, side by side.

Strategies, each training its own deep copy of the same model (same seed) with AdamW, run in one
process and timed round-robin (the order rotates every round) so all see the same machine load:

* ``no checkpointing``: the plain model;
* ``checkpoint all``: every segment recomputed (``use_gradient_checkpointing=True``, what a
  plain on/off flag does);
* ``autockpt F``: the planner at a budget of F times the unplanned peak, for each fraction
  (and ``autockpt 4GiB`` for budgets given outright with ``--budgets``);
* ``autockpt min``: the planner at its own minimum feasible budget (the minimum an infeasible
  budget reports; a little above it when planning at exactly that fails);
* ``compile B`` (``--compile``): ``torch.compile`` with
  ``torch._functorch.config.activation_memory_budget = B`` for B in 1.0 and 0.5.

Memory is measured on one untimed step per strategy: on the CPU as tracked tensor bytes (a
:class:`autockpt.MemoryTracker` started from the parameters, the optimizer state and the batch:
the figure the CPU budget is enforced on); on CUDA as ``max_memory_allocated`` and, for what
``nvidia-smi`` shows, ``max_memory_reserved`` plus the CUDA context. Every strategy's model
lives on the device at once, so on CUDA the bytes resident before the step that belong to the
other strategies are subtracted (see :func:`_cuda_peaks`). Compiled code allocates outside
the dispatcher, so tracked bytes cannot see it: the CPU table shows ``n/a`` for compile rows.

    python benchmarks/memory_time.py --preset tft-225 --json tft225.json
    python benchmarks/memory_time.py --preset tft-225 --device cuda --batch-size-for 4GiB

``--batch-size-for BUDGET`` first searches for the largest batch (a multiple of
``--batch-granularity``, found by bisection) that the planner says fits BUDGET on the device,
then benchmarks it,
with autockpt at BUDGET among the strategies.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

import autockpt
from autockpt.units import format_bytes
from tft.config import PRESET_NAMES, TFTConfig, get_preset
from tft.loss import quantile_loss
from tft.model import TemporalFusionTransformer

#: Budget given when a strategy has no budget of its own (reads as "no limit" on the CPU).
UNLIMITED_BYTES = 2**50
#: Factors over the reported minimum tried, in order, for the "autockpt min" strategy.
MINIMUM_FACTORS = (1.0, 1.01, 1.02, 1.05, 1.1, 1.25, 1.5)
#: Activation memory budgets tried with torch.compile.
COMPILE_BUDGETS = (1.0, 0.5)

Inputs = tuple[torch.Tensor, ...]


# ---------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Workload:
    """The model under test, one batch and the two loss functions."""

    config: TFTConfig
    model: torch.nn.Module
    inputs: Inputs
    target: torch.Tensor  # (B, H)
    device: torch.device

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return quantile_loss(prediction, target, self.config.quantiles)


def make_workload(preset: str, batch_size: int | None, device: torch.device, seed: int) -> Workload:
    config = get_preset(preset)
    if batch_size is not None:
        config = config.with_overrides(batch_size=batch_size)
    torch.manual_seed(seed)
    model = TemporalFusionTransformer(config).to(device).train()
    inputs, target = make_batch(model, config, config.batch_size, device, seed)
    return Workload(config, model, inputs, target, device)


def make_batch(
    model: Any, config: TFTConfig, batch_size: int, device: torch.device, seed: int
) -> tuple[Inputs, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = tuple(t.to(device) for t in model.example_inputs(batch_size, generator=generator))
    target = torch.randn(batch_size, config.horizon, generator=generator).to(device)
    return inputs, target


def plan_for(
    work: Workload, budget: int | str, inputs: Inputs | None = None, **options: Any
) -> autockpt.Plan:
    """``autockpt.plan`` of the workload's model (its target held through the step, as the
    timed steps hold it); forced-mode warnings are kept in the notes."""
    target = work.target
    if inputs is not None:
        target = work.target.new_zeros(inputs[0].shape[0], work.config.horizon)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return autockpt.plan(
            work.model,
            inputs if inputs is not None else work.inputs,
            budget,
            loss_fn=work.loss,
            example_targets=(target,),
            device=work.device,
            **options,
        )


def minimum_bytes(work: Workload, inputs: Inputs | None = None) -> int:
    """The minimum feasible budget the planner reports for an impossible budget of 1 byte."""
    try:
        plan_for(work, 1, inputs)
    except autockpt.InfeasibleBudgetError as error:
        return error.minimum_bytes
    raise RuntimeError("the planner accepted a budget of 1 byte")


def unplanned_budget_bytes(reference: autockpt.Plan) -> int:
    """The smallest budget at which the unplanned step fits, as the planner accounts budgets.

    On the CPU that is the unplanned peak. On CUDA the budget also pays for the context and for
    headroom that is a share of the budget itself, so the peak of the tensors is solved for:
    ``budget = tensors + context + share * budget``.
    """
    breakdown = reference.breakdown
    tensors = reference.unplanned_peak_bytes - breakdown.context_bytes - breakdown.headroom_bytes
    share = breakdown.headroom_bytes / reference.budget_bytes if reference.budget_bytes else 0.0
    return math.ceil((tensors + breakdown.context_bytes) / (1.0 - share))


# ---------------------------------------------------------------------------- strategies


@dataclass
class Strategy:
    """One way to run the step, its copy of the model and what was measured about it."""

    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    runner: torch.nn.Module
    """What the step calls: the model, the planned module or the compiled model."""
    plan: autockpt.Plan | None = None
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    planning_s: float | None = None
    compile_budget: float | None = None
    """For torch.compile strategies, the activation memory budget its backend compiles with."""
    notes: list[str] = field(default_factory=list)
    measured: dict[str, int] = field(default_factory=dict)
    step_s: list[float] = field(default_factory=list)
    failed: str | None = None

    def step(self, work: Workload) -> None:
        """One training step: forward and backward over the plan's pieces, then AdamW."""
        self.optimizer.zero_grad(set_to_none=True)
        autockpt.training_step(
            self.runner, self.plan, work.inputs, (work.target,), work.loss, loss_reduction="mean"
        )
        self.optimizer.step()


def _fresh_copy(work: Workload) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A copy of the model and its AdamW, whose state exists already, as it does in training."""
    model = copy.deepcopy(work.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    parameters = list(model.parameters())
    with torch.no_grad():
        before = [p.detach().clone() for p in parameters]
        for parameter in parameters:
            parameter.grad = torch.zeros_like(parameter)
        optimizer.step()  # weight decay moves the weights even at zero gradient: put them back
        for parameter, value in zip(parameters, before, strict=True):
            parameter.copy_(value)
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def planned_strategy(
    work: Workload, name: str, budget: int | str, *, record_budget: bool = True, **options: Any
) -> Strategy:
    model, optimizer = _fresh_copy(work)
    started = time.perf_counter()
    plan = plan_for(work, budget, **options)
    wall_s = time.perf_counter() - started
    strategy = Strategy(
        name=name,
        model=model,
        optimizer=optimizer,
        runner=autockpt.apply(model, plan),
        plan=plan,
        budget_bytes=plan.budget_bytes if record_budget else None,
        predicted_peak_bytes=plan.predicted_peak_bytes,
        planning_s=plan.planning_s,
    )
    strategy.notes.extend(plan.notes)
    strategy.notes.append(f"plan() wall time {wall_s:.2f} s")
    return strategy


def minimum_strategy(work: Workload) -> Strategy:
    """autockpt at its own minimum feasible budget, or the first factor above it that plans."""
    started = time.perf_counter()
    minimum = minimum_bytes(work)
    probe_s = time.perf_counter() - started
    failures = []
    for factor in MINIMUM_FACTORS:
        budget = math.ceil(minimum * factor)
        try:
            strategy = planned_strategy(work, "autockpt min", budget)
        except autockpt.InfeasibleBudgetError as error:
            failures.append(f"{format_bytes(budget)}: {error}")
            continue
        strategy.notes.append(
            f"reported minimum {format_bytes(minimum)} (probe {probe_s:.2f} s); planned at "
            f"{factor:.2f}x of it"
        )
        strategy.notes.extend(f"infeasible at {failure}" for failure in failures)
        return strategy
    raise RuntimeError(
        f"no plan at up to {MINIMUM_FACTORS[-1]}x the reported minimum "
        f"{format_bytes(minimum)}: " + "; ".join(failures)
    )


def compiled_strategy(work: Workload, activation_memory_budget: float) -> Strategy:
    from torch._inductor.compile_fx import compile_fx

    def backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        # A backend of its own per budget: dynamo then compiles each copy separately, and the
        # partitioner reads the budget while this backend runs.
        with torch._functorch.config.patch(activation_memory_budget=activation_memory_budget):
            return compile_fx(graph, example_inputs)

    model, optimizer = _fresh_copy(work)
    return Strategy(
        name=f"compile {activation_memory_budget:g}",
        model=model,
        optimizer=optimizer,
        runner=cast(torch.nn.Module, torch.compile(model, backend=backend)),
        compile_budget=activation_memory_budget,
    )


# ---------------------------------------------------------------------------- measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def cuda_context_bytes(device: torch.device) -> int:
    """Device memory in use that the caching allocator does not hold: the context (and any
    other process on the card)."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def measure_memory(strategy: Strategy, work: Workload, context_bytes: int) -> None:
    strategy.optimizer.zero_grad(set_to_none=True)
    own = [*autockpt.tensors_of(strategy.model, strategy.optimizer), *work.inputs, work.target]
    if work.device.type == "cuda":
        strategy.measured = _cuda_peaks(strategy, work, own, context_bytes)
        return
    if strategy.compile_budget is not None:
        return  # compiled code allocates outside the dispatcher: nothing to count
    with autockpt.MemoryTracker(initial=own) as tracker:
        strategy.step(work)
    strategy.measured = {"tracked_bytes": tracker.peak_bytes}


def _cuda_peaks(
    strategy: Strategy, work: Workload, own: list[torch.Tensor], context_bytes: int
) -> dict[str, int]:
    """Peaks of one step as if this strategy were alone on the device.

    ``memory_allocated`` before the step holds every strategy's model; only this one's
    parameters, optimizer state and batch (``own``) belong to the step, so the rest is taken
    off the peak. The cache is emptied first, so the reserved peak is this step's.
    """
    device = work.device
    gc.collect()
    torch.cuda.empty_cache()
    _sync(device)
    own_bytes = _storage_bytes(own)
    allocated_before = torch.cuda.memory_allocated(device)
    reserved_before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    strategy.step(work)
    _sync(device)
    allocated = own_bytes + torch.cuda.max_memory_allocated(device) - allocated_before
    reserved = own_bytes + torch.cuda.max_memory_reserved(device) - reserved_before
    return {
        "max_allocated_bytes": allocated,
        "max_reserved_bytes": reserved,
        "context_bytes": context_bytes,
        "visible_bytes": reserved + context_bytes,
    }


def timed_step(strategy: Strategy, work: Workload) -> float:
    _sync(work.device)
    started = time.perf_counter()
    strategy.step(work)
    _sync(work.device)
    return time.perf_counter() - started


def _compile_within(strategy: Strategy, work: Workload, seconds: float) -> None:
    started = time.perf_counter()
    with time_limit(seconds):
        strategy.step(work)
    strategy.notes.append(f"first step, compiling: {time.perf_counter() - started:.1f} s")


def _timed_into(strategy: Strategy, work: Workload) -> None:
    strategy.step_s.append(timed_step(strategy, work))


class CompileTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CompileTimeout` after ``seconds`` (main thread, POSIX; None: no limit)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise CompileTimeout(f"still compiling after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_guarded(strategy: Strategy, work: Workload, action: Callable[[], Any]) -> bool:
    """Run ``action``; an out-of-memory (or a compile error) marks the strategy failed."""
    try:
        action()
        return True
    except torch.OutOfMemoryError:
        strategy.failed = "out of memory"
    except Exception as error:  # noqa: BLE001 - compile and step failures are reported, not fatal
        if strategy.compile_budget is None:
            raise
        strategy.failed = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    strategy.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if work.device.type == "cuda":
        torch.cuda.empty_cache()
    return False


# ---------------------------------------------------------------------------- the run


def largest_fitting_batch(
    work: Workload, budget: str, granularity: int, limit: int = 1 << 16
) -> tuple[int, list[str]]:
    """A large multiple of ``granularity`` whose step the planner says fits ``budget``.

    The minimum feasible budget grows about linearly with the batch, so two probes give an
    estimate; bisection between multiples that fit and do not fit settles it. Feasibility is
    not monotone in the batch (the planner only tries micro-batch counts that divide it: at
    3 MiB tiny fits at 224 and 416 but not at 232), so searching multiples of a power of two
    helps, and the answer is the largest the bisection saw, not a proven maximum.
    """
    log: list[str] = []
    budget_bytes = autockpt.parse_budget(budget, device=work.device).bytes

    def inputs_at(batch: int) -> Inputs:
        return make_batch(work.model, work.config, batch, work.device, seed=0)[0]

    def fits(batch: int) -> bool:
        try:
            plan = plan_for(work, budget, inputs_at(batch))
        except autockpt.InfeasibleBudgetError:
            log.append(f"batch {batch}: does not fit")
            return False
        log.append(
            f"batch {batch}: fits, predicted {format_bytes(plan.predicted_peak_bytes)}, "
            f"{plan.num_micro_batches} micro-batches"
        )
        return True

    # Both probes past the largest micro-batch count, where the minimum grows with the batch.
    small, large = 4 * granularity, 16 * granularity
    low_minimum, high_minimum = (
        minimum_bytes(work, inputs_at(small)),
        minimum_bytes(work, inputs_at(large)),
    )
    per_sample = max((high_minimum - low_minimum) / (large - small), 1.0)
    estimate = small + (budget_bytes - low_minimum) / per_sample
    log.append(
        f"minimum {format_bytes(low_minimum)} at {small}, {format_bytes(high_minimum)} at "
        f"{large}: about {estimate:.0f} fits"
    )
    low = max(int(0.7 * estimate) // granularity * granularity, granularity)
    high = min(
        max(math.ceil(1.05 * estimate / granularity) * granularity, low + granularity), limit
    )
    while not fits(low):
        if low == granularity:
            raise autockpt.InfeasibleBudgetError(
                f"not even batch {granularity} fits {budget}",
                budget_bytes=budget_bytes,
                minimum_bytes=low_minimum,
            )
        low, high = max(low // 2 // granularity * granularity, granularity), low
    while high < limit and fits(high):
        low, high = high, min(2 * high, limit)
    while high - low > granularity:
        middle = (low + high) // 2 // granularity * granularity
        if fits(middle):
            low = middle
        else:
            high = middle
    return low, log


def build_strategies(
    work: Workload, fractions: Sequence[float], budgets: Sequence[str], with_compile: bool
) -> tuple[list[Strategy], autockpt.Plan, int]:
    reference = plan_for(work, UNLIMITED_BYTES, use_gradient_checkpointing=False)
    unplanned = unplanned_budget_bytes(reference)
    model, optimizer = _fresh_copy(work)
    baseline = Strategy(
        name="no checkpointing",
        model=model,
        optimizer=optimizer,
        runner=model,
        predicted_peak_bytes=unplanned,
    )
    strategies = [
        baseline,
        planned_strategy(
            work, "checkpoint all", unplanned, record_budget=False, use_gradient_checkpointing=True
        ),
    ]
    named: list[tuple[str, int | str]] = [
        (f"autockpt {f:.0%}", int(f * unplanned)) for f in fractions
    ]
    named += [(f"autockpt {text}", text) for text in budgets]
    for name, budget in named:
        try:
            strategies.append(planned_strategy(work, name, budget))
        except autockpt.InfeasibleBudgetError as error:
            model, optimizer = _fresh_copy(work)
            strategies.append(
                Strategy(
                    name=name,
                    model=model,
                    optimizer=optimizer,
                    runner=model,
                    budget_bytes=error.budget_bytes,
                    failed=f"infeasible (minimum {_mib(error.minimum_bytes)})",
                    notes=[str(error)],
                )
            )
    strategies.append(minimum_strategy(work))
    if with_compile:
        strategies += [compiled_strategy(work, budget) for budget in COMPILE_BUDGETS]
    return strategies, reference, unplanned


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    batch_search: list[str] = []
    work = make_workload(args.preset, args.batch_size, device, args.seed)
    if args.batch_size_for:
        batch, batch_search = largest_fitting_batch(
            work, args.batch_size_for, args.batch_granularity
        )
        work = make_workload(args.preset, batch, device, args.seed)
    context_bytes = 0
    if device.type == "cuda":
        torch.zeros(1, device=device)
        context_bytes = cuda_context_bytes(device)
    budgets = list(args.budgets)
    if args.batch_size_for and args.batch_size_for not in budgets:
        budgets.append(args.batch_size_for)
    load_before = os.getloadavg()
    started = time.perf_counter()
    strategies, reference, unplanned = build_strategies(
        work, args.budget_fractions, budgets, args.compile
    )
    planning_wall_s = time.perf_counter() - started

    # The memory step is each strategy's warm-up; compiled ones compile first, under a limit.
    for strategy in strategies:
        if strategy.compile_budget is None:
            continue
        torch.manual_seed(args.seed)
        run_guarded(
            strategy,
            work,
            functools.partial(_compile_within, strategy, work, args.compile_timeout),
        )
    active = [s for s in strategies if s.failed is None]
    for strategy in active:
        torch.manual_seed(args.seed + 1)
        run_guarded(
            strategy, work, functools.partial(measure_memory, strategy, work, context_bytes)
        )
    active = [s for s in active if s.failed is None]
    for round_index in range(args.steps):
        shift = round_index % max(len(active), 1)
        for strategy in active[shift:] + active[:shift]:
            if strategy.failed is not None:
                continue
            torch.manual_seed(args.seed + 2 + round_index)
            run_guarded(strategy, work, functools.partial(_timed_into, strategy, work))
    load_after = os.getloadavg()
    return report(
        args,
        work,
        strategies,
        reference,
        unplanned,
        planning_wall_s,
        (load_before, load_after),
        batch_search,
    )


# ---------------------------------------------------------------------------- reporting


def _actions(plan: autockpt.Plan | None) -> dict[str, Any]:
    if plan is None:
        return {}
    return {
        "num_recomputed": plan.num_recomputed,
        "num_segments": len(plan.segments),
        "chunks": {s.name: s.num_chunks for s in plan.segments if s.num_chunks > 1},
        "num_micro_batches": plan.num_micro_batches,
        "recomputed": [s.name for s in plan.segments if s.recomputed],
    }


def _measured_peak(strategy: Strategy) -> int | None:
    measured = strategy.measured
    return measured.get("tracked_bytes", measured.get("visible_bytes"))


def row_of(strategy: Strategy, unplanned: int, baseline: Strategy) -> dict[str, Any]:
    median_s = statistics.median(strategy.step_s) if strategy.step_s else None
    min_s = min(strategy.step_s) if strategy.step_s else None
    baseline_s = statistics.median(baseline.step_s) if baseline.step_s else None
    baseline_min_s = min(baseline.step_s) if baseline.step_s else None
    peak = _measured_peak(strategy)
    held = None
    if strategy.budget_bytes is not None and peak is not None:
        held = peak <= strategy.budget_bytes
    return {
        "strategy": strategy.name,
        "budget_bytes": strategy.budget_bytes,
        "budget_fraction": strategy.budget_bytes / unplanned if strategy.budget_bytes else None,
        "predicted_peak_bytes": strategy.predicted_peak_bytes,
        "measured": strategy.measured,
        "measured_peak_bytes": peak,
        "measured_over_predicted": (
            peak / strategy.predicted_peak_bytes if peak and strategy.predicted_peak_bytes else None
        ),
        "budget_held": held,
        "step_s": strategy.step_s,
        "median_step_s": median_s,
        "ratio_to_no_checkpointing": median_s / baseline_s if median_s and baseline_s else None,
        "min_step_s": min_s,
        "min_ratio_to_no_checkpointing": min_s / baseline_min_s
        if min_s and baseline_min_s
        else None,
        "planning_s": strategy.planning_s,
        "actions": _actions(strategy.plan),
        "failed": strategy.failed,
        "notes": strategy.notes,
    }


def _mib(num_bytes: int | None) -> str:
    """Bytes in MiB with three significant figures (KiB below one MiB)."""
    if num_bytes is None:
        return "-"
    if num_bytes < 2**20:
        return f"{num_bytes / 2**10:.3g} KiB"
    value = num_bytes / 2**20
    return f"{value:,.0f} MiB" if value >= 1000 else f"{value:.3g} MiB"


def markdown_table(rows: list[dict[str, Any]], device: torch.device) -> str:
    on_cuda = device.type == "cuda"
    measured_heads = (
        ["max allocated", "reserved + context"] if on_cuda else ["measured peak (tracked)"]
    )
    heads = [
        "strategy",
        "budget",
        "predicted peak",
        *measured_heads,
        "held",
        "step (median)",
        "vs none",
        "step (min)",
        "vs none (min)",
        "planning",
        "recomputed",
        "chunks",
        "micro-batches",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for row in rows:
        budget = "-"
        if row["budget_bytes"] is not None:
            budget = f"{_mib(row['budget_bytes'])} ({row['budget_fraction']:.0%})"
        measured = row["measured"]
        if row["failed"]:
            cells = [row["failed"]] + [""] * (len(measured_heads) - 1)
        elif on_cuda:
            cells = [_mib(measured.get("max_allocated_bytes")), _mib(measured.get("visible_bytes"))]
        else:
            cells = [_mib(measured.get("tracked_bytes")) if measured else "n/a"]
        held = {True: "yes", False: "**no**", None: "-"}[row["budget_held"]]
        median = row["median_step_s"]
        ratio = row["ratio_to_no_checkpointing"]
        fastest, fastest_ratio = row["min_step_s"], row["min_ratio_to_no_checkpointing"]
        actions = row["actions"]
        chunks = ", ".join(f"{name} x{k}" for name, k in actions.get("chunks", {}).items())
        lines.append(
            "| "
            + " | ".join(
                [
                    row["strategy"],
                    budget,
                    _mib(row["predicted_peak_bytes"]),
                    *cells,
                    held,
                    "-" if median is None else f"{median * 1e3:,.0f} ms",
                    "-" if ratio is None else f"{ratio:.2f}",
                    "-" if fastest is None else f"{fastest * 1e3:,.0f} ms",
                    "-" if fastest_ratio is None else f"{fastest_ratio:.2f}",
                    "-" if row["planning_s"] is None else f"{row['planning_s']:.1f} s",
                    f"{actions['num_recomputed']}/{actions['num_segments']}" if actions else "-",
                    (chunks or "-") if actions else "-",
                    str(actions["num_micro_batches"]) if actions else "-",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def machine_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def source_version() -> str:
    """The checkout's commit, and whether files differ from it (numbers depend on the code)."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "autockpt", "tft"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{commit} with uncommitted changes" if changed else commit


def report(
    args: argparse.Namespace,
    work: Workload,
    strategies: list[Strategy],
    reference: autockpt.Plan,
    unplanned: int,
    planning_wall_s: float,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
    batch_search: list[str],
) -> dict[str, Any]:
    rows = [row_of(s, unplanned, strategies[0]) for s in strategies]
    meta = {
        "preset": args.preset,
        "batch_size": work.config.batch_size,
        "device": str(work.device),
        "machine": machine_name() if work.device.type == "cpu" else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "dropout": work.config.dropout,
        "unplanned_peak_bytes": unplanned,
        "unplanned_tensor_peak_bytes": reference.unplanned_peak_bytes
        - reference.breakdown.context_bytes
        - reference.breakdown.headroom_bytes,
        "planning_wall_s_all_strategies": planning_wall_s,
        "load_average_before": loads[0],
        "load_average_after": loads[1],
        "batch_search": batch_search,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "source": source_version(),
    }
    return {"meta": meta, "rows": rows}


def print_report(result: dict[str, Any]) -> None:
    meta = result["meta"]
    print(
        f"{meta['preset']}, batch {meta['batch_size']}, dropout {meta['dropout']}, "
        f"{meta['device']} ({meta['machine']}), {meta['threads']} threads, torch {meta['torch']}, "
        f"{meta['steps']} timed steps per strategy"
    )
    print(f"source: {meta['source']}")
    print(
        f"unplanned peak: {_mib(meta['unplanned_peak_bytes'])}; load average "
        f"{'/'.join(f'{x:.1f}' for x in meta['load_average_before'])} before, "
        f"{'/'.join(f'{x:.1f}' for x in meta['load_average_after'])} after"
    )
    for line in meta["batch_search"]:
        print(f"batch search: {line}")
    print()
    print(markdown_table(result["rows"], torch.device(meta["device"])))
    print()
    for row in result["rows"]:
        for note in row["notes"]:
            print(f"- {row['strategy']}: {note}")
        if row["failed"]:
            print(f"- {row['strategy']}: failed: {row['failed']}")


def _fractions(text: str) -> list[float]:
    if text.strip().lower() in ("", "none"):
        return []
    values = [float(part) for part in text.split(",") if part.strip()]
    if not values or not all(0 < v <= 1.5 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give fractions such as 0.9,0.5,0.25")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Memory and step time of a TFT training step under each strategy."
    )
    parser.add_argument("--preset", choices=PRESET_NAMES, default="tft-225")
    parser.add_argument("--batch-size", type=int, help="default: the preset's")
    parser.add_argument(
        "--batch-size-for",
        metavar="BUDGET",
        help="use the largest batch (by bisection) the planner says fits BUDGET (e.g. 4GiB)",
    )
    parser.add_argument(
        "--batch-granularity",
        type=int,
        default=32,
        help="--batch-size-for searches multiples of this (default: 32)",
    )
    parser.add_argument(
        "--steps", type=int, help="timed steps per strategy (default: 3 for tft-225, 5 otherwise)"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--budget-fractions",
        type=_fractions,
        default=_fractions("0.9,0.7,0.5,0.3,0.25"),
        help="autockpt budgets as fractions of the unplanned peak ('none' for none)",
    )
    parser.add_argument(
        "--budgets",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        default=[],
        help="autockpt budgets given outright, e.g. 4GiB,800MB (--batch-size-for adds its own)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time torch.compile at activation_memory_budget 1.0 and 0.5",
    )
    parser.add_argument(
        "--compile-timeout",
        type=float,
        default=300.0,
        help="skip a compile strategy still compiling after this many seconds",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 3 if args.preset == "tft-225" else 5
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_report(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
