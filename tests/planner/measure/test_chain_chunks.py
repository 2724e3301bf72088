"""Chunks on the forward-hook path: a submodule of a model torch.fx cannot trace runs in pieces
of the batch (NOTE [Module chain], "Splitting the batch")."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from autockpt.planner.measure.separability import analyse_separability
from autockpt.planner.trace.module_chain import trace_or_find_modules
from tests.oracle import measured_step


class Wide(nn.Module):
    """A per-time-step block with a wide interior and a keyword argument."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, 8 * hidden)
        self.down = nn.Linear(8 * hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, *, gate: torch.Tensor | None = None) -> torch.Tensor:
        y = self.down(F.dropout(F.gelu(self.up(x)), 0.1, self.training))
        if gate is not None:
            y = y * torch.sigmoid(gate)
        return self.norm(x + y)


class BranchyForecaster(nn.Module):
    """Branches on a tensor's value (so fx cannot trace it), then a wide block, an LSTM
    (batch first, returning a tuple) and a BatchNorm over the batch."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(4, hidden)
        self.wide = Wide(hidden)
        self.rnn = nn.LSTM(hidden, hidden, batch_first=True)
        self.norm = nn.BatchNorm1d(hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        if x.abs().sum() > 0:
            h = self.wide(h, gate=h)
        out, _ = self.rnn(h)
        return self.head(self.norm(out[:, -1]))


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def _plan(model: nn.Module, inputs, targets, budget: int, **options) -> autockpt.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autockpt.plan(
            model, inputs, budget, loss_fn=_loss, example_targets=targets, **options
        )


def test_the_probe_finds_which_submodules_compute_sample_by_sample():
    model, inputs = BranchyForecaster(), (torch.randn(16, 20, 4),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chain = trace_or_find_modules(model, inputs)
    found = analyse_separability(chain, inputs, model=model)
    chunkable = {s.name: flag for s, flag in zip(chain.segments, found.chunkable, strict=True)}
    # BatchNorm mixes the samples of the batch; the rest computes each sample alone.
    assert chunkable == {"embed": True, "wide": True, "rnn": True, "norm": False, "head": True}
    wide = [s.name for s in chain.segments].index("wide")
    assert found.input_batch_dims[wide] == (0, 0)  # x, and gate given by keyword


def test_a_low_budget_runs_submodules_in_chunks_under_budget_with_the_plain_gradients():
    model = BranchyForecaster()
    inputs, targets = (torch.randn(64, 50, 4),), (torch.randn(64, 1),)
    unplanned = _plan(model, inputs, targets, 10**12).unplanned_peak_bytes
    budget = int(0.3 * unplanned)
    plan = _plan(model, inputs, targets, budget, allow_micro_batches=False)
    assert plan.tracing == "forward-hooks"
    chunked = {s.name: s.num_chunks for s in plan.segments if s.num_chunks > 1}
    assert "wide" in chunked, plan.segments
    assert "norm" not in chunked
    peak, loss, got = measured_step(model, inputs, plan, loss_fn=_loss, targets=targets, seed=2)
    assert peak <= budget
    _, want_loss, want = measured_step(model, inputs, loss_fn=_loss, targets=targets, seed=2)
    torch.testing.assert_close(loss, want_loss)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name)
    planned = autockpt.apply(model, plan)
    model.eval()
    planned.eval()
    assert torch.equal(planned(*inputs), model(*inputs))
