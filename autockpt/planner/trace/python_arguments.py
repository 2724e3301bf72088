"""Python arguments of ``forward`` that torch.fx traces as constants.

NOTE [Python arguments]
A forward such as ``forward(x, scale: float = 1.0, flag: bool = True)`` with
``return x if flag else -x`` does not trace as written: torch.fx turns every parameter into a
placeholder, and a placeholder cannot decide a Python ``if``. Planning it through forward hooks
instead gives whole-module segments, where recompute may save nothing. So when a trace fails
and ``forward`` has parameters whose defaults are plain Python values (``None``, ``bool``,
``int``, ``float``, ``str``), the trace is tried again with each of them fixed at its default
(torch.fx's ``concrete_args``): the graph then holds the branch the default takes.

torch.fx renames such a placeholder (``flag_1``) and adds a check that the call passes the
traced value (``torch._assert(flag_1 == True)``). Both are undone here: the placeholder takes
its own name back, so the graph module is called as the model is (``flag=True``), the checks
are dropped, so the graph holds only the model's work, and the value is kept in the
placeholder's ``meta`` under ``CONSTANT_KEY``. The planned module compares every call's
arguments against those values and runs the model's own forward, with a warning, when one
differs (NOTE [The planned module]); ``plan()`` refuses example inputs that give such a
parameter another value.

A trace that works as written keeps every argument live: only a failing trace specializes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx as fx

#: Where a specialized placeholder keeps its traced value.
CONSTANT_KEY = "autockpt_constant"

_PLAIN_TYPES = (bool, int, float, str, type(None))
# What torch.fx adds to check a specialized argument, and nothing else.
_CHECK_TARGETS = (torch._assert, fx._symbolic_trace._assert_is_none)


def plain_python_defaults(forward: Callable[..., Any]) -> dict[str, Any]:
    """The parameters of ``forward`` (unbound, ``self`` first) whose default is a plain
    Python value, with that default."""
    parameters = list(inspect.signature(forward).parameters.values())[1:]
    return {
        p.name: p.default
        for p in parameters
        if p.default is not inspect.Parameter.empty
        and type(p.default) in _PLAIN_TYPES
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def keep_specialized_names(graph: fx.Graph, constants: Mapping[str, Any]) -> None:
    """Undo torch.fx's renaming and checks of the ``constants`` it traced (in place).

    Raises:
        AssertionError: a specialized placeholder has a use other than fx's own check.
    """
    by_target = {f"{name}_1": name for name in constants}
    for node in list(graph.nodes):
        if node.op != "placeholder" or node.target not in by_target:
            continue
        name = by_target[node.target]
        checks = _check_nodes(node)
        for check in reversed(checks):
            graph.erase_node(check)
        assert not node.users, f"{name} is used beyond torch.fx's check of its value"
        node.target = name
        node.meta[CONSTANT_KEY] = constants[name]
    graph.lint()


def specialized_arguments(graph: fx.Graph) -> dict[str, Any]:
    """The arguments traced as constants, with their values (NOTE [Python arguments])."""
    return {
        str(node.target): node.meta[CONSTANT_KEY]
        for node in graph.nodes
        if node.op == "placeholder" and CONSTANT_KEY in node.meta
    }


def differing_argument(
    signature: inspect.Signature,
    constants: Mapping[str, Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> tuple[str, Any] | None:
    """The first specialized argument a call gives another value than traced, with that
    value; ``None`` when the call agrees with the graph. ``signature`` has no ``self``."""
    if not constants:
        return None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None  # the model's own forward will say what is wrong with the call
    for name, traced in constants.items():
        if name in bound.arguments and not same_value(bound.arguments[name], traced):
            return name, bound.arguments[name]
    return None


def same_value(value: Any, traced: Any) -> bool:
    """Whether ``value`` is the plain Python value ``traced`` (``True`` is not ``1``)."""
    return type(value) is type(traced) and value == traced


def _check_nodes(placeholder: fx.Node) -> list[fx.Node]:
    """fx's check of a specialized placeholder: an ``eq`` and its ``_assert``, or one
    ``_assert_is_none``, in graph order."""
    found: list[fx.Node] = []
    for user in list(placeholder.users):
        if user.op == "call_function" and user.target in _CHECK_TARGETS:
            found.append(user)
            continue
        asserts = [u for u in user.users if u.op == "call_function" and u.target in _CHECK_TARGETS]
        if user.op == "call_function" and len(asserts) == len(user.users) == 1:
            found.extend([user, *asserts])
    return found
