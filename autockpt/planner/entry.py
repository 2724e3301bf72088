"""``plan()``: the planner's entry point, for one process or one rank of several.

It reads the budget, plans one process's step (NOTE [Planning]) against the budget less one
rank's difference (NOTE [Per-rank accounting]), and, on CUDA, checks the plan with a real step
(:mod:`autockpt.planner.verify`), planning again when the step went over.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence

import torch

from autockpt.errors import (
    AutockptError,
    ConfigError,
    InfeasibleBudgetError,
    PlanningError,
    describe_error,
    warn_at_the_callers_line,
)
from autockpt.planner.compiled_search import MAX_COMPILES, plan_compiled
from autockpt.planner.core.batch_split import (
    BatchShapes,
    batch_shapes,
    batch_size_of,
    carrying_leaves,
    grown_to,
)
from autockpt.planner.core.decisions import Parallelism
from autockpt.planner.core.host_settings import (
    cyclic_gc_paused,
    one_cpu_thread,
    random_streams_kept,
)
from autockpt.planner.core.step_budget import BudgetGiven, StepBudget, read_budget
from autockpt.planner.core.train_eval import training_mode
from autockpt.planner.core.units import Budget, format_bytes
from autockpt.planner.loss_chunks import plan_step
from autockpt.planner.measure.sharding import (
    RankShare,
    fsdp_unit_paths,
    parameter_layouts,
    rank_share,
)
from autockpt.planner.pipeline import PlanRequest
from autockpt.planner.plan_types import BatchLeaves, Plan
from autockpt.planner.simulate.step_profile import LossFn, OptimizerSpec
from autockpt.planner.trace.module_chain import Tracing
from autockpt.planner.verify import REPLANNING, verify_plan
from autockpt.progress import (
    ProgressReporter,
    current_reporter,
    on_a_terminal,
    report_progress,
    showing_progress,
    stderr_lines,
)


def plan(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: BudgetGiven = "auto",
    *,
    loss_fn: LossFn | None = None,
    example_targets: Sequence[torch.Tensor] = (),
    optimizer: OptimizerSpec = "adamw",
    device: torch.device | str | None = None,
    use_gradient_checkpointing: bool | None = None,
    allow_micro_batches: bool = True,
    allow_chunks: bool = True,
    allow_loss_chunks: bool = True,
    verify: bool | None = None,
    autocast_dtype: torch.dtype | None = None,
    world_size: int = 1,
    parallelism: Parallelism | None = None,
    tracing: Tracing = "auto",
    gradients_live: bool = False,
    compile: bool = False,
    max_compiles: int = MAX_COMPILES,
    progress: bool | ProgressReporter | None = None,
    cpu_threads: int | Callable[[int], int] | None = None,
    max_shape: Sequence[int] | None = None,
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
            :class:`~autockpt.planner.core.units.Budget` already read; or a function of the
            plain step's peak in bytes that returns one of those (``lambda plain: plain // 2``:
            half of what the step takes with nothing recomputed), called once that step is
            measured, so that planning runs once (NOTE [A budget decided from the plain
            step]). Not with ``compile=True``.
        loss_fn: ``loss_fn(output, *example_targets) -> scalar``; default: the sum of the
            outputs.
        example_targets: what the loss compares against, at the training batch size (the
            training targets). A training loop holds them through the step like the inputs,
            so they count towards the peak. Needs ``loss_fn``.
        optimizer: ``"adamw"``, ``"sgd"``, ``None``, an optimizer instance (its class and
            settings) or a callable that makes the run's optimizer from a list of parameters
            (``functools.partial(torch.optim.AdamW, lr=3e-4, fused=True)``), to count its state
            (and, where the real model is timed, time its step).
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
        allow_loss_chunks: where no plan fits with the loss run whole, let the plan run the
            model's last linear layer and ``loss_fn`` together in chunks of positions (the
            whole logits never exist), when the loss adds up over positions (NOTE [Loss over
            positions in chunks]); run such a plan's steps with :func:`training_step`.
        verify: run one real planned step and compare its peak with the prediction; if over
            the budget, plan again lower (NOTE [Planning again] in :mod:`autockpt.planner.verify`).
            Default: on CUDA only (on the CPU the prediction is measured with the very kernels
            the step runs). Needs the model and inputs on the device.
        autocast_dtype: the mixed-precision dtype training runs at (``torch.bfloat16``,
            ``torch.float16``): the step is measured and verified under ``torch.autocast``.
        world_size: ranks training together, each on its own ``example_inputs`` batch. The
            budget is per rank, and so are the predicted peak and its breakdown.
        parallelism: ``"single"``, ``"ddp"`` (every rank holds the whole model) or ``"fsdp"``
            (FSDP2: parameters, gradients and optimizer state split over the ranks, gathered
            per unit); default ``"single"`` for one rank, else ``"ddp"``. The planner adds
            the per-rank difference to the measured step (NOTE [Per-rank accounting]);
            ``verify`` defaults to off unless ``"single"`` (a check step is one process).
        tracing: ``"auto"`` traces with torch.fx and falls back to module-level segments
            found with forward hooks (NOTE [Module chain]); ``"forward-hooks"`` plans
            module-level segments directly, so that the plan acts on the model's submodules
            and not on a traced copy of its forward (what a wrapper whose ``forward`` runs
            someone else's training step needs, e.g. :mod:`autockpt.lightning`); ``"fx"``
            traces with torch.fx or raises :class:`TraceError`, with no fallback.
        gradients_live: the loop keeps every gradient alive through the forward (it
            accumulates them over batches, or zeroes them only after the forward): they are
            counted from the start of the step.
        compile: plan the step ``torch.compile`` (inductor) runs: candidates (the plain
            model at inductor's own activation memory budgets, segments in graphs of their own
            at a region budget, the eager plan at this budget) are compiled and their real steps measured by the allocator and timed; the
            fastest that fits is the plan, and :func:`autockpt.apply` returns it compiled
            (NOTE [Compiled plans]). Needs the model and inputs on the device, and
            ``optimizer`` ``"adamw"``, ``"sgd"``, ``None`` or a factory; one process.
        max_compiles: compiles the ``compile=True`` search makes at most.
        progress: what planning shows while it runs, a line per stage (NOTE [Progress on long
            waits] in :mod:`autockpt.progress`): ``None`` shows the lines on stderr when it
            is a terminal (or hands them to a reporter installed around the call with
            :func:`autockpt.progress.showing_progress`), ``True`` always on stderr, ``False``
            nothing, or a function called with each line.
        cpu_threads: the CPU threads training will run with, at which the real model is timed
            (on the CPU): a count, or a function of the plain step's bytes that returns it,
            called once that step is measured and before anything is timed (NOTE [Threads
            chosen from the plain step]); default: torch's count when ``plan()`` is called.
            Planning itself runs on one thread either way.
        max_shape: the batch's leading dimensions at their largest (``(16, 2048)``: at most
            16 samples of 2048 positions): the example batch is grown to it (its own values
            repeated) and planned there, so that the plan holds for every batch under it
            (NOTE [Shapes a plan holds for]). Default: the example batch's own shapes, which
            :func:`training_step` then refuses to exceed; see also
            :class:`autockpt.ShapePlanner`, which plans each new shape as it comes.

    Returns:
        The plan: which segments recompute (and in how many chunks), how many micro-batches,
        the predicted peak and its breakdown.

    Raises:
        BudgetError: the budget cannot be read.
        InfeasibleBudgetError: no plan fits (the message gives the minimum and the levers).
        TraceError: neither torch.fx nor forward hooks find segments in the model.
        PlanningError: the model (or a library it runs) raised where no option could be left
            out, e.g. in its plain step; an option whose measurement fails is left out with a
            note instead.
        ConfigError: ``example_targets`` without a ``loss_fn``.

    Example:
        >>> plan = autockpt.plan(model, (x,), budget="4GB")
        >>> model = autockpt.apply(model, plan)
    """
    with showing_progress(_progress_reporter(progress)):
        if example_targets and loss_fn is None:
            raise ConfigError(
                "example_targets were given without a loss_fn to compare them with; pass "
                "loss_fn=lambda output, *targets: ..."
            )
        if max_shape is not None:  # NOTE [Shapes a plan holds for]
            example_inputs, example_targets = grown_to(max_shape, example_inputs, example_targets)
        shapes = batch_shapes(example_inputs, example_targets)
        resolved_device = _resolve_device(model, device)
        read, budget_of_plain = read_budget(budget, resolved_device, compile=compile)
        parallelism = parallelism or ("single" if world_size == 1 else "ddp")
        request = PlanRequest(
            loss_fn=loss_fn,
            example_targets=example_targets,
            optimizer=optimizer,
            device=resolved_device,
            use_gradient_checkpointing=use_gradient_checkpointing,
            allow_micro_batches=allow_micro_batches,
            allow_chunks=allow_chunks,
            allow_loss_chunks=allow_loss_chunks,
            autocast_dtype=autocast_dtype,
            tracing=tracing,
            gradients_live=gradients_live,
            world_size=world_size,
            parallelism=parallelism,
            cpu_threads=cpu_threads,
            budget_of_plain=budget_of_plain,
        )
        if not model.training:
            _warn_eval_mode(model)
        share = _rank_share(model, request)
        if compile:
            compiled = _plan_compiled(model, example_inputs, read, share, request, max_compiles)
            return compiled.model_copy(update={"batch_shapes": shapes})
        if verify is None:
            verify = resolved_device.type == "cuda" and parallelism == "single"
        step_budget = StepBudget.on(read, resolved_device, rank_offset_bytes=share.offset_bytes)
        notes: list[str] = []
        for _ in range(REPLANNING.max_rounds):
            result = _plan_round(model, example_inputs, step_budget, share, request)
            if request.budget_of_plain is not None:  # decided now, for every later round
                read = result.budget
                step_budget = step_budget.decided(read)
                request = dataclasses.replace(request, budget_of_plain=None)
            if not verify or use_gradient_checkpointing is not None:
                return _made_for(result, shapes, notes, None)
            report_progress("planning: checking the plan with one real step")
            check = verify_plan(
                model,
                result,
                example_inputs,
                loss_fn=loss_fn,
                example_targets=example_targets,
                optimizer=optimizer,
                autocast_dtype=autocast_dtype,
            )
            notes.append(check.note)
            if check.within_budget:
                return _made_for(result, shapes, notes, check.slack)
            overshoot = check.reserved_peak_bytes - read.bytes
            lowered = REPLANNING.lowered(step_budget.target_bytes, over_bytes=overshoot)
            notes.append(f"re-planned: the real step was {format_bytes(overshoot)} over the budget")
            if lowered <= 0:
                break
            step_budget = step_budget.lowered(lowered)
        raise InfeasibleBudgetError(
            f"budget {read.text} could not be kept on {resolved_device}: real steps stayed over it "
            "after re-planning; raise the budget or lower the batch size",
            budget_bytes=read.bytes,
            minimum_bytes=read.bytes,
        )


