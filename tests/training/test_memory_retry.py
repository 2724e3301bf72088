"""A training step retried after running out of memory (NOTE [Recovering outside the except
block]): the failed step's tensors are freed before recovering, the retried step draws the
random numbers the failed one drew, and a device that cannot retry re-raises."""

from __future__ import annotations

import weakref

import pytest
import torch

from autockpt.training.loop.memory_retry import retried_on_out_of_memory


def test_the_failed_steps_tensors_are_freed_and_its_random_state_back_before_the_retry():
    held: list[weakref.ref[torch.Tensor]] = []
    draws: list[torch.Tensor] = []
    alive_when_recovering: list[bool] = []

    def step() -> str:
        draws.append(torch.rand(4))  # a dropout mask's draw
        activations = torch.empty(2**20)  # what the failed step had made when memory ran out
        held.append(weakref.ref(activations))
        if len(draws) == 1:
            raise torch.OutOfMemoryError("planted")
        return "done"

    def recover() -> None:
        alive_when_recovering.append(held[0]() is not None)
        torch.rand(100)  # re-planning draws from the same stream

    assert retried_on_out_of_memory(step, recover, retries=lambda: True) == "done"
    assert alive_when_recovering == [False]
    torch.testing.assert_close(draws[1], draws[0])


def test_a_device_that_cannot_retry_raises_the_error_itself():
    def step() -> None:
        raise torch.OutOfMemoryError("planted")

    def recover() -> None:
        raise AssertionError("never recovers")

    with pytest.raises(torch.OutOfMemoryError, match="planted"):
        retried_on_out_of_memory(step, recover, retries=lambda: False)
