"""The Lightning callback: a LightningModule written for these tests, trained with and without
MemoryPlan, compared step by step; memory counted by the tests' own counter."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

lightning = pytest.importorskip("lightning", reason="the lightning extra is not installed")
pl = lightning.pytorch

from autockpt.errors import BudgetError, InfeasibleBudgetError  # noqa: E402
from autockpt.lightning import MemoryPlan  # noqa: E402
from tests.oracle import LiveBytes, starting_tensors  # noqa: E402

BATCH, WIDTH = 512, 128


class Regressor(pl.LightningModule):
    """Residual blocks with dropout, written the Lightning way: self.log, a dict output."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Linear(WIDTH, 2 * WIDTH),
                nn.GELU(),
                nn.Dropout(dropout),
                nn.Linear(2 * WIDTH, WIDTH),
            )
            for _ in range(6)
        )
        self.head = nn.Linear(WIDTH, 1)
        self.validation_outputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x).squeeze(-1)

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return {"loss": loss, "mean_target": y.mean()}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        prediction = self(x)
        self.validation_outputs.append(prediction)
        self.log("val_loss", F.mse_loss(prediction, y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class UntracedRegressor(Regressor):
    """The same, with a forward torch.fx cannot trace (it reads a value): planned with
    module-level segments."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().max().item() > 1e6:
            x = x / 1e6
        return super().forward(x)


class Losses(pl.Callback):
    """The loss of every training step, as Lightning returned it."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


class StepPeak(pl.Callback):
    """The peak of one training batch (forward, backward, optimizer step) by LiveBytes,
    counted from the parameters, gradients, optimizer state and the batch."""

    def __init__(self, batch_index: int) -> None:
        self.batch_index = batch_index
        self.counter: LiveBytes | None = None
        self.peak_bytes = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx != self.batch_index:
            return
        self.counter = LiveBytes()
        for tensor in starting_tensors(pl_module, trainer.optimizers[0], list(batch)):
            self.counter.hold(tensor)
        self.counter.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.counter is not None and batch_idx == self.batch_index:
            self.counter.__exit__(None, None, None)
            self.peak_bytes = self.counter.peak_bytes
            self.counter = None


class EveryStepPeak(pl.Callback):
    """The highest peak over every training batch, each counted by LiveBytes from its start
    (parameters, gradients, optimizer state, the batch, however nested) to its end."""

    def __init__(self) -> None:
        self.counter: LiveBytes | None = None
        self.peaks: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.counter = LiveBytes()
        optimizer = trainer.optimizers[0]
        for tensor in starting_tensors(pl_module, optimizer, [batch]):
            self.counter.hold(tensor)
        self.counter.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        assert self.counter is not None
        self.counter.__exit__(None, None, None)
        self.peaks.append(self.counter.peak_bytes)
        self.counter = None

    def on_exception(self, trainer, pl_module, exception) -> None:
        # A batch that raised never ends: its count's dispatch mode would stay on for every
        # test after this one.
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.counter = None


def _loader(num_batches: int = 4, seed: int = 0) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_batches * BATCH, WIDTH, generator=generator)
    y = torch.randn(num_batches * BATCH, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


def _fit(
    model: pl.LightningModule,
    callbacks: list[pl.Callback],
    *,
    epochs: int = 1,
    loader: Any = None,
    **options: Any,
) -> pl.Trainer:
    fit_options = options.pop("fit", {})
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **options,
    )
    trainer.fit(model, _loader() if loader is None else loader, **fit_options)
    return trainer


def _unplanned_peak(dropout: float = 0.1) -> int:
    torch.manual_seed(0)
    peak = StepPeak(batch_index=1)
    _fit(Regressor(dropout), [peak], limit_train_batches=2)
    return peak.peak_bytes


@pytest.mark.parametrize(
    ("module", "tracing"), [(Regressor, "fx"), (UntracedRegressor, "forward-hooks")]
)
def test_the_planned_run_takes_the_plain_runs_losses_under_half_its_peak(module, tracing) -> None:
    unplanned = _unplanned_peak()
    torch.manual_seed(0)
    plain = Losses()
    _fit(module(), [plain], epochs=2)

    torch.manual_seed(0)
    budget = unplanned // 2 + unplanned // 8
    # Chunks would draw their own dropout masks: recompute alone keeps the losses bit for bit.
    memory_plan = MemoryPlan(budget=budget, allow_chunks=False, show=False)
    planned, peak = Losses(), StepPeak(1)
    _fit(module(), [memory_plan, planned, peak], epochs=2)
    assert memory_plan.plan is not None and memory_plan.plan.num_recomputed > 0
    assert memory_plan.plan.tracing == tracing
    assert planned.losses == pytest.approx(plain.losses, rel=1e-6, abs=1e-7)  # dropout on
    assert peak.peak_bytes <= budget < unplanned, (peak.peak_bytes, budget, unplanned)


def test_forced_modes_recompute_everything_or_nothing() -> None:
    for forced, expected in ((True, True), (False, False)):
        memory_plan = MemoryPlan(budget=10**12, use_gradient_checkpointing=forced, show=False)
        _fit(Regressor(), [memory_plan], limit_train_batches=1)
        assert memory_plan.plan is not None
        assert {segment.recomputed for segment in memory_plan.plan.segments} == {expected}


def test_validation_and_prediction_see_the_original_outputs() -> None:
    torch.manual_seed(0)
    model = Regressor()
    memory_plan = MemoryPlan(budget=10**12, use_gradient_checkpointing=True, show=False)
    trainer = _fit(
        model,
        [memory_plan],
        val_check_interval=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        fit={"val_dataloaders": _loader(1, seed=1)},
    )
    during_fit = model.validation_outputs[-1]  # validated with the plan installed
    original = copy.deepcopy(model).eval()
    x = next(iter(_loader(1, seed=1)))[0]
    with torch.no_grad():
        assert torch.equal(during_fit, original(x))
    predicted = trainer.predict(model, _loader(1, seed=1))
    assert torch.equal(predicted[0], original(x))


def test_bf16_clipping_and_accumulation_keep_the_plain_losses() -> None:
    options = {"precision": "bf16-mixed", "gradient_clip_val": 0.5, "accumulate_grad_batches": 2}
    torch.manual_seed(0)
    plain = Losses()
    _fit(Regressor(dropout=0.0), [plain], **options)
    torch.manual_seed(0)
    memory_plan, planned = (
        MemoryPlan(budget=10**12, use_gradient_checkpointing=True, show=False),
        Losses(),
    )
    _fit(Regressor(dropout=0.0), [memory_plan, planned], **options)
    assert planned.losses == plain.losses


def test_a_resumed_run_gets_the_same_plan_and_the_same_losses(tmp_path: Path) -> None:
    budget = _unplanned_peak() * 5 // 8
    torch.manual_seed(0)
    whole = Losses()
    _fit(Regressor(dropout=0.0), [MemoryPlan(budget=budget, show=False), whole], epochs=2)

    torch.manual_seed(0)
    first_plan, first = MemoryPlan(budget=budget, show=False), Losses()
    trainer = _fit(Regressor(dropout=0.0), [first_plan, first], epochs=1)
    checkpoint = tmp_path / "epoch1.ckpt"
    trainer.save_checkpoint(checkpoint)

    resumed_plan, second = MemoryPlan(budget=budget, show=False), Losses()
    # Lightning's checkpoints hold no random state, so dropout is off: the weights, the
    # optimizer, the loop's place and the plan are what a resume must restore.
    torch.manual_seed(123)
    _fit(
        Regressor(dropout=0.0), [resumed_plan, second], epochs=2, fit={"ckpt_path": str(checkpoint)}
    )
    assert resumed_plan.plan == first_plan.plan
    assert first.losses + second.losses == pytest.approx(whole.losses, rel=1e-6, abs=1e-7)


def test_a_budget_only_micro_batches_would_meet_names_accumulate_grad_batches() -> None:
    with pytest.raises(InfeasibleBudgetError, match="accumulate_grad_batches=N"):
        _fit(Regressor(), [MemoryPlan(budget=2**20, show=False)], limit_train_batches=1)


def test_a_budget_that_is_not_a_size_fails_where_the_callback_is_made() -> None:
    """NOTE [One budget]: read once, in the constructor, not at the first batch."""
    with pytest.raises(BudgetError, match="'4XB' is not a size"):
        MemoryPlan(budget="4XB")
    assert MemoryPlan(budget="auto").budget == "auto"  # the device's free memory, read later
    assert MemoryPlan(budget="4GB").budget.bytes == 4 * 10**9


DDP_RUN = """
import torch, lightning.pytorch as pl
from tests.lightning.test_callback import Regressor, _loader
from autockpt.lightning import MemoryPlan
class Done(pl.Callback):
    def on_train_end(self, trainer, pl_module):
        print(f"rank {trainer.global_rank} trained {trainer.global_step}", flush=True)
if __name__ == "__main__":
    torch.manual_seed(0)
    trainer = pl.Trainer(
        max_epochs=1, limit_train_batches=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=2,
        strategy="ddp_spawn",
        callbacks=[MemoryPlan(budget=10**8, use_gradient_checkpointing=True), Done()],
    )
    trainer.fit(Regressor(dropout=0.0), _loader())
"""


@pytest.mark.slow
def test_two_ranks_take_rank_zeros_plan_and_print_it_once(tmp_path: Path) -> None:
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_RUN)
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("memory plan (checkpoint-all, batch 512 per rank, 2 ranks ddp") == 1
    assert "rank 0 trained 2" in done.stdout and "rank 1 trained 2" in done.stdout
