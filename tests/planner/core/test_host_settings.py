"""The random streams planning and a retried step fork: a CUDA device named without an index
is the current one, not device 0."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from autockpt.planner.core.host_settings import forked_devices, random_streams_kept


def test_a_cuda_device_without_an_index_forks_the_current_devices_stream(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert forked_devices(torch.device("cuda")) == [1]
    assert forked_devices(torch.device("cuda", 2)) == [2]
    assert forked_devices(torch.device("cpu")) == []


@pytest.mark.parametrize(
    "draw",
    [lambda: torch.rand(3), lambda: np.random.rand(3), random.random],
    ids=["torch", "numpy", "python"],
)
def test_every_stream_the_caller_draws_from_is_where_it_was(draw):
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    with random_streams_kept(torch.device("cpu")):
        torch.rand(5), np.random.rand(5), random.random()
    after = draw()
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    assert np.allclose(np.asarray(after), np.asarray(draw()))
