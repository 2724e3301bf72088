"""Zoo: models torch.fx cannot trace, planned with module-level segments (NOTE [Module chain]).

One takes a dict batch and reads tensor values in its forward; the other is a GPT-2-style
language model used the Hugging Face way: ``model(input_ids, labels)`` returns its own mean
loss, after a branch on the labels' values.

Shape legend: B batch, T tokens, W width, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.zoo.attention import GPTBlock
from tests.zoo.case import Batch, ZooCase, feedforward_blocks, seeded

TOKENS, WIDTH, VOCAB = 32, 32, 64


class DictBatchModel(nn.Module):
    """``forward(batch)`` with ``batch = {"x": (B, T, W), "mask": (B, T), "scale": (W,)}``:
    the scale carries no batch and goes whole to every micro-batch. Whether any position is
    masked is read as a Python bool, which torch.fx cannot trace."""

    def __init__(self, depth: int = 3, dropout: float = 0.1) -> None:
        super().__init__()
        self.blocks = feedforward_blocks(depth, WIDTH, dropout)
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = batch["x"] * batch["scale"]  # (B, T, W)
        for block in self.blocks:
            x = x + block(x)
        y = self.head(x).squeeze(-1)  # (B, T)
        if not bool(batch["mask"].all()):  # a fast path when nothing is masked
            y = y * batch["mask"].to(y.dtype)
        return {"y": y}


def _dict_batch(batch_size: int) -> Batch:
    generator = seeded(9)
    mask = torch.ones(batch_size, TOKENS, dtype=torch.bool)
    mask[:, TOKENS - 4 :] = torch.rand(batch_size, 4, generator=generator) > 0.5
    batch = {
        "x": torch.randn(batch_size, TOKENS, WIDTH, generator=generator),
        "mask": mask,
        "scale": torch.rand(WIDTH, generator=generator) + 0.5,
    }
    return (batch,), ()


def _sum_of_y(output: dict[str, torch.Tensor]) -> torch.Tensor:
    return output["y"].sum()


class OwnLossLM(nn.Module):
    """GPT-2 used the Hugging Face way: ``(loss, logits)`` from ``(input_ids, labels)``."""

    def __init__(self, depth: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(TOKENS, WIDTH)
        self.blocks = nn.ModuleList(GPTBlock(dropout) for _ in range(depth))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        positions = torch.arange(input_ids.shape[1])
        x = self.wte(input_ids) + self.wpe(positions)  # (B, T, W)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if bool((labels < 0).any()):  # a value-dependent branch, as padded labels bring
            labels = labels.clamp(min=0)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        return loss, logits


def _labelled_ids(batch_size: int) -> Batch:
    generator = seeded(10)
    ids = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    labels = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    return (ids, labels), ()


def _own_loss(output: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return output[0]


def _built(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls()


UNTRACEABLE = [
    ZooCase(
        "dict_batch",
        "a dict batch, a value read in forward (no fx)",
        lambda: _built(DictBatchModel),
        _dict_batch,
        loss_fn=_sum_of_y,
    ),
    ZooCase(
        "own_loss_lm",
        "GPT-2 the Hugging Face way: model(ids, labels) -> (mean loss, logits) (no fx)",
        lambda: _built(OwnLossLM),
        _labelled_ids,
        loss_fn=_own_loss,
        loss_reduction="mean",
    ),
]
