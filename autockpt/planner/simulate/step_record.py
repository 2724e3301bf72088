"""The record of one measured step: every storage's life, op by op, and what each segment read.

NOTE [One record, many plans]
A step measured on fake tensors with every segment kept already holds what a plan that recomputes
some of them would do with memory, if each storage's life is written down: the op that made it,
the op after which it was freed, the segment whose forward made it, the last op of forward (or
the loss) that read it, and which segments read it. :class:`StepRecord` is that record, taken
beside the kept step's own profile at no extra step (the tracker tells it of every storage it
starts and stops counting, the step's recorder of every op). From it,
:mod:`autockpt.planner.simulate.recompute_simulation` works out the profile of any set of
segments recomputed, in plain Python, where the planner used to run the step again on fake
tensors.

Ops are numbered as the step's timeline numbers them (the step's own ops, setup excluded): a
storage is live after op ``k`` when ``born <= k < freed``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from autockpt.planner.core.memory_tracker import flat_tensors, sized_for_real, tensor_bytes

#: The recurrent layers' ops: sized by running them for real (NOTE [Tracked bytes]), and
#: simulated where the kept step attributes their backward (NOTE [Recompute simulated]).
RECURRENT_OPS: frozenset[Any] = frozenset(
    op
    for op in (
        getattr(torch.ops.aten, "mkldnn_rnn_layer", None),
        getattr(torch.ops.aten, "_cudnn_rnn", None),
    )
    if op is not None
)

#: The op index of a storage still live when the record ends.
STILL_LIVE = 1 << 62


@dataclass
class StoredTensor:
    """One storage's life in the recorded step (op indices, NOTE [One record, many plans]).

    Attributes:
        size_bytes: bytes the tracker counted for it.
        born: the op that made it (0 for what was live before the step's first op).
        freed: the first op after which it is no longer live (:data:`STILL_LIVE`: never).
        made_by: the segment whose forward made it; -1 for anything else.
        last_read: the last op of forward or of the loss that read it; -1: none did.
        read_by: the segments whose forward read it.
        cast_weight: a cast of a leaf that requires grad made under autocast, which autocast
            keeps in its cache until the autocast region ends, whether autograd saves it or not.
    """

    size_bytes: int
    born: int
    freed: int = STILL_LIVE
    made_by: int = -1
    last_read: int = -1
    read_by: set[int] = field(default_factory=set)
    cast_weight: bool = False


@dataclass
class StepRecord:
    """Every storage's life in one measured step, and each segment's place in its ops.

    Attributes:
        storages: one entry per storage the tracker counted, in the order it began counting.
        forward_ops: per segment, its forward's ops as ``(first, end)`` op indices.
        input_storages: per segment, the storages of the values it read from before it.
        output_storages: per segment, the storages of the values it hands on (the model's
            output among them, which no op may read).
        input_sizes: bytes of each segment input, by the input's name.
        output_sizes: bytes of each segment output, by the output's name.
        unsure: segments whose forward does what the simulation does not model (NOTE
            [Recompute simulated]): writes in place into a storage another segment made (both
            segments), or runs an op whose outputs are sized by running it for real (a loss
            inside the model).
        needs_own_backward: segments simulated only where the kept step's backward ran ops
            it attributes to them: those holding a recurrent layer (NOTE [Recompute
            simulated]).
    """

    storages: list[StoredTensor] = field(default_factory=list)
    forward_ops: list[tuple[int, int]] = field(default_factory=list)
    input_storages: list[list[int]] = field(default_factory=list)
    output_storages: list[list[int]] = field(default_factory=list)
    input_sizes: dict[str, int] = field(default_factory=dict)
    output_sizes: dict[str, int] = field(default_factory=dict)
    unsure: set[int] = field(default_factory=set)
    needs_own_backward: set[int] = field(default_factory=set)


_TO_COPY = torch.ops.aten._to_copy.default


@functools.cache
def _written_positions(func: Any) -> tuple[tuple[int, str], ...]:
    """The ``(position, name)`` of each argument ``func`` writes in place."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    return tuple(
        (position, argument.name)
        for position, argument in enumerate(schema.arguments)
        if argument.alias_info is not None and argument.alias_info.is_write
    )


def _cached_cast(args: Any) -> bool:
    """Whether a ``_to_copy`` of ``args`` (under autocast) is one autocast caches: of a leaf
    that requires grad."""
    source = args[0][0] if args and args[0] else None
    return isinstance(source, torch.Tensor) and source.is_leaf and source.requires_grad