def _made_for(result: Plan, shapes: BatchShapes, notes: list[str], slack: float | None) -> Plan:
    """The plan with its shapes, its checks' notes and the slack its check measured on CUDA."""
    breakdown = result.breakdown.model_copy(update={"measured_slack": slack})
    update = {"notes": [*notes, *result.notes], "batch_shapes": shapes, "breakdown": breakdown}
    return result.model_copy(update=update)


def _rank_share(model: torch.nn.Module, request: PlanRequest) -> RankShare:
    """One rank's states against one process's (NOTE [Per-rank accounting])."""
    fsdp = request.parallelism == "fsdp"
    return rank_share(
        parameter_layouts(
            model,
            optimizer=request.optimizer,
            unit_paths=fsdp_unit_paths(model) if fsdp else (),
        ),
        world_size=request.world_size,
        parallelism=request.parallelism,
    )


def _progress_reporter(progress: bool | ProgressReporter | None) -> ProgressReporter | None:
    """The reporter ``plan(progress=...)`` asks for (NOTE [Progress on long waits])."""
    if progress is None:
        around = current_reporter()
        if around is not None:
            return around
        return stderr_lines() if on_a_terminal(sys.stderr) else None
    if isinstance(progress, bool):
        return stderr_lines() if progress else None
    return progress


