"""The Lightning callback: plan the LightningModule's training step for the shapes of batch
the run gives, under a byte budget, and train with the plans.

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

*Resuming.* The plans are the callback's state in Lightning's checkpoints: a run resumed with
``ckpt_path=`` puts the same plans back without planning again, and so takes the same steps.

*Shapes.* Every batch is checked before its step: the plan made for the smallest shapes that
hold it is put in, and a batch no plan holds for (a longer padded sequence) is planned first,
at its shape bucket (NOTE [Plans that follow the shapes of a run] in
:mod:`autockpt.plans_by_shape`; ``max_shape`` plans once for the largest,
``replan=False`` refuses instead). Under several ranks, each rank's batch shapes are gathered
first and the decision is made on the largest of them, so that all ranks plan together.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
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
from autockpt.planner.core.batch_split import batch_shapes
from autockpt.planner.core.units import read_unless_auto
from autockpt.plans_by_shape import MAX_PLANS, PlansByShape, ShapeFollowing, batch_over_ranks

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
        show: print the first plan's table, a line for each later plan and the run's count
            of plans at its end, on rank 0.
        max_shape: the batch's leading dimensions at their largest (``(32, 2048)``: 32
            samples of 2048 positions): one plan, made at the first batch for that shape,
            holds for every batch under it (NOTE [Plans that follow the shapes of a run]).
        replan: plan a batch no plan holds for (a longer padded batch) before its step;
            ``False`` refuses it in one line (:class:`~autockpt.ShapeError`).
        max_plans: plans made at most; past that, one for the largest shape seen.

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
        max_shape: Sequence[int] | None = None,
        replan: bool = True,
        max_plans: int = MAX_PLANS,
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
        self.shape_plans: PlansByShape[None] = PlansByShape(
            ShapeFollowing.read(max_shape, replan=replan, max_plans=max_plans),
            refusal="plan for the largest batch (MemoryPlan(..., max_shape={max_shape}))",
        )
        """The run's plans, one per shape bucket: ``.plans``, ``.num_plans``, ``.planning_s``."""
        self._saved_plans: list[Plan] = []
        self._installed: InstalledPlan | InstalledForward | None = None

    # ------------------------------------------------------------------ Lightning hooks

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx % trainer.accumulate_grad_batches == 0:
            # NOTE [Gradients in Lightning's step]
            for optimizer in trainer.optimizers:
                optimizer.zero_grad(set_to_none=True)
        if not pl_module.automatic_optimization:
            raise autockpt.ConfigError(
                f"{type(pl_module).__name__} uses manual optimization; MemoryPlan plans the "
                "step Lightning runs with automatic optimization (remove the callback, or plan "
                "the model with autockpt.plan and autockpt.training_step)"
            )
        if self._saved_plans and not self.shape_plans.planned:
            self._take_saved_plans(trainer, pl_module, batch, batch_idx)
        made = self.shape_plans.num_plans

        def make(inputs: list[Any], targets: list[Any]) -> tuple[Plan, None]:
            del targets
            return self._plan_on_rank_zero(trainer, pl_module, inputs[0], batch_idx), None

        # NOTE [Plans that follow the shapes of a run]: every rank decides on the same shapes.
        entry = self.shape_plans.follow((batch_over_ranks(batch, trainer.world_size),), (), make)
        if self._installed is None or entry.plan is not self.plan:
            self._remove()
            self._installed = _install(pl_module, entry.plan, batch_idx, trainer)
            self.plan = entry.plan
        if self.show and trainer.is_global_zero and self.shape_plans.num_plans > made:
            self._print(entry.plan)

    def _take_saved_plans(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """The plans of the checkpoint a run resumed from; one made for another module is
        dropped (this one is planned instead)."""
        for plan in self._saved_plans:
            try:
                _install(pl_module, plan, batch_idx, trainer).remove()
            except PlanMismatchError:
                continue
            shapes = batch_shapes((batch,), ())
            if plan.batch_shapes is not None and plan.batch_shapes.structure == shapes.structure:
                shapes = plan.batch_shapes
            self.shape_plans.add(shapes, plan, None)
        self._saved_plans = []

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.show and trainer.is_global_zero and self.shape_plans.num_plans > 1:
            Console().print(
                f"autockpt: {self.shape_plans.num_plans} plans for the run's batch shapes, "
                f"{self.shape_plans.planning_s:.1f} s of planning"
            )
        self._remove()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._remove()

    def state_dict(self) -> dict[str, Any]:
        plans = [entry.plan.model_dump_json() for entry in self.shape_plans.planned]
        return {"plans": plans}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("plans") or ([state_dict["plan"]] if state_dict.get("plan") else [])
        self._saved_plans = [Plan.model_validate_json(text) for text in saved]

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
        from autockpt.plan_report import print_run_plan

        plans = self.shape_plans
        print_run_plan(Console(), plan, plans.num_plans, plans.planning_s)

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
