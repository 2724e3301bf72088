"""The planned module in every mode: train/eval/no_grad/inference_mode act as on the original,
whatever the model's style; state_dict, deepcopy and hooks."""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from tests.helpers import BatchNormNet
from tests.styles import BATCH, WIDTH, FunctionalDropoutNet, TinyGPT, TrainingBranchNet

STYLES: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "functional-dropout": lambda: (FunctionalDropoutNet(), torch.randn(BATCH, WIDTH)),
    "training-branch": lambda: (TrainingBranchNet(), torch.randn(BATCH, WIDTH)),
    "nanogpt-sdpa": lambda: (TinyGPT(), torch.randint(0, 50, (8, 16))),
    "batchnorm": lambda: (BatchNormNet(WIDTH), torch.randn(BATCH, WIDTH)),
}


def _planned(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, autockpt.Plan]:
    plan = autockpt.plan(model, (x,), 10**12, optimizer=None, use_gradient_checkpointing=True)
    assert plan.num_recomputed > 0
    return autockpt.apply(model, plan), plan


def test_the_issues_reproduction_gives_the_originals_eval_output():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(F.dropout(torch.relu(self.a(x)), 0.5, training=self.training))

    model, x = Net(), torch.randn(32, 64)
    planned = autockpt.apply(model, autockpt.plan(model, (x,), budget="1GB", optimizer=None))
    model.eval()
    planned.eval()
    with torch.no_grad():
        assert torch.equal(model(x), planned(x))


@pytest.mark.parametrize("style", sorted(STYLES))
def test_eval_outputs_equal_the_originals_after_mode_switches(style):
    model, x = STYLES[style]()
    planned, _ = _planned(model, x)
    reference = copy.deepcopy(model)
    for _ in range(2):
        planned.train()
        autockpt.training_step(planned, None, (x,), (), lambda out: out.float().sum())
        planned.eval()
        reference.load_state_dict(model.state_dict())
        reference.eval()
        with torch.no_grad():
            assert torch.equal(planned(x), reference(x))
        with torch.inference_mode():
            assert torch.equal(planned(x), reference(x))
        # Eval with gradients enabled (fine-tuning in eval mode) is the model's own forward too.
        assert torch.equal(planned(x), reference(x))
        assert torch.equal(planned(x), planned(x)), "eval must be deterministic"


@pytest.mark.parametrize("style", sorted(STYLES))
def test_no_grad_forwards_in_training_mode_are_the_originals(style):
    model, x = STYLES[style]()
    planned, _ = _planned(model, x)
    reference = copy.deepcopy(model)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            torch.manual_seed(5)
            got = planned(x)
            torch.manual_seed(5)
            want = reference(x)
        assert torch.equal(got, want)


@pytest.mark.parametrize("style", sorted(STYLES))
def test_recomputed_training_keeps_every_gradient_with_dropout_on(style):
    model, x = STYLES[style]()
    reference = copy.deepcopy(model)
    planned, plan = _planned(model, x)
    loss_fn = lambda out: out.float().square().mean()  # noqa: E731
    torch.manual_seed(7)
    loss = autockpt.training_step(planned, plan, (x,), (), loss_fn)
    torch.manual_seed(7)
    want = loss_fn(reference(x))
    want.backward()
    torch.testing.assert_close(loss, want.detach())
    got = dict(model.named_parameters())
    for name, parameter in reference.named_parameters():
        assert parameter.grad is not None, name
        torch.testing.assert_close(got[name].grad, parameter.grad, msg=name)
    for name, buffer in reference.named_buffers():
        assert torch.equal(model.get_buffer(name), buffer), name


