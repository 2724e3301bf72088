"""Models torch.fx cannot trace: module-level segments found with forward hooks."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import autockpt
from autockpt.planner.trace.module_chain import find_module_chain
from tests.helpers import tracked_step

#: Where between the lowest plan (0) and the unplanned peak (1) the sweeps plan.
BUDGET_FRACTIONS = (1.0, 0.75, 0.5, 0.25, 0.0)

Inputs = tuple[Any, ...]
LossFn = Callable[[Any], torch.Tensor]


class Block(nn.Module):
    """Residual feed-forward block; ``scale`` arrives as a keyword argument."""

    def __init__(self, width: int, dropout: float, norm: bool) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.norm = nn.BatchNorm1d(4 * width) if norm else nn.Identity()
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.down(self.drop(self.act(self.norm(self.up(x)))))  # (B, W)
        return x + (h if scale is None else h * scale)


class BranchyStack(nn.Module):
    """A stack of blocks whose forward branches on a tensor value: torch.fx cannot trace it."""

    def __init__(self, width: int = 64, depth: int = 6, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.blocks = nn.ModuleList(Block(width, dropout, norm=False) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)  # (B, W)
        if x.sum() > 0:
            h = h * 2
        for block in self.blocks:
            h = block(h)
        return self.head(h)  # (B, 1)


class DictStack(nn.Module):
    """A stack of blocks fed from a dict batch, returning a dict."""

    def __init__(
        self, width: int = 64, depth: int = 5, dropout: float = 0.1, norm: bool = False
    ) -> None:
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.blocks = nn.ModuleList(Block(width, dropout, norm) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        h = self.embed(batch["x"])  # (B, W)
        for block in self.blocks:
            h = block(h, scale=batch["scale"])
        return {"y": self.head(h)}  # (B, 1)


def _sum_of_y(output: dict[str, torch.Tensor]) -> torch.Tensor:
    return output["y"].sum()


def _branchy(dropout: float = 0.1) -> tuple[nn.Module, Inputs, LossFn | None]:
    return BranchyStack(dropout=dropout), (torch.randn(256, 16),), None


def _dict(dropout: float = 0.1, norm: bool = False) -> tuple[nn.Module, Inputs, LossFn | None]:
    batch = {"x": torch.randn(256, 16), "scale": torch.rand(256, 1)}
    return DictStack(dropout=dropout, norm=norm), (batch,), _sum_of_y


MODELS = {"branchy": _branchy, "dict": _dict}


def _plan(model: nn.Module, inputs: Inputs, budget: int, **options: Any) -> autockpt.Plan:
    """``autockpt.plan`` with the fallback's warning silenced (one test checks it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*module-level segments")
        return autockpt.plan(model, inputs, budget, **options)


