"""The one re-plan policy (NOTE [Planning again]); the verification step itself is checked in
tests/planner/test_plan.py."""

from __future__ import annotations

from autockpt.planner.verify import REPLANNING, ReplanPolicy


def test_a_round_lowers_by_the_overshoot_and_by_at_least_its_least_share() -> None:
    policy = ReplanPolicy(max_rounds=3, least_share=0.1)
    # A step a little over: the least share.
    assert policy.lowered(1000, over_bytes=1) == 900
    # A step far over: the whole overshoot.
    assert policy.lowered(1000, over_bytes=250) == 750
    # Nothing known of the overshoot (CUDA out of memory): the least share.
    assert policy.lowered(1000, over_bytes=0) == 900


def test_the_planner_and_the_trainer_read_one_policy() -> None:
    from autockpt.planner import entry
    from autockpt.training.loop import replanning, train

    assert entry.REPLANNING is REPLANNING
    assert replanning.REPLANNING is REPLANNING and train.REPLANNING is REPLANNING
    assert REPLANNING.max_rounds >= 1 and 0 < REPLANNING.least_share < 1


def test_the_check_step_runs_in_the_precision_the_plan_was_measured_in() -> None:
    # A plan measured under bf16 autocast is checked by a step under the same autocast: in
    # float32 its activations are twice as large and the check would refuse a plan that fits.
    import torch
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensor

    import autockpt
    from tests.helpers import MLPStack

    torch.manual_seed(0)
    model = MLPStack().train()
    inputs = (torch.randn(64, 64),)
    seen: list[torch.dtype] = []

    def record(module: nn.Module, args: object, output: torch.Tensor) -> None:
        if not isinstance(output, FakeTensor):
            seen.append(output.dtype)

    first = next(m for m in model.modules() if isinstance(m, nn.Linear))
    plan = autockpt.plan(model, inputs, 10**12, autocast_dtype=torch.bfloat16)
    handle = first.register_forward_hook(record)
    try:
        autockpt.planner.verify.verify_plan(model, plan, inputs, autocast_dtype=torch.bfloat16)
    finally:
        handle.remove()
    assert seen and set(seen) == {torch.bfloat16}, seen
    # Through plan(verify=True) too: the last real forward planning runs is the check step's.
    handle = first.register_forward_hook(record)
    try:
        seen.clear()
        autockpt.plan(model, inputs, 10**12, autocast_dtype=torch.bfloat16, verify=True)
    finally:
        handle.remove()
    assert seen[-1] == torch.bfloat16


def test_the_cuda_check_step_counts_from_an_emptied_cache(monkeypatch) -> None:
    # torch.cuda's counters are stand-ins here and the step runs on the CPU: what is checked
    # is that the cache is emptied before the peak is reset, and the model put back. (Where
    # the saved copy of the model lives, host or card, a CPU cannot tell apart.)
    import torch

    import autockpt
    from autockpt.planner import verify
    from tests.helpers import MLPStack

    calls: list[str] = []
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _n=name: calls.append(_n))
    for name in ("max_memory_allocated", "max_memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, lambda *a: 1000)
    monkeypatch.setattr(verify, "forked_devices", lambda device: [])
    torch.manual_seed(0)
    model = MLPStack().train()
    inputs = (torch.randn(32, 64),)
    plan = autockpt.plan(model, inputs, 10**12)
    plan = plan.model_copy(update={"device": "cuda"})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 0.5)  # an accumulation under way
    check = verify.verify_plan(model, plan, inputs)
    assert calls.index("empty_cache") < calls.index("reset_peak_memory_stats")
    assert check.measured_peak_bytes == 1000 + plan.breakdown.context_bytes
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name])
    for parameter in model.parameters():
        assert parameter.grad is not None and bool((parameter.grad == 0.5).all())
