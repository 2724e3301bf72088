"""A LightningModule whose forward traces is planned through torch.fx (NOTE [Tracing a
LightningModule's forward]): as low as the library plans its forward alone."""

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
from tests.lightning.test_callback import EveryStepPeak, Losses, _fit  # noqa: E402

BATCH, CHANNELS, LENGTH, BLOCKS = 32, 32, 256, 5


class DilatedConvolutions(pl.LightningModule):
    """Causal dilated convolutions with their glue in ``forward``, written as people write
    them: a slice, ``F.gelu`` and the residual add between the layers, AdamW, a logged loss."""

    def __init__(self) -> None:
        super().__init__()
        self.convolutions = nn.ModuleList(
            nn.Conv1d(CHANNELS, CHANNELS, 3, dilation=2**i, padding=2 ** (i + 1))
            for i in range(BLOCKS)
        )
        self.head = nn.Conv1d(CHANNELS, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        for convolution in self.convolutions:
            x = x + F.gelu(convolution(x)[..., :length])
        return self.head(x).squeeze(1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3 * BATCH, CHANNELS, LENGTH, generator=generator)
    y = torch.randn(3 * BATCH, LENGTH, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


def _fx_minimum() -> tuple[int, int]:
    """The unplanned peak and the minimum of the module's forward planned alone through
    torch.fx, with the loss the training step computes, without micro-batches: what a budget
    below every plan is refused with (every option examined)."""
    torch.manual_seed(0)
    module = DilatedConvolutions()
    x, y = next(iter(_loader()))
    options: dict[str, Any] = dict(
        loss_fn=lambda output, target: F.mse_loss(output, target),
        example_targets=(y,),
        allow_micro_batches=False,
    )
    unplanned = autockpt.plan(module, (x,), 10**12, **options).unplanned_peak_bytes
    with pytest.raises(autockpt.InfeasibleBudgetError) as refused:
        autockpt.plan(module, (x,), 1, **options)
    return unplanned, refused.value.minimum_bytes


def test_the_callback_plans_the_forward_within_a_tenth_of_its_fx_minimum() -> None:
    unplanned, fx_minimum = _fx_minimum()
    assert fx_minimum < 0.6 * unplanned
    torch.manual_seed(0)
    plain_peaks, plain_losses = EveryStepPeak(), Losses()
    _fit(DilatedConvolutions(), [plain_peaks, plain_losses], loader=_loader())
    budget = int(1.1 * fx_minimum)
    torch.manual_seed(0)
    memory_plan, peaks, losses = MemoryPlan(budget=budget, show=False), EveryStepPeak(), Losses()
    _fit(DilatedConvolutions(), [memory_plan, peaks, losses], loader=_loader())
    plan = memory_plan.plan
    assert plan is not None and plan.tracing == "fx" and plan.num_micro_batches == 1
    assert plan.minimum_feasible_bytes <= budget
    # Every batch, counted from its start to its end by a counter that shares no code with
    # the planner, stays under a budget the module-level segments could not meet.
    assert len(peaks.peaks) == 3 and max(peaks.peaks) <= budget, (peaks.peaks, budget)
    assert budget < 0.8 * max(plain_peaks.peaks[1:])
    torch.testing.assert_close(losses.losses, plain_losses.losses)
