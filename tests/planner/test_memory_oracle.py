"""Peaks of real training steps counted by hand from shapes and dtypes, against the planner's
prediction and the independent counter of :mod:`tests.oracle`.

Each expected peak below is a sum of named terms, each the bytes of one tensor that is live at
the step's peak, written from the model's shapes (float32: 4 bytes, float64: 8). The step is
the one ``tests.oracle.measured_step`` runs: AdamW whose state exists before the step, the
loss held through backward, ``.grad`` set to ``None`` before it. Three facts of PyTorch's CPU
kernels and autograd recur:

- ``backward()`` starts from a ones-like gradient of the loss, which it holds until it returns
  (4 bytes for a float32 scalar);
- ``mse_loss`` on the CPU returns its scalar as a view of the whole element-wise buffer, so the
  loss holds ``B * OUT * 4`` bytes for as long as it lives;
- non-reentrant checkpointing stops a recompute as soon as every tensor the backward needs is
  rebuilt: a segment's last op (whose output nothing saves) is not run again.

If a test here fails after a change to PyTorch or to how a step runs, re-derive the sum (the
``LiveBytes`` counter can print each op's bytes) rather than copying the new number.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from tests.oracle import LiveBytes, measured_step

FLOAT = 4  # bytes of a float32
DOUBLE = 8  # bytes of a float64
STEP = 4  # AdamW's per-parameter ``step`` count: a float32 scalar tensor


def adamw_start(parameter_shapes: list[tuple[int, ...]], *, item: int = FLOAT) -> int:
    """Parameters plus AdamW state (two moments and a step count per parameter), no grads."""
    numel = sum(torch.Size(shape).numel() for shape in parameter_shapes)
    return 3 * numel * item + STEP * len(parameter_shapes)


# ---------------------------------------------------------------------------- the counter


def test_the_counter_counts_storages_not_views() -> None:
    with LiveBytes() as counter:
        x = torch.empty(1000)  # 4000 bytes
        views = [x[10:20], x.view(10, 100).t(), x.unsqueeze(0)]
        x.mul_(2.0)  # in place: the same storage
        assert counter.current_bytes == 4000
        y = torch.empty(10, dtype=torch.float64)  # 80 bytes
        assert counter.current_bytes == 4080
        del x
        assert counter.current_bytes == 4080  # the views keep the storage
        del views
        assert counter.current_bytes == 80
        del y
        assert (counter.current_bytes, counter.peak_bytes) == (0, 4080)


# ---------------------------------------------------------------------------- Linear, GELU, LayerNorm, MSE

B, D, H, OUT = 256, 24, 40, 4  # batch, inputs, hidden, outputs


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.LayerNorm(H), nn.Linear(H, OUT))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target, reduction="sum")


#: Linear(D, H), LayerNorm(H), Linear(H, OUT): weights and biases.
MLP_SHAPES = [(H, D), (H,), (H,), (H,), (OUT, H), (OUT,)]
#: Parameters 1244 floats (4976 B), AdamW state 2 * 4976 + 6 * 4, the batch x and target y.
MLP_START = adamw_start(MLP_SHAPES) + B * D * FLOAT + B * OUT * FLOAT
MLP_GRADS = sum(torch.Size(s).numel() for s in MLP_SHAPES) * FLOAT  # every parameter's .grad


def mlp_activations(rows: int) -> int:
    """What forward saves for backward, per ``rows`` samples: the first Linear's output (GELU
    saves it), GELU's output (LayerNorm's input), LayerNorm's output (the last Linear's input)
    and LayerNorm's mean and reciprocal std (one float per row each)."""
    return 3 * rows * H * FLOAT + 2 * rows * FLOAT


def mlp_last_linear_backward(rows: int) -> int:
    """What the last Linear's backward on ``rows`` samples has made at its peak: the gradient
    of its input (rows x H) and of its weight (OUT x H)."""
    return rows * H * FLOAT + OUT * H * FLOAT


@pytest.fixture
def mlp_case(fixed_time_model: object) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    return mlp(), torch.randn(B, D), torch.randn(B, OUT)


def _check(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    plan: autockpt.Plan,
    expected: int,
    **step: object,
) -> None:
    measured, _, _ = measured_step(model, inputs, plan, **step)  # type: ignore[arg-type]
    assert (plan.predicted_peak_bytes, measured) == (expected, expected)


def test_mlp_nothing_recomputed(mlp_case) -> None:
    model, x, y = mlp_case
    plan = autockpt.plan(
        model, (x,), 10**12, loss_fn=mse, example_targets=(y,), use_gradient_checkpointing=False
    )
    # The peak is in the last Linear's backward, once its bias gradient exists:
    # 43624 + 124928 + 4096 + 4 + 4096 + 41600 + 16 = 218364 bytes.
    expected = (
        MLP_START  # 43624
        + mlp_activations(B)  # 3 * 256 * 40 * 4 + 2 * 256 * 4 = 124928
        + B * OUT * FLOAT  # the loss: mse_loss's element-wise buffer, 4096
        + FLOAT  # backward's seed
        + B * OUT * FLOAT  # the gradient of the model's output, 4096
        + mlp_last_linear_backward(B)  # 40960 + 640
        + OUT * FLOAT  # the last bias's gradient, 16
    )
    assert expected == 218364
    _check(model, (x,), plan, expected, loss_fn=mse, targets=(y,))


