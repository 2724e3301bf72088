"""cuDNN's RNN kernels on planning's fake tensors (NOTE [cuDNN's RNN on fake tensors]).

On a GPU, ``nn.LSTM``/``nn.GRU``/``nn.RNN`` run as ``aten._cudnn_rnn`` and its backward as
``aten._cudnn_rnn_backward``, which torch cannot run on fake tensors: planning any recurrent
model on CUDA failed. These ops exist in every build, so the fake mode's answers are checked
here on the CPU, by calling the ops as cuDNN's LSTM calls them; the plan of a recurrent model
on a real GPU is checked in ``tests/planner/test_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from autockpt.planner.core.fake_mode import PlanningFakeMode, cudnn_rnn_reserve_bytes

LSTM, GRU, RNN_TANH = 2, 3, 1
_GATES = {RNN_TANH: 1, LSTM: 4, GRU: 3}

#: The reserve space cuDNN returned on an NVIDIA H200 (torch 2.11.0+cu130), read by
#: ``benchmarks/cudnn_rnn_reserve.py``: (mode, steps, batch, input, hidden, layers,
#: bidirectional, dtype, bytes).
MEASURED_ON_H200 = [
    (LSTM, 10, 32, 64, 64, 1, False, torch.float32, 409_856),
    (LSTM, 20, 32, 64, 64, 1, False, torch.float32, 819_456),
    (LSTM, 10, 64, 64, 64, 1, False, torch.float32, 819_456),
    (LSTM, 10, 32, 64, 128, 1, False, torch.float32, 819_456),
    (LSTM, 10, 32, 128, 64, 1, False, torch.float32, 409_856),
    (LSTM, 10, 32, 64, 64, 2, False, torch.float32, 901_376),
    (LSTM, 10, 32, 64, 64, 1, True, torch.float32, 819_456),
    (LSTM, 50, 17, 33, 96, 3, True, torch.float32, 11_097_856),
    (LSTM, 10, 32, 64, 64, 1, False, torch.float16, 205_056),
    (LSTM, 10, 32, 64, 64, 1, False, torch.bfloat16, 205_056),
    (LSTM, 100, 256, 160, 160, 1, False, torch.float32, 81_920_256),
    (GRU, 10, 32, 64, 64, 1, False, torch.float32, 491_776),
    (GRU, 20, 64, 64, 128, 2, True, torch.float32, 17_039_616),
    (RNN_TANH, 10, 32, 64, 64, 1, False, torch.float32, 82_176),
    (RNN_TANH, 20, 64, 64, 128, 2, True, torch.float32, 3_932_416),
]


def _arguments(
    mode: int, steps: int, batch: int, inputs: int, hidden: int, layers: int, bidirectional: bool
) -> dict:
    """``aten._cudnn_rnn``'s arguments as ``nn.LSTM`` passes them (time-major input)."""
    gates, directions = _GATES[mode], 2 if bidirectional else 1
    weights = []
    for layer in range(layers):
        width = inputs if layer == 0 else hidden * directions
        for _ in range(directions):
            weights += [
                torch.randn(gates * hidden, width),
                torch.randn(gates * hidden, hidden),
                torch.randn(gates * hidden),
                torch.randn(gates * hidden),
            ]
    states = (layers * directions, batch, hidden)
    return {
        "input": torch.randn(steps, batch, inputs, requires_grad=True),
        "weight": [w.requires_grad_() for w in weights],
        "weight_stride0": 4,
        "weight_buf": None,
        "hx": torch.randn(states),
        "cx": torch.randn(states) if mode == LSTM else None,
        "mode": mode,
        "hidden_size": hidden,
        "proj_size": 0,
        "num_layers": layers,
        "batch_first": False,
        "dropout": 0.0,
        "train": True,
        "bidirectional": bidirectional,
        "batch_sizes": [],
        "dropout_state": None,
    }


@pytest.mark.parametrize(
    ("mode", "steps", "batch", "inputs", "hidden", "layers", "bidirectional", "dtype", "measured"),
    MEASURED_ON_H200,
)
def test_reserve_space_is_the_size_cudnn_gave_on_a_gpu(
    mode, steps, batch, inputs, hidden, layers, bidirectional, dtype, measured
) -> None:
    with PlanningFakeMode():
        bound = _arguments(mode, steps, batch, inputs, hidden, layers, bidirectional)
        bound["input"] = bound["input"].to(dtype)
        assert cudnn_rnn_reserve_bytes(bound) == measured


@pytest.mark.parametrize("mode", [LSTM, GRU, RNN_TANH])
def test_backward_runs_on_fake_tensors_with_the_kernel_s_shapes(mode: int) -> None:
    with PlanningFakeMode():
        arguments = _arguments(mode, 7, 3, 5, 4, 2, True)
        flat = torch.cat([w.detach().reshape(-1) for w in arguments["weight"]])
        arguments["weight_buf"] = flat
        output, hy, _, reserve, _ = torch.ops.aten._cudnn_rnn(*arguments.values())
        assert output.shape == (7, 3, 8)
        assert reserve.dtype == torch.uint8
        assert reserve.numel() == cudnn_rnn_reserve_bytes(arguments) > 0
        (output.sum() + hy.sum()).backward()  # autograd calls aten._cudnn_rnn_backward
        assert arguments["input"].grad.shape == arguments["input"].shape
        grads = [w.grad for w in arguments["weight"]]
        assert [g.shape for g in grads] == [w.shape for w in arguments["weight"]]


def _backward(mask: list[bool]) -> tuple[dict, tuple]:
    """``aten._cudnn_rnn_backward`` called directly on an LSTM's forward, with ``mask``."""
    arguments = _arguments(LSTM, 4, 2, 3, 5, 1, False)
    arguments["weight_buf"] = torch.cat([w.detach().reshape(-1) for w in arguments["weight"]])
    output, _, _, reserve, _ = torch.ops.aten._cudnn_rnn(*arguments.values())
    names = [a.name for a in torch.ops.aten._cudnn_rnn_backward.default._schema.arguments]
    backward = dict.fromkeys(names)
    backward.update(
        {k: v for k, v in arguments.items() if k in names},
        output=output,
        grad_output=torch.ones_like(output),
        reserve=reserve,
        output_mask=mask,
    )
    return arguments, torch.ops.aten._cudnn_rnn_backward(*(backward[name] for name in names))


def test_weight_gradients_are_views_of_one_buffer_as_the_kernel_makes_them() -> None:
    with PlanningFakeMode():
        arguments, (_, grad_hx, grad_cx, grad_weights) = _backward([True] * 4)
        assert grad_hx.shape == grad_cx.shape == arguments["hx"].shape
        storages = {g.untyped_storage()._cdata for g in grad_weights}
        assert len(storages) == 1
        flat = arguments["weight_buf"]
        assert grad_weights[0].untyped_storage().nbytes() == flat.numel() * flat.element_size()


def test_outputs_left_out_by_the_mask_are_not_made() -> None:
    with PlanningFakeMode():
        arguments, outputs = _backward([True, False, False, False])
        grad_input, grad_hx, grad_cx, grad_weights = outputs
        assert grad_input.shape == arguments["input"].shape
        assert grad_hx is None and grad_cx is None and grad_weights == []
