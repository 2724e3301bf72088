"""Real steps measured at batches that fit, scaled to the whole batch (NOTE [Scaled real
measurement]): planning a model that does not run on fake tensors holds its own budget."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import autockpt
from autockpt.planner.measure.scaled_step import LINE_MARGIN, scaled_profile
from autockpt.planner.simulate.step_profile import SegmentProfile, StepProfile
from tests.oracle import LiveBytes, measured_step

MiB = 2**20


def _profile(samples: int) -> StepProfile:
    """A profile whose activations grow by 1000 bytes a sample over 5000 fixed bytes."""
    fixed, grown = 5000, 1000 * samples
    return StepProfile(
        start_bytes=fixed + 10 * samples,
        parameter_bytes=fixed,
        optimizer_state_bytes=0,
        input_bytes=10 * samples,
        gradient_bytes=fixed,
        segments=[SegmentProfile(end_bytes=fixed + grown, forward_flops=7 * samples)],
        phase_peak_bytes={"forward": fixed + grown, "optimizer": 3 * fixed},
        peak_bytes=max(fixed + grown, 3 * fixed),
    )


def test_a_line_through_two_batches_reads_every_count_at_the_whole_batch():
    got = scaled_profile(_profile(4), _profile(8), 4, 8, 1024)
    want = _profile(1024)
    # Peaks read off the line carry its margin; every other count is the line's.
    margin = 1 + LINE_MARGIN
    assert got.phase_peak_bytes == {k: int(v * margin) for k, v in want.phase_peak_bytes.items()}
    assert got.peak_bytes == int(want.peak_bytes * margin)
    got.phase_peak_bytes, got.peak_bytes = want.phase_peak_bytes, want.peak_bytes
    assert got == want


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class _ReadsValues(nn.Module):
    """Residual MLP blocks whose forward reads a tensor's value: it cannot run on fake tensors,
    so the planner measures it for real."""

    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().max().item() > 1e6:  # a data-dependent branch
            x = x / 1e6
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _loss(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


def test_planning_a_model_measured_for_real_holds_the_budget_itself():
    torch.manual_seed(0)
    model = _ReadsValues()
    x = torch.randn(2048, 128)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain_peak, want_loss, want = measured_step(model, (x,), loss_fn=_loss)
    budget = plain_peak // 2
    counter = LiveBytes()
    for tensor in [*model.parameters(), *model.buffers(), x]:
        counter.hold(tensor)  # on the card before planning starts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with counter:
            plan = autockpt.plan(model, (x,), budget, loss_fn=_loss)
    assert plan.tracing == "forward-hooks"
    assert any("measured on real tensors" in note for note in plan.notes)
    # Planning's own peak, by a counter that shares no code with the planner.
    assert counter.peak_bytes <= budget, (
        f"planning held {counter.peak_bytes / MiB:.1f} MiB, budget {budget / MiB:.1f} MiB"
    )
    # The report is not under the count, nor over the budget: the timed runs of the model's
    # whole steps (NOTE [Timing a module chain]) are reported by their bound read off the kept
    # step (NOTE [Timing at a batch that fits]), which is above what they held.
    assert counter.peak_bytes * 0.97 <= plan.planning_peak_bytes <= budget
    # The model is as it was: the measuring copy shared its parameters and never wrote them.
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in model.parameters())
    # The plan, read off the line, is the step's: it holds and keeps the gradients.
    peak, got_loss, got = measured_step(model, (x,), plan, loss_fn=_loss, loss_reduction="mean")
    assert peak <= budget
    assert abs(plan.predicted_peak_bytes - peak) <= 0.03 * peak
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    for name, gradient in want.items():
        torch.testing.assert_close(got[name], gradient, rtol=1e-4, atol=1e-7, msg=name)