def test_mlp_every_segment_recomputed(mlp_case) -> None:
    model, x, y = mlp_case
    plan = autockpt.plan(
        model, (x,), 10**12, loss_fn=mse, example_targets=(y,), use_gradient_checkpointing=True
    )
    # Two segments, [Linear, GELU] and [LayerNorm, Linear], both recomputed.
    assert [s.modules for s in plan.segments] == [["0", "1"], ["2", "3"]]
    assert all(s.recomputed for s in plan.segments)
    # The peak is in the last Linear's backward again, now inside the second segment's
    # recompute: the first segment's output (GELU's, the second's input) is kept; the second
    # rebuilt LayerNorm (output and statistics) but not the Linear after it (early stop); the
    # first Linear's output is gone until the first segment is recomputed.
    expected = (
        MLP_START  # 43624
        + B * H * FLOAT  # GELU's output: the boundary between the segments, 40960
        + B * OUT * FLOAT  # the loss (mse_loss's buffer), 4096
        + FLOAT  # backward's seed
        + B * OUT * FLOAT  # the gradient of the model's output, 4096
        + B * H * FLOAT
        + 2 * B * FLOAT  # LayerNorm recomputed: output and statistics, 43008
        + mlp_last_linear_backward(B)  # 40960 + 640
    )
    assert expected == 177388
    _check(model, (x,), plan, expected, loss_fn=mse, targets=(y,))


def test_mlp_in_chunks(mlp_case) -> None:
    model, x, y = mlp_case
    unplanned = 218364  # test_mlp_nothing_recomputed
    budget = int(unplanned * 0.8)
    plan = autockpt.plan(
        model, (x,), budget, loss_fn=mse, example_targets=(y,), allow_micro_batches=False
    )
    # One segment holding the whole model, recomputed in chunks along the batch.
    [segment] = plan.segments
    assert segment.recomputed and segment.num_chunks > 1 and plan.num_micro_batches == 1
    rows = B // segment.num_chunks
    # The peak is in the last chunk's backward: the whole batch's loss, seed and output
    # gradient are live, the chunks done before left every parameter's gradient, and this
    # chunk's interior is rebuilt (all but its last Linear's output) for its backward.
    expected = (
        MLP_START
        + B * OUT * FLOAT  # the loss (mse_loss's buffer over the whole batch)
        + FLOAT  # backward's seed
        + MLP_GRADS  # 4976: every .grad, from the chunks before
        + B * OUT * FLOAT  # the output's gradient, whole batch (each chunk reads a slice)
        + mlp_activations(rows)  # this chunk's interior, recomputed
        + mlp_last_linear_backward(rows)
    )
    assert segment.num_chunks != 2 or expected == 140380
    _check(model, (x,), plan, expected, loss_fn=mse, targets=(y,))


def test_mlp_in_micro_batches(mlp_case) -> None:
    model, x, y = mlp_case
    unplanned = 218364  # test_mlp_nothing_recomputed
    plan = autockpt.plan(
        model, (x,), int(unplanned * 0.8), loss_fn=mse, example_targets=(y,), allow_chunks=False
    )
    assert plan.num_micro_batches > 1 and plan.num_recomputed == 0
    assert B % plan.num_micro_batches == 0
    rows = B // plan.num_micro_batches
    # The peak is in the last piece's backward, as in the unplanned step at ``rows`` samples,
    # but with every .grad live from the pieces before, and the loss a 4-byte product (the
    # piece's loss times its weight): mse_loss's buffer is gone once it is multiplied.
    expected = (
        MLP_START
        + MLP_GRADS  # 4976
        + mlp_activations(rows)
        + FLOAT  # the piece's loss (scaled)
        + FLOAT  # backward's seed
        + rows * OUT * FLOAT  # the gradient of the piece's output
        + mlp_last_linear_backward(rows)
        + OUT * FLOAT  # the last bias's gradient of this piece, before it is added in
    )
    assert plan.num_micro_batches != 2 or expected == 134256
    _check(model, (x,), plan, expected, loss_fn=mse, targets=(y,))


# ---------------------------------------------------------------------------- attention

AB, AT, AE, AHEADS = 4, 16, 8, 2  # batch, time, width, heads (head width AE // AHEADS)