def _warn_eval_mode(model: torch.nn.Module) -> None:
    warn_at_the_callers_line(
        f"{type(model).__name__} is in eval mode; autockpt.plan measures its training step "
        "as it trains (after model.train()) and leaves it in eval mode "
        "(NOTE [Modes and the traced graph])"
    )


def _plan_compiled(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    read: Budget,
    share: RankShare,
    request: PlanRequest,
    max_compiles: int,
) -> Plan:
    """``plan(..., compile=True)``: the compiled search over eager plans of this budget."""
    if request.world_size != 1 or request.autocast_dtype is not None:
        raise ConfigError(
            "compile=True plans one process in full precision for now; drop world_size and "
            "autocast_dtype, or plan without compile"
        )
    spec = request.optimizer
    if isinstance(spec, torch.optim.Optimizer) or (
        isinstance(spec, str) and spec not in ("adamw", "sgd")
    ):
        raise ConfigError(
            f"compile=True runs real steps with optimizer 'adamw', 'sgd', None or a factory, "
            f"not {spec!r}; pass one of those (the state each keeps is counted)"
        )
    step_budget = StepBudget.on(read, request.device)

    def eager(budget_bytes: int | None) -> Plan:
        if budget_bytes is None:  # the plain step, nothing recomputed
            plain = dataclasses.replace(request, use_gradient_checkpointing=False)
            return _plan_round(model, example_inputs, step_budget, share, plain)
        lowered = step_budget.lowered(budget_bytes)
        return _plan_round(model, example_inputs, lowered, share, request)

    return plan_compiled(
        model,
        example_inputs,
        read.bytes,
        eager,
        loss_fn=request.loss_fn,
        example_targets=request.example_targets,
        optimizer=request.optimizer,
        device=request.device,
        max_compiles=max_compiles,
    )


