"""Models and losses with data-dependent ops (NOTE [Data-dependent sizes on fake tensors]):
boolean masks, ``nonzero`` and ``unique`` in a forward, and ``Wav2Vec2ForCTC`` (its feature
mask, its CTC loss's lengths), planned at half their peak, every step counted by the tests' own
counter under the budget with the plain step's gradients; planning leaves Python's and NumPy's
random streams where they were (NOTE in :func:`autockpt.planner.core.host_settings`)."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from tests.oracle import assert_same_gradients, measured_step

WIDTH, TOKENS, BATCH = 48, 256, 8


class MaskedTokens(nn.Module):
    """A token model that reads only the positions a boolean mask keeps, and counts the
    distinct classes it sees: ``x[mask]``, ``nonzero``, ``unique`` in its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                          nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(4)
        )  # fmt: skip
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(x)
        for block in self.blocks:
            hidden = hidden + block(hidden)
        kept = hidden[keep]  # (kept positions, width)
        rows = keep.nonzero()[:, 0]
        classes = torch.unique(rows).numel()
        return self.head(kept) * (1.0 + 0.0 * classes)


def masked_loss(output: torch.Tensor, target: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target[keep])


def _batch() -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, TOKENS, 8, generator=generator)
    keep = torch.rand(BATCH, TOKENS, generator=generator) < 0.7
    target = torch.randn(BATCH, TOKENS, 4, generator=generator)
    return (x, keep), (target, keep)


def test_a_forward_with_boolean_masks_and_unique_plans_at_half_its_peak():
    torch.manual_seed(0)
    model = MaskedTokens().train()
    inputs, targets = _batch()
    counted = dict(loss_fn=masked_loss, targets=targets, loss_reduction="mean")
    plain_peak, want_loss, want = measured_step(model, inputs, **counted)
    budget = plain_peak // 2
    plan = autockpt.plan(model, inputs, budget, loss_fn=masked_loss, example_targets=targets)
    # Planned on fake tensors (NOTE [Data-dependent sizes on fake tensors]), not real copies.
    assert not any("measured on real tensors" in note for note in plan.notes), plan.notes
    peak, loss, got = measured_step(model, inputs, plan, **counted)
    assert peak <= budget
    torch.testing.assert_close(loss, want_loss)
    assert_same_gradients(got, want)


def test_wav2vec2_for_ctc_plans_at_half_its_peak_with_the_plain_gradients():
    transformers = pytest.importorskip("transformers")
    from autockpt.hf.step import HuggingFaceStep, output_loss

    config = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
        intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        mask_time_prob=0.3, mask_time_length=2, ctc_loss_reduction="mean", pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = HuggingFaceStep(transformers.Wav2Vec2ForCTC(config).train())
    generator = torch.Generator().manual_seed(0)
    batch = {
        "input_values": torch.randn(2, 16000, generator=generator),
        "labels": torch.randint(1, 32, (2, 20), generator=generator),
    }
    counted = dict(loss_fn=output_loss, loss_reduction="mean")
    np.random.seed(5)  # the feature mask's spans are NumPy's draws
    plain_peak, want_loss, want = measured_step(model, (batch,), **counted)
    budget = plain_peak // 2
    random.seed(1)
    np.random.seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autockpt.plan(model, (batch,), budget, loss_fn=output_loss)
    # Planning ran the model for real, and its draws did not move the caller's streams.
    drawn = (random.random(), np.random.rand())
    random.seed(1)
    np.random.seed(1)
    assert drawn == (random.random(), np.random.rand())
    assert plan.num_recomputed > 0
    np.random.seed(5)
    peak, loss, got = measured_step(model, (batch,), plan, **counted)
    assert peak <= budget
    torch.testing.assert_close(loss, want_loss)
    assert_same_gradients(got, want)


class Branchy(nn.Module):
    """Residual MLP blocks, each added or subtracted by a branch on its output's values:
    torch.fx cannot trace it and fake tensors cannot run it (module-level segments, measured on
    a real copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(6)
        )
        self.out = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            update = block(x)
            x = x + update if update.mean() > -10 else x - update
        return self.out(x)


def test_a_loss_closed_over_the_batchs_targets_plans_recompute_on_the_hooks_path():
    torch.manual_seed(0)
    model = Branchy().train()
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(4096, 64, generator=generator), torch.randn(4096, 8, generator=generator)

    def closed_over(output: torch.Tensor) -> torch.Tensor:  # the whole batch's targets
        return F.mse_loss(output, y)

    counted = dict(loss_fn=closed_over, loss_reduction="mean")
    plain_peak, want_loss, want = measured_step(model, (x,), **counted)
    budget = plain_peak // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autockpt.plan(model, (x,), budget, loss_fn=closed_over)
    assert plan.tracing == "forward-hooks" and plan.num_recomputed > 0
    assert plan.num_micro_batches == 1
    # Micro-batches need the loss of a few samples, which this loss cannot give: said so.
    assert any(
        note.startswith("micro-batches not used: loss_fn fails on the probe's outputs")
        for note in plan.notes
    ), plan.notes
    peak, loss, got = measured_step(model, (x,), plan, **counted)
    assert peak <= budget
    torch.testing.assert_close(loss, want_loss)
    assert_same_gradients(got, want)
