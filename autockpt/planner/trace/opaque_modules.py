"""Submodules torch.fx cannot trace: how much of the step they hold, and what to do about them.

NOTE [Opaque submodules]
:func:`~autockpt.planner.trace.fx_graph.trace_graph` keeps a submodule fx cannot trace whole (one
node of the graph) and traces the rest. That costs only the cuts inside it when it is small (a
``TransformerEncoderLayer``, whose fast-path checks do not trace, among many), but when it is most
of the model (a thin wrapper around a Hugging Face model) the fx chain has one or two segments, and
the plan can only recompute all of it at once. So an opaque submodule is never kept silently: each
is named, with fx's reason, in a warning and in the plan's notes, with its *share*: the bytes its
calls leave alive for backward (what they save and return) over the whole forward's, measured with
forward hooks on a fake copy (no real memory). When one holds more than ``LARGE_SHARE`` of the
forward, the whole model is planned with the module chain instead (NOTE [Module chain]), which looks
inside the modules that hold the memory: a wrapped model is then planned as finely as the unwrapped
one. Otherwise the fx chain is kept.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from autockpt.planner.core.fake_copies import fake_copy
from autockpt.planner.core.fake_mode import PlanningFakeMode
from autockpt.planner.core.memory_tracker import MemoryTracker
from autockpt.planner.trace.fx_graph import TracedModel

#: An opaque submodule holding more than this share of the forward's bytes sends the whole
#: model to the module chain (NOTE [Opaque submodules]).
LARGE_SHARE = 0.5

#: Opaque submodules named one by one in a note; the rest are counted.
NAMED_IN_NOTE = 3


def opaque_shares(
    model: torch.nn.Module, example_inputs: Sequence[Any], paths: Sequence[str]
) -> dict[str, float]:
    """Each submodule's share of the bytes one forward leaves alive for backward.

    Args:
        model: the model (left unchanged: the forward runs on a fake copy).
        example_inputs: positional inputs at the training batch size.
        paths: the submodules to measure.

    Returns:
        For each path, the bytes its calls leave alive (summed over calls) over the whole
        forward's, from 0 to 1.
    """
    mode = PlanningFakeMode()
    copied = fake_copy(model, mode)
    tracker = MemoryTracker()
    held = dict.fromkeys(["", *paths], 0)
    started: dict[str, list[int]] = {path: [] for path in held}
    handles = []
    for path in held:
        module = copied.get_submodule(path)

        def before(*_: Any, path: str = path) -> None:
            started[path].append(tracker.current_bytes)

        def after(*_: Any, path: str = path) -> None:
            held[path] += max(tracker.current_bytes - started[path].pop(), 0)

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inputs = tree_map_only(torch.Tensor, mode.from_tensor, list(example_inputs))
            with tracker:
                copied(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    total = max(held[""], 1)
    return {path: min(held[path] / total, 1.0) for path in paths}


def weigh_opaque(
    model: torch.nn.Module, example_inputs: Sequence[Any], traced: TracedModel
) -> tuple[bool, str]:
    """Whether to plan ``model`` with the module chain instead of ``traced``, which keeps
    submodules whole (NOTE [Opaque submodules]), and one sentence that says why.

    Args:
        model: the model ``traced`` was traced from.
        example_inputs: positional inputs at the training batch size.
        traced: its fx chain, with at least one opaque submodule.
    """
    shares = opaque_shares(model, example_inputs, list(traced.opaque))
    ordered = sorted(traced.opaque, key=lambda path: -shares[path])
    largest = ordered[0]
    named = ", ".join(ordered[:NAMED_IN_NOTE])
    if len(ordered) > NAMED_IN_NOTE:
        named += f" and {len(ordered) - NAMED_IN_NOTE} more"
    subject = "submodule" if len(ordered) == 1 else "submodules"
    kind = type(model.get_submodule(largest)).__name__
    share = shares[largest]
    sentence = (
        f"torch.fx cannot trace {subject} {named} of {type(model).__name__} "
        f"({traced.opaque[largest]}); {largest} ({kind}) holds {share:.0%} of what the "
        "forward keeps for backward"
    )
    if share > LARGE_SHARE:
        return True, sentence
    each = "it is" if len(ordered) == 1 else "each is"
    return False, f"{sentence}; {each} planned as one piece, with no cut inside it"
