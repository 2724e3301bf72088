"""The structure of a model's output, kept through tracing and rebuilt around the graph.

NOTE [Output structure]
torch.fx records a forward's return value as it finds it: a dict subclass (a Hugging Face
``ModelOutput`` is an ``OrderedDict`` dataclass) becomes a plain ``dict``, and a dataclass or a
NamedTuple becomes a graph node that builds it, which the planner would cut, recompute and
chunk like an operation. So the tracer flattens the return value instead: every tensor in it
(found through tuples, lists, dicts and their subclasses, NamedTuples and dataclasses) becomes
one output of the graph, and an :class:`OutputStructure` records the containers, their types
and keys, and the values that are not tensors (``None``, numbers, strings). The graph's code
generator (:class:`RebuildingCodeGen`) ends the generated ``forward`` with a call that
rebuilds the value from the structure, so every module made from the graph (the planned
model, the fake copy the planner measures, the segmented module) returns what the model
returns, of the same types, and ``loss_fn`` sees exactly that. A bare tensor needs no
structure. A value of any other type is left to torch.fx, as before.

Rebuilding calls the types' constructors: ``cls(*items)`` for a NamedTuple, ``cls(items)``
for other tuples and lists, ``cls(pairs)`` for dicts, ``cls(**fields)`` for a dataclass (its
``init=False`` fields are set afterwards), so a ``ModelOutput``'s ``__post_init__`` fills its
dict entries as it does for the original.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.fx as fx

#: Values stored in the structure as they are (not graph outputs).
CONSTANT_TYPES: tuple[type, ...] = (
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    enum.Enum,
    type(None),
    type(...),
)

#: The name the generated ``forward`` calls to rebuild its output.
REBUILD_GLOBAL = "_autockpt_rebuild_output"

Kind = Literal["leaf", "constant", "sequence", "namedtuple", "mapping", "dataclass"]


@dataclass(frozen=True)
class OutputStructure:
    """How to rebuild a forward's return value from the graph's flat outputs.

    Attributes:
        kind: ``"leaf"`` (the next graph output), ``"constant"`` (``value``), or a container.
        type: the container's type.
        keys: a mapping's keys, or a dataclass's field names.
        children: the structure of each item, key or field, in order.
        value: a constant's value.
        init: for a dataclass, whether each field goes to the constructor.
    """

    kind: Kind
    type: type | None = None
    keys: tuple[Any, ...] = ()
    children: tuple[OutputStructure, ...] = ()
    value: Any = None
    init: tuple[bool, ...] = ()

    @property
    def num_leaves(self) -> int:
        """How many graph outputs the value takes."""
        if self.kind == "leaf":
            return 1
        return sum(child.num_leaves for child in self.children)

    def rebuild(self, leaves: Sequence[Any]) -> Any:
        """The value, of the recorded types, around ``leaves`` (the graph's outputs)."""
        position = iter(leaves)
        return self._build(position)

    def _build(self, leaves: Any) -> Any:
        if self.kind == "leaf":
            return next(leaves)
        if self.kind == "constant":
            return self.value
        items = [child._build(leaves) for child in self.children]
        assert self.type is not None, "containers record their type"
        if self.kind == "namedtuple":
            return self.type(*items)
        if self.kind == "sequence":
            return self.type(items)
        if self.kind == "mapping":
            return self.type(zip(self.keys, items, strict=True))
        arguments = {k: v for k, v, init in zip(self.keys, items, self.init, strict=True) if init}
        built = self.type(**arguments)
        for key, item, init in zip(self.keys, items, self.init, strict=True):
            if not init:
                object.__setattr__(built, key, item)
        return built


@dataclass(frozen=True)
class OutputSlot:
    """Where a head's scores sit in the model's output (NOTE [The loss sees the scores
    alone] in :mod:`autockpt.planner.runtime.chunked_loss`).

    Attributes:
        structure: the output's structure.
        leaf: the scores' place among its leaves.
    """

    structure: OutputStructure
    leaf: int

    def output(self, scores: torch.Tensor) -> Any:
        """An output of the model's type with ``scores`` in the head's place, ``None`` else."""
        leaves: list[Any] = [None] * self.structure.num_leaves
        leaves[self.leaf] = scores
        return self.structure.rebuild(leaves)


def needs_structure(value: Any) -> bool:
    """Whether a traced return value is more than one graph value (a bare proxy or tensor)."""
    return not isinstance(value, (fx.Proxy, torch.Tensor))


def flatten_output(value: Any) -> tuple[list[Any], OutputStructure]:
    """The graph outputs in ``value`` (tensors, proxies, unknown objects) and its structure."""
    leaves: list[Any] = []
    structure = _flatten(value, leaves)
    return leaves, structure


def _flatten(value: Any, leaves: list[Any]) -> OutputStructure:
    if isinstance(value, (fx.Proxy, torch.Tensor)):
        leaves.append(value)
        return OutputStructure("leaf")
    if isinstance(value, CONSTANT_TYPES):
        return OutputStructure("constant", value=value)
    kind = type(value)
    # A dataclass first: a ModelOutput is a dataclass and a dict at once.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return OutputStructure(
            "dataclass",
            type=kind,
            keys=tuple(f.name for f in fields),
            children=tuple(_flatten(getattr(value, f.name), leaves) for f in fields),
            init=tuple(f.init for f in fields),
        )
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return OutputStructure(
            "namedtuple", type=kind, children=tuple(_flatten(v, leaves) for v in value)
        )
    if isinstance(value, (tuple, list)):
        return OutputStructure(
            "sequence", type=kind, children=tuple(_flatten(v, leaves) for v in value)
        )
    if isinstance(value, dict):
        return OutputStructure(
            "mapping",
            type=kind,
            keys=tuple(value),
            children=tuple(_flatten(v, leaves) for v in value.values()),
        )
    # Anything else goes to torch.fx as one value (it refuses what it cannot record).
    leaves.append(value)
    return OutputStructure("leaf")


def output_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a return value, dataclasses and dict subclasses included."""
    leaves, _ = flatten_output(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


class RebuildingCodeGen(fx.graph.CodeGen):
    """A code generator whose ``forward`` returns ``structure.rebuild(outputs)``
    (NOTE [Output structure])."""

    def __init__(self, structure: OutputStructure) -> None:
        super().__init__()
        self.structure = structure

    def generate_output(
        self,
        output_args: Any,
        *,
        descs: Sequence[str] | None = None,
        repr_fn: Callable[[object], str] | None = None,
    ) -> str:
        # fx passes only the keywords this signature names, so it names them all.
        statement = super().generate_output(output_args, descs=descs, repr_fn=repr_fn)
        assert statement.startswith("return "), statement
        return f"return {REBUILD_GLOBAL}({statement[len('return ') :]})"

    def process_outputs(self, outputs: Any) -> Any:
        return self.structure.rebuild(outputs)

    def additional_globals(self) -> list[tuple[str, Any]]:
        return [(REBUILD_GLOBAL, self.structure.rebuild)]