class SelfAttention(nn.Module):
    """One projection to q, k and v, scaled dot-product attention over time, one output."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(AE, 3 * AE)
        self.out = nn.Linear(AE, AE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, width = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, T, E) each, views of one (B, T, 3E)
        q, k, v = (t.view(batch, steps, AHEADS, width // AHEADS).transpose(1, 2) for t in (q, k, v))
        mixed = F.scaled_dot_product_attention(q, k, v)  # (B, heads, T, E / heads)
        return self.out(mixed.transpose(1, 2).reshape(batch, steps, width))


def total(output: torch.Tensor) -> torch.Tensor:
    return output.sum()


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
def test_attention(recompute: bool, fixed_time_model: object) -> None:
    model, x = SelfAttention(), torch.randn(AB, AT, AE)
    plan = autockpt.plan(model, (x,), 10**12, loss_fn=total, use_gradient_checkpointing=recompute)
    assert plan.num_recomputed == (len(plan.segments) if recompute else 0)
    activation = AB * AT * AE * FLOAT  # one (B, T, E) tensor: 2048 bytes
    # The peak is in the attention's backward (the CPU's flash kernel), which returns the
    # gradients of q, k and v at once. Recomputing changes nothing here: the attention's
    # segment is rebuilt whole for its own backward, and that is where the peak is.
    expected = (
        adamw_start([(3 * AE, AE), (3 * AE,), (AE, AE), (AE,)])  # 1152 + 2304 + 16
        + activation  # the batch x
        + 3 * activation  # the projection's output: q, k and v are views of it
        + activation  # the attention's output
        + AB * AHEADS * AT * FLOAT  # its log-sum-exp, kept for backward: 512
        + FLOAT  # the loss
        + FLOAT  # backward's seed (sum's backward expands it: a view)
        + activation  # the gradient of the output projection's input
        + AE * AE * FLOAT  # ... of its weight, 256
        + AE * FLOAT  # ... of its bias, 32
        + 3 * activation  # the gradients of q, k and v
    )
    assert expected == 22712
    _check(model, (x,), plan, expected, loss_fn=total)


# ---------------------------------------------------------------------------- LSTM

LB, LT, LI, LH = 8, 3, 5, 6  # batch, time steps, inputs, hidden


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(LI, LH, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _ = self.lstm(x)  # (B, T, H)
        return output


LSTM_SHAPES = [(4 * LH, LI), (4 * LH, LH), (4 * LH,), (4 * LH,)]


def lstm_forward(rows: int) -> int:
    """Bytes a float64 LSTM holds at the end of its forward on ``rows`` sequences.

    In float64 the CPU runs PyTorch's own LSTM (the oneDNN kernel, whose workspace has no
    formula here, takes float32 only): the input gates of every step at once, then per step
    one matrix product and the cell's element-wise ops, then the outputs stacked.
    """
    return (
        2 * rows * LH * DOUBLE  # the zero initial h and c
        + LT * rows * LI * DOUBLE  # the input, time-major and contiguous (saved for W_ih's grad)
        + LT * rows * 4 * LH * DOUBLE  # x @ W_ih.T + b_ih for every step
        + LT
        * (
            rows * 4 * LH * DOUBLE  # the step's gates (sigmoid/tanh in place; saved)
            + rows * LH * DOUBLE  # the new cell state c
            + rows * LH * DOUBLE  # tanh(c), saved for the output's gradient
            + rows * LH * DOUBLE  # the new hidden state h
        )
        + LT * rows * LH * DOUBLE  # the outputs, stacked
    )


def test_lstm(fixed_time_model: object) -> None:
    model = Recurrent().double()
    x = torch.randn(LB, LT, LI, dtype=torch.float64)
    plan = autockpt.plan(model, (x,), 10**12, loss_fn=total, use_gradient_checkpointing=False)
    # The peak is at the end of forward: every step's gates and states are live, and backward
    # frees them step by step faster than it allocates.
    expected = adamw_start(LSTM_SHAPES, item=DOUBLE) + LB * LT * LI * DOUBLE + lstm_forward(LB)
    assert expected == 24016
    _check(model, (x,), plan, expected, loss_fn=total)


def test_lstm_in_two_micro_batches(fixed_time_model: object) -> None:
    model = Recurrent().double()
    x = torch.randn(LB, LT, LI, dtype=torch.float64)
    plan = autockpt.plan(model, (x,), int(24016 * 0.8), loss_fn=total, allow_chunks=False)
    assert (plan.num_micro_batches, plan.num_recomputed) == (2, 0)
    # Still at the end of the (second) piece's forward, on half the rows, with every .grad
    # left by the first piece: 8464 + 2496 + 7776 = 18736 bytes.
    parameters = sum(torch.Size(s).numel() for s in LSTM_SHAPES) * DOUBLE
    expected = (
        adamw_start(LSTM_SHAPES, item=DOUBLE)
        + LB * LT * LI * DOUBLE
        + parameters
        + lstm_forward(LB // 2)
    )
    assert expected == 18736
    _check(model, (x,), plan, expected, loss_fn=total)
