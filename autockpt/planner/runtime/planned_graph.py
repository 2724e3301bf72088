"""The planned module of a traced plan: the user's model, running the plan while it trains.

NOTE [The planned module]
``autockpt.apply`` returns a shallow copy of the model (an instance of the model's own class)
whose ``forward`` is a :class:`PlannedForward`. The copy shares the model's tables of
submodules, parameters and buffers (the same dict objects), so ``state_dict()`` has the same
keys, ``load_state_dict`` on either loads both, an optimizer over either's parameters trains
both, and ``.to()`` moves both. Its own are the root's ``training`` flag and the root's hook
tables (copies of the model's at ``apply`` time).

``PlannedForward`` runs the segmented graph (NOTE [Segment runners]) only when the planned
module trains with gradients enabled and every training flag the graph froze has the value
it was traced with (NOTE [Modes and the traced graph]); otherwise the model's own
``forward``, on the copy: eval, ``torch.no_grad()`` and ``torch.inference_mode()`` forwards
are the original's, bit for bit, and recompute nothing. A training flag that differs sends
the forward to the model's own code too, with a warning naming the module (the step then runs
unplanned: the unplanned peak). So does a call that gives an argument the graph holds as a
constant another value (NOTE [Python arguments]).

The graph and every segment's subgraph run on the copy's own tables: their attribute paths
(``self.blocks.0.attn.mask``) resolve to the live modules and tensors, so a buffer that
``.to()`` replaces is the one the graph reads. ``copy.deepcopy`` of the planned module builds
the graph modules again on the copied tables.

Hooks: a hook on the planned module (or on the model's root before ``apply``) fires on every
call. In the model's own forward every submodule's hooks fire as usual. In the graph, hooks
fire on the modules the tracer keeps whole (``nn.Linear``, ``nn.Dropout``, ``nn.LSTM``, ...;
``LEAF_MODULE_TYPES``), and fire again when a recomputed segment runs them in backward;
modules the tracer traces through (the model's own blocks, ``nn.Sequential``) are not called,
so their hooks do not fire while training.

NOTE [A planned forward's own code under torch.compile]
dynamo keeps its compiled entries, and counts recompiles, per code object (NOTE [A segment's
own code under torch.compile] in :mod:`autockpt.planner.runtime.segment_runners`). Every
planned module's ``forward`` is a ``PlannedForward``, so the planned modules of one process
shared one ``__call__``'s code: each compiled one added its entries there (guarded on its own
instance and its inputs' shapes), and the ninth compiled in a process (a sweep, a notebook, a
test session) ran its forward eagerly past dynamo's recompile limit (8), not the step its
plan was measured for: a chunked plan's compiled step peaked over its prediction. So each
``PlannedForward`` is an instance of a class of its own whose ``__call__``, ``before_head``
and ``_runs_graph`` are copies with code of their own, made once per planned module (a copy
of the planned module makes its own); no limit is raised.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.core.output_structure import OutputSlot
from autockpt.planner.core.train_eval import frozen_training_flags
from autockpt.planner.runtime.segment_runners import (
    SegmentRunner,
    build_segmented_module,
    class_of_its_own,
)
from autockpt.planner.trace.fx_graph import Segment, trace_graph
from autockpt.planner.trace.output_head import OutputHead, output_around
from autockpt.planner.trace.python_arguments import differing_argument, specialized_arguments

#: The tables the planned module shares with the model (NOTE [The planned module]).
SHARED_TABLES = ("_parameters", "_buffers", "_modules")


_PLANNED_FORWARDS = itertools.count()
"""Numbers the planned forwards of the process, each of whose code is its own."""

#: The functions of a planned forward dynamo may start a frame on (NOTE [A planned forward's
#: own code under torch.compile]).
_OWN_CODE = ("__call__", "before_head", "_runs_graph")


class PlannedForward:
    """The ``forward`` of a planned module (NOTE [The planned module]).

    Args:
        root: the planned module (the model's shallow copy) this is the forward of.
        tables: the tables ``root`` shares with the model (``SHARED_TABLES``).
        root_attributes: tensors the graph reads from the root that are not in the tables
            (torch.fx's tensor constants, plain tensor attributes).
        graph: the model's graph, traced in training mode.
        segments: the plan's chain over ``graph``.
        actions: what to do with each segment.
        frozen_flags: module path -> the training flag the graph froze for it.
        model_forward: the model class's ``forward`` (called with ``root``).
        head: the model's head, where ``graph`` ends before it, returning its input, weight,
            bias and the output's other values (NOTE [Loss over positions in chunks]).
    """

    def __init__(
        self,
        root: torch.nn.Module,
        *,
        tables: dict[str, Any],
        root_attributes: dict[str, Any],
        graph: fx.Graph,
        segments: Sequence[Segment],
        actions: Sequence[SegmentAction],
        frozen_flags: dict[str, bool],
        model_forward: Callable[..., Any],
        head: OutputHead | None = None,
    ) -> None:
        self.root = root
        self.head = head
        self.head_cut = head is not None
        self.tables = tables
        self.root_attributes = root_attributes
        self.graph = graph
        self.segments = tuple(segments)
        self.actions = tuple(actions)
        self.frozen_flags = dict(frozen_flags)
        self.model_forward = model_forward
        self.frozen_modules = [
            (path, _module_at(root, tables["_modules"], path), flag)
            for path, flag in self.frozen_flags.items()
        ]
        self.graph_module = self._build()
        # ``inspect.signature(planned.forward)`` reads as the model's (without ``self``).
        signature = inspect.signature(model_forward)
        self.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
        #: Arguments the graph holds as constants (NOTE [Python arguments]).
        self.constants = specialized_arguments(graph)
        # NOTE [A planned forward's own code under torch.compile]
        self.__class__ = class_of_its_own(
            PlannedForward, f"model_{next(_PLANNED_FORWARDS)}", _OWN_CODE
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._runs_graph(args, kwargs):
            output = self.graph_module(*args, **kwargs)
            # NOTE [Loss over positions in chunks]: called directly, the model's output.
            return output if self.head is None else output_around(self.head, output)
        return self.model_forward(self.root, *args, **kwargs)

    def before_head(
        self, *args: Any, **kwargs: Any
    ) -> tuple[tuple[Any, ...], OutputSlot | None] | None:
        """A plan that cuts the graph before the model's head: the head's input, weight and
        bias, and where its scores sit in the model's output, for
        :func:`autockpt.training_step` to run the head and the loss in chunks; ``None`` when
        the step runs the model's own forward instead (see ``__call__``)."""
        assert self.head is not None, "the plan runs the head with the model"
        if self._runs_graph(args, kwargs):
            return tuple(self.graph_module(*args, **kwargs))[:3], self.head.slot
        return None

    def _runs_graph(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether this call runs the planned graph (else the model's own forward)."""
        if self.root.training and torch.is_grad_enabled():
            changed = [
                (path, flag)
                for path, module, flag in self.frozen_modules
                if module.training != flag
            ]
            differing = differing_argument(self.__signature__, self.constants, args, kwargs)
            if changed:
                self._warn_unplanned(changed)
            elif differing is not None:
                self._warn_argument(*differing)
            else:
                return True
        elif torch.is_grad_enabled() and any(
            child.training for child in self.tables["_modules"].values() if child is not None
        ):
            self._warn_root_in_eval()
        return False

    def __deepcopy__(self, memo: dict[int, Any]) -> PlannedForward:
        # The copied root may still be empty here (its state is being copied): everything
        # is reached through the copied tables instead.
        return PlannedForward(
            copy.deepcopy(self.root, memo),
            tables=copy.deepcopy(self.tables, memo),
            root_attributes=copy.deepcopy(self.root_attributes, memo),
            graph=self.graph,
            segments=self.segments,
            actions=self.actions,
            frozen_flags=self.frozen_flags,
            model_forward=self.model_forward,
            head=self.head,
        )

    def _build(self) -> fx.GraphModule:
        """The segmented graph module, running on the shared tables."""
        holder = torch.nn.Module()
        holder.__dict__.update(self.tables)
        holder.__dict__.update(self.root_attributes)
        name = f"Planned{type(self.root).__name__}"
        traced = fx.GraphModule(holder, self.graph, class_name=name)
        # The runners then find the live modules whose buffers they restore, not fx's copies.
        _run_on_tables(traced, self.tables)
        planned = build_segmented_module(traced, self.segments, self.actions)
        _run_on_tables(planned, self.tables)
        for node in planned.graph.nodes:
            runner = node.target
            if isinstance(runner, SegmentRunner) and isinstance(runner.module, torch.nn.Module):
                _run_on_tables(runner.module, self.tables)
        return planned

    def _warn_unplanned(self, changed: list[tuple[str, bool]]) -> None:
        path, flag = changed[0]
        name = f"{type(self.root).__name__}.{path}" if path else type(self.root).__name__
        warnings.warn(
            f"{name}.training is {not flag} while the planned model trains, but torch.fx froze "
            f"it as {flag} in the plan's graph; this forward runs the model's own forward "
            f"without the plan (no recompute: the unplanned memory). Set {name}.training back "
            f"to {flag}, or make {type(self.root).__name__}.train() leave it {not flag} and "
            "plan and apply again",
            stacklevel=3,
        )

    def _warn_argument(self, name: str, value: Any) -> None:
        model = type(self.root).__name__
        traced = self.constants[name]
        warnings.warn(
            f"{model}.forward was called with {name}={value!r}, but the plan's graph was traced "
            f"with {name}={traced!r} (NOTE [Python arguments]); this forward runs the model's "
            f"own forward without the plan (no recompute: the unplanned memory). Train with "
            f"{name}={traced!r}, or make the forward traceable with {name} as an input",
            stacklevel=3,
        )

    def _warn_root_in_eval(self) -> None:
        # planned.eval() then model.train() (on the original) leaves this flag off: training
        # would go on without the plan, unseen.
        name = type(self.root).__name__
        warnings.warn(
            f"the planned {name} is in eval mode while its submodules train (was train() "
            "called on the original model?); this forward runs the model's own forward without "
            "the plan (no recompute: the unplanned memory). Call train() on the planned model",
            stacklevel=3,
        )


def planned_module(
    model: torch.nn.Module,
    graph: fx.Graph,
    segments: Sequence[Segment],
    actions: Sequence[SegmentAction],
    *,
    head: OutputHead | None = None,
) -> torch.nn.Module:
    """The planned module of a traced plan (NOTE [The planned module]).

    Args:
        model: the model, traced into ``graph`` in training mode.
        graph: from :func:`~autockpt.planner.trace.fx_graph.trace_graph`.
        segments: the plan's chain over ``graph``.
        actions: one per segment.
        head: the model's head, where ``graph`` ends before it (NOTE [Loss over positions
            in chunks]).

    Returns:
        A shallow copy of ``model`` whose ``forward`` is a :class:`PlannedForward`.
    """
    frozen = frozen_training_flags(model, lambda m: trace_graph(m, in_training_mode=False))
    planned = copy.copy(model)
    for name, value in model.__dict__.items():
        if "hook" in name and isinstance(value, (dict, set)):
            planned.__dict__[name] = copy.copy(value)
    tables = {name: planned.__dict__[name] for name in SHARED_TABLES}
    root_reads = {
        str(node.target)
        for node in graph.nodes
        if node.op == "get_attr" and "." not in str(node.target)
    }
    root_attributes = {
        name: planned.__dict__[name]
        for name in sorted(root_reads)
        if not any(name in table for table in tables.values()) and name in planned.__dict__
    }
    planned.forward = PlannedForward(
        planned,
        tables=tables,
        root_attributes=root_attributes,
        graph=graph,
        segments=segments,
        actions=actions,
        frozen_flags=frozen,
        model_forward=type(model).forward,
        head=head,
    )
    return planned


def planned_forward_of(module: torch.nn.Module) -> PlannedForward | None:
    """The :class:`PlannedForward` of a planned module of a traced plan, else ``None``."""
    forward = module.__dict__.get("forward")
    return forward if isinstance(forward, PlannedForward) else None


def _run_on_tables(view: torch.nn.Module, tables: dict[str, Any]) -> None:
    """Make ``view`` resolve its attribute paths in ``tables`` (NOTE [The planned module]).

    A tensor ``view`` registered that the tables lack (a tensor constant, a plain attribute
    of the root) stays an attribute of its own.
    """
    for name, value in view._buffers.items():
        if name not in tables["_buffers"]:
            view.__dict__[name] = value
    view.__dict__.update(tables)


def _module_at(root: torch.nn.Module, modules: dict[str, Any], path: str) -> torch.nn.Module:
    """The module at ``path`` below ``root``, whose children table is ``modules``."""
    if not path:
        return root
    first, _, rest = path.partition(".")
    child: torch.nn.Module = modules[first]
    return child.get_submodule(rest) if rest else child
