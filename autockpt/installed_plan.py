"""A step's plan put into the user's module in place, for the trainers that hold that module
(Lightning, Hugging Face's ``Trainer``) and keep calling it.

The planned submodules are shallow copies sharing every parameter and buffer
(:func:`autockpt.apply`), so the optimizer the trainer built keeps training the same tensors
and ``state_dict()`` keeps its keys.
"""

from __future__ import annotations

import torch

__all__ = ["InstalledPlan"]


class InstalledPlan:
    """The planned submodules of a step's plan, put into the user's module itself.

    ``planned`` is ``autockpt.apply(step, plan)`` for a ``step`` module that holds the user's
    ``module`` as its child ``module`` and runs it (a LightningModule's ``training_step``, a
    Hugging Face model called on a batch). Every child of ``module`` that the plan copied (a
    recomputed submodule or one on the path to one) is replaced by its planned copy; when the
    plan recomputes the module's own ``forward`` (a ``training_step`` that calls ``self(x)``),
    the planned ``forward`` is set on the instance. :meth:`remove` puts the originals back.
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
        """Children of the module now running planned (the forward counts as one)."""
        return len(self._replaced) + int(self._forward_set)

    def remove(self) -> None:
        """Put the module's own submodules and forward back."""
        for name, original in self._replaced.items():
            self.module._modules[name] = original
        self._replaced.clear()
        if self._forward_set:
            del self.module.__dict__["forward"]
            self._forward_set = False
