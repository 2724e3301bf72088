"""The ``transformers.Trainer`` callback: plan the model's training step for the shapes of
batch the run gives, under a byte budget, and train with the plans.

NOTE [Planning under transformers.Trainer]
*When.* A Trainer callback is never handed a batch, so at ``on_train_begin`` the callback puts a
forward pre-hook on the model, and every call the Trainer makes with gradients on (a training
step's ``model(**inputs)``, the batch already on the device) is checked before it runs: the
plan made for the smallest shapes that hold the batch is put in, and a batch no plan holds for
(a longer padded batch) is planned first, at its shape bucket (NOTE [Plans that follow the
shapes of a run] in :mod:`autockpt.plans_by_shape`; ``max_shape`` plans once for the
largest, ``replan=False`` refuses instead). The batch, the optimizer the Trainer built and its
precision are all known then, and nothing has been allocated for the step yet. Planning runs on
copies and forks the random streams, so the steps, the data order and the dropout masks are the
plain run's. Evaluation calls (no gradients) never plan. A plan that recomputes the model's own
``forward`` whole (not one of its submodules) is put in one call late: the module's ``forward``
is read before its pre-hooks run.

*What.* The planner measures ``model(**batch)`` and the backward of the loss the model returns
(:class:`~autockpt.hf.step.HuggingFaceStep`), with module-level segments; where the model's
loss is its ``loss_function`` on its logits, the model and that loss apart, so that the head
and the loss can run in chunks of positions (NOTE [The model's own loss in chunks] in
:mod:`autockpt.hf.own_loss`; ``allow_loss_chunks=False`` keeps them whole); the optimizer's state
is counted from the Trainer's optimizer (fused kernels included), ``bf16`` and ``fp16`` measure
under autocast, ``gradient_accumulation_steps > 1`` counts every gradient from the start of a
step (``plan(..., gradients_live=True)``). The planned submodules go into the model the Trainer
holds (:class:`~autockpt.installed_plan.InstalledPlan`): same parameters, same ``state_dict``
keys, so the Trainer's checkpoints and ``save_pretrained`` are the plain run's; evaluation runs
the same computation. They come out again when training ends.

*Micro-batches.* The Trainer runs one forward and one backward per batch and accumulates
gradients itself, so the plan does not split the batch: a budget only micro-batches would meet
is refused with the Trainer's way out (a smaller ``per_device_train_batch_size`` and
``gradient_accumulation_steps``).

*Hugging Face's checkpointing.* ``args.gradient_checkpointing`` (``activation_checkpointing``)
recomputes every layer. With MemoryPlan the plan wins: the callback turns the model's own
checkpointing off and says so in one line, and the plan recomputes what the budget needs.

*Resuming.* The plans are the callback's state (``ExportableState``) in each checkpoint's
``trainer_state.json``; a run resumed from a checkpoint takes them again without planning,
whether or not ``args.restore_callback_states_from_checkpoint`` is set.

*Ranks.* Under several ranks (``torchrun``, ``accelerate launch``: DDP, every rank holding
the whole model) each rank's batch shapes are gathered and every rank decides on the largest
(NOTE [Plans that follow the shapes of a run]); rank 0 plans, counting DDP's gradient buckets
(``world_size``), and every rank takes its plan (one broadcast), so all ranks recompute the
same submodules and run the same chunks. FSDP and DeepSpeed shard what the plan counts whole
and are refused in one line.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from rich.console import Console
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

import autockpt
from autockpt import Budget, Plan
from autockpt.errors import ConfigError, InfeasibleBudgetError, PlanMismatchError
from autockpt.hf.own_loss import (
    LogitsStep,
    OwnLoss,
    OwnLossInChunks,
    loss_targets,
    model_inputs,
    own_loss_split,
)
from autockpt.hf.step import HuggingFaceStep, output_loss
from autockpt.installed_plan import InstalledPlan
from autockpt.planner.core.batch_split import batch_shapes
from autockpt.planner.core.units import read_unless_auto
from autockpt.planner.trace.output_head import find_head_by_running
from autockpt.plans_by_shape import (
    MAX_PLANS,
    PlansByShape,
    ShapeFollowing,
    batch_over_ranks,
    plan_from_rank_zero,
)

__all__ = ["MemoryPlan"]


class MemoryPlan(TrainerCallback, ExportableState):  # type: ignore[misc]
    """Plan the model's training step under ``transformers.Trainer`` to fit ``budget`` (NOTE
    [Planning under transformers.Trainer]).

    Args:
        budget: bytes as an ``int``, or ``"8GB"``, ``"3.5GiB"``, ``"auto"`` (CUDA: the free
            memory less a margin), or a :class:`~autockpt.Budget` already read. Read here: one
            that is not a size raises :class:`~autockpt.BudgetError` at once.
        use_gradient_checkpointing: ``None`` lets the planner choose for the budget, ``True``
            recomputes every segment, ``False`` none.
        allow_chunks: let the plan run batch-separable segments in chunks. With dropout on,
            each chunk draws its own masks: turn it off where the losses must be the unplanned
            run's bit for bit (recompute alone keeps the masks).
        show: print the first plan's table when it is made, a line for each later plan,
            and the run's count of plans at its end.
        max_shape: the batch's leading dimensions at their largest (``(8, 2048)``: 8
            sequences of 2048 tokens): one plan, made at the first step for that shape, holds
            for every batch under it (NOTE [Plans that follow the shapes of a run]).
        replan: plan a batch no plan holds for (a longer padded batch) before its step;
            ``False`` refuses it in one line (:class:`~autockpt.ShapeError`).
        max_plans: plans made at most; past that, one for the largest shape seen.
        allow_loss_chunks: let the plan run the model's head and its own loss in chunks of
            positions where the logits are the peak (NOTE [The model's own loss in chunks]).

    Example:
        trainer = transformers.Trainer(
            model, args, train_dataset=data, callbacks=[autockpt.hf.MemoryPlan("8GB")]
        )
    """

    def __init__(
        self,
        budget: str | int | Budget = "auto",
        *,
        use_gradient_checkpointing: bool | None = None,
        allow_chunks: bool = True,
        show: bool = True,
        max_shape: Sequence[int] | None = None,
        replan: bool = True,
        max_plans: int = MAX_PLANS,
        allow_loss_chunks: bool = True,
    ) -> None:
        # NOTE [One budget]: read once, here; ``auto`` needs the device, read at the first step.
        self.budget = read_unless_auto(budget)
        self.use_gradient_checkpointing = use_gradient_checkpointing
        self.allow_chunks = allow_chunks
        self.show = show
        self.max_shape = tuple(max_shape) if max_shape is not None else None
        self.replan = replan
        self.max_plans = max_plans
        self.allow_loss_chunks = allow_loss_chunks
        self.plan: Plan | None = None
        """The plan in use, once the first training step has started."""
        self.plans_json: list[str] = []
        """The plans a checkpoint saved, taken again when a run resumes from it."""
        self.plan_json: str | None = None
        """The one plan a checkpoint of an earlier release saved."""
        self.shape_plans: PlansByShape[torch.nn.Module] = PlansByShape(
            ShapeFollowing.read(max_shape, replan=replan, max_plans=max_plans),
            refusal="plan for the largest batch (MemoryPlan(..., max_shape={max_shape}))",
        )
        """The run's plans, one per shape bucket: ``.plans``, ``.num_plans``, ``.planning_s``."""
        self._installed: InstalledPlan | None = None
        self._own_loss: OwnLossInChunks | None = None
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._model: torch.nn.Module | None = None
        self._planning = False

    # ------------------------------------------------------------------ Trainer events

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the settings and the plans (``ExportableState``)."""
        budget = self.budget.text if isinstance(self.budget, Budget) else self.budget
        plans = [entry.plan.model_dump_json() for entry in self.shape_plans.planned]
        return {
            "args": {
                "budget": budget,
                "use_gradient_checkpointing": self.use_gradient_checkpointing,
                "allow_chunks": self.allow_chunks,
                "show": self.show,
                "max_shape": list(self.max_shape) if self.max_shape is not None else None,
                "replan": self.replan,
                "max_plans": self.max_plans,
                "allow_loss_chunks": self.allow_loss_chunks,
            },
            "attributes": {"plans_json": plans or self.plans_json},
        }

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        if model is None:
            raise ConfigError("MemoryPlan needs the Trainer's model; pass it to Trainer(model=)")
        if args.world_size > 1 and (args.fsdp or args.deepspeed):
            raise ConfigError(
                f"MemoryPlan plans DDP ranks, each holding the whole model, not "
                f"{'FSDP' if args.fsdp else 'DeepSpeed'}'s shards; train with DDP (drop "
                "TrainingArguments' fsdp/deepspeed), or remove the callback"
            )
        self._turn_off_hugging_face_checkpointing(args, model)
        # Loaded from the checkpoint a run resumes from: a dict by callback name.
        states: Any = state.stateful_callbacks or {}
        saved = states.get(type(self).__name__) if isinstance(states, dict) else None
        if isinstance(saved, dict) and not self.plans_json:
            attributes = saved.get("attributes", {})
            self.plans_json = list(attributes.get("plans_json") or [])
            if not self.plans_json and attributes.get("plan_json"):
                self.plans_json = [attributes["plan_json"]]
        if not self.plans_json and self.plan_json:  # restored by an earlier release's state
            self.plans_json = [self.plan_json]
        if not self._hooks:
            self._model = model
            hook = functools.partial(self._before_training_call, args, state, optimizer)
            self._hooks = [
                model.register_forward_pre_hook(hook, with_kwargs=True),
                # NOTE [The model's own loss in chunks]: the head put back, even on an error.
                model.register_forward_hook(
                    self._after_call, with_kwargs=True, always_call=True, prepend=True
                ),
            ]

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.show and self.shape_plans.num_plans > 1 and state.is_world_process_zero:
            Console().print(
                f"autockpt: {self.shape_plans.num_plans} plans for the run's batch shapes, "
                f"{self.shape_plans.planning_s:.1f} s of planning"
            )
        self._remove()

    # ------------------------------------------------------------------ planning

    def _before_training_call(
        self,
        args: TrainingArguments,
        state: TrainerState,
        optimizer: torch.optim.Optimizer | None,
        module: torch.nn.Module,
        call_args: tuple[Any, ...],
        call_kwargs: dict[str, Any],
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The forward pre-hook: before each training call, the plan of its batch's shapes,
        planned now where none holds for it (NOTE [Planning under transformers.Trainer]);
        the call without its labels where the plan runs the model's own loss in chunks."""
        if (
            self._planning
            or module is not self._model
            or not (module.training and torch.is_grad_enabled())
        ):
            return None  # an evaluation call, or planning's own runs of the model (hooks and all)
        if call_args:
            raise ConfigError(
                f"the model was called with {len(call_args)} positional inputs; MemoryPlan "
                "plans the call transformers.Trainer makes, model(**batch)"
            )
        batch = dict(call_kwargs)
        if not self.shape_plans.planned and self.plans_json:
            self._take_saved_plans(module, batch)
        made = self.shape_plans.num_plans

        def make(inputs: list[Any], targets: list[Any]) -> tuple[Plan, torch.nn.Module]:
            del targets  # the model computes its own loss
            self._planning = True  # planning times the model itself: its calls are not steps
            try:
                plan = plan_from_rank_zero(
                    lambda: self._plan(module, inputs[0], args, optimizer), args.world_size
                )
            finally:
                self._planning = False
            return plan, _planned_step(module, plan)

        # NOTE [Plans that follow the shapes of a run]: every rank decides on the same shapes.
        entry = self.shape_plans.follow((batch_over_ranks(batch, args.world_size),), (), make)
        if self._installed is None or entry.plan is not self.plan:
            if self._installed is not None:
                self._installed.remove()
            self._installed = InstalledPlan(module, entry.runner)
            chunks = entry.plan.loss_chunks
            self._own_loss = OwnLossInChunks(module, chunks) if chunks is not None else None
            self.plan = entry.plan
        if self.show and self.shape_plans.num_plans > made and state.is_world_process_zero:
            from autockpt.plan_report import print_run_plan

            plans = self.shape_plans
            print_run_plan(Console(), entry.plan, plans.num_plans, plans.planning_s)
        if self._own_loss is not None and "labels" in batch:
            return call_args, self._own_loss.before(batch)
        return None

    def _after_call(
        self,
        module: torch.nn.Module,
        call_args: tuple[Any, ...],
        call_kwargs: dict[str, Any],
        output: Any,
    ) -> Any:
        """The forward hook: the head and the model's own loss in chunks of positions after
        a training call whose labels :meth:`_before_training_call` took out (NOTE [The
        model's own loss in chunks]); every other call's output as it is."""
        return self._own_loss.after(output) if self._own_loss is not None else output

    def _take_saved_plans(self, module: torch.nn.Module, batch: dict[str, Any]) -> None:
        """The plans of the checkpoint a run resumed from, for the shapes each was made at;
        one made for another model is dropped (this one is planned instead)."""
        for text in self.plans_json:
            plan = Plan.model_validate_json(text)
            try:
                planned = _planned_step(module, plan)
            except PlanMismatchError:
                continue
            shapes = plan.batch_shapes or batch_shapes((batch,), ())
            self.shape_plans.add(shapes, plan, planned)

    def _plan(
        self,
        model: torch.nn.Module,
        batch: dict[str, Any],
        args: TrainingArguments,
        optimizer: torch.optim.Optimizer | None,
    ) -> Plan:
        parameter = next(model.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
        budget = (
            self.budget
            if isinstance(self.budget, Budget)
            else autockpt.parse_budget(self.budget, device=device)
        )
        autocast_dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
        # NOTE [The model's own loss in chunks]: the model and its loss apart, where they split.
        split = own_loss_split(model, batch) if self.allow_loss_chunks else None
        step: torch.nn.Module = HuggingFaceStep(model)
        inputs: tuple[Any, ...] = (batch,)
        loss: dict[str, Any] = {"loss_fn": output_loss, "allow_loss_chunks": False}
        if isinstance(split, OwnLoss):
            step, inputs = LogitsStep(model), (model_inputs(batch),)
            loss = {"loss_fn": split, "example_targets": loss_targets(batch)}
        try:
            plan = autockpt.plan(
                step,
                inputs,
                budget,
                **loss,
                optimizer=_unwrapped(optimizer) if optimizer is not None else "adamw",
                device=device,
                use_gradient_checkpointing=self.use_gradient_checkpointing,
                allow_micro_batches=False,
                allow_chunks=self.allow_chunks,
                autocast_dtype=autocast_dtype,
                tracing="forward-hooks",
                gradients_live=args.gradient_accumulation_steps > 1,
                world_size=args.world_size,
            )
        except InfeasibleBudgetError as error:
            raise InfeasibleBudgetError(
                f"{error} (transformers.Trainer: the plan does not split the batch; for "
                "micro-batches divide per_device_train_batch_size by N and multiply "
                "gradient_accumulation_steps by N)",
                budget_bytes=error.budget_bytes,
                minimum_bytes=error.minimum_bytes,
                bound=error.bound,
            ) from None
        plain = plan.num_recomputed == 0 and not any(s.num_chunks > 1 for s in plan.segments)
        if isinstance(split, OwnLoss) and plan.loss_chunks is None and not plain:
            head = find_head_by_running(step, inputs)
            split = head if isinstance(head, str) else None
        if isinstance(split, str) and not plain:
            note = f"the model's own loss is not run in chunks of positions: {split}"
            plan = plan.model_copy(update={"notes": [*plan.notes, note]})
        return plan

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _turn_off_hugging_face_checkpointing(
        args: TrainingArguments, model: torch.nn.Module
    ) -> None:
        asked = getattr(args, "activation_checkpointing", None) or getattr(
            args, "gradient_checkpointing", None
        )
        if not asked:
            return
        for name in ("activation_checkpointing_disable", "gradient_checkpointing_disable"):
            turn_off = getattr(model, name, None)
            if callable(turn_off):
                turn_off()
                break
        warnings.warn(
            "args.gradient_checkpointing and MemoryPlan both recompute: the plan wins (it "
            "recomputes what the budget needs), and the model's own checkpointing of every "
            "layer is off for this run; drop the flag to silence this, or the callback to keep it",
            stacklevel=2,
        )

    def _remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._own_loss = None
        if self._installed is not None:
            self._installed.remove()
            self._installed = None


def _planned_step(module: torch.nn.Module, plan: Plan) -> torch.nn.Module:
    """The plan applied to the step it was made for: its planned submodules, which
    :class:`~autockpt.installed_plan.InstalledPlan` puts into the model. A plan that runs the
    head and the model's own loss in chunks is applied without them (the head stays the
    model's; :class:`~autockpt.hf.own_loss.OwnLossInChunks` stands it aside per call)."""
    if plan.loss_chunks is None:
        return autockpt.apply(HuggingFaceStep(module), plan)
    return autockpt.apply(LogitsStep(module), plan.model_copy(update={"loss_chunks": None}))


def _unwrapped(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer inside accelerate's wrapper (whose state is the wrapped one's)."""
    inner = getattr(optimizer, "optimizer", None)
    return _unwrapped(inner) if isinstance(inner, torch.optim.Optimizer) else optimizer
