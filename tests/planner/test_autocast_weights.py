"""A step run whole inside ``torch.autocast`` (as the trainer and many loops run it) holds no
more than its plan measured (NOTE [Autocast's weight cache]): the cast weights are not kept
alive through backward by autocast's cache."""

from __future__ import annotations

import torch
from torch import nn

import autockpt
from tests.oracle import LiveBytes, starting_tensors


def test_a_step_inside_autocast_stays_at_its_plans_peak() -> None:
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(1024, 1024), nn.GELU()) for _ in range(8)]
    model = nn.Sequential(*layers, nn.Linear(1024, 1)).train()
    x = torch.randn(8, 1024)

    def loss_fn(output: torch.Tensor) -> torch.Tensor:
        return output.float().sum()

    plan = autockpt.plan(
        model, (x,), 10**12, loss_fn=loss_fn, autocast_dtype=torch.bfloat16, optimizer="sgd"
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    for parameter in model.parameters():  # momentum state, as in the middle of training
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    counter = LiveBytes()
    for tensor in starting_tensors(model, optimizer, [x]):
        counter.hold(tensor)
    with counter, torch.autocast("cpu", dtype=torch.bfloat16):
        autockpt.training_step(model, plan, (x,), (), loss_fn)
        optimizer.step()
    bf16_weights = sum(p.numel() * 2 for p in model.parameters())
    # Without the cache released the step held every bf16 weight more (16.8 MB here).
    assert counter.peak_bytes <= plan.predicted_peak_bytes, (
        counter.peak_bytes - plan.predicted_peak_bytes,
        bf16_weights,
    )
