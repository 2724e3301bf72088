"""Planning's fake mode, and what it does where fake tensors alone would end planning: Python
values read off them (a loss's ``.item()``), ``torch.distributions``' argument checks, and
cuDNN's RNN kernels, which torch gives no fake implementation of its backward.

NOTE [Values read off fake tensors]
A fake tensor has a shape and no values, so ``loss.item()``, ``float(loss)``, ``bool(t)`` and
``torch.equal`` on one raise a data-dependent error, and a loss written the way people write
them (a finite check ``if not torch.isfinite(loss).item(): raise``, a running total of
``loss.item()`` for a progress line, a Lightning step that logs ``loss.item()``) ended planning.
The step's memory does not depend on such a value: it is read after the tensors are made, and
what it decides (raise, log, print) allocates nothing the planner counts. So while the loss runs
on fake tensors, :class:`FakeScalars` answers each read with a value that lets the step go on as
a healthy training step would: ``True`` for a boolean (a finite check passes, a mask is not
empty), ``1`` for an integer and ``1.0`` for a floating-point value (finite, non-zero). A real
tensor read as it is (a scalar the loss closes over) gives its real value; what an op makes of
it under the fake mode is fake, and reads as above. A branch on such a value
that allocates (``if loss.item() > 10: loss = loss + extra``) is measured down the branch the
value picks: the plan's verification on a real step (``autockpt.apply`` and ``verify``) is where
that would show.

NOTE [Argument checks on fake tensors]
Forecasting models that output a distribution (``transformers``' TimeSeriesTransformer, any
DeepAR-style head built on ``torch.distributions``) build it inside ``forward``, and a
distribution checks its arguments by default: ``constraint.check(scale).all()`` read as a
Python ``bool``. On fake tensors that read raises, the forward is taken as one that does not
run on fake tensors, and planning falls back to real copies that take real memory (planning
TimeSeriesTransformer at its minimum held 2.40 MB by the tests' counter at a budget of 2.14 MB).
Such a check allocates nothing that stays and changes no value: it raises or it does not. So
while planning's fake mode is entered (:class:`PlanningFakeMode`), ``torch.distributions``'
default argument checks are off, and they are back as they were when it is left; the user's
real steps check as they always did. Reads that can change what a forward allocates (a size
from ``.item()``, a branch on ``mask.any()``) still raise in the forward, and planning measures
such a model on real copies, as before, and so does a distribution made with
``validate_args=True`` in so many words. (The first ``torch.compile`` in a process turns the
default checks off for good, dynamo does: after it, torch.fx traces such a forward too.)

NOTE [cuDNN's RNN on fake tensors]
On a CUDA device ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` run as one cuDNN kernel,
``aten._cudnn_rnn``, and their backward as ``aten._cudnn_rnn_backward``. torch has a fake
implementation of the first and none of the second: fake mode falls back to running the real
kernel on zero-filled stand-ins, which cuDNN refuses (``CUDNN_STATUS_BAD_PARAM``), so planning
any model with a recurrent layer on a GPU failed, the bundled TFT among them (seen on an H200;
on the CPU these layers run as ordinary ops and plan). Planning's fake mode gives the backward
its outputs' shapes as the CUDA kernel makes them: the input's gradient, the initial states',
and the weights' as views of one buffer the size of the flat weight buffer (the kernel fills
one buffer and hands out views of it). torch's fake forward gives the reserve space (what cuDNN
keeps from forward for backward) no bytes at all; in training it is activation memory, so the
fake mode makes it :func:`cudnn_rnn_reserve_bytes` long, a size read off cuDNN on a GPU (see
that function). The kernels' own scratch space lives only inside the call, as an op's
workspace does everywhere else in the planner.

NOTE [Data-dependent sizes on fake tensors]
``nonzero`` (a boolean mask's indexing ``x[mask]``, ``torch.where(mask)``), ``masked_select``,
``unique`` and ``unique_consecutive`` make a tensor whose size depends on the values, which a
fake tensor has not: torch's fake mode raises, and a model (``Wav2Vec2ForCTC``'s feature mask)
or a loss (a z-loss over ``logits[labels != -100]``) that uses one ended planning. The planner
needs bytes, not values: planning's fake mode makes each such output as large as it can be,
every element kept (a mask all true, every value distinct), so the step is measured at its
most and every shape after it is one a real batch can give. It agrees with what a read of a
fake mask gives (NOTE [Values read off fake tensors]: not empty). A real step's are the same
size or smaller. ``repeat_interleave`` with a tensor of repeats has no such bound (its size is
the repeats' sum) and still raises; planning measures that model on real copies, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from autockpt.planner.core.dispatch_mode import OpMode

_READS = frozenset({torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default})


class FakeScalars(OpMode):
    """While active, a Python value read off a fake tensor is a healthy step's (NOTE [Values
    read off fake tensors]); every other op runs as it would."""

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if func not in _READS:
            return func(*args, **kwargs)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(isinstance(t, FakeTensor) for t in tensors):
            if func is torch.ops.aten.equal.default:
                return True
            return neutral_value(tensors[0].dtype)
        with _disable_current_modes():  # a real tensor: its value
            return func(*args, **kwargs)


def neutral_value(dtype: torch.dtype) -> bool | int | float | complex:
    """What a fake tensor of ``dtype`` reads as (NOTE [Values read off fake tensors])."""
    if dtype == torch.bool:
        return True
    if dtype.is_complex:
        return complex(1.0)
    if dtype.is_floating_point:
        return 1.0
    return 1


class PlanningFakeMode(FakeTensorMode):
    """The fake mode planning runs a model's forward in: a ``FakeTensorMode`` (non-fake inputs
    allowed) that turns ``torch.distributions``' default argument checks off while it is
    entered (NOTE [Argument checks on fake tensors])."""

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self._checks_before: list[bool] = []

    def __enter__(self) -> PlanningFakeMode:
        self._checks_before.append(torch.distributions.Distribution._validate_args)
        torch.distributions.Distribution.set_default_validate_args(False)
        try:
            return super().__enter__()  # type: ignore[return-value]
        except BaseException:
            torch.distributions.Distribution.set_default_validate_args(self._checks_before.pop())
            raise

    def __exit__(self, *exc_info: Any) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            torch.distributions.Distribution.set_default_validate_args(self._checks_before.pop())

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] = MappingProxyType({}),
    ) -> Any:
        if func is _CUDNN_RNN_BACKWARD:  # NOTE [cuDNN's RNN on fake tensors]
            return _cudnn_rnn_backward(bound_arguments(func, args, kwargs))
        if func in _DATA_DEPENDENT:  # NOTE [Data-dependent sizes on fake tensors]
            return self._every_element_kept(func, types, bound_arguments(func, args, kwargs))
        out: Any = super().__torch_dispatch__(func, types, args, kwargs)
        if func is _CUDNN_RNN:
            bound = bound_arguments(func, args, kwargs)
            if bound["train"]:
                reserve = bound["input"].new_empty(
                    cudnn_rnn_reserve_bytes(bound), dtype=torch.uint8
                )
                out = (*out[:3], reserve, *out[4:])
        return out

    def _every_element_kept(self, func: Any, types: Any, bound: dict[str, Any]) -> Any:
        """The outputs of a data-dependent op at their largest (NOTE [Data-dependent sizes on
        fake tensors])."""
        source: torch.Tensor = bound["self"]

        def empty(shape: Sequence[int], dtype: torch.dtype) -> Any:
            return super(PlanningFakeMode, self).__torch_dispatch__(
                _NEW_EMPTY, types, (source, list(shape)), {"dtype": dtype}
            )

        if func is _NONZERO:
            return empty((source.numel(), source.dim()), torch.int64)
        if func is _MASKED_SELECT:
            kept = torch.broadcast_shapes(source.shape, bound["mask"].shape).numel()
            return empty((kept,), source.dtype)
        # unique, unique_consecutive: values, inverse, counts; the last two empty unless
        # asked for, as the kernels make them. Along a dimension: every slice distinct.
        dim = bound.get("dim")
        values = tuple(source.shape) if dim is not None else (source.numel(),)
        along = source.shape[dim] if dim is not None else source.numel()
        whole = (along,) if dim is not None else tuple(source.shape)
        inverse = whole if bound.get("return_inverse", False) else (0,)
        counts = (along,) if bound.get("return_counts", False) else (0,)
        return (
            empty(values, source.dtype),
            empty(inverse, torch.int64),
            empty(counts, torch.int64),
        )


_NEW_EMPTY = torch.ops.aten.new_empty.default
_NONZERO = torch.ops.aten.nonzero.default
_MASKED_SELECT = torch.ops.aten.masked_select.default
_DATA_DEPENDENT = frozenset(
    {
        _NONZERO,
        _MASKED_SELECT,
        torch.ops.aten._unique2.default,
        torch.ops.aten.unique_consecutive.default,
    }
)
_CUDNN_RNN = torch.ops.aten._cudnn_rnn.default
_CUDNN_RNN_BACKWARD = torch.ops.aten._cudnn_rnn_backward.default
#: Rows of the hidden size cuDNN keeps per layer, direction, step and sample, by the mode
#: ``aten._cudnn_rnn`` takes: RNN_RELU, RNN_TANH, LSTM (four gates and the cell), GRU.
_RESERVE_ROWS = {0: 1, 1: 1, 2: 5, 3: 6}
#: What cuDNN adds to every reserve space, whatever its shape.
_RESERVE_ALIGNMENT_BYTES = 256


def bound_arguments(
    func: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """An op's arguments by the names its schema gives them."""
    names = [argument.name for argument in func._schema.arguments]
    return {**dict(zip(names, args, strict=False)), **(kwargs or {})}


