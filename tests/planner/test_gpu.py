"""Checks that need a CUDA device: the planner against the caching allocator.

Run on a machine with a GPU (``pytest -m gpu``); skipped elsewhere.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autockpt
from autockpt.planner.verify import verify_plan
from tests.helpers import MLPStack

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _tft_225_on_cuda(batch_size: int = 32) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from tft.model.config import get_preset
    from tft.model.transformer import TemporalFusionTransformer

    config = get_preset("tft-225")
    model = TemporalFusionTransformer(config).cuda()
    return model, model.example_inputs(batch_size, device=torch.device("cuda"))


def _tensor_peak(plan: autockpt.Plan) -> int:
    """The plan's prediction without the context and headroom it adds on CUDA."""
    return plan.predicted_peak_bytes - plan.breakdown.context_bytes - plan.breakdown.headroom_bytes


@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.25])
def test_prediction_within_3_percent_of_max_memory_allocated(fraction):
    model, inputs = _tft_225_on_cuda()
    unplanned = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=False)
    budget = int(unplanned.predicted_peak_bytes * fraction) + unplanned.breakdown.context_bytes
    plan = autockpt.plan(model, inputs, budget, verify=False)
    check = verify_plan(model, plan, inputs)
    allocated = check.measured_peak_bytes - plan.breakdown.context_bytes
    reserved = check.reserved_peak_bytes - plan.breakdown.context_bytes
    print(
        f"fraction {fraction}: predicted {_tensor_peak(plan)} allocated {allocated} "
        f"reserved {reserved} ({reserved / max(allocated, 1) - 1:+.1%} over allocated)"
    )
    assert abs(_tensor_peak(plan) - allocated) <= 0.03 * allocated


def test_planned_step_stays_under_budget_as_nvidia_smi_would_show_it():
    model, inputs = _tft_225_on_cuda()
    unplanned = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=False)
    budget = unplanned.predicted_peak_bytes // 2
    plan = autockpt.plan(model, inputs, budget)  # verifies with a real step on CUDA
    check = verify_plan(model, plan, inputs)
    assert check.within_budget, check


def test_cudnn_lstm_reserve_is_counted():
    lstm = nn.LSTM(64, 64, batch_first=True).cuda()

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = lstm

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lstm(x)[0]

    model = Wrapper()
    inputs = (torch.randn(32, 130, 64, device="cuda"),)
    plan = autockpt.plan(model, inputs, 10**12, verify=False)
    check = verify_plan(model, plan, inputs)
    allocated = check.measured_peak_bytes - plan.breakdown.context_bytes
    assert abs(_tensor_peak(plan) - allocated) <= 0.03 * allocated


class _RecurrentStack(nn.Module):
    """Four LSTM/GRU layers with projections between them: cuDNN's kernels, segments to
    recompute (NOTE [cuDNN's RNN on fake tensors])."""

    def __init__(self, width: int = 96) -> None:
        super().__init__()
        self.rnns = nn.ModuleList(
            nn.LSTM(width, width, batch_first=True) if i % 2 == 0 else nn.GRU(width, width)
            for i in range(4)
        )
        self.projections = nn.ModuleList(nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, (rnn, projection) in enumerate(zip(self.rnns, self.projections, strict=True)):
            x = x if i % 2 == 0 else x.transpose(0, 1)
            x = torch.tanh(projection(rnn(x)[0]))
            x = x if i % 2 == 0 else x.transpose(0, 1)
        return x


def test_recurrent_model_plans_on_cuda_with_the_plain_gradients():
    torch.manual_seed(0)
    model = _RecurrentStack().cuda()
    inputs = (torch.randn(64, 120, 96, device="cuda"),)
    unplanned = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=False)
    budget = unplanned.breakdown.context_bytes + int(
        (unplanned.predicted_peak_bytes - unplanned.breakdown.context_bytes) * 0.6
    )
    plan = autockpt.plan(model, inputs, budget, allow_micro_batches=False)
    assert plan.num_recomputed > 0, plan
    check = verify_plan(model, plan, inputs)
    assert check.within_budget, check
    planned = autockpt.apply(model, plan)
    model(*inputs).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    planned(*inputs).sum().backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad, want[name], msg=name)


def test_mlp_gradients_match_on_cuda():
    model = MLPStack(256, 6, dropout=0.1).cuda()
    inputs = (torch.randn(1024, 256, device="cuda"),)
    unplanned = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=False)
    context = unplanned.breakdown.context_bytes
    plan = autockpt.plan(
        model,
        inputs,
        context + int((unplanned.predicted_peak_bytes - context) * 0.9),
        allow_chunks=False,
        allow_micro_batches=False,
    )
    planned = autockpt.apply(model, plan)
    torch.manual_seed(0)
    model(*inputs).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    planned(*inputs).sum().backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad, want[name], msg=name)


def test_a_compiled_plan_holds_its_budget_as_nvidia_smi_would_show_it():
    """``plan(..., compile=True)`` on CUDA: what the device shows in use after a planned step
    (the CUDA context, loaded kernels and every block the caching allocator kept from the
    step's peak; nothing empties the cache after it) stays under the budget, counted by the
    driver, not the allocator; the gradients are the eager step's."""
    torch.manual_seed(0)
    model = MLPStack(1024, 6, dropout=0.0).cuda()
    x, y = torch.randn(65536, 1024, device="cuda"), torch.randn(65536, 1, device="cuda")

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, target)

    def compiled_plan(budget: int) -> autockpt.Plan:
        return autockpt.plan(
            model, (x,), budget, loss_fn=loss_fn, example_targets=(y,), compile=True
        )

    plain = compiled_plan(10**13)
    context = plain.breakdown.context_bytes
    assert context > 0
    budget = context + int((plain.unplanned_peak_bytes - context) * 0.75)
    plan = compiled_plan(budget)
    planned = autockpt.apply(model, plan)
    reference = copy.deepcopy(model)
    loss_fn(reference(x), y).backward()

    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        autockpt.training_step(planned, plan, (x,), (y,), loss_fn)
        optimizer.step()

    step()  # compiles
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    step()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print(f"budget {budget}, predicted {plan.predicted_peak_bytes}, shown {total - free}")
    assert total - free <= budget
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(
            dict(model.named_parameters())[name].grad, parameter.grad, rtol=1e-3, atol=1e-5
        )
