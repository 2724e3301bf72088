"""Lightning with batches padded to lengths that rise, fall and end longer than any seen:
MemoryPlan plans each new shape bucket before its step, every step (planning included) stays
under the budget by the tests' own counter, and the losses are the plain run's (NOTE [Plans
that follow the shapes of a run])."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

lightning = pytest.importorskip("lightning", reason="the lightning extra is not installed")
pl = lightning.pytorch

import autockpt  # noqa: E402
from autockpt.lightning import MemoryPlan  # noqa: E402
from tests.lightning.test_callback import EveryStepPeak  # noqa: E402

BATCH, WIDTH = 4, 64
LENGTHS = [32, 96, 384, 64, 256, 700]


class SequenceRegressor(pl.LightningModule):
    """Residual blocks with dropout over the positions of padded sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * WIDTH, WIDTH)
            )
            for _ in range(4)
        )
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)  # (B, T, W)
        return self.head(x).squeeze(-1)  # (B, T)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, mask = batch
        loss = (F.mse_loss(self(x), y, reduction="none") * mask).sum() / mask.sum()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class EveryStep(EveryStepPeak):
    """Each training batch's peak by LiveBytes, from its start (before any other callback,
    so planning counts) to its end, and its loss."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.losses.append(float(outputs["loss"]))


def _batches(lengths: list[int]) -> list[tuple[torch.Tensor, ...]]:
    """Batches as a padding collator gives them: each padded to its longest sequence."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for length in lengths:
        x = torch.randn(BATCH, length, WIDTH, generator=generator)
        y = torch.randn(BATCH, length, generator=generator)
        mask = torch.ones(BATCH, length)
        mask[1:, length // 2 :] = 0  # the shorter sequences' padding
        batches.append((x, y, mask))
    return batches


def _fit(callbacks: list[pl.Callback], lengths: list[int] = LENGTHS) -> EveryStep:
    torch.manual_seed(0)
    model = SequenceRegressor()
    counter = EveryStep()
    loader = torch.utils.data.DataLoader(_batches(lengths), batch_size=None)
    trainer = pl.Trainer(
        max_epochs=1, callbacks=[counter, *callbacks], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(model, loader)
    return counter


@pytest.fixture(scope="module")
def plain() -> EveryStep:
    return _fit([])


def test_every_padded_length_runs_under_the_budget_with_the_plain_losses(plain) -> None:
    budget = int(0.6 * max(plain.peaks))
    memory_plan = MemoryPlan(budget, allow_chunks=False, show=False)
    planned = _fit([memory_plan])
    assert max(planned.peaks) <= budget, (planned.peaks, budget)
    torch.testing.assert_close(planned.losses, plain.losses, rtol=1e-5, atol=1e-6)
    # 32, then the buckets of 96 and 384; 64 and 256 run with the plans above them; 700 is
    # longer than any seen and gets its own.
    lengths = [plan.batch_shapes.shapes[0][1] for plan in memory_plan.shape_plans.plans]
    assert lengths == [32, 128, 512, 1024], lengths
    assert memory_plan.shape_plans.planning_s > 0


def test_a_declared_maximum_plans_once_before_the_first_step(plain) -> None:
    budget = int(0.6 * max(plain.peaks))
    memory_plan = MemoryPlan(budget, allow_chunks=False, show=False, max_shape=(BATCH, 700))
    planned = _fit([memory_plan])
    assert memory_plan.shape_plans.num_plans == 1
    assert max(planned.peaks) <= budget, (planned.peaks, budget)
    torch.testing.assert_close(planned.losses, plain.losses, rtol=1e-5, atol=1e-6)


def test_with_replanning_off_a_longer_batch_is_refused_in_one_line() -> None:
    memory_plan = MemoryPlan("1GB", show=False, replan=False)
    with pytest.raises(autockpt.ShapeError) as refused:
        _fit([memory_plan], lengths=[32, 96])
    message = str(refused.value)
    assert "\n" not in message and "4x96x64" in message and "4x32x64" in message
    assert "max_shape=(4, 96, 64)" in message and "replan=True" in message
