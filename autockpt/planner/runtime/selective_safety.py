"""Which segments may be recomputed selectively: none whose stored products are written later.

A selective recompute hands the recompute the outputs of the matrix products it stored in
forward (NOTE [Selective recompute]). If anything writes such an output in place after it was
made, the recompute reads the written value, and the gradients are wrong. torch notices a write
to the stored tensor itself, in backward, but not one through a view of it: ``nn.GRU`` on the
CPU splits its gate products into views and adds to them in place, and a selective recompute
of a GRU gave gradients off by 0.1-0.8 without a word. The segments are cut before every write
a traced graph shows (NOTE [In-place writes]), but writes inside one node (a GRU, an opaque
submodule, a composite op) are invisible there.

So the planner runs the model's forward once on fake tensors, segment by segment, under a
dispatch mode that remembers which segment made each storage a ``KEPT_OPS`` op returned and
sees every op that writes in place: a segment any of whose stored products is written, by
itself or by a later segment, is not offered a selective recompute.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from autockpt.planner.core.decisions import KEEP
from autockpt.planner.core.memory_tracker import flat_tensors
from autockpt.planner.runtime.segment_runners import build_segmented_module
from autockpt.planner.runtime.selective_recompute import KEPT_OPS, may_recompute_selectively
from autockpt.planner.trace.fx_graph import TracedModel
from autockpt.planner.trace.inplace_writes import WriteRecorder
from autockpt.planner.trace.module_chain import ModuleChain


class _KeptWrites(WriteRecorder):
    """Stored products by the segment that made them, and the segments whose were written."""

    def __init__(self) -> None:
        super().__init__(self._written_to)
        self.segment = -1
        self.written: set[int] = set()
        self._made_by: dict[int, int] = {}
        # The storages stay referenced for the whole pass so that their ids are never reused.
        self._alive: list[torch.UntypedStorage] = []

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = super().on_op(func, args, kwargs)
        if func in KEPT_OPS:
            for tensor in flat_tensors(out):
                storage = tensor.untyped_storage()
                self._made_by[id(storage)] = self.segment
                self._alive.append(storage)
        return out

    def _written_to(self, op: str, storage: torch.UntypedStorage) -> None:
        if id(storage) in self._made_by:
            self.written.add(self._made_by[id(storage)])

    # The segment observer's calls (autockpt.planner.runtime.segment_runners.SegmentObserver).
    def segment_started(self, index: int) -> None:
        self.segment = index

    def segment_finished(self, index: int, inputs: tuple[Any, ...], outputs: Any) -> None:
        self.segment = -1


def selective_segments(
    traced: TracedModel | ModuleChain, example_inputs: Sequence[Any]
) -> frozenset[int]:
    """The indices of the segments that may be recomputed selectively (see the module
    docstring): none on a module chain."""
    candidates = {s.index for s in traced.segments if may_recompute_selectively(traced, s)}
    if not candidates or not isinstance(traced, TracedModel):
        return frozenset()
    finder = _KeptWrites()
    module = build_segmented_module(
        traced.fake_module, traced.segments, [KEEP] * len(traced.segments), observer=finder
    )
    mode = traced.fake_mode
    with mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs = tree_map_only(torch.Tensor, mode.from_tensor, tuple(example_inputs))
        with finder:
            module(*inputs)
    return frozenset(candidates - finder.written)
