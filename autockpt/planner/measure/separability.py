"""Which segments, and whether the whole step, can be split along the batch.

NOTE [Batch separability]
Running a segment in chunks along the batch, or the whole step in micro-batches, changes nothing
only where no operation mixes samples: a per-variable GRN qualifies, BatchNorm in training mode
(batch statistics) and anything that reduces over the batch do not. Rather than trust a list of
"safe" ops, this is established by experiment on the real model at a small batch
(:mod:`autockpt.planner.measure.per_sample_probe`): it runs as it trains on 3 samples, on 2, and on
each of the first 3 alone, with every random draw made fixed (NOTE [Fixed randomness]: dropout
frozen on by torch.fx or drawn by hand is not mixing), and

- a segment of a traced model may run in chunks if it has an input that carries the batch,
  every output carries it too, and every output of every sample agrees;
- the step may run in micro-batches if every output that carries the batch agrees sample by
  sample and the loss of the 3 samples is the mean or the sum of each sample's loss alone:
  then pieces weighted by their share of the batch (a mean) or by 1 (a sum) give the whole
  batch's gradients (:func:`~autockpt.planner.training_step.training_step`). An output that carries
  no batch, such as a mean loss the model computes itself from labels, is judged by the loss
  alone. The probe cuts its batches with :mod:`autockpt.planner.core.batch_split`, as micro-batches
  are cut: every tensor whose dim 0 is the batch, in nests too.

When the step does not separate, :mod:`autockpt.planner.measure.mixing_op` names the operation that
mixes samples ("BatchNorm2d at layer1.0.bn1"); the reason reaches the plan's notes and the
refusal of a budget. A model that does not trace (NOTE [Module chain]) is probed the same way
on a copy of itself: micro-batches if its step separates, and chunks for a segment of one
submodule whose arguments and output, taken with a forward hook, pass the same test as a traced
segment's (NOTE [Module chain]). The runs use a copy of the model whose parameters are
shared and only read (under no_grad), so BatchNorm statistics and the RNG state of the
original are untouched.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from autockpt.planner.core.batch_split import batch_size_of, take_samples
from autockpt.planner.core.decisions import KEEP
from autockpt.planner.core.fixed_randomness import FixedRandomness
from autockpt.planner.core.host_settings import one_cpu_thread
from autockpt.planner.measure.fake_step import default_loss
from autockpt.planner.measure.mixing_op import first_mixing_call, first_mixing_node
from autockpt.planner.measure.per_sample_probe import (
    PROBE_BATCHES,
    agrees,
    batch_dim,
    close,
    sample_of,
    tensors_in,
)
from autockpt.planner.runtime.segment_runners import build_segmented_module
from autockpt.planner.simulate.step_profile import LossFn
from autockpt.planner.trace.fx_graph import Segment, TracedModel
from autockpt.planner.trace.module_chain import ModuleChain

LossReduction = Literal["mean", "sum"]


@dataclass(frozen=True)
class Separability:
    """What the probe found.

    Attributes:
        chunkable: per segment, whether it may run in chunks along the batch.
        input_batch_dims: per segment, for each input the dimension carrying the batch (or None).
        output_batch_dims: per segment, for each output the dimension carrying the batch.
        micro_batchable: whether the whole step may run in micro-batches.
        reason: why micro-batches are not possible, when they are not; it names the
            operation that mixes samples where the probe found it.
        loss_reduction: when ``micro_batchable``, whether the step's loss is the mean or the
            sum of the samples' losses (the ``loss_reduction`` steps must be run with).
    """

    chunkable: tuple[bool, ...]
    input_batch_dims: tuple[tuple[int | None, ...], ...]
    output_batch_dims: tuple[tuple[int, ...], ...]
    micro_batchable: bool
    reason: str
    loss_reduction: LossReduction | None = None

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
    example_inputs: Sequence[Any],
    segments: Sequence[Segment] | None = None,
    *,
    model: torch.nn.Module | None = None,
    loss_fn: LossFn | None = None,
    example_targets: Sequence[Any] = (),
) -> Separability:
    """Probe every segment (default: the traced model's) and the whole step
    (NOTE [Batch separability]).

    Args:
        traced: the traced model, or the module chain of one that does not trace.
        example_inputs: positional inputs at the training batch size (nests too).
        segments: the chain to probe for chunks; default ``traced.segments``.
        model: the model itself; needed for a module chain (probed on a copy of it).
        loss_fn: ``loss_fn(output, *example_targets) -> scalar``; default: the outputs' sum.
        example_targets: what the loss compares against, at the training batch size.

    Returns:
        Which segments may run in chunks, and whether (and why not) the step may run in
        micro-batches.
    """
    segments = traced.segments if segments is None else segments
    num_segments = len(segments)
    batch = batch_size_of(example_inputs)
    big, small = PROBE_BATCHES
    if batch is None or batch < big:
        reason = f"the inputs carry no batch of at least {big} samples"
        return Separability.nothing(num_segments, reason)
    if isinstance(traced, ModuleChain) and model is None:
        return Separability.nothing(num_segments, "no model was given to probe")
    root = model if isinstance(traced, ModuleChain) else traced.graph_module
    assert root is not None
    # Parameters are only read (under no_grad), so the copy shares them: only buffers, which
    # BatchNorm updates, need copies of their own.
    probe_model = copy.deepcopy(root, memo={id(p): p for p in root.parameters()})
    pieces = [slice(0, big), slice(0, small), *(slice(j, j + 1) for j in range(big))]
    runs = [take_samples(example_inputs, s, batch_size=batch) for s in pieces]
    targets = [take_samples(example_targets, s, batch_size=batch) for s in pieces]
    with _probing():
        if isinstance(traced, TracedModel):
            found = _probe_segments(probe_model, segments, runs[:2])
        else:
            found = _probe_module_runs(probe_model, segments, runs[:2])
        if isinstance(found, Separability):
            return found
        chunkable, input_dims, output_dims, outputs = found
        reduction, reason = _probe_step(
            probe_model, runs, targets, loss_fn or default_loss, outputs
        )
        if reason is _MIXES:
            if isinstance(probe_model, torch.fx.GraphModule):
                culprit = first_mixing_node(probe_model, runs)
            else:
                culprit = first_mixing_call(probe_model, runs)
            reason = culprit or "some operation mixes samples (e.g. BatchNorm in training)"
    return Separability(
        tuple(chunkable),
        tuple(input_dims),
        tuple(output_dims),
        reduction is not None,
        reason,
        reduction,
    )


#: The step's reason when an output that carries the batch disagrees (then named).
_MIXES = "mixes"

_Found = tuple[list[bool], list[tuple[int | None, ...]], list[tuple[int, ...]], list[Any]]


@contextlib.contextmanager
def _probing() -> Iterator[None]:
    # fx prints the generated code of a module that raises; a failed probe is an answer here.
    with (
        torch.random.fork_rng(devices=[]),
        torch.no_grad(),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
        one_cpu_thread(),
        FixedRandomness(),
    ):
        warnings.simplefilter("ignore")
        yield


def _refused_probe_batch(num_segments: int, size: int, error: Exception) -> Separability:
    """Nothing separable: the model did not run on a probe batch of ``size`` samples."""
    reason = f"the model does not run on {size} samples ({type(error).__name__})"
    return Separability.nothing(num_segments, reason)


def _probe_module_runs(
    probe_model: torch.nn.Module, segments: Sequence[Segment], runs: Sequence[Sequence[Any]]
) -> _Found | Separability:
    """Per segment of a module chain: chunkable (only a segment of one link), and its batch
    dims; and the outputs of the whole model on the two probe batches. Each link's arguments
    and output are taken with a forward hook, flattened as its planned ``forward`` flattens
    them (NOTE [Module chain])."""
    num_segments = len(segments)
    links = {s.module_paths[0]: i for i, s in enumerate(segments) if len(s.module_paths) == 1}
    captures: list[dict[int, tuple[Any, Any]]] = []
    outputs = []
    for size, run in zip(PROBE_BATCHES, runs, strict=True):
        seen: dict[int, tuple[Any, Any]] = {}

        def keep(
            index: int, args: Any, kwargs: Any, output: Any, seen: dict[int, Any] = seen
        ) -> None:
            # Returns None: a forward hook's result would replace the module's output.
            seen.setdefault(index, ((args, kwargs), output))

        handles = [
            probe_model.get_submodule(path).register_forward_hook(
                lambda _, args, kwargs, out, i=index: keep(i, args, kwargs, out),
                with_kwargs=True,
            )
            for path, index in links.items()
        ]
        try:
            outputs.append(probe_model(*run))
        except Exception as error:  # the model itself refuses a small batch
            return _refused_probe_batch(num_segments, size, error)
        finally:
            for handle in handles:
                handle.remove()
        captures.append(seen)
    chunkable, input_dims, output_dims = [], [], []
    for index, segment in enumerate(segments):
        found = None
        if index in captures[0] and index in captures[1]:
            module = probe_model.get_submodule(segment.module_paths[0])
            found = _link_batch_dims(module, captures[0][index], captures[1][index])
        chunkable.append(found is not None)
        input_dims.append(found[0] if found else ())
        output_dims.append(found[1] if found else ())
    return chunkable, input_dims, output_dims, outputs


def _link_batch_dims(
    module: torch.nn.Module, first: tuple[Any, Any], second: tuple[Any, Any]
) -> tuple[tuple[int | None, ...], tuple[int, ...]] | None:
    """A link's input and output batch dims if it may run in chunks: every output a tensor
    that carries the batch, and each sample alone giving its slice of them; else None."""
    leaves, spec = tree_flatten(first[0])
    others = tree_flatten(second[0])[0]
    outs, outs_second = tree_flatten(first[1])[0], tree_flatten(second[1])[0]
    if len(leaves) != len(others) or len(outs) != len(outs_second) or not outs:
        return None
    in_dims = tuple(batch_dim(a, b) for a, b in zip(leaves, others, strict=True))
    out_dims = [batch_dim(a, b) for a, b in zip(outs, outs_second, strict=True)]
    dims = tuple(d for d in out_dims if d is not None)
    if all(d is None for d in in_dims) or len(dims) < len(out_dims):
        return None

    def output_leaves(*flat: Any) -> list[Any]:
        args, kwargs = tree_unflatten(list(flat), spec)
        alone = tree_flatten(module(*args, **kwargs))[0]
        if not all(isinstance(leaf, torch.Tensor) for leaf in alone):
            raise TypeError("an output leaf is not a tensor")  # no agreement (chunks join tensors)
        return alone

    if not _segment_agrees(output_leaves, tuple(leaves), outs, in_dims, dims):
        return None
    return in_dims, dims


def _probe_segments(
    probe_model: Any, segments: Sequence[Segment], runs: Sequence[Sequence[Any]]
) -> _Found | Separability:
    """Per segment of the traced model: chunkable, and its batch dims; and the outputs of
    the whole model on the two probe batches."""
    num_segments = len(segments)
    capture = _Capture()
    segmented = build_segmented_module(
        probe_model, segments, [KEEP] * num_segments, observer=capture
    )
    captures, outputs = [], []
    for size, run in zip(PROBE_BATCHES, runs, strict=True):
        try:
            outputs.append(segmented(*run))
        except Exception as error:  # the model itself refuses a small batch
            return _refused_probe_batch(num_segments, size, error)
        captures.append(capture.handed_over())
    first, second = captures
    chunkable, input_dims, output_dims = [], [], []
    for index, segment in enumerate(segments):
        in_dims = tuple(
            batch_dim(a, b) for a, b in zip(first.inputs[index], second.inputs[index], strict=True)
        )
        out_dims = tuple(
            batch_dim(a, b)
            for a, b in zip(
                tensors_in(first.outputs[index]), tensors_in(second.outputs[index]), strict=True
            )
        )
        produced = first.outputs[index]
        ok = (
            any(d is not None for d in in_dims)
            and all(d is not None for d in out_dims)
            and len(out_dims) == len(segment.output_names)
            # Chunks are joined output by output with torch.cat: a structure holding the one
            # tensor (a Hugging Face ModelOutput from a submodule fx keeps whole) cannot be.
            and all(
                isinstance(value, torch.Tensor)
                for value in (produced if isinstance(produced, tuple) else (produced,))
            )
            and _segment_agrees(
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
    return chunkable, input_dims, output_dims, outputs


def _probe_step(
    probe_model: Any,
    runs: Sequence[Sequence[Any]],
    targets: Sequence[Sequence[Any]],
    loss_fn: LossFn,
    outputs: Sequence[Any],
) -> tuple[LossReduction | None, str]:
    """Whether the step separates: the loss reduction that makes it, or None and why not."""
    try:
        alone = [probe_model(*run) for run in runs[2:]]
    except Exception:  # e.g. BatchNorm1d refuses one sample in training mode
        return None, _MIXES
    if not agrees(outputs[0], outputs[1], alone, unbatched="skip"):
        return None, _MIXES
    try:
        whole = float(loss_fn(outputs[0], *targets[0]))
        each = [float(loss_fn(out, *t)) for out, t in zip(alone, targets[2:], strict=True)]
    except Exception as error:
        return None, f"loss_fn fails on the probe's outputs ({type(error).__name__}: {error})"
    reference = torch.tensor(whole, dtype=torch.float64)
    for reduction, value in (("mean", sum(each) / len(each)), ("sum", sum(each))):
        if torch.allclose(torch.tensor(value, dtype=torch.float64), reference, rtol=1e-4):
            return reduction, ""  # type: ignore[return-value]
    return None, (
        f"the loss of {len(each)} samples is neither the mean nor the sum of each sample's "
        "loss alone (the loss, or the model's own, mixes samples)"
    )


def _segment_module(segmented: torch.nn.Module, index: int) -> Any:
    for node in segmented.graph.nodes:  # type: ignore[union-attr]
        runner = node.target
        if node.op == "call_function" and getattr(runner, "index", None) == index:
            return runner.module
    raise AssertionError(f"segment {index} has no runner")


def _segment_agrees(
    module: Any,
    inputs: tuple[Any, ...],
    full_output: Any,
    input_dims: Sequence[int | None],
    output_dims: Sequence[int],
) -> bool:
    """Whether the segment run on each sample alone gives that sample's slice of its outputs."""
    full = tensors_in(full_output)
    if not full or len(full) != len(output_dims):
        return False
    for sample in range(PROBE_BATCHES[0]):
        sample_inputs = [
            sample_of(value, dim, sample) for value, dim in zip(inputs, input_dims, strict=True)
        ]
        try:
            alone = tensors_in(module(*sample_inputs))
        except Exception:  # e.g. BatchNorm refuses one sample in training mode
            return False
        if len(alone) != len(full):
            return False
        for whole, single, dim in zip(full, alone, output_dims, strict=True):
            if not close(single, sample_of(whole, dim, sample)):
                return False
    return True