class StepRecording:
    """Writes a :class:`StepRecord` while a step runs: the tracker's storage listener, and
    the step recorder's hooks for each op and segment.

    Args:
        input_names / output_names: each segment's value names, in the order its runner
            passes and returns them.
        under_autocast: the step runs its forward and loss under ``torch.autocast`` (whose
            state a dispatch mode cannot read).
    """

    def __init__(
        self,
        input_names: list[tuple[str, ...]],
        output_names: list[tuple[str, ...]],
        *,
        under_autocast: bool,
    ) -> None:
        self._under_autocast = under_autocast
        self.record = StepRecord(
            forward_ops=[(0, 0)] * len(input_names),
            input_storages=[[] for _ in input_names],
            output_storages=[[] for _ in input_names],
        )
        self._input_names = input_names
        self._output_names = output_names
        self._live: dict[int, int] = {}  # storage id -> index in record.storages
        self._ops = 0  # op index of the next op
        self._segment = -1  # the segment whose forward runs, -1: none

    def storage_counted(self, key: int, size: int, counted: bool) -> None:
        """The tracker's listener (:data:`~autockpt.planner.core.memory_tracker.StorageListener`)."""
        storages = self.record.storages
        if counted:
            self._live[key] = len(storages)
            storages.append(StoredTensor(size, self._ops, made_by=self._segment))
        elif (index := self._live.pop(key, None)) is not None:
            storages[index].freed = self._ops

    def op_ran(self, func: Any, args: Any, out: Any, phase: str) -> None:
        """One of the step's ops ran (``func(*args) -> out``); the next op gets the next index."""
        if phase in ("forward", "loss"):
            if self._under_autocast and func is _TO_COPY and _cached_cast(args):
                for tensor in flat_tensors(out):
                    index = self._live.get(id(tensor.untyped_storage()))
                    if index is not None:
                        self.record.storages[index].cast_weight = True
            if self._segment >= 0:
                written = self._written_elsewhere(func, args)
                if func.overloadpacket in RECURRENT_OPS:
                    self.record.needs_own_backward.add(self._segment)
                elif written or sized_for_real(func):
                    self.record.unsure |= {self._segment, *written}
            for tensor in flat_tensors(args):
                index = self._live.get(id(tensor.untyped_storage()))
                if index is not None:
                    stored = self.record.storages[index]
                    stored.last_read = self._ops
                    if self._segment >= 0:
                        stored.read_by.add(self._segment)
        self._ops += 1

    def _written_elsewhere(self, func: Any, args: Any) -> set[int]:
        """The segments other than the one running whose storages ``func`` writes in place
        (parameters' and buffers' updates are no segment's)."""
        written = _written_positions(func)
        makers: set[int] = set()
        if not written:
            return makers
        positional, keywords = args
        for position, name in written:
            value = positional[position] if position < len(positional) else keywords.get(name)
            for tensor in flat_tensors(value):
                index = self._live.get(id(tensor.untyped_storage()))
                made_by = -1 if index is None else self.record.storages[index].made_by
                if made_by not in (-1, self._segment):
                    makers.add(made_by)
        return makers

    def _storages_of(self, values: Any) -> list[int]:
        """The record's indices of the live storages behind the tensors in ``values``."""
        keys = (id(t.untyped_storage()) for t in flat_tensors(values))
        return sorted({self._live[key] for key in keys if key in self._live})

    def segment_started(self, index: int) -> None:
        """Segment ``index``'s forward begins with the next op."""
        self._segment = index
        self.record.forward_ops[index] = (self._ops, self._ops)

    def segment_finished(self, index: int, inputs: tuple[Any, ...], outputs: Any) -> None:
        """Segment ``index``'s forward ended; ``inputs``/``outputs`` as its runner has them."""
        record = self.record
        record.forward_ops[index] = (record.forward_ops[index][0], self._ops)
        record.input_storages[index] = self._storages_of(inputs)
        record.output_storages[index] = self._storages_of(outputs)
        for name, value in zip(self._input_names[index], inputs, strict=False):
            record.input_sizes[name] = tensor_bytes(value)
        values = outputs if isinstance(outputs, tuple) else (outputs,)
        for name, value in zip(self._output_names[index], values, strict=False):
            record.output_sizes[name] = tensor_bytes(value)
        self._segment = -1
