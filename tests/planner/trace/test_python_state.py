"""Python state written in forward (NOTE [Python state written in forward]): a layer that
appends to a cache object it is given is recomputed with the cache as its forward found it, and
one that appends to a list it is given is never recomputed, so planning neither dies with
torch's CheckpointError nor changes the gradients, and the cache ends as the forward left it."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from tests.oracle import assert_same_gradients, measured_step


class KeyCache:
    """What a Hugging Face ``DynamicCache`` does, in a few lines: each layer appends its keys."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []

    def update(self, key: torch.Tensor) -> torch.Tensor:
        self.keys.append(key)
        return torch.stack(self.keys).mean(dim=0)


class CachingLayer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.key = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, cache: KeyCache | None = None) -> torch.Tensor:
        key = F.gelu(self.key(x))
        if cache is not None:
            key = key + cache.update(key)
        return x + self.out(key)


class CachingDecoder(nn.Module):
    """Layers sharing one cache object made in the forward, as a Hugging Face decoder in train
    mode with ``use_cache=True`` does."""

    def __init__(self, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CachingLayer(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = KeyCache()
        self.__dict__["last_cache"] = cache  # what the caller would read after the step
        for layer in self.layers:
            x = layer(x, cache=cache)
        return self.head(x)


class AppendingBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, seen: list[torch.Tensor]) -> torch.Tensor:
        y = torch.tanh(self.linear(x))
        seen.append(y)
        return y


class ListLogging(nn.Module):
    """Blocks that append their outputs to a list the parent passes, read after the loop."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(AppendingBlock(width) for _ in range(4))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        for block in self.blocks:
            x = block(x, seen)
        return self.head(torch.stack(seen).mean(dim=0))


def _forced(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> autockpt.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autockpt.plan(
            model, inputs, 10**12, tracing="forward-hooks", use_gradient_checkpointing=True
        )


def _same_step(model: nn.Module, plan: autockpt.Plan, inputs: tuple[torch.Tensor, ...]) -> None:
    _, loss, got = measured_step(model, inputs, plan)
    _, want_loss, want = measured_step(model, inputs)
    assert torch.equal(loss, want_loss)
    assert_same_gradients(got, want)


def test_calls_writing_an_object_they_are_given_recompute_with_it_as_forward_found_it():
    torch.manual_seed(0)
    model, inputs = CachingDecoder(), (torch.randn(64, 32),)
    plan = _forced(model, inputs)
    layers = [s for s in plan.segments if s.modules[0].startswith("layers.")]
    assert len(layers) == 4 and all(s.recomputed for s in layers), plan.segments
    _same_step(model, plan, inputs)
    planned = autockpt.apply(model, plan)
    autockpt.training_step(planned, plan, inputs, (), lambda output: output.sum())
    # Each layer's recompute wrote its keys again; the cache ends with the forward's four.
    assert len(planned.last_cache.keys) == 4


def test_calls_writing_a_list_they_are_given_are_kept_and_gradients_hold():
    torch.manual_seed(0)
    model, inputs = ListLogging(), (torch.randn(64, 32),)
    plan = _forced(model, inputs)
    writing = [s for s in plan.segments if s.modules[0].startswith("blocks.")]
    assert len(writing) == 4, plan.segments
    for segment in writing:
        assert not segment.recomputed
        assert "writes to the list it is given" in segment.reason, segment.reason
    assert any(s.recomputed for s in plan.segments)  # the head still is
    _same_step(model, plan, inputs)
