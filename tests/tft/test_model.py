"""The TFT: shapes, gradients, fx tracing, interpretation, the quantile loss and the config."""

from __future__ import annotations

import pytest
import torch
import torch.fx
import torch.nn.functional as F

from tft.errors import ConfigError
from tft.model.config import PRESET_NAMES, TFTConfig, get_preset
from tft.model.layers import PerVariableGRN, PerVariableLinear
from tft.model.loss import QuantileLoss, quantile_loss
from tft.model.transformer import TemporalFusionTransformer


@pytest.fixture
def tiny_config() -> TFTConfig:
    """The tiny preset with two static inputs, so the static selection network is exercised."""
    return get_preset("tiny", static_cardinalities=[3, 5])


@pytest.fixture
def tiny_model(tiny_config: TFTConfig) -> TemporalFusionTransformer:
    return TemporalFusionTransformer(tiny_config)


def _inputs(model: TemporalFusionTransformer, batch_size: int) -> tuple[torch.Tensor, ...]:
    return model.example_inputs(batch_size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_output_shape_of_each_preset(name: str) -> None:
    config = get_preset(name)
    model = TemporalFusionTransformer(config)
    batch_size = 2 if name == "tft-225" else config.batch_size
    with torch.no_grad():
        prediction = model(*_inputs(model, batch_size))
    assert prediction.shape == (batch_size, config.horizon, len(config.quantiles))
    assert torch.isfinite(prediction).all()


def test_example_inputs_have_the_documented_shapes_and_dtypes(
    tiny_model: TemporalFusionTransformer, tiny_config: TFTConfig
) -> None:
    static_ids, observed, known, future = _inputs(tiny_model, 64)
    assert static_ids.dtype == torch.int64 and static_ids.shape == (64, 2)
    assert (static_ids >= 0).all()
    assert (static_ids < torch.tensor(tiny_config.static_cardinalities)).all()
    assert observed.shape == (64, tiny_config.encoder_length, tiny_config.num_observed)
    assert known.shape == (64, tiny_config.encoder_length, tiny_config.num_known)
    assert future.shape == (64, tiny_config.horizon, tiny_config.num_known)
    assert observed.dtype == known.dtype == future.dtype == torch.float32


def test_every_parameter_receives_a_nonzero_gradient(tiny_model: TemporalFusionTransformer) -> None:
    tiny_model(*_inputs(tiny_model, 8)).square().mean().backward()
    missing = [
        name
        for name, parameter in tiny_model.named_parameters()
        if parameter.grad is None or not parameter.grad.abs().sum() > 0
    ]
    assert missing == []


def test_fx_trace_equals_eager_with_dropout_on(tiny_model: TemporalFusionTransformer) -> None:
    traced = torch.fx.symbolic_trace(tiny_model)
    inputs = _inputs(tiny_model, 8)
    tiny_model.train()
    torch.manual_seed(3)
    eager = tiny_model(*inputs)
    eager_grads = torch.autograd.grad(eager.sum(), list(tiny_model.parameters()))
    torch.manual_seed(3)
    replayed = traced(*inputs)
    traced_grads = torch.autograd.grad(replayed.sum(), list(tiny_model.parameters()))
    torch.testing.assert_close(replayed, eager, rtol=0, atol=0)
    for traced_grad, eager_grad in zip(traced_grads, eager_grads, strict=True):
        torch.testing.assert_close(traced_grad, eager_grad, rtol=0, atol=0)


def test_traced_graph_exposes_the_per_variable_grns_as_plain_ops(
    tiny_model: TemporalFusionTransformer,
) -> None:
    graph = torch.fx.symbolic_trace(tiny_model).graph
    leaves = {
        str(n.target): tiny_model.get_submodule(str(n.target))
        for n in graph.nodes
        if n.op == "call_module"
    }
    assert "lstm_encoder" in leaves and "lstm_decoder" in leaves
    assert all(type(m).__module__.startswith("torch.nn") for m in leaves.values())
    grn_ops = [
        n
        for n in graph.nodes
        if n.op == "call_function"
        and "encoder_selection.variable_grns" in str(n.meta.get("nn_module_stack"))
    ]
    assert torch.bmm in {n.target for n in grn_ops}


@pytest.mark.parametrize(("input_size", "output_size"), [(4, 16), (6, 6)])
def test_fused_per_variable_grn_equals_a_grn_per_variable(
    input_size: int, output_size: int
) -> None:
    """NOTE [Fused per-variable GRN]: the batched layout against equations (2)-(4) written for
    one variable at a time with ``F.linear`` and ``F.glu``, outputs and every gradient."""
    num_vars, rows = 5, 7
    grn = PerVariableGRN(num_vars, input_size, input_size, output_size, dropout=0.0)
    for parameter in (grn.norm_weight, grn.norm_bias):  # not the initial ones and zeros
        torch.nn.init.normal_(parameter)
    x = torch.randn(num_vars, rows, input_size, requires_grad=True)

    def linear(layer: PerVariableLinear, v: int, value: torch.Tensor) -> torch.Tensor:
        return F.linear(value, layer.weight[v].t(), layer.bias[v, 0])

    def one_variable(v: int) -> torch.Tensor:
        residual = x[v] if grn.skip is None else linear(grn.skip, v, x[v])
        hidden = linear(grn.fc2, v, F.elu(linear(grn.fc1, v, x[v])))
        gated = F.glu(linear(grn.gate, v, hidden), dim=-1)
        return F.layer_norm(
            residual + gated, (output_size,), grn.norm_weight[v, 0], grn.norm_bias[v, 0]
        )

    fused = grn(x)  # (V, N, out)
    looped = torch.stack([one_variable(v) for v in range(num_vars)])
    torch.testing.assert_close(fused, looped)
    upstream = torch.randn_like(fused)
    wrt = [x, *grn.parameters()]
    fused_grads = torch.autograd.grad(fused, wrt, upstream)
    looped_grads = torch.autograd.grad(looped, wrt, upstream)
    for fused_grad, looped_grad in zip(fused_grads, looped_grads, strict=True):
        torch.testing.assert_close(fused_grad, looped_grad)


def test_same_seed_gives_the_same_model_and_the_same_output(tiny_config: TFTConfig) -> None:
    outputs = []
    for _ in range(2):
        torch.manual_seed(5)
        model = TemporalFusionTransformer(tiny_config)
        inputs = _inputs(model, 4)
        outputs.append(model(*inputs))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_dropout_changes_training_outputs_but_not_eval_outputs(
    tiny_model: TemporalFusionTransformer,
) -> None:
    inputs = _inputs(tiny_model, 4)
    assert not torch.equal(tiny_model(*inputs), tiny_model(*inputs))
    tiny_model.eval()
    torch.testing.assert_close(tiny_model(*inputs), tiny_model(*inputs), rtol=0, atol=0)


def test_interpretation_weights_are_distributions_and_attention_is_causal(
    tiny_model: TemporalFusionTransformer, tiny_config: TFTConfig
) -> None:
    tiny_model.eval()
    inputs = _inputs(tiny_model, 4)
    with torch.no_grad():
        prediction, found = tiny_model.interpret(*inputs)
        torch.testing.assert_close(prediction, tiny_model(*inputs))
    encoder_length, horizon = tiny_config.encoder_length, tiny_config.horizon
    num_vars = tiny_config.num_observed + tiny_config.num_known
    assert found.static_weights.shape == (4, 2)
    assert found.encoder_weights.shape == (4, encoder_length, num_vars)
    assert found.decoder_weights.shape == (4, horizon, tiny_config.num_known)
    assert found.attention.shape == (4, horizon, encoder_length + horizon)
    for weights in found:
        assert (weights >= 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    for step in range(horizon):
        assert (found.attention[:, step, encoder_length + step + 1 :] == 0).all()
        assert (found.attention[:, step, : encoder_length + step + 1] > 0).all()


def test_forecast_of_a_step_does_not_depend_on_later_future_inputs(
    tiny_model: TemporalFusionTransformer,
) -> None:
    tiny_model.eval()
    static_ids, observed, known, future = _inputs(tiny_model, 4)
    changed = future.clone()
    changed[:, 2:] += 10.0
    with torch.no_grad():
        before = tiny_model(static_ids, observed, known, future)
        after = tiny_model(static_ids, observed, known, changed)
    torch.testing.assert_close(after[:, :2], before[:, :2])
    assert not torch.allclose(after[:, 2:], before[:, 2:])


def test_quantile_loss_matches_a_hand_computed_example() -> None:
    # errors target - prediction = (2, -1) at quantiles (0.1, 0.9):
    # max(0.1 * 2, -0.9 * 2) = 0.2 and max(0.9 * -1, -0.1 * -1) = 0.1; mean 0.15
    prediction = torch.tensor([[[0.0, 3.0]]])
    target = torch.tensor([[2.0]])
    torch.testing.assert_close(quantile_loss(prediction, target, [0.1, 0.9]), torch.tensor(0.15))
    torch.testing.assert_close(QuantileLoss([0.1, 0.9])(prediction, target), torch.tensor(0.15))


def test_quantile_loss_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="3 quantiles"):
        quantile_loss(torch.zeros(2, 4, 2), torch.zeros(2, 4), [0.1, 0.5, 0.9])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 30}, "not a multiple of num_heads"),
        ({"dropout": 1.0}, "dropout must be in"),
        ({"dropout": -0.1}, "dropout must be in"),
        ({"quantiles": (0.9, 0.1)}, "strictly increasing"),
        ({"quantiles": (0.5, 1.0)}, r"in \(0, 1\)"),
        ({"quantiles": ()}, "at least one quantile"),
        ({"static_cardinalities": [4, 0]}, "below 1"),
        ({"num_observed": 0}, "num_observed must be 1 or more"),
        ({"encoder_length": -3}, "encoder_length must be 1 or more"),
        ({"hidden": 64}, "hidden is not a field"),
    ],
)
def test_bad_config_values_raise_config_error(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        get_preset("small", **overrides)


def test_config_is_frozen_and_overrides_are_validated() -> None:
    config = get_preset("tiny")
    assert config.with_overrides(horizon=7).horizon == 7
    with pytest.raises(ConfigError, match="num_heads"):
        config.with_overrides(num_heads=3)
    with pytest.raises(ValueError):
        config.horizon = 7  # type: ignore[misc]
    assert TFTConfig.from_dict(config.model_dump()) == config


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'x'; choose one of tiny, small, tft-225"):
        get_preset("x")