def _linear_calls(model: nn.Module, run: Callable[[], None]) -> Counter[str]:
    calls: Counter[str] = Counter()
    handles = [
        module.register_forward_hook(lambda *_, n=name: calls.update([n]))
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
    run()
    for handle in handles:
        handle.remove()
    return calls


@pytest.mark.parametrize("style", ["functional-dropout", "batchnorm"])
def test_eval_pays_no_recompute_while_training_recomputes(style):
    model, x = STYLES[style]()
    planned, _ = _planned(model, x)

    def step() -> None:
        planned(x).sum().backward()

    training = _linear_calls(model, step)
    assert max(training.values()) == 2, "the plan recomputes: some linear runs twice"
    planned.eval()
    evaluating = _linear_calls(model, step)
    assert set(evaluating) == set(training) and set(evaluating.values()) == {1}


def test_a_model_planned_in_eval_mode_is_measured_as_it_trains_and_left_in_eval():
    # Dropout masks and batch statistics count only in training mode.
    model, x = BatchNormNet(WIDTH), torch.randn(BATCH, WIDTH)
    trained = autockpt.plan(model, (x,), 10**12, optimizer=None)
    model.eval()
    with pytest.warns(UserWarning, match="eval mode"):
        evaluated = autockpt.plan(model, (x,), 10**12, optimizer=None)
    assert not any(m.training for m in model.modules())
    assert evaluated.predicted_peak_bytes == trained.predicted_peak_bytes


def test_a_model_applied_in_eval_mode_trains_with_its_training_graph():
    model, x = FunctionalDropoutNet(), torch.randn(BATCH, WIDTH)
    model.eval()
    with pytest.warns(UserWarning, match="eval mode"):
        plan = autockpt.plan(model, (x,), 10**12, optimizer=None, use_gradient_checkpointing=True)
    planned = autockpt.apply(model, plan)
    assert not planned.training
    planned.train()
    torch.manual_seed(3)
    got = planned(x)
    reference = copy.deepcopy(model).train()
    torch.manual_seed(3)
    assert torch.equal(got, reference(x)), "dropout is on once the planned model trains"


def test_a_submodule_switched_to_eval_is_named_and_the_forward_stays_right():
    model, x = TrainingBranchNet(), torch.randn(BATCH, WIDTH)
    planned, _ = _planned(model, x)
    planned.blocks[1].eval()  # the traced graph froze blocks.1.training == True
    reference = copy.deepcopy(planned.forward.root)
    with pytest.warns(UserWarning, match=r"TrainingBranchNet\.blocks\.1\.training is False"):
        torch.manual_seed(4)
        got = planned(x)
    torch.manual_seed(4)
    want = type(model).forward(reference, x)
    assert torch.equal(got, want)


def test_training_the_original_while_the_planned_module_is_in_eval_warns():
    model, x = FunctionalDropoutNet(), torch.randn(BATCH, WIDTH)
    planned, _ = _planned(model, x)
    planned.eval()
    model.train()  # the original's flags: the planned root stays in eval mode
    with pytest.warns(UserWarning, match="planned FunctionalDropoutNet is in eval mode"):
        planned(x)
    planned.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        planned(x)


def test_a_graph_that_reads_no_flag_is_found_to_freeze_none():
    model, x = BatchNormNet(WIDTH), torch.randn(BATCH, WIDTH)
    planned, _ = _planned(model, x)
    assert planned.forward.frozen_flags == {}
    planned.layers[1].eval()  # a leaf module's own flag stays live: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        planned(x).sum().backward()


def test_state_dict_keys_are_the_originals_and_round_trip():
    model, x = TinyGPT(), torch.randint(0, 50, (8, 16))
    planned, _ = _planned(model, x)
    assert list(planned.state_dict()) == list(model.state_dict())
    other = TinyGPT()
    planned.load_state_dict(other.state_dict())
    for name, tensor in other.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    fresh = TinyGPT()
    fresh.load_state_dict(planned.state_dict())
    fresh.eval()
    planned.eval()
    with torch.no_grad():
        assert torch.equal(fresh(x), planned(x))


def test_tensors_replaced_after_apply_are_the_ones_the_graph_reads():
    model, x = TinyGPT(), torch.randint(0, 50, (8, 16))
    planned, _ = _planned(model, x)
    state = planned.state_dict()
    state["position"] = torch.zeros_like(state["position"])
    state["blocks.0.attn.gain"] = torch.full_like(state["blocks.0.attn.gain"], 2.0)
    planned.load_state_dict(state, assign=True)  # new tensor objects, not copies into the old
    reference = copy.deepcopy(model)
    assert torch.equal(reference.position, torch.zeros_like(reference.position))
    assert reference.blocks[0].attn.gain.item() == 2.0
    torch.manual_seed(6)
    got = planned(x)
    torch.manual_seed(6)
    assert torch.equal(got, reference(x))


def test_deepcopy_gives_an_independent_planned_module():
    model, x = FunctionalDropoutNet(), torch.randn(BATCH, WIDTH)
    planned, _ = _planned(model, x)
    twin = copy.deepcopy(planned)
    assert type(twin) is type(model)
    assert list(twin.state_dict()) == list(model.state_dict())
    assert all(a is not b for a, b in zip(twin.parameters(), model.parameters(), strict=True))
    torch.manual_seed(8)
    want = planned(x)
    torch.manual_seed(8)
    got = twin(x)
    assert torch.equal(got, want)
    got.sum().backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None for p in twin.parameters())
    calls = _linear_calls(twin, lambda: twin(x).sum().backward())
    assert max(calls.values()) == 2, "the copy recomputes as planned"
    twin.eval()
    with torch.no_grad():
        assert torch.equal(twin(x), copy.deepcopy(model).eval()(x))


def test_hooks_of_whole_modules_fire_while_training_and_all_fire_in_eval():
    model, x = TrainingBranchNet(), torch.randn(BATCH, WIDTH)
    planned, _ = _planned(model, x)
    fired: Counter[str] = Counter()
    model.blocks[0].linear.register_forward_hook(lambda *_: fired.update(["leaf"]))
    model.blocks[0].register_forward_hook(lambda *_: fired.update(["block"]))
    planned.register_forward_hook(lambda *_: fired.update(["planned"]))
    planned(x).sum().backward()
    assert fired == Counter({"planned": 1, "leaf": 2})  # the leaf again in recompute
    fired.clear()
    planned.eval()
    planned(x)
    assert fired == Counter({"planned": 1, "leaf": 1, "block": 1})
