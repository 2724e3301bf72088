"""A model of module-level segments cut before its head (NOTE [Loss over positions in chunks]
in :mod:`autockpt.planner.trace.output_head`).

Where torch.fx does not trace the model, its graph cannot be cut; the model itself is. The cut
is a shallow copy of the model (the modules on the path to the head copied too, so the model is
not changed) whose head is replaced by :class:`FeaturesOut`, a module that returns its input and
holds the head's weight and bias as its own (same objects, same ``state_dict()`` keys), and
whose class is the model's, subclassed so that ``forward`` returns ``(features, weight, bias)``
for planning and for :func:`autockpt.training_step`, or the head applied to them (the model's
output, the structure it returns rebuilt around the scores) for a caller of the planned model. Planning measures the cut model as it measures any
model of module-level segments.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from autockpt.errors import PlanMismatchError
from autockpt.planner.core.output_structure import OutputSlot, flatten_output
from autockpt.planner.runtime.planned_chain import copied_path
from autockpt.planner.runtime.planned_graph import planned_forward_of


class FeaturesOut(torch.nn.Module):
    """Stands in for the head: returns its input, holding the head's parameters."""

    def __init__(self, head: torch.nn.Linear) -> None:
        super().__init__()
        self.weight = head.weight
        self.bias = head.bias

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        # Called as the head was: ``head(x)`` or ``head(input=x)``.
        return args[0] if args else kwargs["input"]


class _CutBeforeHead:
    """Marks the subclasses :func:`cut_before_head_module` makes; see ``before_head``."""

    head_path: str
    head_leaf: int | None
    returns_cut: bool

    def before_head(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], Any]:
        """The head's input, weight and bias (the model's forward with the head left out),
        and the model's output with the features in the head's place."""
        output = super().forward(*args, **kwargs)  # type: ignore[misc]
        head = self.get_submodule(self.head_path)  # type: ignore[attr-defined]
        features = output if self.head_leaf is None else flatten_output(output)[0][self.head_leaf]
        return (features, head.weight, head.bias), output

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        cut, output = self.before_head(*args, **kwargs)
        if self.returns_cut:
            return cut
        scores = F.linear(*cut)
        if self.head_leaf is None:
            return scores
        leaves, structure = flatten_output(output)
        leaves[self.head_leaf] = scores
        return structure.rebuild(leaves)


def cut_before_head_module(
    model: torch.nn.Module, head_path: str, head_leaf: int | None, *, returns_cut: bool
) -> torch.nn.Module:
    """``model`` cut before the ``nn.Linear`` at ``head_path``, whose output is its output.

    Args:
        model: the model (or its planned module); left unchanged.
        head_path: the head's module path.
        head_leaf: the head's output's place in the structure the model returns
            (:mod:`autockpt.planner.core.output_structure`); ``None``: the model returns it.
        returns_cut: ``forward`` returns ``(features, weight, bias)`` (planning's model);
            ``False``: the head applied to them, the model's output (the planned model).
    """
    copies: dict[str, torch.nn.Module] = {"": copy.copy(model)}
    parent_path, _, name = head_path.rpartition(".")
    parent = copied_path(copies, parent_path) if parent_path else copies[""]
    head = parent._modules[name]
    assert isinstance(head, torch.nn.Linear), f"{head_path} is not an nn.Linear"
    parent.__dict__["_modules"] = {**parent._modules, name: FeaturesOut(head)}
    cut = copies[""]
    base = type(model)
    cut.__class__ = type(
        base.__name__,
        (_CutBeforeHead, base),
        {
            "head_path": head_path,
            "head_leaf": head_leaf,
            "returns_cut": returns_cut,
            "__module__": base.__module__,
        },
    )
    return cut


def features_before_head(
    model: torch.nn.Module, inputs: Any, head_path: str
) -> tuple[tuple[Any, ...], OutputSlot | None] | None:
    """What :func:`autockpt.training_step` runs the head and the loss in chunks on: the
    planned model's ``(features, weight, bias)`` and where the scores sit in its output, or
    ``None`` where a planned graph runs the model's own forward for this call (NOTE [The
    planned module]).

    Raises:
        PlanMismatchError: ``model`` is not a planned model cut before ``head_path``.
    """
    forward = planned_forward_of(model)
    if forward is not None and forward.head_cut:
        return forward.before_head(*inputs)
    if isinstance(model, _CutBeforeHead) and model.head_path == head_path:
        cut, output = model.before_head(*inputs)
        if model.head_leaf is None:
            return cut, None
        return cut, OutputSlot(flatten_output(output)[1], model.head_leaf)
    raise PlanMismatchError(
        f"the plan runs {head_path} with the loss in chunks of positions; pass the planned "
        "model, autockpt.apply(model, plan), to training_step"
    )
