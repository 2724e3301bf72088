"""Python values read off fake tensors: what a loss's ``.item()`` gets while planning measures.

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
"""

from __future__ import annotations

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
