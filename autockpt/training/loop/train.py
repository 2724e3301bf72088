"""Training the TFT under a memory budget: plan once, then a plain AdamW loop.

:func:`train` takes what :func:`autockpt.training.setup.prepare.prepare` resolved (device, data, model, plan)
and runs the loop in a :class:`Trainer`: planned steps, validation on the unplanned model
(:mod:`autockpt.training.forecasts.evaluate`), early stopping, and the run folder
(:mod:`autockpt.training.setup.runs`) written at the end of each epoch.

The trainer measures the peaks of a sample of steps with :mod:`autockpt.training.loop.step_memory`
and re-plans (:mod:`autockpt.training.loop.replanning`) when a measured step goes over (NOTE
[Enforcing the budget]). On the CPU it sets its process's threads and malloc first
(:mod:`autockpt.training.host.host_tuning`). What it saves at the end of each epoch, and how a run
continues from it, is in :mod:`autockpt.training.setup.checkpoint` (NOTE [Exact resume] there). The
learning-rate schedule is in :mod:`autockpt.training.options.schedule`.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable
from typing import Any

import torch

import autockpt
from autockpt.errors import DeviceError
from autockpt.planner.core.host_settings import forked_devices
from autockpt.planner.verify import REPLANNING
from autockpt.training.forecasts.evaluate import evaluate
from autockpt.training.forecasts.held_out import score_test_windows
from autockpt.training.host.host_tuning import tune_host
from autockpt.training.host.progress import Reporter, scoring_progress
from autockpt.training.loop.memory_retry import (
    optimizer_step_retried_on_out_of_memory,
    retried_on_out_of_memory,
)
from autockpt.training.loop.prefetch import Prefetch, epoch_batches
from autockpt.training.loop.replanning import Replanner
from autockpt.training.loop.run_summary import run_summary, validation_record
from autockpt.training.loop.run_time import RunClock
from autockpt.training.loop.step_memory import StepMemoryMeter
from autockpt.training.loop.step_model import compiled_step
from autockpt.training.options.schedule import learning_rate_factor
from autockpt.training.options.settings import run_optimizer, seed_everything
from autockpt.training.setup.checkpoint import (
    RunState,
    gather_random_states,
    gather_states,
    model_checkpoint,
    restore_random_states,
    restore_states,
    restored_run_state,
    resume_checkpoint,
)
from autockpt.training.setup.prepare import Setup, autocast
from autockpt.training.setup.runs import BEST_FILE, LAST_FILE, RunFolder
from tft.data.windows import Batch


class Trainer:
    """Runs epochs of planned training steps and validation, writing the run folder.

    Its plan and planned model are held by a :class:`Replanner` (``self.plans``), which makes
    them again when a measured step goes over the budget.
    """

    def __init__(self, setup: Setup, run: RunFolder, reporter: Reporter) -> None:
        self.setup = setup
        self.run = run
        self.reporter, self.config, self.model = reporter, setup.config, setup.model
        self.world, self.parallelism = setup.world, setup.parallelism
        self.naive_losses: dict[str, float] | None = None
        """The naive forecasts' validation losses (NOTE [Naive forecasts]), once validated."""
        self.state = RunState()
        self.pending: list[dict[str, Any]] = []
        """Records of the epoch in progress, written to metrics.jsonl when it ends."""
        # Before the optimizer: under FSDP wrapping the planned model shards the parameters
        # the optimizer must hold.
        self.plans = Replanner(
            setup,
            run,
            new_plan=lambda plan: self.meter.use_plan(plan),
            compile_step=functools.partial(compiled_step, config=self.config),
            log=self.log,
        )
        optimizer_of = run_optimizer(setup.config, setup.device, setup.parallelism)  # planned for
        self.optimizer = optimizer_of(list(self.model.parameters()))
        num_batches = len(setup.data.train) // setup.global_batch_size
        assert num_batches > 0, "prepare() checks there is a full batch"
        self.steps_per_epoch = min(num_batches, self.config.max_steps_per_epoch or num_batches)
        self.clock = RunClock(setup, steps_per_epoch=self.steps_per_epoch)
        """The windows scored, and the run's times (NOTE [The run's expected time])."""
        factor = learning_rate_factor(self.config, self.steps_per_epoch * self.config.epochs)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        use_scaler = setup.autocast_dtype == torch.float16
        self.scaler = torch.amp.GradScaler(setup.device.type) if use_scaler else None
        self.meter = StepMemoryMeter(
            setup.device,
            self.model,
            self.optimizer,
            setup.plan,
            parallelism=self.parallelism,
            budget_bytes=setup.budget_bytes,
            check_every=self.config.memory_check_every,
        )
        self.data_wait_s = 0.0
        """This process's seconds waiting for a batch (NOTE [Prefetching batches])."""
        self.step_s_run = 0.0
        """This process's seconds in training steps (a resumed run's earlier ones not counted)."""
        self.upcoming: Prefetch[Batch] | None = None
        """The next epoch's batches, gathered ahead (NOTE [Prefetching batches])."""

    @property
    def budget_bytes(self) -> int | None:
        """The run's budget (``None``: none given)."""
        return self.plans.budget_bytes

    def enforce_budget(self, peak_bytes: int | None) -> None:
        """Re-plan when a measured step went over the budget (NOTE [Enforcing the budget])."""
        self.plans.enforce_budget(peak_bytes, self.state)

    def log(self, record: dict[str, Any]) -> None:
        """An event record for metrics.jsonl (at the epoch's end) and the progress display."""
        self.pending.append(record)
        self.reporter.event(record)

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Continue from ``last.pt``; see NOTE [Exact resume] in
        :mod:`autockpt.training.setup.checkpoint`."""
        restore_states(
            checkpoint,
            model=self.model,
            planned=self.plans.planned,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            parallelism=self.parallelism,
        )
        self.state = restored_run_state(checkpoint)
        tightened = self.state.planning_budget_bytes
        if tightened is not None and tightened < self.plans.plan.budget_bytes:
            self.plans.use_plan_for(tightened, self.state)
        restore_random_states(checkpoint, self.world.rank)

    # -------------------------------------------------------------- the run

    def fit(self) -> dict[str, Any]:
        """Train until the last epoch or early stopping; returns the summary record."""
        config = self.config
        self.model.train()
        # NOTE [Prefetching batches]: the epoch's shuffle starts before the run's bookkeeping.
        self.upcoming = epoch_batches(self.setup, self.state.epoch)
        try:
            self.reporter.start(
                num_epochs=config.epochs,
                first_epoch=self.state.epoch,
                steps_per_epoch=self.steps_per_epoch,
            )
            self.plans.record_plan_agreement(self.state)
            left = config.epochs - self.state.epoch  # NOTE [The run's expected time]
            line = self.clock.expect(self.setup, epochs=left, model=self.scoring_model)
            self.log({"kind": "event", "message": line, "expected": self.clock.expected.record()})
            stopped = "finished" if self.state.epoch < config.epochs else "already finished"
            while self.upcoming is not None:
                if self.state.epochs_without_improvement >= config.patience:
                    stopped = f"early stop: no better validation loss for {config.patience} epochs"
                    break
                self.run_epoch(self.upcoming)
        finally:
            if self.upcoming is not None:
                self.upcoming.close()
        with self.clock.timing("test_s"):
            test = score_test_windows(self.setup, self.run, self.clock.test, self.scoring("test"))
        summary = {**self.summary(stopped), **test}
        if self.world.is_main:
            self.run.append_metrics([summary])
        self.reporter.finish(summary)
        return summary

    def run_epoch(self, prefetch: Prefetch[Batch]) -> None:
        """Train one epoch from ``prefetch`` and validate; the next epoch's batches start
        before validation (``self.upcoming``), so that their shuffle overlaps it."""
        epoch_index = self.state.epoch  # 0-based; records count epochs from 1
        started = time.perf_counter()
        records = []
        with prefetch:
            for step_in_epoch in range(1, self.steps_per_epoch + 1):
                waited_before = prefetch.wait_s
                batch = prefetch.next()
                if batch is None:
                    break
                waited = prefetch.wait_s - waited_before
                self.data_wait_s += waited
                records.append(
                    self.train_step(
                        batch,
                        epoch=epoch_index + 1,
                        step_in_epoch=step_in_epoch,
                        data_wait_s=waited,
                    )
                )
        self.upcoming = epoch_batches(self.setup, epoch_index + 1)
        losses = [record["loss"] for record in records]
        peaks = [record["peak_bytes"] for record in records if record["peak_measured"]]
        epoch_peak = max(peaks, default=None)
        self.state.peak_bytes = max(self.state.peak_bytes, epoch_peak or 0)
        self.state.num_measured_steps += len(peaks)
        self.finish_epoch(
            sum(losses) / len(losses),
            epoch_peak,
            time.perf_counter() - started,
            num_measured=len(peaks),
        )

    def train_step(
        self, batch: Batch, *, epoch: int, step_in_epoch: int, data_wait_s: float = 0.0
    ) -> dict[str, Any]:
        """One step of the loop: ``batch`` (this rank's share of the global batch, which is all
        it reads) to the device, the optimizer step, its record logged, the budget enforced;
        returns the record (``data_wait_s``: how long the loop waited for the batch)."""
        inputs = tuple(t.to(self.setup.device) for t in batch.inputs())
        target = batch.target.to(self.setup.device)
        lr = self.scheduler.get_last_lr()[0]
        started = time.perf_counter()
        loss, peak_bytes = self.step(inputs, target)
        step_s = time.perf_counter() - started
        self.state.global_step += 1
        self.state.step_seconds.append(step_s)
        self.step_s_run += step_s
        record = {
            "kind": "step",
            "epoch": epoch,
            "step": self.state.global_step,
            "step_in_epoch": step_in_epoch,
            "loss": loss,
            "lr": lr,
            "step_s": step_s,
            "data_wait_s": data_wait_s,
            "samples_per_s": self.setup.global_batch_size / step_s,
            "peak_bytes": peak_bytes,
            "peak_measured": peak_bytes is not None,
            "budget_bytes": self.budget_bytes,
        }
        self.pending.append(record)
        self.reporter.step(record)
        self.enforce_budget(peak_bytes)
        return record

    def finish_epoch(
        self, train_loss: float, epoch_peak: int | None, epoch_s: float, *, num_measured: int
    ) -> None:
        config = self.config
        with self.clock.timing("validation_s"):
            evaluation = evaluate(
                self.setup,
                self.setup.data.validation,
                positions=self.clock.validation.positions,
                model=self.scoring_model,
                progress=self.scoring("validation"),
            )
        score = evaluation.loss if evaluation is not None else train_loss
        if evaluation is not None:
            self.naive_losses = {k: v.loss for k, v in evaluation.naive.items()}
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
            **validation_record(evaluation, self.clock.validation),
            "improved": improved,
            "peak_bytes": epoch_peak,
            "num_measured_steps": num_measured,
            "budget_bytes": self.budget_bytes,
            "predicted_peak_bytes": self.plans.plan.predicted_peak_bytes,
            "epoch_s": epoch_s,
        }
        rng_by_rank = gather_random_states(self.world)
        states = gather_states(
            self.model, self.plans.planned, self.optimizer, parallelism=self.parallelism
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

    def step(
        self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor
    ) -> tuple[float, int | None]:
        """One optimizer step; returns (loss, peak bytes by NOTE [Enforcing the budget] in
        :mod:`autockpt.training.loop.step_memory`, or None on a step that is not measured).

        With several ranks the loss is the mean over the ranks (the global batch's loss) and
        the peak the largest, so every rank makes the same re-plan decision (the ranks measure
        the same steps: the schedule depends on the step and the shapes only).
        """
        step = self.state.global_step + 1
        with self.meter.measure(inputs, target, step=step) as reading:
            loss = self.forward_backward_with_retries(inputs, target)
            self.optimizer_step()
        peak = self.world.max(reading.peak_bytes) if reading.peak_bytes is not None else None
        return self.world.mean(loss), peak

    def forward_backward_with_retries(
        self, inputs: tuple[torch.Tensor, ...], target: torch.Tensor
    ) -> float:
        """Forward and backward; on a CUDA out-of-memory, re-plan tighter and try again (NOTE
        [Recovering outside the except block]). The optimizer step runs once, after them."""
        return retried_on_out_of_memory(
            lambda: self.forward_backward(inputs, target),
            self._recover_from_out_of_memory,
            retries=self._retries_out_of_memory,
            cuda_devices=forked_devices(self.setup.device),
        )

    def _recover_from_out_of_memory(self, *, keep_gradients: bool = False) -> None:
        """Free what the failed step left and plan tighter; raise where no retry can help. A
        failed optimizer step keeps the gradients it is retried with."""
        step, fix = self.state.global_step + 1, self._out_of_memory_fix
        if self.world.is_distributed:  # the other ranks wait in DDP's all-reduce: no retry
            raise DeviceError(
                f"CUDA ran out of memory on rank {self.world.rank} at step {step}; {fix}"
            )
        if not keep_gradients:
            self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.setup.device)
        if self.state.num_replans >= REPLANNING.max_rounds:
            rounds = REPLANNING.max_rounds
            raise DeviceError(
                f"CUDA ran out of memory at step {step} after {rounds} re-plans; {fix}"
            )
        # Out of memory says not by how much: the least a round lowers the budget.
        self.plans.replan(
            REPLANNING.lowered(self.plans.planning_budget_bytes(self.state), over_bytes=0),
            self.state,
            reason=f"CUDA ran out of memory at step {step}",
        )

    def _retries_out_of_memory(self) -> bool:
        """Whether a step that ran out of memory is tried again: on CUDA, where the allocator
        is capped at the budget (NOTE [Enforcing the budget])."""
        return self.setup.device.type == "cuda"

    @property
    def _out_of_memory_fix(self) -> str:
        return f"lower --vram-budget or --batch-size, then continue with --resume {self.run.path}"

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
        no_sync = (
            getattr(self.plans.planned, "no_sync", None) if self.parallelism == "ddp" else None
        )
        with autocast(self.setup):
            loss = autockpt.training_step(
                self.plans.step_model, self.plans.plan, inputs, (target,), loss_fn, no_sync=no_sync
            )
        return float(loss.item()) / scale

    def optimizer_step(self) -> None:
        parameters = list(self.model.parameters())
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.config.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(parameters, self.config.grad_clip_norm)
        scaler = self.scaler
        optimizer_step_retried_on_out_of_memory(
            self.optimizer.step if scaler is None else lambda: scaler.step(self.optimizer),
            self.optimizer,
            lambda: self._recover_from_out_of_memory(keep_gradients=True),
            retries=self._retries_out_of_memory,
            written_fix=self._out_of_memory_fix,
        )
        if scaler is not None:
            scaler.update()
        self.scheduler.step()
        # Under DDP the gradients are views of its buckets; zeroing them in place keeps them
        # there, where dropping them would make the micro-batches under no_sync accumulate
        # into fresh tensors and hold a second copy of every gradient.
        self.optimizer.zero_grad(set_to_none=self.parallelism != "ddp")

    @property
    def scoring_model(self) -> torch.nn.Module | None:
        """What validation runs: the sharded planned model under FSDP (its ranks run forward
        together), else the setup's."""
        return self.plans.planned if self.parallelism == "fsdp" else None

    def scoring(self, what: str) -> Callable[[int, int], None]:
        """The progress callback of a scoring wait (``validation``, ``test``)."""
        return scoring_progress(what, self.reporter.progress)

    def summary(self, stopped: str) -> dict[str, Any]:
        """The run's last record (:func:`~autockpt.training.loop.run_summary.run_summary`)."""
        return run_summary(self, stopped)


# ---------------------------------------------------------------------------- entry points


def train(
    setup: Setup, run: RunFolder, reporter: Reporter, *, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train (from ``checkpoint`` when resuming) and return the summary record.

    On the CPU the process's threads and malloc are set for the run first and logged
    (NOTE [Tuning the host process] in :mod:`autockpt.training.host.host_tuning`).
    """
    tuning = setup.host_tuning
    if tuning is None:  # a setup prepared without tuning: tuned now, after its planning
        tuning = tune_host(setup.config, setup.device, setup.plan.unplanned_peak_bytes)
    try:
        trainer = Trainer(setup, run, reporter)
        if tuning is not None:
            trainer.plans.event(trainer.state, tuning.describe())
        if checkpoint is not None:
            trainer.restore(checkpoint)
        else:
            # Each rank draws its own dropout masks; rank 0's stream is the single process's.
            seed_everything(setup.config.seed + setup.world.rank)
        return trainer.fit()
    finally:
        if tuning is not None:
            tuning.restore()
