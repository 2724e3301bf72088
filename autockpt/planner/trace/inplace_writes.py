"""In-place writes in a forward: which values they change, and which cuts they forbid.

NOTE [In-place writes]
``torch.utils.checkpoint`` saves a recomputed segment's inputs and checks, when backward
unpacks them for the recompute, that no one has written to them since (their version
counters). So a segment may not be recomputed when any of its inputs is written in place
after it started: by the segment itself (``nn.ReLU(inplace=True)`` right after a cut, whose
input is the segment's input), or by a later one. Since the version check raises, a missed
write is never silently wrong, but it turns a plan into a crash.

Writes are found where they happen, not from names: a dispatch mode sees every aten op of one
forward on fake tensors, and an op writes the arguments its schema marks as written
(``Tensor(a!)``: ``relu_``, ``add_``, ``copy_``, ``index_put_``, ``out=``). That catches
``nn.ReLU(inplace=True)``, ``F.relu(x, inplace=True)``, ``x.add_(y)``, and writes inside modules
torch.fx keeps whole or a module chain runs (``x[mask] = 0``, ``x += y``) alike. (torch.fx
records ``x += y`` on tensors as ``x + y``, so in a traced graph that one writes nothing.) A
write counts against the value that owns the written storage: the node that allocated it, so
that writing through a view counts against the view's base.

What the planner does about it:

* On an fx chain, a value written in place at node ``m`` and made at node ``p`` never crosses
  a unit's or a region's edge: the cut DP (NOTE [Cut points]) chooses those among the other
  positions, so whatever may be recomputed as one, whole or in chunks, makes, writes and reads
  the value within itself. The planner moves the cut, not the user.
* The segments are cut once more just before each write (``m``): the piece before may be
  recomputed alone, the piece from the write on reads a value it writes and is only ever
  kept (:attr:`~autockpt.planner.trace.fx_graph.Segment.keep_reason` says why). That is the cheapest
  plan around a BatchNorm followed by ``ReLU(inplace=True)``.
* A value made before the first node (a model input) cannot be kept inside one unit that way:
  the run up to its write is kept, and ends right after the write.
* On a module chain (NOTE [Module chain]) a link whose inputs are written in place from its
  start on is kept, for the same reason.

Writes to buffers (BatchNorm's running statistics, also when ``F.batch_norm`` writes buffers
the graph reads) are not values of the chain: the segment runner puts the buffers of the
modules a segment calls or reads back after a recompute (NOTE [Segment runners]).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from autockpt.planner.core.dispatch_mode import OpMode
from autockpt.planner.core.memory_tracker import flat_tensors


class WriteRecorder(OpMode):
    """A dispatch mode that reports every storage an op writes in place.

    Args:
        on_write: called with the op's name and the written storage, for each written tensor
            argument, after the op ran. It keeps no reference of its own: a storage held
            past its last use would change what a :class:`MemoryTracker` counts.
    """

    def __init__(self, on_write: Callable[[str, torch.UntypedStorage], None]) -> None:
        super().__init__()
        self.on_write = on_write

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = func(*args, **kwargs)
        schema = getattr(func, "_schema", None)
        if schema is not None and schema.is_mutable:
            for position, argument in enumerate(schema.arguments):
                info = argument.alias_info
                if info is None or not info.is_write:
                    continue
                if position < len(args) and not argument.kwarg_only:
                    value = args[position]
                else:
                    value = kwargs.get(argument.name)
                for tensor in flat_tensors(value):
                    self.on_write(str(func), tensor.untyped_storage())
        return out


def forbidden_cuts(
    positions: Mapping[str, int], writes: Mapping[str, Sequence[str]], inputs: Iterable[str]
) -> set[int]:
    """Cut positions that would put a value and an in-place write to it in different segments.

    Args:
        positions: each compute node's index in execution order.
        writes: for each node that writes in place, the nodes owning the storages it writes
            (values made before it; see :func:`written_owners`).
        inputs: the graph's placeholders (made before position 0).

    Returns:
        Positions ``c`` (a cut between compute nodes ``c - 1`` and ``c``) that must not be cut
        (NOTE [In-place writes]).
    """
    made_before = dict.fromkeys(inputs, -1)
    forbidden: set[int] = set()
    for writer, owners in writes.items():
        end = positions[writer]
        for owner in owners:
            start = positions.get(owner, made_before.get(owner))
            if start is not None:
                forbidden.update(range(start + 1, end + 1))
    return forbidden


def keep_reason(
    members: Sequence[str],
    inputs: Sequence[str],
    positions: Mapping[str, int],
    writes: Mapping[str, Sequence[str]],
    storage_owner: Mapping[str, str],
) -> str:
    """Why a segment must not be recomputed, or ``""`` when it may be.

    Args:
        members: the segment's compute nodes, in order.
        inputs: the values it reads from before it.
        positions: each compute node's index in execution order.
        writes: as for :func:`forbidden_cuts`.
        storage_owner: for a value that is a view, the node owning its storage.
    """
    start = positions[members[0]]
    for name in inputs:
        owner = storage_owner.get(name, name)
        for writer, owners in writes.items():
            if owner in owners and positions[writer] >= start:
                return f"{writer} writes in place to its input {name}"
    return ""
