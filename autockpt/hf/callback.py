"""The ``transformers.Trainer`` callback: plan the model's training step at the first batch,
under a byte budget, and train with the plan.

NOTE [Planning under transformers.Trainer]
*When.* A Trainer callback is never handed a batch, so at ``on_train_begin`` the callback puts a
forward pre-hook on the model, and the first call the Trainer makes with gradients on (the first
training step's ``model(**inputs)``, the batch already on the device) plans: the batch, the
optimizer the Trainer built and its precision are all known then, and nothing has been
allocated for the step yet. Planning runs on copies and forks the random streams, so the steps,
the data order and the dropout masks are the plain run's. The hook then puts the plan into the
model and the call goes on, planned; evaluation calls (no gradients) never plan.

*What.* The planner measures ``model(**batch)`` and the backward of the loss the model returns
(:class:`~autockpt.hf.step.HuggingFaceStep`), with module-level segments; the optimizer's state
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

*Resuming.* The plan is the callback's state (``ExportableState``) in each checkpoint's
``trainer_state.json``; a run resumed from a checkpoint takes that plan again without planning,
whether or not ``args.restore_callback_states_from_checkpoint`` is set.

*Ranks.* One process for now: a run on several ranks is refused in one line.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from rich.console import Console
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

import autockpt
from autockpt import Budget, Plan
from autockpt.errors import ConfigError, InfeasibleBudgetError, PlanMismatchError
from autockpt.hf.step import HuggingFaceStep, output_loss
from autockpt.installed_plan import InstalledPlan
from autockpt.planner.core.units import read_unless_auto

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
        show: print the plan table once, when it is made.

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
    ) -> None:
        # NOTE [One budget]: read once, here; ``auto`` needs the device, read at the first step.
        self.budget = read_unless_auto(budget)
        self.use_gradient_checkpointing = use_gradient_checkpointing
        self.allow_chunks = allow_chunks
        self.show = show
        self.plan: Plan | None = None
        """The plan in use, once the first training step has started."""
        self.plan_json: str | None = None
        """The plan a checkpoint saved, taken again when a run resumes from it."""
        self._installed: InstalledPlan | None = None
        self._hook: torch.utils.hooks.RemovableHandle | None = None

    # ------------------------------------------------------------------ Trainer events

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the settings and the plan (``ExportableState``)."""
        budget = self.budget.text if isinstance(self.budget, Budget) else self.budget
        plan_json = self.plan.model_dump_json() if self.plan is not None else self.plan_json
        return {
            "args": {
                "budget": budget,
                "use_gradient_checkpointing": self.use_gradient_checkpointing,
                "allow_chunks": self.allow_chunks,
                "show": self.show,
            },
            "attributes": {"plan_json": plan_json},
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
        if args.world_size > 1:
            raise ConfigError(
                f"MemoryPlan plans one process for now, not {args.world_size} ranks; train on "
                "one device, or remove the callback"
            )
        self._turn_off_hugging_face_checkpointing(args, model)
        # Loaded from the checkpoint a run resumes from: a dict by callback name.
        states: Any = state.stateful_callbacks or {}
        saved = states.get(type(self).__name__) if isinstance(states, dict) else None
        if isinstance(saved, dict) and self.plan_json is None:
            self.plan_json = saved.get("attributes", {}).get("plan_json")
        if self._installed is None and self._hook is None:
            hook = functools.partial(self._plan_first_step, args, state, optimizer)
            self._hook = model.register_forward_pre_hook(hook, with_kwargs=True)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._remove()

    # ------------------------------------------------------------------ planning

    def _plan_first_step(
        self,
        args: TrainingArguments,
        state: TrainerState,
        optimizer: torch.optim.Optimizer | None,
        module: torch.nn.Module,
        call_args: tuple[Any, ...],
        call_kwargs: dict[str, Any],
    ) -> None:
        """The forward pre-hook: plan on the first training call, put the plan in, go on."""
        if not (module.training and torch.is_grad_enabled()):
            return  # an evaluation before training (eval_on_start)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if call_args:
            raise ConfigError(
                f"the model was called with {len(call_args)} positional inputs; MemoryPlan "
                "plans the call transformers.Trainer makes, model(**batch)"
            )
        batch = dict(call_kwargs)
        plan = self.plan  # a second train() of the same Trainer takes the plan it made
        if plan is None and self.plan_json:
            plan = Plan.model_validate_json(self.plan_json)
        planned_here = plan is None
        if plan is None:
            plan = self._plan(module, batch, args, optimizer)
        try:
            self._installed = InstalledPlan(module, autockpt.apply(HuggingFaceStep(module), plan))
        except PlanMismatchError:
            # A checkpoint's plan for another model: plan this one.
            plan, planned_here = self._plan(module, batch, args, optimizer), True
            self._installed = InstalledPlan(module, autockpt.apply(HuggingFaceStep(module), plan))
        self.plan = plan
        if self.show and planned_here and state.is_world_process_zero:
            from autockpt.plan_report import print_plan

            print_plan(Console(), plan, budget_given=True)

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
        try:
            inputs: tuple[Any, ...] = (batch,)
            return autockpt.plan(
                HuggingFaceStep(model),
                inputs,
                budget,
                loss_fn=output_loss,
                optimizer=_unwrapped(optimizer) if optimizer is not None else "adamw",
                device=device,
                use_gradient_checkpointing=self.use_gradient_checkpointing,
                allow_micro_batches=False,
                allow_chunks=self.allow_chunks,
                allow_loss_chunks=False,  # the model computes its loss on the whole logits
                autocast_dtype=autocast_dtype,
                tracing="forward-hooks",
                gradients_live=args.gradient_accumulation_steps > 1,
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
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._installed is not None:
            self._installed.remove()
            self._installed = None


def _unwrapped(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer inside accelerate's wrapper (whose state is the wrapped one's)."""
    inner = getattr(optimizer, "optimizer", None)
    return _unwrapped(inner) if isinstance(inner, torch.optim.Optimizer) else optimizer
