"""Train and eval modes around tracing: the mode a graph is traced in, and what it froze.

NOTE [Modes and the traced graph]
torch.fx runs the forward once with proxies and records every Python value it reads as a
constant: ``self.training`` above all (``F.dropout(x, p, training=self.training)``,
``if self.training:``, ``dropout_p=self.p if self.training else 0.0``). Modules the tracer keeps
whole (``nn.Dropout``, ``nn.BatchNorm1d``, ...) read their own flag when they run, so they
stay live; a flag read by traced-through code does not.

So the planner traces a model *as it trains*: after ``model.train()`` (which honours a model
that keeps a part of itself in eval mode by overriding ``train``), with every flag put back
afterwards. ``plan()`` measures the step in that mode too, whatever mode the model was in.

The planned module runs the traced graph only when it trains with gradients enabled, and the
model's own forward otherwise (eval, ``no_grad``, ``inference_mode``), which reads every flag
live. While it trains the graph is right only if every flag it froze still has the value it
was traced with: :func:`frozen_training_flags` finds those flags by tracing again with flags
flipped, first all of them (when the code does not change, the graph froze none), then the
modules of one class at a time, and the planned module checks them on every training forward
(a module a user puts in eval mode inside a training model). Values other than the training
flags that the forward reads from Python (an attribute changed after ``apply``, a global
setting) stay frozen, as torch.fx documents.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.fx as fx


@contextlib.contextmanager
def training_mode(model: torch.nn.Module) -> Iterator[dict[torch.nn.Module, bool]]:
    """``model.train()`` inside the block; every module's flag as it was afterwards.

    Yields:
        Each module's flag as it was before the block.
    """
    before = {module: module.training for module in model.modules()}
    model.train()
    try:
        yield before
    finally:
        for module, flag in before.items():
            module.training = flag


def frozen_training_flags(
    model: torch.nn.Module, trace: Callable[[torch.nn.Module], fx.Graph]
) -> dict[str, bool]:
    """Modules whose ``training`` flag the graph traced in training mode depends on.

    Args:
        model: the model; it is traced as it trains, with flags flipped, and left as it was.
        trace: traces a model in the modes its modules are in.

    Returns:
        Each such module's path (``""`` for the root) and the flag it was traced with.
    """
    with training_mode(model):
        traced_flags = {module: module.training for module in model.modules()}
        reference = _code(model, trace)
        everything = list(traced_flags)
        if _code(model, trace, flipped=everything) == reference:
            return {}
        frozen: dict[str, bool] = {}
        paths = {module: path for path, module in model.named_modules()}
        for kind in dict.fromkeys(type(module) for module in everything):
            members = [module for module in everything if type(module) is kind]
            if _code(model, trace, flipped=members) != reference:
                frozen.update({paths[module]: traced_flags[module] for module in members})
        return frozen


def _code(
    model: torch.nn.Module,
    trace: Callable[[torch.nn.Module], fx.Graph],
    *,
    flipped: list[torch.nn.Module] | None = None,
) -> str | None:
    """The Python code of a trace with the flags of ``flipped`` inverted (``None`` when it
    does not trace); the model is left as it was, attributes torch.fx adds included."""
    flags = {module: module.training for module in flipped or []}
    attributes = set(model.__dict__)
    for module, flag in flags.items():
        module.training = not flag
    try:
        return trace(model).python_code("self").src
    except Exception:  # a flipped model may refuse to trace: its graph differs
        return None
    finally:
        for module, flag in flags.items():
            module.training = flag
        # Tensor constants torch.fx sets on the root: the next trace would name them anew.
        for name in set(model.__dict__) - attributes:
            del model.__dict__[name]
