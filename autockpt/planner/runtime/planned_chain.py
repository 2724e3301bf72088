"""The planned module of a module chain: shallow copies whose recomputed links run checkpointed.

A recomputed segment of one link wraps the link's ``forward`` in a
:class:`~autockpt.planner.runtime.segment_runners.SegmentRunner` (NOTE [Module chain], "Running
it"); one of several links (a span) gives each link's ``forward`` to a shared
:class:`~autockpt.planner.runtime.chain_spans.Span` (NOTE [Module spans]).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from autockpt.errors import PlanMismatchError
from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.runtime.chain_spans import Span
from autockpt.planner.runtime.held_state import with_state_put_back
from autockpt.planner.runtime.segment_runners import (
    SegmentObserver,
    class_of_its_own,
    runner_class,
)
from autockpt.planner.trace.fx_graph import Segment
from autockpt.planner.trace.module_chain import module_segments


def build_module_planned(
    model: torch.nn.Module,
    segments: Sequence[Segment],
    actions: Sequence[SegmentAction],
    *,
    observer: SegmentObserver | None = None,
) -> torch.nn.Module:
    """A shallow copy of ``model`` whose recomputed links run checkpointed (NOTE [Module chain]).

    Args:
        model: the model the chain was found on (or a copy of it).
        segments: the links, or spans of them, each with its module paths in ``module_paths``.
        actions: one per segment; a link (not a span) may run in chunks, its batch dims those
            of its flattened arguments and outputs.
        observer: when given, every segment (kept ones too) reports to it; the planner uses
            this to measure.

    Returns:
        A module with ``model``'s call signature and ``state_dict()`` keys, sharing its
        parameters, buffers and every module not on a path to a planned link.
    """
    assert len(segments) == len(actions), "one action per segment"
    copies: dict[str, torch.nn.Module] = {"": copy.copy(model)}
    for segment, action in zip(segments, actions, strict=True):
        if not action.recompute and action.region_fraction is None and observer is None:
            continue
        links = [copied_path(copies, path) for path in segment.module_paths]
        assert len(links) == 1 or action.num_chunks <= 1, "a span runs whole"
        # A region budget wraps one call in a graph of its own (NOTE [Per-region budgets]).
        assert len(links) == 1 or action.region_fraction is None, "a span is several calls"
        if len(links) == 1:
            link = links[0]
            # NOTE [A segment's own code under torch.compile]: each link's call its own code.
            forward = class_of_its_own(_LinkForward, f"link_{segment.index}", ("__call__",))
            link.forward = forward(segment.index, link.forward, action, link, observer)
            continue
        span = Span(
            segment.index,
            len(links),
            recompute=action.recompute,
            stateful_modules=_stateful_modules(links),
            observer=observer,
        )
        for position, link in enumerate(links):
            link.forward = span.link(position, link.forward)
    return copies[""]


def apply_module_plan(
    model: torch.nn.Module, groups: Sequence[Sequence[str]], actions: Sequence[SegmentAction]
) -> torch.nn.Module:
    """The planned module of a module-level plan (see :func:`autockpt.apply`).

    Args:
        model: the model the plan was made for.
        groups: each segment's module paths (several for a span).
        actions: each segment's action.

    Raises:
        PlanMismatchError: a planned module path does not exist in ``model``.
    """
    known = {path for path, _ in model.named_modules()}
    missing = [path for group in groups for path in group if path not in known]
    if missing:
        raise PlanMismatchError(
            f"the plan recomputes module {missing[0]!r}, which {type(model).__name__} does not "
            "have; re-plan for this model with autockpt.plan"
        )
    return build_module_planned(model, module_segments(groups), actions)


class _LinkForward:
    """The ``forward`` of a planned link: its arguments flattened into one runner call."""

    def __init__(
        self,
        index: int,
        forward: Any,
        action: SegmentAction,
        module: torch.nn.Module,
        observer: SegmentObserver | None,
    ) -> None:
        self.index = index
        self.forward = forward
        self.action = action
        self.stateful_modules = _stateful_modules([module])
        self.observer = observer
        self.runner_class = runner_class(index)
        """The link's runner class, one for every call (NOTE [A segment's own code under
        torch.compile])."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        chunked = self.action.num_chunks > 1 and torch.is_grad_enabled()
        output_spec: list[TreeSpec] = []

        def run(*flat: Any) -> Any:
            # A kept link runs on its own arguments: rebuilt lists and dicts would take a
            # write to them away from the caller (NOTE [Python state written in forward]);
            # such a link is never recomputed. Other objects (a Cache) are the caller's.
            positional, keywords = (
                tree_unflatten(list(flat), spec) if self.action.recompute else (args, kwargs)
            )
            output = self.forward(*positional, **keywords)
            if not chunked:
                return output
            # Chunks are joined leaf by leaf (the probe found every leaf a batched tensor).
            output_leaves, spec_of_output = tree_flatten(output)
            output_spec[:] = [spec_of_output]
            return tuple(output_leaves)

        action = self.action if chunked else dataclasses.replace(self.action, num_chunks=1)
        if action.recompute:
            run = with_state_put_back(run, (*args, *kwargs.values()))
        runner = self.runner_class(self.index, run, action, self.stateful_modules, self.observer)
        output = runner(*leaves)
        return tree_unflatten(list(output), output_spec[0]) if chunked else output


def _stateful_modules(links: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """Modules with buffers in the links' subtrees: BatchNorm's statistics must not move in
    recompute."""
    return [
        m for link in links for m in link.modules() if any(True for _ in m.buffers(recurse=False))
    ]


def copied_path(copies: dict[str, torch.nn.Module], path: str) -> torch.nn.Module:
    """Shallow-copy each module from the root down to ``path`` (once each); the last copy.

    ``copies`` maps paths to the copies made so far and starts with the root's.
    """
    module = copies[""]
    walked = ""
    for part in path.split("."):
        walked = f"{walked}.{part}" if walked else part
        if walked not in copies:
            child = module._modules[part]
            assert child is not None, f"{walked} is not a module"
            copies[walked] = copy.copy(child)
            # A shallow copy shares its original's table of children: give it its own before
            # replacing the child, or the original model would change too.
            module.__dict__["_modules"] = {**module._modules, part: copies[walked]}
        module = copies[walked]
    return module
