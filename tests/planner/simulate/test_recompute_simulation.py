"""The profile of a step with segments recomputed, worked out from the kept step's record
(NOTE [Recompute simulated]), against the same step measured on fake tensors.

The measured step is the simulation's reference: every segment recomputed, at each level the
chain model reads (the segments, the units, the regions), the simulated profile must say what the
measurement says of what each segment leaves alive and of its forward, and never less than the
measurement of a backward or of the step's peak (a simulation that reads low would offer plans
that do not fit); where it reads high, by little.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.measure.step_measurer import StepMeasurer
from autockpt.planner.simulate.recompute_simulation import simulated_profile
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.simulate.step_spec import StepSpec
from autockpt.planner.solve.chain_terms import kept_increments
from autockpt.planner.trace.fx_graph import Segment
from autockpt.planner.trace.module_chain import trace_or_find_modules
from tests.zoo import ZOO
from tests.zoo.case import randomness_off

WIDTH, TOKENS = 32, 16


class DropoutMLP(nn.Module):
    """Residual blocks with functional dropout: a mask made in place inside the segment."""

    def __init__(self) -> None:
        super().__init__()
        self.ups = nn.ModuleList(nn.Linear(WIDTH, 2 * WIDTH) for _ in range(3))
        self.downs = nn.ModuleList(nn.Linear(2 * WIDTH, WIDTH) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for up, down in zip(self.ups, self.downs, strict=True):
            x = x + down(F.dropout(F.gelu(up(x)), 0.2, self.training))
        return x


class Transients(nn.Module):
    """Blocks whose inputs and largest values nothing saves: scaled before the linear, which
    saves the scaled copy, a spread sixteen times the block's width made without grad, and
    scalings after (the recompute's rerun makes them all again, and its peak is the block's
    backward's; the checkpoint holds each block's input to its backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(WIDTH, 4 * WIDTH) for _ in range(3))
        self.downs = nn.ModuleList(nn.Linear(4 * WIDTH, WIDTH) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear, down in zip(self.linears, self.downs, strict=True):
            wide = linear(x * 1.5)
            # A large value nothing saves: made again by the rerun only.
            spread = wide.detach().unsqueeze(-1).expand(-1, -1, -1, 16).pow(2).mean(-1)
            wide = (wide * 2.0 + 1.0) * 0.5 / (spread + 1.0)
            x = torch.tanh(down(wide * 0.25)) * 3.0
        return x


def _decoder() -> tuple[nn.Module, tuple[Any, ...], Callable[..., Any], tuple[Any, ...]]:
    case = ZOO["nanogpt"]  # causal SDPA blocks, a tied head; dropout off (SDPA's is measured)
    inputs, targets = case.batch(case.test_batch_size)
    return randomness_off(case.build()), inputs, case.loss_fn, targets


def _squares_of(
    make: Callable[[], nn.Module],
) -> Callable[[], tuple[nn.Module, tuple[Any, ...], Callable[..., Any], tuple[Any, ...]]]:
    """A case of ``make()``'s model on a seeded batch, its loss the sum of the squared output."""

    def case() -> tuple[nn.Module, tuple[Any, ...], Callable[..., Any], tuple[Any, ...]]:
        torch.manual_seed(0)
        return make(), (torch.randn(8, TOKENS, WIDTH),), lambda out: out.square().sum(), ()

    return case


CASES = {
    "transients": (_squares_of(Transients), None),
    "decoder": (_decoder, None),
    "dropout-mlp-bf16": (_squares_of(DropoutMLP), torch.bfloat16),
    "dropout-mlp": (_squares_of(DropoutMLP), None),
}


def _measurer(name: str) -> StepMeasurer:
    make, autocast = CASES[name]
    model, inputs, loss_fn, targets = make()
    traced = trace_or_find_modules(model.train(), inputs)
    return StepMeasurer(traced, StepSpec(model, inputs, targets, loss_fn, "adamw", autocast))


def _both(measurer: StepMeasurer, segments: tuple[Segment, ...]) -> tuple[StepProfile, StepProfile]:
    actions = [SegmentAction(recompute=not s.keep_reason) for s in segments]
    measured = measurer.measure(segments, actions)
    assert measurer.record is not None
    simulated = simulated_profile(
        measurer.record,
        measurer.kept,
        measurer.traced.segments,
        segments,
        [a.recompute for a in actions],
    )
    assert simulated is not None, "the simulation must cover a plain traced model"
    return measured, simulated


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("level", ["segments", "unit_segments", "region_segments"])
def test_every_segment_recomputed_is_simulated_as_measured(name: str, level: str) -> None:
    measurer = _measurer(name)
    segments = getattr(measurer.traced, level)
    measured, simulated = _both(measurer, segments)
    assert kept_increments(simulated) == kept_increments(measured)
    for got, want in zip(simulated.segments, measured.segments, strict=True):
        assert got.forward_peak_bytes == want.forward_peak_bytes
        assert got.input_sizes == want.input_sizes
        assert got.output_bytes == want.output_bytes
        # Never below the measurement (a plan that does not fit), and above it by little.
        assert want.backward_peak_bytes <= got.backward_peak_bytes
        assert got.backward_peak_bytes <= want.backward_peak_bytes + 0.02 * measured.peak_bytes
    assert measured.peak_bytes <= simulated.peak_bytes <= 1.01 * measured.peak_bytes


def test_a_segment_kept_is_left_as_the_kept_step_has_it() -> None:
    measurer = _measurer("decoder")
    segments = measurer.traced.segments
    recompute = [i % 2 == 1 for i in range(len(segments))]
    measured = measurer.measure(segments, [SegmentAction(recompute=r) for r in recompute])
    assert measurer.record is not None
    simulated = simulated_profile(measurer.record, measurer.kept, segments, segments, recompute)
    assert simulated is not None
    assert kept_increments(simulated) == kept_increments(measured)
    assert measured.peak_bytes <= simulated.peak_bytes <= 1.01 * measured.peak_bytes


@pytest.mark.parametrize("name", ["in_place", "lstm_batch_first", "nanogpt"])
def test_what_the_simulation_does_not_model_is_measured(name: str) -> None:
    # In-place writes into another segment's output; an LSTM kept whole whose backward the
    # kept step attributes to no op of its segment; scaled dot-product attention with dropout.
    case = ZOO[name]
    model = case.build()
    inputs, targets = case.batch(case.test_batch_size)
    traced = trace_or_find_modules(model.train(), inputs)
    measurer = StepMeasurer(traced, StepSpec(model, inputs, targets, case.loss_fn, "adamw"))
    assert measurer.record is not None
    recompute = [not s.keep_reason for s in traced.segments]
    assert any(recompute)
    assert (
        simulated_profile(
            measurer.record, measurer.kept, traced.segments, traced.segments, recompute
        )
        is None
    )


def test_a_recurrent_layer_whose_backward_is_attributed_is_simulated() -> None:
    """NOTE [Recompute simulated]: the TFT-like model's LSTMs sit in a segment whose backward
    the kept step attributes to it; recomputed, alone or with every other segment, it is
    worked out from the record and meets the measurement."""
    case = ZOO["tft_functional_dropout"]
    torch.manual_seed(0)
    model = case.build()
    inputs, targets = case.batch(case.test_batch_size)
    traced = trace_or_find_modules(model.train(), inputs)
    measurer = StepMeasurer(traced, StepSpec(model, inputs, targets, case.loss_fn, "adamw"))
    record = measurer.record
    assert record is not None and record.needs_own_backward, "no recurrent segment: nothing shown"
    segments = traced.segments
    (lstm,) = record.needs_own_backward
    for recompute in (
        [not s.keep_reason for s in segments],
        [s.index == lstm for s in segments],
    ):
        measured = measurer.measure(segments, [SegmentAction(recompute=r) for r in recompute])
        simulated = simulated_profile(record, measurer.kept, segments, segments, recompute)
        assert simulated is not None
        assert kept_increments(simulated) == kept_increments(measured)
        assert measured.peak_bytes <= simulated.peak_bytes <= 1.01 * measured.peak_bytes


@pytest.mark.parametrize("name", ["decoder", "transients"])
def test_a_micro_batch_is_simulated_from_its_own_kept_step(name: str) -> None:
    # Pieces of half the batch, every gradient live from the start: the kept step at that
    # count is recorded when measured, and the recomputed one worked out from it.
    measurer = _measurer(name)
    segments = measurer.traced.segments
    recompute = [SegmentAction(recompute=not s.keep_reason) for s in segments]
    measurer.measure(segments, [SegmentAction() for _ in segments], 2)
    assert 2 in measurer.records
    simulated = measurer.all_recomputed(segments, 2)
    measured = measurer.measure(segments, recompute, 2)
    assert simulated is not measured
    assert kept_increments(simulated) == kept_increments(measured)
    assert simulated.start_bytes == measured.start_bytes
    assert measured.peak_bytes <= simulated.peak_bytes <= 1.01 * measured.peak_bytes
