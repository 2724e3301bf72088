"""Spans of links on the forward-hook path (NOTE [Module spans]): runs of module calls
recomputed as one, where recomputing each alone saves nothing."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from tests.oracle import measured_step


class LinearChain(nn.Module):
    """Six ``Linear`` + ``ReLU`` blocks called in a loop: each block saves only its input and
    the ReLU's output, so every saved tensor is a boundary the next block keeps anyway."""

    def __init__(self, width: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(dropout)) for _ in range(6)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class GluedChain(nn.Module):
    """Blocks with Python between them, written as people write it: a BatchNorm first,
    functional dropout and a scale in the glue, a keyword argument, a dict output."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(width)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1)) for _ in range(6)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.norm(x)
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index == 2:
                x = F.dropout(x, 0.1, self.training) * 2.0
        return {"prediction": self.head(input=x)}


def _loss(output: dict[str, torch.Tensor]) -> torch.Tensor:
    return output["prediction"].pow(2).mean()


def _plan(model: nn.Module, inputs: tuple[torch.Tensor, ...], budget: int, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autockpt.plan(
            model,
            inputs,
            budget,
            tracing="forward-hooks",
            allow_micro_batches=False,
            **options,
        )


def _assert_same_gradients(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")


def test_forced_checkpointing_lowers_the_peak_of_a_chain_of_linears_through_hooks():
    # The model: recomputing each block alone kept every boundary (8.5 MB either way).
    model, inputs = LinearChain(), (torch.randn(4096, 64),)
    plain = _plan(model, inputs, 10**12, optimizer=None)
    forced = _plan(model, inputs, 10**12, optimizer=None, use_gradient_checkpointing=True)
    assert any(len(s.modules) > 1 and s.recomputed for s in forced.segments)
    assert forced.predicted_peak_bytes <= 0.8 * plain.unplanned_peak_bytes
    unplanned_peak, _, want = measured_step(model, inputs)
    planned_peak, _, got = measured_step(model, inputs, forced)
    # The oracle (AdamW state included) sees the same saving, and the same gradients.
    assert planned_peak <= unplanned_peak - 0.5 * (
        plain.unplanned_peak_bytes - forced.predicted_peak_bytes
    )
    _assert_same_gradients(got, want)


@pytest.mark.parametrize("share", [0.8, 0.6])
def test_a_budget_plan_recomputes_spans_fits_and_keeps_every_gradient_with_dropout_on(share):
    model, inputs = GluedChain(), (torch.randn(4096, 64),)
    plain = _plan(model, inputs, 10**12, loss_fn=_loss)
    budget = int(share * plain.unplanned_peak_bytes)
    plan = _plan(model, inputs, budget, loss_fn=_loss)
    assert any(len(s.modules) > 1 and s.recomputed for s in plan.segments), plan.segments
    peak, loss, got = measured_step(model, inputs, plan, loss_fn=_loss, seed=7)
    assert peak <= budget
    _, want_loss, want = measured_step(model, inputs, loss_fn=_loss, seed=7)
    assert torch.equal(loss, want_loss)
    _assert_same_gradients(got, want)


def test_a_span_puts_batchnorm_statistics_back_and_a_second_backward_recomputes_it():
    model = GluedChain()
    inputs = (torch.randn(512, 64),)
    plan = _plan(model, inputs, 10**12, loss_fn=_loss, use_gradient_checkpointing=True)
    spans = [s for s in plan.segments if len(s.modules) > 1 and s.recomputed]
    assert any("norm" in s.modules for s in spans), plan.segments
    reference = copy.deepcopy(model)
    planned = autockpt.apply(model, plan)
    torch.manual_seed(0)
    want = _loss(reference(*inputs))
    torch.autograd.backward(want, retain_graph=True)
    want.backward()
    torch.manual_seed(0)
    got = _loss(planned(*inputs))
    got.backward(retain_graph=True)  # the span reruns in each backward
    got.backward()
    assert torch.equal(got, want)
    for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    for (name, a), b in zip(model.named_buffers(), reference.buffers(), strict=True):
        assert torch.equal(a, b), name  # one update per forward, none in the reruns


def test_in_eval_and_without_gradients_the_spans_run_the_models_own_forward():
    model = GluedChain()
    inputs = (torch.randn(256, 64),)
    plan = _plan(model, inputs, 10**12, loss_fn=_loss, use_gradient_checkpointing=True)
    planned = autockpt.apply(model, plan)
    with torch.no_grad():
        model.train()
        planned.train()
        torch.manual_seed(1)
        want = model(*inputs)["prediction"]
        torch.manual_seed(1)
        assert torch.equal(planned(*inputs)["prediction"], want)
    model.eval()
    planned.eval()
    assert torch.equal(planned(*inputs)["prediction"], model(*inputs)["prediction"])


def test_a_budget_only_spans_meet_is_planned_with_the_loss_backward_counted():
    # The loss's backward runs with every kept byte alive (here its gradient of the output
    # and the square's): a plan that keeps the last blocks peaks there, which the chain model
    # must count to prefer the spans (left out, the lowest plan it finds is 82%).
    model, inputs = LinearChain(), (torch.randn(4096, 64),)

    def loss_fn(output: torch.Tensor) -> torch.Tensor:
        return output.pow(2).mean()

    plain = _plan(model, inputs, 10**12, loss_fn=loss_fn)
    budget = int(0.7 * plain.unplanned_peak_bytes)
    plan = _plan(model, inputs, budget, loss_fn=loss_fn, allow_chunks=False)
    assert any(len(s.modules) > 1 and s.recomputed for s in plan.segments), plan.segments
    peak, _, got = measured_step(model, inputs, plan, loss_fn=loss_fn)
    assert peak <= budget
    _assert_same_gradients(got, measured_step(model, inputs, loss_fn=loss_fn)[2])
