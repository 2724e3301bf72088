"""The chain builder's shortcuts, checked against measured steps."""

from __future__ import annotations

import itertools

import pytest
import torch

from autockpt.planner.core.decisions import KEEP, SegmentAction
from autockpt.planner.measure.fake_step import FakeTrainingState, profile_step
from autockpt.planner.solve.chain_terms import recompute_lower_bound_bytes
from autockpt.planner.trace.fx_graph import trace_model
from tests.helpers import MLPStack, TinyTransformer
from tft.model.config import get_preset
from tft.model.transformer import TemporalFusionTransformer


def _tiny_tft() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    config = get_preset("tiny")
    model = TemporalFusionTransformer(config)
    return model, model.example_inputs(
        config.batch_size, generator=torch.Generator().manual_seed(0)
    )


MODELS = {
    "mlp": lambda: (MLPStack(128, 6, 0.1), (torch.randn(256, 128),)),
    "transformer": lambda: (TinyTransformer(dropout=0.1), (torch.randn(16, 40, 32),)),
    "tft-tiny": _tiny_tft,
}


@pytest.mark.parametrize(
    "name",  # the two larger chains take 30 to 45 s on 2 cores: slow tests
    ["mlp", *(pytest.param(name, marks=pytest.mark.slow) for name in ("transformer", "tft-tiny"))],
)
def test_no_plain_recompute_plan_measures_below_the_lower_bound(name):
    model, inputs = MODELS[name]()
    traced = trace_model(model, inputs)
    state = FakeTrainingState(traced)
    count = len(traced.segments)
    kept = profile_step(state, inputs, [KEEP] * count)
    bound = recompute_lower_bound_bytes(kept)
    recompute = SegmentAction(recompute=True)
    # Every plan of plain recomputes on small chains, or the all-kept, all-recomputed and
    # one-segment plans on longer ones.
    if count <= 6:
        choices = list(itertools.product((False, True), repeat=count))
    else:
        choices = [(False,) * count, (True,) * count]
        choices += [tuple(i == j for j in range(count)) for i in range(count)]
    for choice in choices:
        actions = [recompute if chosen else KEEP for chosen in choice]
        peak = profile_step(state, inputs, actions, run_optimizer=False).peak_bytes
        assert bound <= peak, (choice, bound, peak)
    # The bound is a bound, not a guess far below: it is at least the kept step's start.
    assert bound >= kept.start_bytes
