"""The batch-separability probe: randomness is not mixing, real mixing is caught and named,
and the step's loss must be a mean or a sum over samples."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autockpt.planner.core.fixed_randomness import FixedRandomness
from autockpt.planner.measure.separability import Separability, analyse_separability
from autockpt.planner.trace.module_chain import trace_or_find_modules
from tests.zoo.attention import NanoGPT
from tests.zoo.feedforward import FunctionalDropoutMLP, TrainingBranch
from tests.zoo.untraceable import OwnLossLM


def _probe(model: nn.Module, inputs: tuple[Any, ...], **options: Any) -> Separability:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*module-level segments")
        traced = trace_or_find_modules(model, inputs)
    return analyse_separability(traced, inputs, model=model, **options)


class Residual(nn.Module):
    """Residual layers, each followed by ``mix`` (what a test plants)."""

    def __init__(self, mix: str = "") -> None:
        super().__init__()
        self.mix = mix
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.norm = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.tanh(layer(x))  # (B, W)
        if self.mix == "centre":
            x = x - x.mean(0)
        elif self.mix == "batchnorm":
            x = self.norm(x)
        elif self.mix == "total":
            x = x * x.mean()
        return self.head(x)


class Untraceable(Residual):
    """The same, with a value-dependent branch: planned with module-level segments."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.isnan().any()):
            x = x.nan_to_num()
        return super().forward(x)


def _tokens() -> tuple[torch.Tensor]:
    return (torch.randn(8, 32, 32),)


@pytest.mark.parametrize("model_type", [FunctionalDropoutMLP, TrainingBranch])
def test_dropout_frozen_on_and_draws_by_hand_are_not_mixing(model_type):
    found = _probe(model_type(), _tokens())
    assert found.micro_batchable, found.reason
    assert found.loss_reduction == "sum"


def test_sdpa_dropout_and_a_loss_computed_inside_separate_as_a_mean():
    ids = torch.randint(0, 64, (8, 32))
    found = _probe(NanoGPT(dropout=0.5), (ids, ids), loss_fn=lambda out: out[1])
    assert found.micro_batchable, found.reason
    assert found.loss_reduction == "mean"
    assert any(found.chunkable)


def test_every_segment_of_a_model_with_functional_dropout_may_run_in_chunks():
    found = _probe(FunctionalDropoutMLP(dropout=0.5), _tokens())
    assert found.chunkable and all(found.chunkable)


def test_random_draws_are_fixed_to_one_value_whatever_the_batch():
    x = torch.randn(3, 5)
    with FixedRandomness(), torch.no_grad():
        dropped = F.dropout(x, 0.5, True)
        draws = [torch.rand(4), torch.randn_like(x), torch.bernoulli(torch.full((4,), 0.2))]
        integers = [torch.randint(3, 9, (4,)), torch.randperm(4)]
        mean = torch.normal(x, 2.0)
    torch.testing.assert_close(dropped, x * 2)
    for draw, value in zip(draws, (0.5, 0.0, 1.0), strict=True):
        assert bool((draw == value).all())
    assert integers[0].tolist() == [3] * 4 and integers[1].tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(mean, x)


@pytest.mark.parametrize(
    ("mix", "culprit"),
    [
        ("centre", "Tensor.mean (node mean) in the model's forward mixes samples"),
        ("batchnorm", "BatchNorm1d at norm mixes samples"),
        ("total", "Tensor.mean (node mean) in the model's forward mixes samples"),
    ],
)
def test_mixing_in_a_traced_model_is_caught_and_named(mix, culprit):
    found = _probe(Residual(mix), (torch.randn(8, 16),))
    assert not found.micro_batchable
    assert found.reason.startswith(culprit), found.reason
    assert not found.chunkable[-1]


@pytest.mark.parametrize(
    ("mix", "culprit"),
    [
        ("centre", "an operation in the forward of Untraceable itself mixes samples"),
        ("batchnorm", "BatchNorm1d at norm mixes samples"),
    ],
)
def test_mixing_in_a_model_that_does_not_trace_is_caught_and_named(mix, culprit):
    found = _probe(Untraceable(mix), (torch.randn(8, 16),))
    assert not found.micro_batchable
    assert found.reason.startswith(culprit), found.reason


def test_a_model_that_does_not_trace_separates_with_its_own_mean_loss():
    ids = torch.randint(0, 64, (8, 32))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*module-level segments")
        traced = trace_or_find_modules(OwnLossLM(dropout=0.5), (ids, ids))
    found = _probe(OwnLossLM(dropout=0.5), (ids, ids), loss_fn=lambda out: out[0])
    assert found.micro_batchable, found.reason
    assert found.loss_reduction == "mean"
    # Its links run in chunks where they compute sample by sample: not the position
    # embedding, whose input (the positions) carries no batch.
    chunkable = {s.name: flag for s, flag in zip(traced.segments, found.chunkable, strict=True)}
    assert chunkable.pop("wpe") is False
    assert all(chunkable.values()), chunkable


@pytest.mark.parametrize(
    ("loss_fn", "reduction"),
    [
        (lambda out, y: F.mse_loss(out, y), "mean"),
        (lambda out, y: F.mse_loss(out, y, reduction="sum"), "sum"),
        (lambda out, y: F.mse_loss(out, y) ** 2, None),
        (lambda out, y: (out - out.mean() - y).abs().sum(), None),
    ],
)
def test_the_loss_must_be_a_mean_or_a_sum_over_samples(loss_fn, reduction):
    inputs, targets = (torch.randn(8, 16),), (torch.randn(8, 1),)
    found = _probe(Residual(), inputs, loss_fn=loss_fn, example_targets=targets)
    assert found.loss_reduction == reduction
    assert found.micro_batchable is (reduction is not None)
    if reduction is None:
        assert "neither the mean nor the sum" in found.reason


def test_the_probe_leaves_the_model_and_the_rng_as_they_were():
    model = Residual("batchnorm")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = (torch.randn(8, 16),)
    traced = trace_or_find_modules(model, inputs)
    state = torch.random.get_rng_state()
    analyse_separability(traced, inputs, model=model)
    assert torch.equal(torch.random.get_rng_state(), state)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in model.parameters())