def cudnn_rnn_reserve_bytes(bound: dict[str, Any]) -> int:
    """The bytes of the reserve space cuDNN keeps from an RNN's training forward for its
    backward (NOTE [cuDNN's RNN on fake tensors]), for ``aten._cudnn_rnn``'s arguments.

    cuDNN does not say how it sizes it, and torch does not ask it on fake tensors. Read off the
    kernel on an H200 (``benchmarks/cudnn_rnn_reserve.py``: LSTM, GRU and RNN; 1 to 3 layers,
    one or two directions; float32, float16 and bfloat16; every shape to the byte): for each
    layer, direction, step and sample, a fixed number of rows of the hidden size by the mode
    (:data:`_RESERVE_ROWS`), and each inner layer's output once per direction, plus 256 bytes.
    """
    input_ = bound["input"]
    if bound["batch_sizes"]:
        steps_times_batch = int(input_.shape[0])  # a packed sequence: every step's rows
    else:
        steps_times_batch = int(input_.shape[0]) * int(input_.shape[1])
    directions = 2 if bound["bidirectional"] else 1
    layers = int(bound["num_layers"])
    rows = directions * (layers * _RESERVE_ROWS[int(bound["mode"])] + layers - 1)
    row_bytes = steps_times_batch * int(bound["hidden_size"]) * input_.element_size()
    return rows * row_bytes + _RESERVE_ALIGNMENT_BYTES


def _cudnn_rnn_backward(bound: dict[str, Any]) -> tuple[Any, Any, Any, list[Any]]:
    """``aten._cudnn_rnn_backward``'s outputs, empty and shaped as the CUDA kernel makes them."""
    mask = bound["output_mask"]
    input_, hx, cx = bound["input"], bound["hx"], bound["cx"]
    grad_input = input_.new_empty(input_.shape) if mask[0] else None
    grad_hx = hx.new_empty(hx.shape) if mask[1] else None
    grad_cx = cx.new_empty(cx.shape) if mask[2] and cx is not None else None
    grad_weights: list[Any] = []
    if mask[3]:
        weights, flat = bound["weight"], bound["weight_buf"]
        if flat is None:
            grad_weights = [w.new_empty(w.shape) for w in weights]
        else:
            buffer, offset = flat.new_empty(flat.shape), 0
            for w in weights:
                grad_weights.append(buffer[offset : offset + w.numel()].view(w.shape))
                offset += w.numel()
    return grad_input, grad_hx, grad_cx, grad_weights
