"""plan() and apply() on small models of several shapes: correctness, budgets, accuracy."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import nn

import autockpt
from autockpt.planner.verify import verify_plan
from tests.helpers import BatchNormNet, MLPStack, OneHugeOp, TinyTransformer, tracked_step
from tft.config import get_preset
from tft.model import TemporalFusionTransformer

#: Where between the lowest plain-recompute budget (0) and the unplanned peak (1) to plan.
BUDGET_FRACTIONS = (0.6, 0.1)


def _mlp(dropout: float = 0.1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return MLPStack(128, 6, dropout), (torch.randn(512, 128),)


def _transformer(dropout: float = 0.1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return TinyTransformer(dropout=dropout), (torch.randn(16, 40, 32),)


def _tft(preset: str) -> Callable[..., tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def build(dropout: float = 0.1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        config = get_preset(preset).with_overrides(dropout=dropout)
        model = TemporalFusionTransformer(config)
        generator = torch.Generator().manual_seed(0)
        return model, model.example_inputs(config.batch_size, generator=generator)

    return build


MODELS = {
    "mlp": _mlp,
    "transformer": _transformer,
    "tft-tiny": _tft("tiny"),
    "tft-small": _tft("small"),
}


def _unplanned_peak(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    return autockpt.plan(
        model, inputs, 10**12, use_gradient_checkpointing=False
    ).predicted_peak_bytes


def _assert_same_gradients(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("mode", ["none", "all", *BUDGET_FRACTIONS])
def test_plain_recompute_keeps_loss_and_every_gradient_with_dropout_on(name, mode):
    model, inputs = MODELS[name](dropout=0.1)
    _, want_loss, want = tracked_step(model, inputs, seed=3)
    if mode in ("none", "all"):
        plan = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=mode == "all")
    else:
        unplanned = _unplanned_peak(model, inputs)
        lowest = autockpt.plan(
            model, inputs, unplanned, allow_chunks=False, allow_micro_batches=False
        ).minimum_feasible_bytes
        budget = int(lowest + (unplanned - lowest) * mode)
        plan = autockpt.plan(model, inputs, budget, allow_chunks=False, allow_micro_batches=False)
        assert plan.num_recomputed > 0 or lowest == unplanned
    _, got_loss, got = tracked_step(model, inputs, plan, seed=3)
    torch.testing.assert_close(got_loss, want_loss)
    _assert_same_gradients(got, want)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_chunks_and_micro_batches_keep_gradients_with_dropout_off(name):
    model, inputs = MODELS[name](dropout=0.0)
    _, want_loss, want = tracked_step(model, inputs)
    unplanned = _unplanned_peak(model, inputs)
    lowest = autockpt.plan(model, inputs, unplanned).minimum_feasible_bytes
    # Below the lowest plain-recompute plan only chunks or micro-batches can fit.
    for budget in (int(lowest * 0.85), (lowest + unplanned) // 2):
        plan = autockpt.plan(model, inputs, budget)
        if budget < lowest:
            assert plan.num_micro_batches > 1 or any(s.num_chunks > 1 for s in plan.segments)
        _, got_loss, got = tracked_step(model, inputs, plan)
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-4)
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tracked_peak_stays_under_budget_and_near_prediction(name):
    model, inputs = MODELS[name](dropout=0.1)
    unplanned = _unplanned_peak(model, inputs)
    lowest = autockpt.plan(model, inputs, unplanned).minimum_feasible_bytes
    budgets = [int(lowest + (unplanned - lowest) * f) for f in (1.0, 0.75, 0.5, 0.25)]
    budgets.append(int(lowest * 1.02))
    for budget in budgets:
        try:
            plan = autockpt.plan(model, inputs, budget)
        except autockpt.InfeasibleBudgetError:
            assert budget < lowest * 1.1, "only budgets at the very bottom may be refused"
            continue
        peak, _, _ = tracked_step(model, inputs, plan)
        assert peak <= budget, f"tracked {peak} over budget {budget}"
        assert abs(plan.predicted_peak_bytes - peak) <= 0.03 * peak


def test_linears_of_recomputed_segments_run_twice_and_others_once():
    model, inputs = _mlp(dropout=0.1)
    budget = int(_unplanned_peak(model, inputs) * 0.8)
    plan = autockpt.plan(model, inputs, budget, allow_chunks=False, allow_micro_batches=False)
    assert 0 < plan.num_recomputed < len(plan.segments)
    calls: Counter[str] = Counter()
    planned = autockpt.apply(model, plan)
    handles = [
        module.register_forward_hook(lambda *_, n=name: calls.update([n]))
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
    autockpt.training_step(planned, plan, inputs, (), lambda out: out.sum())
    for handle in handles:
        handle.remove()
    for segment in plan.segments:
        for path in segment.modules:
            if path in calls:
                assert calls[path] == (2 if segment.recomputed else 1), (path, segment.name)


def test_batchnorm_statistics_update_once_under_recompute():
    model = BatchNormNet()
    inputs = (torch.randn(64, 48),)
    plan = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=True)
    assert plan.num_recomputed == len(plan.segments)
    reference, planned_model = BatchNormNet(), BatchNormNet()
    reference.load_state_dict(model.state_dict())
    planned_model.load_state_dict(model.state_dict())
    _, want_loss, want = tracked_step(reference, inputs, seed=5)
    torch.manual_seed(5)
    reference(inputs[0]).sum().backward()
    planned = autockpt.apply(planned_model, plan)
    torch.manual_seed(5)
    autockpt.training_step(planned, plan, inputs, (), lambda out: out.sum())
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(planned_model.get_buffer(name), buffer, msg=name)
    _, got_loss, got = tracked_step(model, inputs, plan, seed=5)
    torch.testing.assert_close(got_loss, want_loss)
    _assert_same_gradients(got, want)


def test_batchnorm_model_is_never_split_into_micro_batches():
    model = BatchNormNet()
    inputs = (torch.randn(256, 48),)
    unplanned = _unplanned_peak(model, inputs)
    try:
        plan = autockpt.plan(model, inputs, int(unplanned * 0.8))
    except autockpt.InfeasibleBudgetError:
        return
    assert plan.num_micro_batches == 1
    assert all(s.num_chunks == 1 for s in plan.segments if "layers.1" in s.modules)


def test_one_huge_op_raises_with_the_minimum_and_the_lever():
    model = OneHugeOp()
    inputs = (torch.randn(8, 1024),)
    unplanned = _unplanned_peak(model, inputs)
    with pytest.raises(autockpt.InfeasibleBudgetError) as caught:
        autockpt.plan(model, inputs, unplanned // 4, allow_micro_batches=False)
    assert caught.value.minimum_bytes > unplanned // 4
    assert "below the minimum" in str(caught.value)
    assert "batch size" in str(caught.value) or "raise the budget" in str(caught.value)


def test_plan_leaves_the_model_as_it_found_it():
    model = BatchNormNet()
    model.layers[0].weight.grad = torch.ones_like(model.layers[0].weight)
    model.eval()
    inputs = (torch.randn(64, 48),)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    autockpt.plan(model, inputs, 10**12)
    assert not model.training
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert torch.equal(model.layers[0].weight.grad, torch.ones_like(model.layers[0].weight))


def test_plan_round_trips_through_json_and_applies_from_it():
    model, inputs = _mlp()
    plan = autockpt.plan(model, inputs, int(_unplanned_peak(model, inputs) * 0.7))
    again = autockpt.Plan.model_validate_json(plan.model_dump_json())
    assert again == plan
    planned = autockpt.apply(model, again)
    assert list(planned.state_dict()) == list(model.state_dict())
    assert {id(p) for p in planned.parameters()} == {id(p) for p in model.parameters()}
    torch.manual_seed(1)
    got = planned(*inputs)
    torch.manual_seed(1)
    torch.testing.assert_close(got, model(*inputs))


def test_forced_modes_report_the_peak_and_warn_when_over_budget():
    model, inputs = _mlp()
    unplanned = _unplanned_peak(model, inputs)
    with pytest.warns(UserWarning, match="over the budget"):
        plan = autockpt.plan(model, inputs, unplanned // 2, use_gradient_checkpointing=False)
    assert not plan.fits
    assert plan.strategy == "checkpoint-none"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = autockpt.plan(model, inputs, unplanned * 2, use_gradient_checkpointing=True)
    assert plan.fits and plan.num_recomputed == len(plan.segments)


def test_apply_refuses_a_plan_made_for_another_model():
    model, inputs = _mlp()
    plan = autockpt.plan(model, inputs, 10**12)
    with pytest.raises(autockpt.PlanMismatchError):
        autockpt.apply(MLPStack(128, 3), plan)


def test_verify_runs_a_real_step_and_leaves_the_model_as_it_was():
    model, inputs = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    budget = int(_unplanned_peak(model, inputs) * 0.8)
    plan = autockpt.plan(model, inputs, budget, verify=True, allow_micro_batches=False)
    assert any(note.startswith("verified") for note in plan.notes)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())
    check = verify_plan(model, plan, inputs)
    assert check.within_budget
    assert abs(check.relative_error) < 0.03


def test_targets_held_through_the_step_count_towards_the_peak():
    model, (x,) = _mlp(dropout=0.0)
    target = torch.randn(x.shape[0], 1)

    def mse(output: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, wanted, reduction="sum")

    unplanned = autockpt.plan(model, (x,), 10**12, loss_fn=mse, example_targets=(target,))
    # Nothing recomputed: the step is the same but for the target held from the start.
    without = autockpt.plan(model, (x,), 10**12, loss_fn=lambda output: mse(output, target))
    target_bytes = target.numel() * target.element_size()
    assert unplanned.breakdown.inputs_bytes == without.breakdown.inputs_bytes + target_bytes
    for fraction in (1.0, 0.7, 0.5):
        budget = int(fraction * unplanned.predicted_peak_bytes)
        plan = autockpt.plan(model, (x,), budget, loss_fn=mse, example_targets=(target,))
        tracked, _, _ = tracked_step(model, (x,), plan, loss_fn=mse, targets=(target,))
        assert tracked <= budget
        assert abs(tracked - plan.predicted_peak_bytes) <= 0.03 * tracked


def test_targets_without_a_loss_function_are_refused():
    model, inputs = _mlp()
    with pytest.raises(ValueError, match="example_targets"):
        autockpt.plan(model, inputs, 10**12, example_targets=(torch.zeros(512),))


@pytest.mark.parametrize("name", ["mlp", "tft-tiny"])
def test_the_minimum_an_infeasible_budget_reports_can_be_planned_and_is_kept(name):
    model, inputs = MODELS[name](dropout=0.0)
    with pytest.raises(autockpt.InfeasibleBudgetError) as caught:
        autockpt.plan(model, inputs, 1)
    minimum = caught.value.minimum_bytes
    plan = autockpt.plan(model, inputs, minimum)
    tracked, _, _ = tracked_step(model, inputs, plan)
    assert plan.predicted_peak_bytes <= minimum
    assert tracked <= minimum


def test_micro_batch_counts_need_not_divide_the_batch():
    model = MLPStack(128, 6, 0.0)
    inputs = (torch.randn(510, 128),)  # 2 * 3 * 5 * 17: 4, 8, 16 and 32 do not divide it
    _, want_loss, want = tracked_step(model, inputs)
    with pytest.raises(autockpt.InfeasibleBudgetError) as caught:
        autockpt.plan(model, inputs, 1)
    minimum = caught.value.minimum_bytes
    plan = autockpt.plan(model, inputs, minimum)
    # At the smallest budget the step is cut into the most pieces, of unequal sizes.
    assert plan.num_micro_batches > 2 and 510 % plan.num_micro_batches
    tracked, got_loss, got = tracked_step(model, inputs, plan)
    assert tracked <= minimum
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-4)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)
