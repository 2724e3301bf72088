"""A Hugging Face GPT-2 with ``use_cache=True`` trained in a Lightning fit under MemoryPlan:
its decoder layers write their ``Cache`` in train mode (NOTE [Python state written in
forward]), every training batch is counted from its start to its end by the tests' own
counter, and the losses are the plain fit's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

lightning = pytest.importorskip("lightning", reason="the lightning extra is not installed")
transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pl = lightning.pytorch

from autockpt.lightning import MemoryPlan  # noqa: E402
from tests.lightning.test_callback import EveryStepPeak, Losses, _fit  # noqa: E402
from tests.planner.test_hugging_face import VOCAB, gpt2_config  # noqa: E402

BATCH, LENGTH = 16, 64


class GPT2Module(pl.LightningModule):
    """Next-token prediction with GPT-2, written as its users write it: a cache asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = transformers.GPT2LMHeadModel(gpt2_config(LENGTH))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        logits = self.lm(input_ids=ids, use_cache=True).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (4 * BATCH, LENGTH), generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=BATCH)


def test_gpt2_with_its_cache_trains_under_the_budget_with_the_plain_losses() -> None:
    torch.manual_seed(0)
    plain_peaks, plain_losses = EveryStepPeak(), Losses()
    _fit(GPT2Module(), [plain_peaks, plain_losses], loader=_loader())
    budget = int(0.6 * max(plain_peaks.peaks[1:]))  # the first step makes AdamW's state
    torch.manual_seed(0)
    memory_plan, peaks, losses = MemoryPlan(budget=budget, show=False), EveryStepPeak(), Losses()
    _fit(GPT2Module(), [memory_plan, peaks, losses], loader=_loader())
    assert memory_plan.plan is not None and memory_plan.plan.num_recomputed > 0
    # The attention modules write the cache: never recomputed, alone or in a span.
    segments = memory_plan.plan.segments
    writers = [s for s in segments if any(m.endswith(".attn") for m in s.modules)]
    assert writers and not any(s.recomputed for s in writers), segments
    assert not any("measuring it failed" in note for note in memory_plan.plan.notes)
    assert len(peaks.peaks) == 4 and max(peaks.peaks[1:]) <= budget, (peaks.peaks, budget)
    torch.testing.assert_close(losses.losses, plain_losses.losses)
