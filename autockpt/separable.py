"""Which segments, and whether the whole step, can be split along the batch.

NOTE [Batch separability]
Running a segment in chunks along the batch, or the whole step in micro-batches, changes
nothing only where no operation mixes samples: a per-variable GRN qualifies, BatchNorm in
training mode (batch statistics) and anything that reduces over the batch do not. Rather than
trust a list of "safe" ops, this is established by experiment on the real model at a small
batch: with dropout off (evaluation mode, but normalisation layers that use batch
statistics left as they are), each segment is run on a few samples at once and on each sample alone,
and it counts as separable only if every output of every sample agrees (and every output
carries the batch in dim 0). An input counts as batch-carrying when its dim 0 follows the batch
size across two runs at different batch sizes. The run uses a copy of the model, so BatchNorm
statistics and the RNG state of the original are untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from autockpt.segmented import KEEP, build_segmented_module
from autockpt.trace import TracedModel

#: Samples in the two probe batches.
PROBE_BATCHES = (3, 2)


@dataclass(frozen=True)
class Separability:
    """What the probe found.

    Attributes:
        chunkable: per segment, whether it may run in chunks along the batch.
        chunked_inputs: per segment, which of its inputs carry the batch in dim 0.
        micro_batchable: whether the whole forward may run in micro-batches.
        reason: why micro-batches are not possible, when they are not.
    """

    chunkable: tuple[bool, ...]
    chunked_inputs: tuple[tuple[bool, ...], ...]
    micro_batchable: bool
    reason: str


class _Capture:
    def __init__(self) -> None:
        self.inputs: dict[int, tuple[Any, ...]] = {}
        self.outputs: dict[int, Any] = {}

    def segment_started(self, index: int) -> None:
        return None

    def segment_finished(self, index: int, inputs: tuple[Any, ...], outputs: Any) -> None:
        self.inputs[index] = inputs
        self.outputs[index] = outputs


def analyse_separability(
    traced: TracedModel, example_inputs: Sequence[torch.Tensor]
) -> Separability:
    """Probe every segment and the whole model (NOTE [Batch separability])."""
    batch = _batch_size(example_inputs)
    num_segments = len(traced.segments)
    if batch is None or batch < max(PROBE_BATCHES):
        reason = "the inputs carry no common batch dimension of at least 3"
        return Separability((False,) * num_segments, ((),) * num_segments, False, reason)
    probe_model = copy.deepcopy(traced.graph_module)
    # Evaluation mode turns dropout off everywhere (modules like MultiheadAttention apply it
    # inside); normalisation layers that use batch statistics stay in training mode, since
    # that is what mixes samples.
    probe_model.eval()
    for module in probe_model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._NormBase):
            module.train(traced.graph_module.training)
    captures = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for size in PROBE_BATCHES:
            capture = _Capture()
            segmented = build_segmented_module(
                probe_model, traced.segments, [KEEP] * num_segments, observer=capture
            )
            probe_inputs = [_take(x, size, batch) for x in example_inputs]
            try:
                full_output = segmented(*probe_inputs)
            except Exception as error:  # the model itself refuses a small batch
                reason = f"the model does not run on {size} samples ({type(error).__name__})"
                return Separability((False,) * num_segments, ((),) * num_segments, False, reason)
            captures.append((capture, probe_inputs, full_output))
        chunkable, chunked_inputs = [], []
        for segment in traced.segments:
            first, second = captures[0][0], captures[1][0]
            mask = tuple(
                _carries_batch(a, PROBE_BATCHES[0]) and _carries_batch(b, PROBE_BATCHES[1])
                for a, b in zip(first.inputs[segment.index], second.inputs[segment.index], strict=True)
            )
            module = _segment_module(segmented, segment.index)
            ok = any(mask) and _agrees_per_sample(
                module, first.inputs[segment.index], first.outputs[segment.index], mask
            )
            chunkable.append(ok)
            chunked_inputs.append(mask)
        capture, probe_inputs, full_output = captures[0]
        model_mask = tuple(_carries_batch(x, PROBE_BATCHES[0]) for x in probe_inputs)
        micro_batchable = all(model_mask) and _agrees_per_sample(
            probe_model, tuple(probe_inputs), full_output, model_mask
        )
    reason = "" if micro_batchable else "some operation mixes samples (e.g. BatchNorm in training)"
    return Separability(tuple(chunkable), tuple(chunked_inputs), micro_batchable, reason)


def _segment_module(segmented: torch.nn.Module, index: int) -> Any:
    for node in segmented.graph.nodes:  # type: ignore[union-attr]
        runner = node.target
        if node.op == "call_function" and getattr(runner, "index", None) == index:
            return runner.module
    raise AssertionError(f"segment {index} has no runner")


def _batch_size(inputs: Sequence[Any]) -> int | None:
    sizes = {x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0}
    return sizes.pop() if len(sizes) == 1 else None


def _take(value: Any, size: int, batch: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
        return value[:size].clone()
    return value


def _carries_batch(value: Any, size: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size


def _agrees_per_sample(
    module: Any, inputs: tuple[Any, ...], full_output: Any, mask: tuple[bool, ...]
) -> bool:
    full = tree_flatten(full_output)[0]
    size = PROBE_BATCHES[0]
    if not full or not all(_carries_batch(t, size) for t in full):
        return False
    for sample in range(size):
        sample_inputs = [
            value[sample : sample + 1] if chunked else value
            for value, chunked in zip(inputs, mask, strict=True)
        ]
        try:
            alone = tree_flatten(module(*sample_inputs))[0]
        except Exception:  # e.g. BatchNorm refuses one sample in training mode
            return False
        if len(alone) != len(full):
            return False
        for whole, single in zip(full, alone, strict=True):
            expected = whole[sample : sample + 1]
            if single.shape != expected.shape or not torch.allclose(
                single.float(), expected.float(), rtol=1e-4, atol=1e-5
            ):
                return False
    return True
