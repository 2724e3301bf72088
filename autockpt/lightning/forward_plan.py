"""A LightningModule's own ``forward`` planned through torch.fx, with the rest of its
``training_step`` as the loss.

NOTE [Tracing a LightningModule's forward]
Module-level segments (NOTE [Module chain]) lower a peak only as far as whole submodules allow:
the glue a ``forward`` runs between them (``x = x + F.gelu(conv(x)[..., :T])``) keeps what it
saves whatever is recomputed, so five dilated convolutions planned that way could not go below
their unplanned peak, where torch.fx reached 57% of it. So where the ``training_step`` calls the
module's own ``forward`` and that ``forward`` traces, the callback plans the ``forward`` with fx:

- *Its inputs.* The ``training_step`` runs on the batch under ``no_grad`` with ``forward``
  replaced by a stand-in that records its arguments and stops the step: what comes before the
  call (unpacking the batch, a cast) is all that runs, so it costs next to nothing.
- *The loss.* The rest of the step is the loss: :class:`LossAfterForward` runs the whole
  ``training_step`` again with ``forward`` replaced by one that hands back the planned
  ``forward``'s output, and reads the loss as Lightning does. It runs on a copy of the module
  that shares its parameters and buffers, so what the step's Python writes while planning
  measures and times it (``self.history.append(loss.item())``, a torchmetrics metric's
  ``update``) lands in the copy, not in the module Lightning trains; on fake tensors a value
  the step reads (``loss.item()``, ``float(loss)``) is a healthy step's (NOTE [Values read
  off fake tensors]). The batch is the loss's target,
  held through the step as Lightning holds it. A step that calls ``forward`` twice makes that
  stand-in raise, and the callback plans with module-level segments instead.
- *Installing it.* ``autockpt.apply`` gives the planned module, a shallow copy sharing every
  parameter and buffer; :class:`InstalledForward` sets its ``forward`` on the LightningModule
  (an instance attribute, taken away at the end of the fit). It follows the module's
  train/eval mode, so validation and prediction run the module's own ``forward``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

import torch

from autockpt.lightning.step import LightningStep, step_loss

__all__ = ["InstalledForward", "LossAfterForward", "forward_inputs"]


class _Called(Exception):
    """Raised by the stand-in ``forward`` to stop the step at the call (NOTE [Tracing a
    LightningModule's forward])."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("forward called")
        self.args, self.kwargs = args, kwargs


class _ForwardReplaced:
    """``module.forward`` replaced by ``stand_in`` while the block runs, then put back."""

    def __init__(self, module: torch.nn.Module, stand_in: Any) -> None:
        self.module, self.stand_in = module, stand_in
        self._had = "forward" in module.__dict__
        self._saved = module.__dict__.get("forward")

    def __enter__(self) -> None:
        self.module.__dict__["forward"] = self.stand_in

    def __exit__(self, *exc: object) -> None:
        if self._had:
            self.module.__dict__["forward"] = self._saved
        else:
            del self.module.__dict__["forward"]


def forward_inputs(
    module: torch.nn.Module, batch: Any, batch_idx: int, trainer: Any
) -> tuple[Any, ...] | None:
    """The positional arguments ``training_step(batch, batch_idx)`` calls ``module``'s own
    ``forward`` with, or ``None`` where it does not call it (or calls it with arguments that
    do not bind by position)."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise _Called(args, kwargs)

    step = LightningStep(module, batch_idx, trainer)
    try:
        with _ForwardReplaced(module, stand_in), torch.no_grad():
            step(batch)
    except _Called as called:
        return _positional(module, called.args, called.kwargs)
    except Exception:  # the step needs its forward's output to get that far: not ours to plan
        return None
    return None


def _positional(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...] | None:
    if not kwargs:
        return args
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except TypeError:
        return None
    return bound.args if not bound.kwargs else None


class LossAfterForward:
    """``loss_fn(output, batch)``: the rest of ``training_step`` after ``forward`` returned
    ``output``, and the loss Lightning reads from it (NOTE [Tracing a LightningModule's
    forward])."""

    def __init__(self, module: torch.nn.Module, batch_idx: int, trainer: Any) -> None:
        self.step = LightningStep(_sharing_copy(module), batch_idx, trainer)

    def __call__(self, output: Any, batch: Any) -> torch.Tensor:
        calls = 0

        def stand_in(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:
                raise RuntimeError(
                    "training_step calls forward more than once; planned with module-level "
                    "segments instead"
                )
            return output

        with _ForwardReplaced(self.step.module, stand_in):
            return step_loss(self.step(batch))


def _sharing_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module`` that shares its parameters and buffers: what the step's Python
    writes while planning runs it (a loss history, a metric's state) lands in the copy."""
    shared = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, shared)


class InstalledForward:
    """The planned ``forward`` of ``autockpt.apply(module, plan)`` set on ``module``.

    The planned module is a shallow copy; its train/eval flag follows ``module``'s on every
    call, so evaluation runs the module's own ``forward`` (NOTE [The planned module]). Its
    ``forward`` is called directly, not the copy itself: hooks on ``module`` fire once, as
    Lightning calls ``module``.
    """

    num_replaced = 1

    def __init__(self, module: torch.nn.Module, planned: torch.nn.Module) -> None:
        self.module = module
        planned_forward = planned.__dict__["forward"]

        def forward(*args: Sequence[Any], **kwargs: Any) -> Any:
            planned.training = module.training
            return planned_forward(*args, **kwargs)

        self._replaced = _ForwardReplaced(module, forward)
        self._replaced.__enter__()
        self._installed = True

    def remove(self) -> None:
        """Put the module's own ``forward`` back."""
        if self._installed:
            self._replaced.__exit__(None, None, None)
            self._installed = False
