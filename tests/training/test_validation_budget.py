"""Validation within the step's budget (NOTE [Validation within the step's budget]).

Without autograd the planned module runs the model's forward whole, so a region the plan runs
in chunks or micro-batches would make its whole batch's intermediates at once: validation cuts
the batch into the plan's ``inference_pieces``. The peak is counted by the tests' own counter
(``tests/oracle.LiveBytes``), which shares no code with the planner.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autockpt
from autockpt.training.forecasts.evaluate import forward_in_pieces
from tests.helpers import MLPStack
from tests.oracle import LiveBytes, starting_tensors


def _wide_model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 2048), nn.GELU(), nn.Linear(2048, 32)), torch.randn(512, 32)


@pytest.mark.parametrize("pieces_by", ["micro-batches", "chunks"])
def test_validation_forward_stays_under_the_budget_the_whole_batch_would_overrun(
    pieces_by: str,
) -> None:
    model, x = _wide_model()
    unplanned = autockpt.plan(model, (x,), 10**12, use_gradient_checkpointing=False)
    budget = unplanned.predicted_peak_bytes // 2
    only = (
        {"allow_chunks": False} if pieces_by == "micro-batches" else {"allow_micro_batches": False}
    )
    plan = autockpt.plan(model, (x,), budget, **only)
    assert plan.fits and plan.inference_pieces > 1
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.no_grad(), LiveBytes() as whole:
        want = model(x)
    assert whole.peak_bytes + parameter_bytes > budget  # what validation did before
    with torch.no_grad(), LiveBytes() as pieces:
        got = forward_in_pieces(model, (x,), plan.inference_pieces)
    assert pieces.peak_bytes + parameter_bytes <= budget
    torch.testing.assert_close(got, want)


def test_a_forward_that_fits_in_fewer_pieces_than_the_bound_runs_in_them_within_the_budget():
    """NOTE [Validation in as few pieces as fit]: a deep stack keeps every block's activations
    for backward, so its step needs micro-batches or chunks; without autograd one block's are
    alive at a time, and the forward is measured to fit in fewer pieces. The count holds the
    budget by the tests' own counter, the trainer's state (parameters, gradients, AdamW's
    state, the batch) live beside it."""
    torch.manual_seed(0)
    model, x = MLPStack(32, 6, 0.0), torch.randn(32, 256, 32)
    unplanned = autockpt.plan(model, (x,), 10**12).unplanned_peak_bytes
    budget = int(0.3 * unplanned)
    plan = autockpt.plan(model, (x,), budget)
    bound = plan.num_micro_batches * max(s.num_chunks for s in plan.segments)
    assert plan.forward_pieces is not None and plan.inference_pieces < bound, (plan, bound)
    optimizer = torch.optim.AdamW(model.parameters())
    autockpt.training_step(autockpt.apply(model, plan), plan, (x,), (), lambda out: out.sum())
    optimizer.step()  # the gradients stay: validation may run before they are zeroed
    with torch.no_grad():
        want = model(x)
    counter = LiveBytes()
    for tensor in starting_tensors(model, optimizer, [x]):
        counter.hold(tensor)
    with torch.no_grad(), counter:
        got = forward_in_pieces(model, (x,), plan.inference_pieces)
    assert counter.peak_bytes <= budget, f"{counter.peak_bytes:,} over {budget:,}"
    torch.testing.assert_close(got, want)


def test_inference_pieces_multiply_micro_batches_by_the_most_chunks() -> None:
    model, x = _wide_model()
    plan = autockpt.plan(model, (x,), 10**12, use_gradient_checkpointing=False)
    assert plan.inference_pieces == 1
    segments = [
        s.model_copy(update={"num_chunks": 4 if i == 0 else 2}) for i, s in enumerate(plan.segments)
    ]
    chunked = plan.model_copy(update={"segments": segments, "num_micro_batches": 3})
    assert chunked.inference_pieces == 12


def test_every_piece_runs_as_many_forwards_on_a_short_batch() -> None:
    """Under FSDP every rank must run the same forwards (each gathers parameters)."""
    calls = []
    model = nn.Linear(4, 2)
    model.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(2, 4)
    with torch.no_grad():
        out = forward_in_pieces(model, (x,), 5, every_piece=True)
        assert len(calls) == 5 and out.shape == (2, 2)
        calls.clear()
        forward_in_pieces(model, (x,), 5)
    assert len(calls) == 2


def test_the_trainer_s_validation_cuts_its_batches_by_the_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    from autockpt.training.forecasts import evaluate as evaluation
    from autockpt.training.options.config import TrainConfig
    from autockpt.training.options.settings import SAMPLE_DATA
    from autockpt.training.setup.prepare import prepare

    setup = prepare(TrainConfig(data=SAMPLE_DATA, preset="tiny", batch_size=16))
    whole = evaluation.evaluate(setup, setup.data.validation, max_batches=2)
    in_micro_batches = dataclasses.replace(
        setup, plan=setup.plan.model_copy(update={"num_micro_batches": 4})
    )
    seen: list[int] = []

    def recording(model: nn.Module, inputs: tuple, pieces: int, **kwargs) -> torch.Tensor:
        seen.append(pieces)
        return forward_in_pieces(model, inputs, pieces, **kwargs)

    monkeypatch.setattr(evaluation, "forward_in_pieces", recording)
    cut = evaluation.evaluate(in_micro_batches, setup.data.validation, max_batches=2)
    assert seen == [4, 4]
    assert whole is not None and cut is not None
    assert cut.loss == pytest.approx(whole.loss, rel=1e-5)
