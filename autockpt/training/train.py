"""Training the TFT under a memory budget: plan once, then a plain AdamW loop.

:func:`train` takes what :func:`autockpt.training.prepare.prepare` resolved (device, data, model, plan)
and runs the loop in a :class:`Trainer`: planned steps, validation on the unplanned model
(:mod:`autockpt.training.evaluate`), early stopping, and the run folder
(:mod:`autockpt.training.runs`) written at the end of each epoch.

The trainer measures every step's peak with :mod:`autockpt.training.step_memory` and re-plans
when a step goes over (NOTE [Enforcing the budget] there). What it saves at the end of each
epoch, and how a run continues from it, is in :mod:`autockpt.training.checkpoint`
(NOTE [Exact resume] there). The learning-rate schedule is in :mod:`autockpt.training.schedule`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

import torch

import autockpt
from autockpt.errors import DeviceError
from autockpt.planner.units import format_bytes, parse_budget
from autockpt.training.checkpoint import (
    RunState,
    gather_random_states,
    gather_states,
    model_checkpoint,
    restore_random_states,
    restore_states,
    restored_run_state,
    resume_checkpoint,
)
from autockpt.training.distributed import agree_on_plan, plan_digest, rank_slice, wrap
from autockpt.training.evaluate import evaluate
from autockpt.training.planning import make_plan
from autockpt.training.prepare import Setup, autocast
from autockpt.training.progress import Reporter
from autockpt.training.runs import BEST_FILE, LAST_FILE, RunFolder
from autockpt.training.schedule import learning_rate_factor
from autockpt.training.settings import seed_everything
from autockpt.training.step_memory import StepMemoryMeter
from tft.data import iterate_batches

#: Share of the budget a re-plan aims at after a step went over (NOTE [Enforcing the budget]
#: in :mod:`autockpt.training.step_memory`).
REPLAN_FRACTION = 0.9
#: Re-plans allowed in one run before the trainer gives up.
MAX_REPLANS = 3


class Trainer:
    """Runs epochs of planned training steps and validation, writing the run folder."""

    def __init__(self, setup: Setup, run: RunFolder, reporter: Reporter) -> None:
        self.setup = setup
        self.run = run
        self.reporter = reporter
        self.config = setup.config
        self.model = setup.model
        self.world = setup.world
        self.plan = setup.plan
        self.parallelism = setup.parallelism
        self.planned = wrap(
            autockpt.apply(self.model, self.plan),
            self.world,
            setup.device,
            parallelism=self.parallelism,
            model=self.model,
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        num_batches = len(setup.data.train) // setup.global_batch_size
        assert num_batches > 0, "prepare() checks there is a full batch"
        self.steps_per_epoch = min(num_batches, self.config.max_steps_per_epoch or num_batches)
        factor = learning_rate_factor(self.config, self.steps_per_epoch * self.config.epochs)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        use_scaler = setup.autocast_dtype == torch.float16
        self.scaler = torch.amp.GradScaler(setup.device.type) if use_scaler else None
        self.meter = StepMemoryMeter(
            setup.device, self.model, self.optimizer, self.plan, parallelism=self.parallelism
        )
        self.state = RunState()
        self.pending: list[dict[str, Any]] = []
        """Records of the epoch in progress, written to metrics.jsonl when it ends."""
        self.gave_up_replanning = False

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Continue from ``last.pt``; see NOTE [Exact resume] in
        :mod:`autockpt.training.checkpoint`."""
        restore_states(
            checkpoint,
            model=self.model,
            planned=self.planned,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            parallelism=self.parallelism,
        )
        self.state = restored_run_state(checkpoint)
        tightened = self.state.planning_budget_bytes
        if tightened is not None and tightened < self.plan.budget_bytes:
            self.use_plan_for(tightened)
        restore_random_states(checkpoint, self.world.rank)

    # -------------------------------------------------------------- the run

    def fit(self) -> dict[str, Any]:
        """Train until the last epoch or early stopping; returns the summary record."""
        config = self.config
        self.model.train()
        self.reporter.start(
            num_epochs=config.epochs,
            first_epoch=self.state.epoch,
            steps_per_epoch=self.steps_per_epoch,
        )
        self.record_plan_agreement()
        stopped = "finished" if self.state.epoch < config.epochs else "already finished"
        while self.state.epoch < config.epochs:
            if self.state.epochs_without_improvement >= config.patience:
                stopped = f"early stop: no better validation loss for {config.patience} epochs"
                break
            self.run_epoch()
        summary = self.summary(stopped)
        if self.world.is_main:
            self.run.append_metrics([summary])
        self.reporter.finish(summary)
        return summary

    def run_epoch(self) -> None:
        config, setup = self.config, self.setup
        epoch_index = self.state.epoch  # 0-based; records count epochs from 1
        started = time.perf_counter()
        batches = iterate_batches(
            setup.data.train,
            setup.global_batch_size,
            shuffle=True,
            seed=config.seed + epoch_index,
            drop_last=True,
        )
        losses, epoch_peak = [], 0
        for step_in_epoch, global_batch in enumerate(
            islice(batches, self.steps_per_epoch), start=1
        ):
            batch = rank_slice(global_batch, self.world)
            inputs = tuple(t.to(setup.device) for t in batch.inputs())
            target = batch.target.to(setup.device)
            lr = self.scheduler.get_last_lr()[0]
            step_started = time.perf_counter()
            loss, peak_bytes = self.step(inputs, target)
            step_s = time.perf_counter() - step_started
            self.state.global_step += 1
            self.state.step_seconds.append(step_s)
            losses.append(loss)
            epoch_peak = max(epoch_peak, peak_bytes)
            record = {
                "kind": "step",
                "epoch": epoch_index + 1,
                "step": self.state.global_step,
                "step_in_epoch": step_in_epoch,
                "loss": loss,
                "lr": lr,
                "step_s": step_s,
                "samples_per_s": len(global_batch.target) / step_s,
                "peak_bytes": peak_bytes,
                "budget_bytes": self.budget_bytes,
            }
            self.pending.append(record)
            self.reporter.step(record)
            self.enforce_budget(peak_bytes)
        self.state.peak_bytes = max(self.state.peak_bytes, epoch_peak)
        self.finish_epoch(sum(losses) / len(losses), epoch_peak, time.perf_counter() - started)

    def finish_epoch(self, train_loss: float, epoch_peak: int, epoch_s: float) -> None:
        config = self.config
        evaluation = evaluate(
            self.setup,
            self.setup.data.validation,
            max_batches=config.max_steps_per_epoch,
            model=self.planned if self.parallelism == "fsdp" else None,
        )
        score = evaluation.loss if evaluation is not None else train_loss
        improved = self.state.best_val_loss is None or score < self.state.best_val_loss
        self.state.epoch += 1
        if improved:
            self.state.best_val_loss = score
            self.state.epochs_without_improvement = 0
        else:
            self.state.epochs_without_improvement += 1
        record = {
            "kind": "epoch",
            "epoch": self.state.epoch,
            "num_epochs": config.epochs,
            "step": self.state.global_step,
            "train_loss": train_loss,
            "val_loss": evaluation.loss if evaluation else None,
            "val_mae": evaluation.mae if evaluation else None,
            "val_rmse": evaluation.rmse if evaluation else None,
            "val_coverage": evaluation.coverage if evaluation else None,
            "improved": improved,
            "peak_bytes": epoch_peak,
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.plan.predicted_peak_bytes,
            "val_windows": evaluation.num_windows if evaluation else 0,
            "epoch_s": epoch_s,
        }
        rng_by_rank = gather_random_states(self.world)
        states = gather_states(
            self.model, self.planned, self.optimizer, parallelism=self.parallelism
        )
        if self.world.is_main:
            if improved:
                best = model_checkpoint(self.setup, self.state, states[0])
                self.run.save_checkpoint(BEST_FILE, best)
            last = resume_checkpoint(
                self.setup,
                self.state,
                states,
                scheduler=self.scheduler,
                scaler=self.scaler,
                rng_by_rank=rng_by_rank,
            )
            self.run.save_checkpoint(LAST_FILE, last)
            self.run.append_metrics([*self.pending, record])
        self.pending = []
        self.reporter.epoch(record)

    def step(self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> tuple[float, int]:
        """One optimizer step; returns (loss, peak bytes by NOTE [Enforcing the budget] in
        :mod:`autockpt.training.step_memory`).

        With several ranks the loss is the mean over the ranks (the global batch's loss) and
        the peak the largest, so every rank makes the same re-plan decision.
        """
        with self.meter.measure(inputs, target) as measure:
            loss = self.forward_backward_with_retries(inputs, target)
            self.optimizer_step()
        return self.world.mean(loss), self.world.max(measure.peak_bytes)

    def forward_backward_with_retries(
        self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor
    ) -> float:
        """Forward and backward; on a CUDA out-of-memory, re-plan tighter and try again.

        Only forward and backward are retried: they change nothing but the gradients, which
        are dropped before the retry. The optimizer step runs once, after them.
        """
        while True:
            try:
                return self.forward_backward(inputs, target)
            except torch.OutOfMemoryError:
                if self.setup.device.type != "cuda":
                    raise
                if self.world.is_distributed:
                    # The other ranks are waiting in DDP's all-reduce; a retry here would not
                    # meet them, so the run stops and is resumed with a lower budget.
                    raise DeviceError(
                        f"CUDA ran out of memory on rank {self.world.rank} at step "
                        f"{self.state.global_step + 1}; lower --vram-budget or --batch-size, then "
                        f"continue the run with --resume {self.run.path}"
                    ) from None
                self.optimizer.zero_grad(set_to_none=True)
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(self.setup.device)
                step = self.state.global_step + 1
                if self.state.num_replans >= MAX_REPLANS:
                    raise DeviceError(
                        f"CUDA ran out of memory at step {step} after {MAX_REPLANS} re-plans; "
                        f"lower --vram-budget or --batch-size, then continue the run with "
                        f"--resume {self.run.path}"
                    ) from None
                self.replan(
                    int(self.planning_budget_bytes * REPLAN_FRACTION),
                    reason=f"CUDA ran out of memory at step {step}",
                )

    def forward_backward(self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> float:
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self.setup.loss_fn
        scale = 1.0
        if self.scaler is not None:
            # training_step runs backward itself, so the scaling goes into the loss it is given.
            scaler, unscaled = self.scaler, self.setup.loss_fn
            scale = float(scaler.get_scale())

            def loss_fn(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                return scaler.scale(unscaled(prediction, target))

        # FSDP reduce-scatters every micro-batch (NOTE [Distributed training]): no no_sync.
        no_sync = getattr(self.planned, "no_sync", None) if self.parallelism == "ddp" else None
        with autocast(self.setup):
            loss = autockpt.training_step(
                self.planned, self.plan, inputs, (target,), loss_fn, no_sync=no_sync
            )
        return float(loss.item()) / scale

    def optimizer_step(self) -> None:
        parameters = list(self.model.parameters())
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.config.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(parameters, self.config.grad_clip_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        # Under DDP the gradients are views of its buckets; zeroing them in place keeps them
        # there, where dropping them would make the micro-batches under no_sync accumulate
        # into fresh tensors and hold a second copy of every gradient.
        self.optimizer.zero_grad(set_to_none=self.parallelism != "ddp")

    # -------------------------------------------------------------- memory

    @property
    def budget_bytes(self) -> int | None:
        return self.setup.budget.bytes if self.setup.budget is not None else None

    @property
    def planning_budget_bytes(self) -> int:
        if self.state.planning_budget_bytes is not None:
            return self.state.planning_budget_bytes
        return self.plan.budget_bytes

    def enforce_budget(self, peak_bytes: int) -> None:
        """Re-plan tighter when a CPU step went over the budget; see NOTE [Enforcing the budget]
        in :mod:`autockpt.training.step_memory`."""
        budget = self.budget_bytes
        if budget is None or peak_bytes <= budget or self.setup.device.type == "cuda":
            return
        if self.parallelism == "fsdp" or self.state.num_replans >= MAX_REPLANS:
            if not self.gave_up_replanning:
                self.gave_up_replanning = True
                why = (
                    "FSDP runs do not re-plan (NOTE [FSDP and the planned model]); resume "
                    "with a lower --vram-budget"
                    if self.parallelism == "fsdp"
                    else f"after {MAX_REPLANS} re-plans; not re-planning again"
                )
                self.event(
                    f"step {self.state.global_step} peaked at {format_bytes(peak_bytes)}, over "
                    f"the budget {format_bytes(budget)}, {why}"
                )
            return
        self.replan(
            int(self.planning_budget_bytes * REPLAN_FRACTION),
            reason=(
                f"step {self.state.global_step} peaked at {format_bytes(peak_bytes)}, over the "
                f"budget {format_bytes(budget)}"
            ),
        )

    def replan(self, budget_bytes: int, *, reason: str) -> None:
        """Plan again for ``budget_bytes``, swap the planned model and log why."""
        self.use_plan_for(budget_bytes)
        self.state.num_replans += 1
        self.event(
            f"{reason}: re-planned for {format_bytes(budget_bytes)} "
            f"(predicted peak {format_bytes(self.plan.predicted_peak_bytes)}, "
            f"{self.plan.num_recomputed} segments recomputed, "
            f"{self.plan.num_micro_batches} micro-batches)"
        )
        self.record_plan_agreement()

    def use_plan_for(self, budget_bytes: int) -> None:
        """Plan for ``budget_bytes`` and train with that plan (same parameters, new wrapping)."""
        setup = self.setup
        self.plan = agree_on_plan(
            self.world,
            lambda: make_plan(
                self.model,
                setup.example_inputs,
                setup.example_targets,
                parse_budget(budget_bytes),
                loss_fn=setup.loss_fn,
                device=setup.device,
                config=self.config,
                autocast_dtype=setup.autocast_dtype,
                world_size=self.plan.world_size,
                parallelism=self.parallelism,
            ),
        )
        assert self.parallelism != "fsdp", "FSDP runs do not re-plan"
        self.meter.use_plan(self.plan)
        self.planned = wrap(autockpt.apply(self.model, self.plan), self.world, setup.device)
        self.state.planning_budget_bytes = budget_bytes
        if self.world.is_main:
            self.run.write_plan(self.plan.model_dump_json(indent=2))

    def record_plan_agreement(self) -> None:
        """Log which plan each rank runs (their digests must be equal), when there are ranks."""
        if not self.world.is_distributed:
            return
        digests = self.world.all_gather(plan_digest(self.plan))
        assert len(set(digests)) == 1, f"the ranks run different plans: {digests}"
        record = {
            "kind": "event",
            "step": self.state.global_step,
            "message": f"{self.world.world_size} ranks run plan {digests[0]}",
            "plan_digest_by_rank": digests,
        }
        self.pending.append(record)
        self.reporter.event(record)

    def event(self, message: str) -> None:
        record = {"kind": "event", "step": self.state.global_step, "message": message}
        self.pending.append(record)
        self.reporter.event(record)

    def summary(self, stopped: str) -> dict[str, Any]:
        seconds = self.state.step_seconds
        return {
            "kind": "summary",
            "run_dir": str(self.run.path),
            "epochs_done": self.state.epoch,
            "stopped": stopped,
            "global_step": self.state.global_step,
            "best_val_loss": self.state.best_val_loss,
            "peak_bytes": self.state.peak_bytes,
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.plan.predicted_peak_bytes,
            "within_budget": self.budget_bytes is None
            or self.state.peak_bytes <= self.budget_bytes,
            "memory_measure": self.meter.description,
            "mean_step_s": sum(seconds) / len(seconds) if seconds else 0.0,
            "num_replans": self.state.num_replans,
            "world_size": self.world.world_size,
            "parallelism": self.parallelism,
        }


# ---------------------------------------------------------------------------- entry points


def train(
    setup: Setup, run: RunFolder, reporter: Reporter, *, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train (from ``checkpoint`` when resuming) and return the summary record."""
    trainer = Trainer(setup, run, reporter)
    if checkpoint is not None:
        trainer.restore(checkpoint)
    else:
        # Each rank draws its own dropout masks; rank 0's stream is the single process's.
        seed_everything(setup.config.seed + setup.world.rank)
    return trainer.fit()
