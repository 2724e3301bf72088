"""Lightning ``training_step``s written the way people write them (``loss.item()``, a
torchmetrics metric updated and logged, a dict batch, ``float(loss)`` printed, the loss in a
helper method) still plan the module's ``forward`` through torch.fx (NOTE [Tracing a
LightningModule's forward]): at 75% of the plain run's peak, without micro-batches, every batch
planning included, under the budget by the independent counter, the plain run's losses, and
nothing of planning's in the module's own state."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

lightning = pytest.importorskip("lightning", reason="the lightning extra is not installed")
torchmetrics = pytest.importorskip("torchmetrics", reason="the lightning extra is not installed")
pl = lightning.pytorch

from autockpt.lightning import MemoryPlan  # noqa: E402
from tests.lightning.test_callback import EveryStepPeak, Losses, _fit  # noqa: E402
from tests.lightning.test_forward_plan import BATCH, CHANNELS, LENGTH, DilatedConvolutions  # noqa: E402


class ItemHistory(DilatedConvolutions):
    """``loss.item()`` kept in a history, as a progress display does."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.history.append(loss.item())
        self.log("train_loss", loss)
        return loss


class MetricOnDictBatch(DilatedConvolutions):
    """A dict batch, a torchmetrics metric updated and logged, a dict returned."""

    def __init__(self) -> None:
        super().__init__()
        self.train_mae = torchmetrics.MeanAbsoluteError()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        prediction = self(batch["x"])
        loss = F.mse_loss(prediction, batch["y"])
        self.train_mae.update(prediction, batch["y"])
        self.log("train_mae", self.train_mae, on_step=True)
        return {"loss": loss, "prediction": prediction.detach()}


class HelperAndPrint(DilatedConvolutions):
    """The loss in a helper method, ``float(loss)`` printed, a tensor logged."""

    def _loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(prediction, target) + 0.01 * prediction.abs().mean()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self._loss(self(x), y)
        if batch_idx % 2 == 0:
            print(f"step {batch_idx}: loss {float(loss):.4f}")
        self.log("loss", loss.detach(), prog_bar=True)
        return loss


class GuardedLogDict(DilatedConvolutions):
    """A finite guard on the loss (``bool`` of a tensor), a sign accuracy, ``self.log_dict``."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        prediction = self(x)
        loss = F.mse_loss(prediction, y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at batch {batch_idx}")
        accuracy = (prediction.sign() == y.sign()).float().mean()
        self.log_dict({"train_loss": loss, "train_sign_accuracy": accuracy})
        return loss


class _DictLoader(torch.utils.data.Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


def _loader(dict_batches: bool) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3 * BATCH, CHANNELS, LENGTH, generator=generator)
    y = torch.randn(3 * BATCH, LENGTH, generator=generator)
    data = _DictLoader(x, y) if dict_batches else torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(data, batch_size=BATCH)


@pytest.mark.parametrize(
    ("module_type", "dict_batches"),
    [
        (ItemHistory, False),
        (MetricOnDictBatch, True),
        (HelperAndPrint, False),
        (GuardedLogDict, False),
    ],
    ids=["loss-item", "torchmetrics-dict-batch", "helper-float-print", "finite-guard-log-dict"],
)
def test_a_step_as_users_write_it_plans_its_forward_at_three_quarters(
    module_type: type[pl.LightningModule], dict_batches: bool
) -> None:
    torch.manual_seed(0)
    plain_peaks, plain_losses = EveryStepPeak(), Losses()
    _fit(module_type(), [plain_peaks, plain_losses], loader=_loader(dict_batches))
    budget = int(0.75 * max(plain_peaks.peaks[1:]))
    torch.manual_seed(0)
    memory_plan, peaks, losses = MemoryPlan(budget=budget, show=False), EveryStepPeak(), Losses()
    module = module_type()
    # The counter's callback first: the first batch's count starts before the plan is made.
    _fit(module, [peaks, memory_plan, losses], loader=_loader(dict_batches))
    plan = memory_plan.plan
    assert plan is not None and plan.tracing == "fx", plan and plan.notes
    assert plan.num_micro_batches == 1
    # Every batch, planning in the first, under the budget by the independent counter.
    assert len(peaks.peaks) == 3 and max(peaks.peaks) <= budget, (peaks.peaks, budget)
    torch.testing.assert_close(losses.losses, plain_losses.losses)
    if isinstance(module, ItemHistory):
        assert len(module.history) == 3, "planning ran the step's Python on the user's module"
