"""The Lightning callback: plan the LightningModule's training step on the first batch, under a
byte budget, and train with the plan.

NOTE [Planning a LightningModule]
*When.* On the first training batch (``on_train_batch_start``, the batch already on the
device), before its step: the batch size, the optimizer Lightning built, the precision and the
number of ranks are all known then, and nothing has been allocated for the step yet.

*What.* Where ``training_step`` calls the module's own ``forward`` and torch.fx traces it, the
planner plans that ``forward`` with fx, the rest of the step being the loss (NOTE [Tracing a
LightningModule's forward]); it is as low as the library plans. Otherwise it measures the real
``training_step(batch, batch_idx)`` and the backward of the loss it returns
(:class:`~autockpt.lightning.step.LightningStep`), with module-level segments, on a copy of the
module that sees the trainer and logs nothing. The optimizer's state is counted from the optimizer
Lightning built, ``"bf16-mixed"`` and ``"16-mixed"`` measure under autocast. The plan is put
into the LightningModule Lightning trains (its planned ``forward``,
:class:`~autockpt.lightning.forward_plan.InstalledForward`, or its planned submodules,
:class:`~autockpt.installed_plan.InstalledPlan`):
same parameters, same ``state_dict`` keys; evaluation, validation and prediction run the same
computation (a recomputed submodule only changes what backward keeps).

NOTE [Gradients in Lightning's step]
Lightning zeroes the gradients after ``training_step`` and before ``backward`` (at the first
batch of each accumulation window), so the last step's gradients are alive through the
forward: a peak the planner's plain step (gradients freed before the forward) does not have.
The callback frees them itself at the start of each such batch (they are about to be zeroed
anyway; the gradients and the steps are the same), and with ``accumulate_grad_batches > 1``
the plan counts every gradient as alive from the start of every batch
(``plan(..., gradients_live=True)``), which the batches inside a window have.

*Micro-batches.* Lightning runs one forward and one backward per batch and accumulates
gradients over batches itself (``accumulate_grad_batches``), so the plan does not split the
batch: a budget only micro-batches would meet is refused with the way out Lightning has
(a smaller ``batch_size`` and ``accumulate_grad_batches``).

*Ranks.* Under a multi-rank strategy rank 0 plans and every rank takes its plan (one
broadcast), so all ranks recompute the same submodules.

*Resuming.* The plan is the callback's state in Lightning's checkpoints: a run resumed with
``ckpt_path=`` puts the same plan back without planning again, and so takes the same steps.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from rich.console import Console

import autockpt
from autockpt import Budget, Plan
from autockpt.errors import InfeasibleBudgetError, PlanMismatchError, PlanningError, TraceError
from autockpt.installed_plan import InstalledPlan
from autockpt.lightning.forward_plan import InstalledForward, LossAfterForward, forward_inputs
from autockpt.lightning.step import LightningStep, step_loss
from autockpt.planner.core.units import read_unless_auto

__all__ = ["MemoryPlan"]

#: Lightning's precision settings that run the step under autocast, and its dtype.
AUTOCAST_DTYPES = {
    "bf16-mixed": torch.bfloat16,
    "16-mixed": torch.float16,
}


class MemoryPlan(pl.Callback):
    """Plan the LightningModule's training step to fit ``budget`` (NOTE [Planning a
    LightningModule]).

    Args:
        budget: bytes as an ``int``, or ``"4GB"``, ``"3.5GiB"``, ``"auto"`` (CUDA: the free
            memory less a margin), or a :class:`~autockpt.Budget` already read. Read here:
            one that is not a size raises :class:`~autockpt.BudgetError` at once.
        use_gradient_checkpointing: ``None`` lets the planner choose for the budget, ``True``
            recomputes every segment, ``False`` none.
        allow_chunks: let the plan run batch-separable segments in chunks. With dropout on,
            each chunk draws its own masks: turn it off where the losses must be the unplanned
            run's bit for bit (recompute alone keeps the masks).
        show: print the plan table once, on rank 0.

    Example::

        trainer = lightning.Trainer(callbacks=[MemoryPlan(budget="4GB")], max_epochs=10)
        trainer.fit(model, train_dataloaders=loader)
    """

    def __init__(
        self,
        budget: str | int | Budget = "auto",
        *,
        use_gradient_checkpointing: bool | None = None,
        allow_chunks: bool = True,
        show: bool = True,
    ) -> None:
        super().__init__()
        # NOTE [One budget]: read once, here, so a typo fails where the callback is made;
        # ``auto`` needs the device, so it is read when the first batch is planned.
        self.budget = read_unless_auto(budget)
        self.use_gradient_checkpointing = use_gradient_checkpointing
        self.allow_chunks = allow_chunks
        self.show = show
        self.plan: Plan | None = None
        """The plan in use, once the first training batch has started."""
        self._saved_plan: Plan | None = None
        self._installed: InstalledPlan | InstalledForward | None = None

    # ------------------------------------------------------------------ Lightning hooks

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx % trainer.accumulate_grad_batches == 0:
            # NOTE [Gradients in Lightning's step]
            for optimizer in trainer.optimizers:
                optimizer.zero_grad(set_to_none=True)
        if self._installed is not None:
            return
        if not pl_module.automatic_optimization:
            raise autockpt.ConfigError(
                f"{type(pl_module).__name__} uses manual optimization; MemoryPlan plans the "
                "step Lightning runs with automatic optimization (remove the callback, or plan "
                "the model with autockpt.plan and autockpt.training_step)"
            )
        plan = self._saved_plan
        if plan is None:
            plan = self._plan_on_rank_zero(trainer, pl_module, batch, batch_idx)
        try:
            self._installed = _install(pl_module, plan, batch_idx, trainer)
        except PlanMismatchError:
            # A checkpoint's plan for another module: plan this one.
            plan = self._plan_on_rank_zero(trainer, pl_module, batch, batch_idx)
            self._installed = _install(pl_module, plan, batch_idx, trainer)
        self.plan = plan
        if self.show and trainer.is_global_zero and self._saved_plan is None:
            self._print(plan)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._remove()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._remove()

    def state_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.model_dump_json() if self.plan is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("plan")
        self._saved_plan = Plan.model_validate_json(saved) if saved else None

    # ------------------------------------------------------------------ planning

    def _plan_on_rank_zero(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> Plan:
        plan_json = None
        if trainer.is_global_zero:
            plan_json = self._plan(trainer, pl_module, batch, batch_idx).model_dump_json()
        plan_json = trainer.strategy.broadcast(plan_json, src=0)
        assert plan_json is not None, "rank 0 sends its plan"
        return Plan.model_validate_json(plan_json)

    def _plan(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> Plan:
        optimizers = trainer.optimizers
        budget = (
            self.budget
            if isinstance(self.budget, Budget)
            else autockpt.parse_budget(self.budget, device=pl_module.device)
        )
        options: dict[str, Any] = dict(
            optimizer=optimizers[0] if len(optimizers) == 1 else "adamw",
            device=pl_module.device,
            use_gradient_checkpointing=self.use_gradient_checkpointing,
            allow_micro_batches=False,
            allow_chunks=self.allow_chunks,
            allow_loss_chunks=False,  # Lightning runs the loss on the whole output itself
            autocast_dtype=AUTOCAST_DTYPES.get(str(trainer.precision)),
            world_size=trainer.world_size,
            gradients_live=trainer.accumulate_grad_batches > 1,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*module-level segments asked for.*")
            try:
                # NOTE [Tracing a LightningModule's forward]
                inputs = forward_inputs(pl_module, batch, batch_idx, trainer)
                if inputs is not None:
                    try:
                        return autockpt.plan(
                            pl_module,
                            inputs,
                            budget,
                            loss_fn=LossAfterForward(pl_module, batch_idx, trainer),
                            example_targets=(batch,),
                            tracing="fx",
                            **options,
                        )
                    except (TraceError, PlanningError):
                        pass  # module-level segments, below
                return autockpt.plan(
                    LightningStep(pl_module, batch_idx, trainer),
                    (batch,),
                    budget,
                    loss_fn=step_loss,
                    tracing="forward-hooks",
                    **options,
                )
            except InfeasibleBudgetError as error:
                raise InfeasibleBudgetError(
                    f"{error} (Lightning: the plan does not split the batch; for micro-batches "
                    "lower the DataLoader's batch_size by N and set "
                    "Trainer(accumulate_grad_batches=N))",
                    budget_bytes=error.budget_bytes,
                    minimum_bytes=error.minimum_bytes,
                    bound=error.bound,
                ) from None

    # ------------------------------------------------------------------ helpers

    def _print(self, plan: Plan) -> None:
        from autockpt.plan_report import print_plan

        print_plan(Console(), plan, budget_given=True)

    def _remove(self) -> None:
        if self._installed is not None:
            self._installed.remove()
            self._installed = None


def _install(
    pl_module: pl.LightningModule, plan: Plan, batch_idx: int, trainer: pl.Trainer
) -> InstalledPlan | InstalledForward:
    """Put ``plan`` into ``pl_module``: its traced ``forward``, or its planned submodules."""
    if plan.tracing == "fx":
        return InstalledForward(pl_module, autockpt.apply(pl_module, plan))
    step = LightningStep(pl_module, batch_idx, trainer)
    return InstalledPlan(pl_module, autockpt.apply(step, plan))
