"""Which segments, and whether the whole step, can be split along the batch.

NOTE [Batch separability]
Running a segment in chunks along the batch, or the whole step in micro-batches, changes
nothing only where no operation mixes samples: a per-variable GRN qualifies, BatchNorm in
training mode (batch statistics) and anything that reduces over the batch do not. Rather than
trust a list of "safe" ops, this is established by experiment on the real model at a small
batch: with dropout off (evaluation mode, but normalisation layers that use batch
statistics left as they are), each segment is run on a few samples at once and on each sample alone,
and it counts as separable only if every output of every sample agrees (and every output
carries the batch in dim 0). An input or output carries the batch in the dimension whose size follows the batch
across two runs at different batch sizes (dim 0 of ``(B, T, H)``, dim 1 of a variable-major
``(V, B * T, E)``); sample ``j`` is the ``j``-th equal slice of that dimension. The run uses a copy of the model, so BatchNorm
statistics and the RNG state of the original are untouched.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autockpt.planner.host import one_cpu_thread
from autockpt.planner.memory import flat_tensors
from autockpt.planner.module_chain import ModuleChain
from autockpt.planner.segmented import KEEP, build_segmented_module
from autockpt.planner.trace import Segment, TracedModel

#: Samples in the two probe batches.
PROBE_BATCHES = (3, 2)


@dataclass(frozen=True)
class Separability:
    """What the probe found.

    Attributes:
        chunkable: per segment, whether it may run in chunks along the batch.
        input_batch_dims: per segment, for each input the dimension carrying the batch (or None).
        output_batch_dims: per segment, for each output the dimension carrying the batch.
        micro_batchable: whether the whole forward may run in micro-batches.
        reason: why micro-batches are not possible, when they are not.
    """

    chunkable: tuple[bool, ...]
    input_batch_dims: tuple[tuple[int | None, ...], ...]
    output_batch_dims: tuple[tuple[int, ...], ...]
    micro_batchable: bool
    reason: str

    @classmethod
    def nothing(cls, num_segments: int, reason: str) -> Separability:
        """No segment may be chunked and the step may not be split."""
        return cls(
            (False,) * num_segments, ((),) * num_segments, ((),) * num_segments, False, reason
        )


class _Capture:
    def __init__(self) -> None:
        self.inputs: dict[int, tuple[Any, ...]] = {}
        self.outputs: dict[int, Any] = {}

    def segment_started(self, index: int) -> None:
        return None

    def handed_over(self) -> _Capture:
        """What was captured so far; capturing starts again from empty."""
        done = _Capture()
        done.inputs, done.outputs = self.inputs, self.outputs
        self.inputs, self.outputs = {}, {}
        return done

    def segment_finished(self, index: int, inputs: tuple[Any, ...], outputs: Any) -> None:
        self.inputs[index] = inputs
        self.outputs[index] = outputs


def analyse_separability(
    traced: TracedModel | ModuleChain,
    example_inputs: Sequence[torch.Tensor],
    segments: Sequence[Segment] | None = None,
) -> Separability:
    """Probe every segment (default: the traced model's) and the whole model
    (NOTE [Batch separability])."""
    segments = traced.segments if segments is None else segments
    num_segments = len(segments)
    if isinstance(traced, ModuleChain):
        # A module's arguments have no known batch layout to split (NOTE [Module chain]).
        reason = "segments are whole modules (the model does not trace with torch.fx)"
        return Separability.nothing(num_segments, reason)
    batch = _batch_size(example_inputs)
    if batch is None or batch < max(PROBE_BATCHES):
        reason = "the inputs carry no common batch dimension of at least 3"
        return Separability.nothing(num_segments, reason)
    # Parameters are only read (under no_grad), so the copy shares them: only buffers, which
    # BatchNorm updates, need copies of their own.
    parameters = {id(p): p for p in traced.graph_module.parameters()}
    probe_model = copy.deepcopy(traced.graph_module, memo=parameters)
    # Evaluation mode turns dropout off everywhere (modules like MultiheadAttention apply it
    # inside); normalisation layers that use batch statistics stay in training mode, since
    # that is what mixes samples.
    probe_model.eval()
    for module in probe_model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._NormBase):
            module.train(traced.graph_module.training)
    captures = []
    # fx prints the generated code of a module that raises; a failed probe is an answer here.
    with (
        torch.random.fork_rng(devices=[]),
        torch.no_grad(),
        contextlib.redirect_stderr(io.StringIO()),
        one_cpu_thread(),
    ):
        capture = _Capture()
        segmented = build_segmented_module(
            probe_model, segments, [KEEP] * num_segments, observer=capture
        )
        for size in PROBE_BATCHES:
            probe_inputs = [_take(x, size, batch) for x in example_inputs]
            try:
                full_output = segmented(*probe_inputs)
            except Exception as error:  # the model itself refuses a small batch
                reason = f"the model does not run on {size} samples ({type(error).__name__})"
                return Separability.nothing(num_segments, reason)
            captures.append((capture.handed_over(), probe_inputs, full_output))
        (first, first_inputs, first_output), (second, _, second_output) = captures
        chunkable, input_dims, output_dims = [], [], []
        for index, segment in enumerate(segments):
            in_dims = tuple(
                _batch_dim(a, b)
                for a, b in zip(first.inputs[index], second.inputs[index], strict=True)
            )
            out_dims = tuple(
                _batch_dim(a, b)
                for a, b in zip(
                    flat_tensors(first.outputs[index]),
                    flat_tensors(second.outputs[index]),
                    strict=True,
                )
            )
            ok = (
                any(d is not None for d in in_dims)
                and all(d is not None for d in out_dims)
                and len(out_dims) == len(segment.output_names)
                and _agrees_per_sample(
                    _segment_module(segmented, index),
                    first.inputs[index],
                    first.outputs[index],
                    in_dims,
                    [d for d in out_dims if d is not None],
                )
            )
            chunkable.append(ok)
            input_dims.append(in_dims if ok else ())
            output_dims.append(tuple(d for d in out_dims if d is not None) if ok else ())
        model_dims = tuple(
            _batch_dim(a, b) for a, b in zip(first_inputs, captures[1][1], strict=True)
        )
        model_out_dims = [
            _batch_dim(a, b)
            for a, b in zip(flat_tensors(first_output), flat_tensors(second_output), strict=True)
        ]
        # When every segment agrees sample by sample, so does their chain, on the same probe
        # data: the run of the whole model per sample is needed only when some segment failed.
        micro_batchable = (
            all(d == 0 for d in model_dims)
            and all(d == 0 for d in model_out_dims)
            and (
                all(chunkable)
                or _agrees_per_sample(
                    probe_model,
                    tuple(first_inputs),
                    first_output,
                    model_dims,
                    [0] * len(model_out_dims),
                )
            )
        )
    reason = "" if micro_batchable else "some operation mixes samples (e.g. BatchNorm in training)"
    return Separability(
        tuple(chunkable), tuple(input_dims), tuple(output_dims), micro_batchable, reason
    )


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


def _batch_dim(first: Any, second: Any) -> int | None:
    """The dimension whose size follows the batch between the two probes (rows per sample
    equal), or None."""
    if not isinstance(first, torch.Tensor) or not isinstance(second, torch.Tensor):
        return None
    if first.dim() != second.dim():
        return None
    big, small = PROBE_BATCHES
    for dim, (a, b) in enumerate(zip(first.shape, second.shape, strict=True)):
        if a != b and a % big == 0 and b % small == 0 and a // big == b // small:
            return dim
    return None


def _sample(value: Any, dim: int | None, sample: int) -> Any:
    if dim is None:
        return value
    rows = value.shape[dim] // PROBE_BATCHES[0]
    return value.narrow(dim, sample * rows, rows)


def _agrees_per_sample(
    module: Any,
    inputs: tuple[Any, ...],
    full_output: Any,
    input_dims: Sequence[int | None],
    output_dims: Sequence[int],
) -> bool:
    full = flat_tensors(full_output)
    if not full or len(full) != len(output_dims):
        return False
    for sample in range(PROBE_BATCHES[0]):
        sample_inputs = [
            _sample(value, dim, sample) for value, dim in zip(inputs, input_dims, strict=True)
        ]
        try:
            alone = flat_tensors(module(*sample_inputs))
        except Exception:  # e.g. BatchNorm refuses one sample in training mode
            return False
        if len(alone) != len(full):
            return False
        for whole, single, dim in zip(full, alone, output_dims, strict=True):
            expected = _sample(whole, dim, sample)
            if single.shape != expected.shape or not torch.allclose(
                single.float(), expected.float(), rtol=1e-4, atol=1e-5
            ):
                return False
    return True
