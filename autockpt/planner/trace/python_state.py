"""What a forward writes in the Python objects it is given, found by comparing them before and after.

NOTE [Python state written in forward]
A forward may write Python state rather than tensors: a Hugging Face decoder layer appends its
keys and values to the ``Cache`` object it is given (``use_cache=True``), a layer appends to a
list or dict its caller passes. torch sees no tensor written, but a recompute runs the forward
again and writes it again: the cache grows, the recompute saves other tensors than the forward
did, and torch's checkpoint fails (T5: "51 vs 47" tensors saved). So every call's mutable
arguments (lists, dicts, objects, not tensors) are fingerprinted before and after it: which
objects and tensors they hold, a few levels down.

A call that changed a list or a dict it was given is kept, like one that writes its input in
place: the runner passes rebuilt lists and dicts to a recomputed link, and a write to those
would not reach the caller's. A call that changed another object (a ``Cache``) may be
recomputed whole: :mod:`autockpt.planner.runtime.held_state` records what the object holds
before its forward, puts that back while the forward runs again in backward, and puts back
what it held just before that once the run is done, so the recompute sees the cache as the
forward did and the caller's cache ends as the forward left it (on the Llama-style decoder at
1 x 2048 tokens, ``use_cache=True``, every layer was kept before; recomputing them took the
minimum down with the rest). Such a call never runs in chunks (each chunk would write the
object) or in a span with others (a span puts back no state).
"""

from __future__ import annotations

from typing import Any

import torch

#: How many levels of lists, dicts and attributes below a call's argument are compared before
#: and after the call.
STATE_DEPTH = 4


def python_objects(arguments: Any) -> list[Any]:
    """The mutable Python objects among a call's arguments (not tensors, not plain values):
    lists, dicts and objects such as a Hugging Face ``Cache``."""
    found: list[Any] = []
    pending = [arguments]
    while pending:
        value = pending.pop()
        if isinstance(value, tuple):
            pending.extend(value)
        elif isinstance(value, (list, dict)) or (
            hasattr(value, "__dict__")
            and not isinstance(value, (torch.Tensor, torch.nn.Module, type))
            and not callable(value)
        ):
            found.append(value)
    return found


def state_of(value: Any, depth: int = 0) -> tuple[Any, ...]:
    """What a forward can change of ``value`` without writing a tensor: which objects and
    tensors its lists, dicts and attributes hold, a few levels down."""
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))
    if depth > STATE_DEPTH or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return ("value", value if isinstance(value, (int, float, bool, str)) else id(value))
    if isinstance(value, (list, tuple)):
        return ("seq", len(value), *(state_of(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("map", *((k, state_of(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, torch.nn.Module) or not hasattr(value, "__dict__"):
        return ("object", id(value))
    return ("attrs", *((k, state_of(v, depth + 1)) for k, v in vars(value).items()))