def _assert_same_gradients(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_plan_warns_and_records_module_level_segments(name):
    model, inputs, loss_fn = MODELS[name]()
    with pytest.warns(UserWarning, match="module-level segments found with forward hooks") as seen:
        plan = autockpt.plan(model, inputs, 10**12, loss_fn=loss_fn)
    message = next(str(w.message) for w in seen if "module-level" in str(w.message))
    reason = "cannot trace BranchyStack" if name == "branchy" else "DictStack takes a dict"
    assert reason in message
    assert "\n" not in message
    assert message in plan.notes
    assert plan.tracing == "forward-hooks"
    blocks = [f"blocks.{i}" for i in range(len(model.blocks))]
    assert [s.modules for s in plan.segments] == [[p] for p in ["embed", *blocks, "head"]]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_budget_sweep_fits_predicts_and_keeps_every_gradient_with_dropout_on(name):
    model, inputs, loss_fn = MODELS[name](dropout=0.1)
    options: dict[str, Any] = {"loss_fn": loss_fn} if loss_fn else {}
    _, want_loss, want = tracked_step(model, inputs, seed=3, **options)
    unplanned = _plan(
        model, inputs, 10**12, use_gradient_checkpointing=False, **options
    ).predicted_peak_bytes
    lowest = _plan(
        model, inputs, unplanned, allow_micro_batches=False, **options
    ).minimum_feasible_bytes
    assert lowest < 0.8 * unplanned
    num_recomputed = []
    for fraction in BUDGET_FRACTIONS:
        budget = int(lowest + (unplanned - lowest) * fraction)
        try:
            # Recompute alone keeps dropout's masks; micro-batches draw their own per piece.
            plan = _plan(model, inputs, budget, allow_micro_batches=False, **options)
        except autockpt.InfeasibleBudgetError:
            assert fraction == 0.0, "only the estimated minimum itself may be refused"
            continue
        peak, got_loss, got = tracked_step(model, inputs, plan, seed=3, **options)
        assert peak <= budget, f"tracked {peak} over budget {budget}"
        assert abs(plan.predicted_peak_bytes - peak) <= 0.03 * peak
        torch.testing.assert_close(got_loss, want_loss)
        _assert_same_gradients(got, want)
        num_recomputed.append(plan.num_recomputed)
    assert num_recomputed[0] == 0 and max(num_recomputed) > 0


def test_recomputed_blocks_run_twice_and_kept_ones_once():
    model, inputs, _ = _branchy()
    unplanned = _plan(model, inputs, 10**12).unplanned_peak_bytes
    plan = _plan(model, inputs, int(unplanned * 0.8))
    recomputed = {m: s.recomputed for s in plan.segments for m in s.modules}
    blocks = [f"blocks.{i}" for i in range(len(model.blocks))]
    assert 0 < sum(recomputed[b] for b in blocks) < len(blocks)
    calls: Counter[str] = Counter()
    # A block's first layer: the recompute stops early once the saved tensors backward
    # needs are rebuilt, so later layers whose inputs are saved may not run again.
    handles = [
        model.get_submodule(f"{block}.up").register_forward_hook(
            lambda *_, n=block: calls.update([n])
        )
        for block in blocks
    ]
    planned = autockpt.apply(model, plan)
    autockpt.training_step(planned, plan, inputs, (), lambda out: out.sum())
    for handle in handles:
        handle.remove()
    assert {b: calls[b] for b in blocks} == {b: 2 if recomputed[b] else 1 for b in blocks}


def test_batchnorm_statistics_update_once_under_recompute():
    model, inputs, loss_fn = _dict(dropout=0.1, norm=True)
    plan = _plan(model, inputs, 10**12, loss_fn=loss_fn, use_gradient_checkpointing=True)
    assert plan.num_recomputed == len(plan.segments)
    reference, planned_model = DictStack(norm=True), DictStack(norm=True)
    reference.load_state_dict(model.state_dict())
    planned_model.load_state_dict(model.state_dict())
    torch.manual_seed(5)
    reference(*inputs)["y"].sum().backward()
    planned = autockpt.apply(planned_model, plan)
    torch.manual_seed(5)
    autockpt.training_step(planned, plan, inputs, (), _sum_of_y)
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(planned_model.get_buffer(name), buffer, msg=name)
    _, want_loss, want = tracked_step(model, inputs, seed=5, loss_fn=loss_fn)
    _, got_loss, got = tracked_step(model, inputs, plan, seed=5, loss_fn=loss_fn)
    torch.testing.assert_close(got_loss, want_loss)
    _assert_same_gradients(got, want)


def test_apply_shares_parameters_keeps_keys_and_leaves_the_original_alone():
    model, inputs, _ = _branchy()
    plan = _plan(model, inputs, 10**12, use_gradient_checkpointing=True)
    again = autockpt.Plan.model_validate_json(plan.model_dump_json())
    assert again == plan
    planned = autockpt.apply(model, again)
    assert type(planned) is type(model)
    assert list(planned.state_dict()) == list(model.state_dict())
    assert [id(p) for p in planned.parameters()] == [id(p) for p in model.parameters()]
    torch.manual_seed(1)
    got = planned(*inputs)
    torch.manual_seed(1)
    torch.testing.assert_close(got, model(*inputs))
    # Recomputed modules are replaced in a copy; the original runs without checkpoints.
    assert all("forward" not in vars(module) for module in model.modules())
    assert all("forward" in vars(block) for block in planned.blocks)
    assert planned.blocks[0] is not model.blocks[0]
    assert planned.blocks[0].up is model.blocks[0].up


def test_a_plan_without_tracing_loads_as_fx():
    model, inputs, _ = _branchy()
    plan = _plan(model, inputs, 10**12)
    text = plan.model_copy(update={"tracing": "fx"}).model_dump_json(exclude={"tracing"})
    assert autockpt.Plan.model_validate_json(text).tracing == "fx"


def test_apply_refuses_a_module_plan_for_another_model():
    model, inputs, _ = _branchy()
    plan = _plan(model, inputs, 10**12)
    with pytest.raises(autockpt.PlanMismatchError, match="re-plan"):
        autockpt.apply(BranchyStack(depth=3), plan)


class _Wrapper(nn.Module):
    """A model around a model, with an activation it calls twice (not a chain link)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = BranchyStack(depth=4)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.inner(self.act(x)))


def test_chain_looks_through_wrappers_and_skips_modules_called_twice():
    chain = find_module_chain(_Wrapper(), (torch.randn(64, 16),), why="test")
    paths = [segment.module_paths[0] for segment in chain.segments]
    assert paths == ["inner.embed", *(f"inner.blocks.{i}" for i in range(4)), "inner.head"]


class _NoSubmodules(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight if x.sum() > 0 else x - self.weight


def test_a_model_without_submodules_raises_a_trace_error_with_both_reasons():
    with pytest.raises(autockpt.TraceError, match="cannot trace.*no submodule runs once"):
        autockpt.plan(_NoSubmodules(), (torch.randn(8, 16),), 10**12)


@pytest.mark.slow
def test_pytorch_forecasting_tft_plans_with_module_level_segments():
    pd = pytest.importorskip("pandas")
    forecasting = pytest.importorskip("pytorch_forecasting")
    import numpy as np

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        [
            {
                "series": str(series),
                "time_idx": t,
                "value": float(rng.normal()),
                "price": float(rng.normal()),
                "weekday": str(t % 7),
            }
            for series in range(4)
            for t in range(60)
        ]
    )
    dataset = forecasting.TimeSeriesDataSet(
        frame,
        time_idx="time_idx",
        target="value",
        group_ids=["series"],
        max_encoder_length=24,
        max_prediction_length=6,
        static_categoricals=["series"],
        time_varying_known_categoricals=["weekday"],
        time_varying_known_reals=["time_idx"],
        time_varying_unknown_reals=["value", "price"],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on hyperparameters
        model = forecasting.TemporalFusionTransformer.from_dataset(
            dataset, hidden_size=16, attention_head_size=2, hidden_continuous_size=8
        )
        batch, _ = next(iter(dataset.to_dataloader(train=True, batch_size=32, num_workers=0)))
    inputs = (batch,)

    def loss_fn(output: Any) -> torch.Tensor:
        return output["prediction"].sum()

    with pytest.warns(UserWarning, match="TemporalFusionTransformer takes a dict"):
        unplanned = autockpt.plan(
            model, inputs, 10**12, loss_fn=loss_fn, use_gradient_checkpointing=False
        ).predicted_peak_bytes
    lowest = _plan(model, inputs, unplanned, loss_fn=loss_fn).minimum_feasible_bytes
    budget = (lowest + unplanned) // 2
    plan = _plan(model, inputs, budget, loss_fn=loss_fn)
    assert plan.tracing == "forward-hooks" and plan.num_recomputed > 0
    assert any("measured on real tensors" in note for note in plan.notes)
    # The encoder's variable selection holds over a third of the step: it is looked into,
    # and each variable's GRN is a segment (NOTE [Module chain]).
    names = [s.name for s in plan.segments]
    assert "encoder_variable_selection.single_variable_grns.value" in names
    _, want_loss, want = tracked_step(model, inputs, seed=3, loss_fn=loss_fn)
    peak, got_loss, got = tracked_step(model, inputs, plan, seed=3, loss_fn=loss_fn)
    assert peak <= budget
    assert abs(plan.predicted_peak_bytes - peak) <= 0.03 * peak
    torch.testing.assert_close(got_loss, want_loss)
    _assert_same_gradients(got, want)
    assert list(autockpt.apply(model, plan).state_dict()) == list(model.state_dict())
