"""How close the planner gets to the floor of a torchvision-style ResNet-18.

BatchNorm in training mixes samples, so neither chunks nor micro-batches apply: the lowest
peak comes from recompute alone, and it cannot go below a *floor*: parameters, their gradients,
the optimizer state and the input batch, plus the backward of the one segment no plan can split
further (the first in backward order that needs the most at once). For each optimizer setting
the script prints, on fake tensors (no real memory):

* the unplanned peak;
* the minimum the planner reports (``InfeasibleBudgetError.minimum_bytes`` for a 1-byte
  budget: a measured plan);
* the minimum of the chain without the cuts before in-place writes (the units only, NOTE [Cut
  points]), as the solver estimates it: what the finer cuts buy;
* the floor and its parts, and which segment sets it.

    python benchmarks/resnet_floor.py [--batch-size 16] [--image-size 128] [--width 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

import autockpt
from autockpt.planner.core.decisions import KEEP, SegmentAction
from autockpt.planner.measure.fake_step import FakeTrainingState, profile_step
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_builder import ChainBuilder
from autockpt.planner.solve.chain_positions import Profiles, unit_segments
from autockpt.planner.solve.chain_solver import minimum_peak
from autockpt.planner.timing.calibration import TimeModel
from autockpt.planner.timing.time_model import EstimatedCosts
from autockpt.planner.trace.fx_graph import Segment, TracedModel, trace_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.resnet_style import ResNet18  # noqa: E402

MIB = 2**20


def chain_minimum(
    traced: TracedModel, state: FakeTrainingState, inputs: Sequence[torch.Tensor]
) -> int:
    """The solver's lowest peak over ``traced``'s chain with plain recompute (no regions)."""
    kept = profile_step(state, inputs, [KEEP] * len(traced.segments), segments=traced.segments)

    def recomputed(segments: Sequence[Segment]) -> StepProfile:
        actions = [SegmentAction(recompute=not s.keep_reason) for s in segments]
        return profile_step(state, inputs, actions, segments=segments)

    units = unit_segments(traced)
    profiles = Profiles(kept, recomputed(traced.segments), None, units and recomputed(units))
    costs = EstimatedCosts(TimeModel(1e12, 1e10, 1e-6), kept)
    builder = ChainBuilder(traced, costs, inputs[0].shape[0])
    return minimum_peak(builder.chain(profiles, None, 1, None)).peak_bytes


def floor(kept: StepProfile, traced: TracedModel) -> tuple[int, int, str]:
    """The floor: the states (parameters, optimizer state, inputs, all gradients), the bytes
    above them that the bounding segment's backward needs at once, and that segment's name.

    The bound is :func:`~autockpt.planner.solve.chain_terms.recompute_lower_bound_bytes` over the
    finest chain: while segment ``i`` runs backward, no plan holds less than the kept step then,
    less what the segments before it keep.
    """
    states = kept.start_bytes + kept.gradient_bytes
    bounds = [
        profile.backward_peak_bytes - (profile.start_bytes - kept.start_bytes)
        for profile in kept.segments
    ]
    worst = max(range(len(bounds)), key=bounds.__getitem__)
    return states, bounds[worst] - states, traced.segments[worst].name


def _share(value: int, unplanned: int) -> str:
    return f"{value / MIB:8.1f} MiB {value / unplanned:6.1%}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = ResNet18(width=args.width)
    inputs = (torch.randn(args.batch_size, 3, args.image_size, args.image_size),)
    traced = trace_model(model, inputs)
    units = traced.unit_segments
    coarse = dataclasses.replace(
        traced, segments=units, units=tuple((i, i + 1) for i in range(len(units)))
    )
    print(
        f"ResNet-18 style, width {args.width}, batch {args.batch_size}, "
        f"3x{args.image_size}x{args.image_size}: {len(traced.segments)} segments, "
        f"{len(units)} units"
    )
    for optimizer in ("adamw", None):
        state = FakeTrainingState(traced, optimizer=optimizer)
        kept = profile_step(state, inputs, [KEEP] * len(traced.segments))
        unplanned = kept.peak_bytes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                autockpt.plan(model, inputs, 1, optimizer=optimizer)
                raise AssertionError("a 1-byte budget planned")
            except autockpt.InfeasibleBudgetError as error:
                reported = error.minimum_bytes
        units_only = chain_minimum(coarse, FakeTrainingState(coarse, optimizer=optimizer), inputs)
        states, piece, name = floor(kept, traced)

        print(f"\noptimizer {optimizer}")
        print(f"  unplanned peak                       {_share(unplanned, unplanned)}")
        print(f"  reported minimum                     {_share(reported, unplanned)}")
        print(f"  minimum, units only (solver)         {_share(units_only, unplanned)}")
        print(
            f"  floor                                {_share(states + piece, unplanned)}"
            f"  = parameters {kept.parameter_bytes / MIB:.1f} + gradients "
            f"{kept.gradient_bytes / MIB:.1f} + optimizer state "
            f"{kept.optimizer_state_bytes / MIB:.1f} + inputs {kept.input_bytes / MIB:.1f} "
            f"+ backward of {name} {piece / MIB:.1f}"
        )


if __name__ == "__main__":
    main()
