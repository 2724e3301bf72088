"""A LightningModule's training step as a module the planner can plan, and putting its plan
into the LightningModule that Lightning trains.

:class:`LightningStep` is a module whose ``forward(batch)`` is the LightningModule's own
``training_step(batch, batch_idx)``: planning it measures exactly what Lightning runs (the
loss, the logging, several outputs), and its backward is the one Lightning runs on that loss.
It is planned with module-level segments (``plan(..., tracing="forward-hooks")``, NOTE
[Module chain]): the segments are the LightningModule's submodules, so the plan can act on the
module Lightning calls rather than on a traced copy of the step.

:class:`~autockpt.installed_plan.InstalledPlan` puts the planned submodules into the
LightningModule itself and takes them out again.
"""

from __future__ import annotations

import contextlib
import io
import weakref
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["LightningStep", "step_loss"]


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
