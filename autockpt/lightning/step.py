"""A LightningModule's training step as a module the planner can plan, and putting its plan
into the LightningModule that Lightning trains.

:class:`LightningStep` is a module whose ``forward(batch)`` is the LightningModule's own
``training_step(batch, batch_idx)``: planning it measures exactly what Lightning runs (the
loss, the logging, several outputs), and its backward is the one Lightning runs on that loss.
It is planned with module-level segments (``plan(..., tracing="forward-hooks")``, NOTE
[Module chain]): the segments are the LightningModule's submodules, so the plan can act on the
module Lightning calls rather than on a traced copy of the step.

:class:`InstalledPlan` puts the planned submodules into the LightningModule itself and takes
them out again. The planned submodules are shallow copies sharing every parameter and buffer
(:func:`autockpt.apply`), so the optimizer Lightning built keeps training the same tensors and
``state_dict()`` keeps its keys.
"""

from __future__ import annotations

import contextlib
import io
import weakref
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["InstalledPlan", "LightningStep", "step_loss"]


class LightningStep(torch.nn.Module):
    """``forward(batch) = module.training_step(batch, batch_idx)``, logging nothing.

    The planner runs it on copies of the module. A LightningModule drops its trainer when it is
    copied, and a ``training_step`` may read it (``self.trainer.state``, ``self.current_epoch``),
    so the step gives a copy the trainer back for the call: it is held through a weak
    reference, which ``copy.deepcopy`` shares instead of copying. ``self.log`` and
    ``self.log_dict`` do nothing during the call, and what it prints is dropped, so measuring
    the step never logs or prints a value.
    """

    def __init__(self, module: torch.nn.Module, batch_idx: int, trainer: Any) -> None:
        super().__init__()
        self.module = module
        self.batch_idx = batch_idx
        self._trainer_ref = weakref.ref(trainer)

    def forward(self, batch: Any) -> Any:
        module = self.module
        state = module.__dict__
        saved = {name: state.get(name, _ABSENT) for name in ("log", "log_dict", "_trainer")}
        state["log"] = state["log_dict"] = _log_nothing
        if state.get("_trainer") is None:
            state["_trainer"] = self._trainer_ref()
        try:
            # What the step prints (a progress line with float(loss)) is planning's, not the
            # user's: it goes nowhere, as its self.log calls do.
            with contextlib.redirect_stdout(io.StringIO()):
                return module.training_step(batch, self.batch_idx)  # type: ignore[operator]
        finally:
            for name, value in saved.items():
                if value is _ABSENT:
                    del state[name]
                else:
                    state[name] = value


_ABSENT = object()


def _log_nothing(*args: Any, **kwargs: Any) -> None:
    del args, kwargs


def step_loss(output: Any) -> torch.Tensor:
    """The loss of a ``training_step`` output, as Lightning reads it: the tensor, or ``"loss"``.

    Raises:
        ValueError: the step returned no loss (Lightning skips such a batch; there is nothing
            to plan on it).
    """
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    raise ValueError(
        f"training_step returned {type(output).__name__}, not a loss tensor or a dict with "
        "'loss'; MemoryPlan plans the step on a batch whose training_step returns the loss"
    )


class InstalledPlan:
    """The planned submodules of a :class:`LightningStep` plan, put into the LightningModule.

    ``planned`` is ``autockpt.apply(LightningStep(module, ...), plan)``. Every child of
    ``module`` that the plan copied (a recomputed submodule or one on the path to one) is
    replaced by its planned copy; when the plan recomputes the LightningModule's own
    ``forward`` (a ``training_step`` that calls ``self(x)``), the planned ``forward`` is set on
    the instance. :meth:`remove` puts the originals back.
    """

    def __init__(self, module: torch.nn.Module, planned: torch.nn.Module) -> None:
        self.module = module
        planned_module = planned._modules["module"]
        assert planned_module is not None
        self._replaced: dict[str, torch.nn.Module | None] = {}
        for name, child in planned_module._modules.items():
            if child is not module._modules.get(name):
                self._replaced[name] = module._modules.get(name)
                module._modules[name] = child
        forward = planned_module.__dict__.get("forward")
        self._forward_set = forward is not None and planned_module is not module
        if self._forward_set:
            module.forward = forward  # type: ignore[method-assign, assignment]

    @property
    def num_replaced(self) -> int:
        """Children of the LightningModule now running planned (the forward counts as one)."""
        return len(self._replaced) + int(self._forward_set)

    def remove(self) -> None:
        """Put the LightningModule's own submodules and forward back."""
        for name, original in self._replaced.items():
            self.module._modules[name] = original
        self._replaced.clear()
        if self._forward_set:
            del self.module.__dict__["forward"]
            self._forward_set = False
