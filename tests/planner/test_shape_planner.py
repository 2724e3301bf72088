"""Batches of other shapes than the planned one: ``training_step`` refuses a larger batch in
one line, ``ShapePlanner`` plans it before its step, a declared maximum plans once, and every
step (planning included) stays under the budget by the tests' own counter, with the plain
run's losses and gradients (NOTE [Plans that follow the shapes of a run])."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import autockpt
from autockpt.planner.core.batch_split import batch_shapes
from tests.oracle import LiveBytes, assert_same_gradients, measured_step, starting_tensors

VOCAB, WIDTH = 64, 32


class TokenMLP(nn.Module):
    """Tokens through residual MLP blocks and a vocabulary head: its memory grows with the
    batch and with the positions alike."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(4)
        )
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)  # (B, T, W)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)  # (B, T, V)


def token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), ids.flatten())


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _plain_peak(model: nn.Module, ids: torch.Tensor) -> int:
    peak, _, _ = measured_step(model, (ids,), loss_fn=token_loss, targets=(ids,))
    return peak


class CountedRun:
    """A run of AdamW steps on one model, each step counted by LiveBytes from its start
    (parameters, gradients, optimizer state, the batch) to its end, planning included."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.peaks: list[int] = []
        self.losses: list[float] = []
        self.gradients: list[dict[str, torch.Tensor]] = []

    def step(self, run: Any, ids: torch.Tensor) -> None:
        counter = LiveBytes()
        for tensor in starting_tensors(self.model, self.optimizer, [ids]):
            counter.hold(tensor)
        with counter:
            loss = run(ids)
            self.gradients.append(
                {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}
            )
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.peaks.append(counter.peak_bytes)
        self.losses.append(float(loss))


def _plain_run(model: nn.Module, batches: list[torch.Tensor]) -> CountedRun:
    run = CountedRun(model)
    for ids in batches:

        def plain(ids: torch.Tensor) -> torch.Tensor:
            loss = token_loss(run.model(ids), ids)
            loss.backward()
            return loss.detach()

        run.step(plain, ids)
    return run


def _planned_run(
    model: nn.Module, batches: list[torch.Tensor], budget: int, **options: Any
) -> tuple[CountedRun, autockpt.ShapePlanner]:
    run = CountedRun(model)
    planner = autockpt.ShapePlanner(
        model, budget, loss_fn=token_loss, optimizer=run.optimizer, progress=False, **options
    )
    for ids in batches:
        run.step(lambda ids: planner.training_step((ids,), (ids,)), ids)
    return run, planner


def _assert_same_run(planned: CountedRun, plain: CountedRun) -> None:
    torch.testing.assert_close(planned.losses, plain.losses, rtol=1e-5, atol=1e-6)
    for got, want in zip(planned.gradients, plain.gradients, strict=True):
        assert_same_gradients(got, want)


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return TokenMLP()


def test_training_step_refuses_a_batch_larger_than_its_plan_in_one_line(model) -> None:
    ids = _ids(4, 16)
    plan = autockpt.plan(
        model, (ids,), 10**9, loss_fn=token_loss, example_targets=(ids,), progress=False
    )
    assert plan.batch_shapes == batch_shapes((ids,), (ids,))
    planned = autockpt.apply(model, plan)
    longer = _ids(4, 64)
    with pytest.raises(autockpt.ShapeError) as refused:
        autockpt.training_step(planned, plan, (longer,), (longer,), token_loss)
    message = str(refused.value)
    assert "\n" not in message
    assert "4x64" in message and "4x16" in message  # the shape given and the shape planned
    assert "max_shape=(4, 64)" in message and "ShapePlanner" in message  # the ways out
    # Smaller along every dimension: it runs.
    autockpt.training_step(planned, plan, (ids[:1, :5],), (ids[:1, :5],), token_loss)


def test_batches_of_1x_4x_and_03x_stay_under_the_budget_with_the_plain_gradients(model) -> None:
    planned_ids = _ids(10, 24)
    batches = [planned_ids, _ids(40, 24, seed=1), _ids(3, 24, seed=2), _ids(40, 24, seed=3)]
    budget = int(0.6 * _plain_peak(model, batches[1]))
    # The bug this is named for: the plan of the first batch, kept for the larger one (its
    # shapes unchecked, as before plans recorded them), goes over.
    first = autockpt.plan(
        model,
        (planned_ids,),
        budget,
        loss_fn=token_loss,
        example_targets=(planned_ids,),
        progress=False,
    )
    unchecked = first.model_copy(update={"batch_shapes": None})
    stale_peak, _, _ = measured_step(
        model,
        (batches[1],),
        unchecked,
        loss_fn=token_loss,
        targets=(batches[1],),
        loss_reduction="mean",
    )
    assert stale_peak > budget, (stale_peak, budget)

    plain = _plain_run(copy.deepcopy(model), batches)
    planned, planner = _planned_run(copy.deepcopy(model), batches, budget)
    assert max(planned.peaks) <= budget, (planned.peaks, budget)
    _assert_same_run(planned, plain)
    # One plan for the first batch, one for the bucket of 4x (64 samples); 0.3x and the second
    # 4x batch run with those, planned for nothing.
    assert planner.num_plans == 2
    assert [p.batch_shapes.text() for p in planner.plans] == [
        "inputs[0] 10x24, targets[0] 10x24",
        "inputs[0] 64x24, targets[0] 64x24",
    ]
    assert planner.planning_s > 0


def test_lengths_rising_falling_and_past_any_seen_plan_once_per_bucket(model) -> None:
    lengths = [8, 24, 96, 16, 64, 200]
    batches = [_ids(4, length, seed=index) for index, length in enumerate(lengths)]
    budget = int(0.7 * _plain_peak(model, _ids(4, 256)))
    plain = _plain_run(copy.deepcopy(model), batches)
    planned, planner = _planned_run(copy.deepcopy(model), batches, budget)
    assert max(planned.peaks) <= budget, (planned.peaks, budget)
    _assert_same_run(planned, plain)
    planned_lengths = [plan.batch_shapes.shapes[0][1] for plan in planner.plans]
    assert planned_lengths == [8, 32, 128, 256]  # 16 and 64 ran with the plans above them


def test_a_declared_maximum_plans_once_and_holds_for_every_batch_under_it(model) -> None:
    lengths = [12, 256, 37, 1, 200]
    batches = [_ids(4, length, seed=index) for index, length in enumerate(lengths)]
    budget = int(0.5 * _plain_peak(model, _ids(4, 256)))
    plain = _plain_run(copy.deepcopy(model), batches)
    planned, planner = _planned_run(copy.deepcopy(model), batches, budget, max_shape=(4, 256))
    assert planner.num_plans == 1
    (plan,) = planner.plans
    assert plan.batch_shapes.shapes == [[4, 256], [4, 256]]
    assert plan.num_micro_batches > 1 or plan.num_recomputed > 0 or plan.loss_chunks is not None
    assert max(planned.peaks) <= budget, (planned.peaks, budget)
    _assert_same_run(planned, plain)


def test_a_plan_in_chunks_made_for_2048_positions_runs_at_37(model, fixed_time_model) -> None:
    ids = _ids(4, 2048)
    budget = int(0.3 * _plain_peak(model, ids))
    plan = autockpt.plan(
        model, (ids[:, :40],), budget, loss_fn=token_loss, example_targets=(ids[:, :40],),
        max_shape=(4, 2048), allow_micro_batches=False, progress=False,
    )  # fmt: skip
    assert plan.batch_shapes.shapes == [[4, 2048], [4, 2048]]
    assert any(s.num_chunks > 1 for s in plan.segments), plan
    # 37 positions, the whole batch and one sample (fewer samples than the plan's chunks).
    for short in (_ids(4, 37, seed=5), _ids(1, 37, seed=6)):
        peak, loss, gradients = measured_step(
            model, (short,), plan, loss_fn=token_loss, targets=(short,), loss_reduction="mean"
        )
        _, plain_loss, plain_gradients = measured_step(
            model, (short,), loss_fn=token_loss, targets=(short,)
        )
        assert peak <= budget
        torch.testing.assert_close(loss, plain_loss)
        assert_same_gradients(gradients, plain_gradients)


def test_with_replanning_off_a_longer_batch_is_refused_before_its_forward(model) -> None:
    planner = autockpt.ShapePlanner(model, 10**9, loss_fn=token_loss, replan=False, progress=False)
    planner.training_step((_ids(4, 16),), (_ids(4, 16),))
    calls = []
    handle = model.embed.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(autockpt.ShapeError, match=r"4x32 .* 4x16; .*max_shape=\(4, 32\)"):
            planner.training_step((_ids(4, 32),), (_ids(4, 32),))
    finally:
        handle.remove()
    assert not calls  # refused before the forward
    assert planner.num_plans == 1


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_shape": (4, 0)}, r"max_shape=\(4, 0\) is not a tuple of positive sizes"),
        ({"max_shape": "4x16"}, r"max_shape='4x16' is not a tuple"),
        ({"max_plans": 0}, r"max_plans=0 keeps no plan"),
    ],
)
def test_bad_settings_are_refused_where_they_are_given(model, options, match) -> None:
    with pytest.raises(autockpt.ConfigError, match=match):
        autockpt.ShapePlanner(model, "1GB", loss_fn=token_loss, **options)


def test_an_example_batch_above_its_declared_maximum_is_refused(model) -> None:
    ids = _ids(4, 64)
    with pytest.raises(autockpt.ConfigError, match=r"larger than max_shape=\(4, 32\)"):
        autockpt.plan(
            model, (ids,), "1GB", loss_fn=token_loss, example_targets=(ids,), max_shape=(4, 32)
        )


def test_past_max_plans_each_plan_is_for_the_largest_shape_seen(model) -> None:
    planner = autockpt.ShapePlanner(model, 10**9, loss_fn=token_loss, max_plans=2, progress=False)
    for index, length in enumerate([8, 24, 96, 50, 200]):
        ids = _ids(2, length, seed=index)
        planner.training_step((ids,), (ids,))
    # 8, the bucket of 24; then no more buckets: 96 itself, 50 under it, 200 itself.
    assert [plan.batch_shapes.shapes[0][1] for plan in planner.plans] == [8, 32, 96, 200]


def test_a_batch_smaller_than_the_plans_micro_batches_runs_no_empty_piece(model) -> None:
    ids = _ids(8, 256)
    budget = int(0.3 * _plain_peak(model, ids))
    plan = autockpt.plan(
        model, (ids,), budget, loss_fn=token_loss, example_targets=(ids,), allow_chunks=False,
        progress=False,
    )  # fmt: skip
    # Two or more pieces (the timing decides how many; 2 to 4 were seen): every batch with
    # fewer samples than pieces, as the last batch of an epoch can be.
    assert plan.num_micro_batches >= 2, plan
    for samples in range(plan.num_micro_batches - 1, 0, -1):
        short = _ids(samples, 256, seed=samples)
        peak, loss, gradients = measured_step(
            model, (short,), plan, loss_fn=token_loss, targets=(short,), loss_reduction="mean"
        )
        _, plain_loss, plain_gradients = measured_step(
            model, (short,), loss_fn=token_loss, targets=(short,)
        )
        assert peak <= budget
        torch.testing.assert_close(loss, plain_loss)  # an empty piece's mean is NaN
        assert_same_gradients(gradients, plain_gradients)