def _plan_round(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    budget: StepBudget,
    share: RankShare,
    request: PlanRequest,
) -> Plan:
    """One rank's plan against ``budget`` (NOTE [One budget])."""
    # Probes draw random numbers (the caller's streams must not move); the step is measured
    # as it trains, whatever mode the model is in.
    try:
        with (
            random_streams_kept(request.device),
            cyclic_gc_paused(),
            one_cpu_thread() as cpu_threads,
            training_mode(model),
        ):
            if budget.usable_bytes <= 0 and share.offset_bytes > 0:
                raise InfeasibleBudgetError("", budget_bytes=budget.read.bytes, minimum_bytes=0)
            # NOTE [Loss over positions in chunks]: the loss whole, and in chunks.
            result = plan_step(model, example_inputs, budget, request, cpu_threads=cpu_threads)
    except InfeasibleBudgetError as error:
        if share.offset_bytes == 0:
            raise
        raise _rank_refusal(error, budget, share) from None
    except AutockptError:
        raise
    except Exception as error:  # the model's own, or a library's: never the caller's to parse
        raise PlanningError(
            f"planning {type(model).__name__} failed where no option could be left out "
            f"({describe_error(error)}); the traceback is this error's cause: train it "
            "without a plan, or with tracing='forward-hooks'"
        ) from error
    # NOTE [The batch's leaves, as planned]: the batch it was planned at says what carries it.
    size = batch_size_of(example_inputs)
    inputs_structure, inputs = carrying_leaves(example_inputs, size)
    targets_structure, targets = carrying_leaves(request.example_targets, size)
    leaves = BatchLeaves(
        inputs_structure=inputs_structure,
        inputs=inputs,
        targets_structure=targets_structure,
        targets=targets,
    )
    return _per_rank(result.model_copy(update={"batch_leaves": leaves}), budget, share)


def _rank_refusal(
    error: InfeasibleBudgetError, budget: StepBudget, share: RankShare
) -> InfeasibleBudgetError:
    """One process's refusal as one rank's (NOTE [Per-rank accounting] in
    :mod:`autockpt.planner.measure.sharding`): the states per rank and the levers ranks have."""
    minimum = max(error.minimum_bytes, budget.shown_bytes(0))
    read = budget.read
    return InfeasibleBudgetError(
        f"budget {read.text} ({format_bytes(read.bytes)}) per rank is below the minimum "
        f"{format_bytes(minimum)} of one of {share.world_size} ranks under "
        f"{share.parallelism} (states per rank: parameters "
        f"{format_bytes(share.parameters_bytes)}, gradients "
        f"{format_bytes(share.gradients_bytes)}, optimizer state "
        f"{format_bytes(share.optimizer_state_bytes)}); raise the budget to at least "
        f"{format_bytes(minimum * 1.05)}, lower the batch size"
        + (" or use more ranks" if share.parallelism == "fsdp" else " or use --strategy fsdp"),
        budget_bytes=read.bytes,
        minimum_bytes=minimum,
    )


def _per_rank(result: Plan, budget: StepBudget, share: RankShare) -> Plan:
    """One process's plan, its peaks already one rank's (NOTE [One budget]), with the
    breakdown showing the rank's states (NOTE [Per-rank accounting])."""
    if share.parallelism == "single":
        return result
    old = result.breakdown
    peak = result.predicted_peak_bytes
    tensors = peak - old.context_bytes
    headroom = tensors - int(tensors / (1.0 + budget.headroom_fraction))
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
            "breakdown": breakdown,
            "world_size": share.world_size,
            "parallelism": share.parallelism,
        }
    )


def _resolve_device(model: torch.nn.Module, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")
