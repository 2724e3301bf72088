"""The fallback for models torch.fx cannot trace: module-level segments found with forward hooks.

NOTE [Module chain]
Some models do not trace: their forward branches on tensor values (``if x.sum() > 0``,
``int(lengths.max())``), takes a dict batch, or packs sequences by length (pytorch-forecasting's
TFT does all three). For those the chain's segments are submodules instead of runs of fx nodes.

*Finding the chain.* The model runs forward once (on a fake copy; see below) under a
:class:`~autockpt.planner.core.memory_tracker.MemoryTracker`, with a pre- and a post-forward hook on
every submodule. That gives the *call tree* (which module call ran inside which) and, for each call,
the bytes it leaves alive at its end (what it saves for backward and returns: its *held* bytes). The
chain starts as the root's calls, in order. While one link holds over a third of the chain's held
bytes (recomputed whole, it would bound the step's peak near that share) and its own calls hold most
of its bytes, it is replaced by those calls: segments get finer where the memory is (a wrapper
module is looked through; a ``ModuleList`` of blocks, which is never called itself, gives one
segment per block). A call is a link only if its module runs once per forward and sits below the
calling module in the module tree: a module called twice (a shared activation, a weight-tied layer),
or reached from a module that is not its parent (a ``ModuleDict`` shared by two networks), stays
part of *the rest*, with the operations the forwards run between links. The rest is always kept. The
step measurements count it with its neighbours: in forward on top of the link before it (what it
keeps is part of that link's kept bytes), in backward with the link whose autograd nodes ran last;
the plan's final measurement covers whatever the chain model misses.

*Running it.* The planned module is a shallow copy of the root in which each recomputed link's
module (and each module on the path to it) is a shallow copy whose ``forward`` is a
:class:`~autockpt.planner.runtime.segment_runners.SegmentRunner` around the original forward:
non-reentrant ``torch.utils.checkpoint`` with the RNG state preserved and the module's buffers put
back after the recompute (NOTE [Segment runners]). Shallow copies share every parameter, buffer and
untouched submodule, so the planned module has the original's call signature and ``state_dict()``
keys, and the original keeps running without checkpoints. The runner gets the call's arguments
flattened (keyword arguments and tensors inside dicts included), so backward attributes every
autograd node to the right segment. Links recomputed one by one keep every input, which in a chain
of ``Linear`` layers is everything they save; so the chain is also cut into *spans*, runs of
consecutive links that may be recomputed as one (the cuts of NOTE [Cut points] over the links, each
link weighing its held bytes and each cut its input bytes), which the solver offers as the fx path's
regions (NOTE [Module spans]; built by :mod:`autockpt.planner.runtime.planned_chain`).
``use_gradient_checkpointing=True`` recomputes the spans when that peaks lower than the links one by
one.

*Measuring it.* The fake copy is the planner's usual fake model, and the step measurements are those
of :mod:`autockpt.planner.measure.fake_step`: same tracker, same per-segment attribution, same chain
model, same final measurement of the chosen plan. A forward that reads tensor values cannot run on
fake tensors; then the model is measured on a real copy that shares its parameters' memory (the
forward that finds the chain runs on the first ``RECORDED_SAMPLES`` samples), its steps at batches
small enough to fit the budget beside the model, scaled to the example batch (same accounting, but
real steps on the model's device; NOTE [Scaled real measurement] in
:mod:`autockpt.planner.measure.scaled_step`).

*Splitting the batch.* Micro-batches cut the model's inputs, not a module's arguments: every
tensor whose dim 0 is the batch, inside tuples, lists and dicts too
(:mod:`autockpt.planner.core.batch_split`). The plan uses them when the separability probe finds
the whole step separable on a copy of the model (NOTE [Batch separability]), a model that
computes its own mean loss included. A segment of one link may also run in chunks: the probe
takes the link's arguments and output with a forward hook, flattened as the planned
``forward`` flattens them, and finds where each carries the batch; the link qualifies when
every output leaf is a tensor carrying it and each sample alone gives its slice. Its planned
``forward`` then splits the flattened arguments, runs each piece checkpointed, and joins the
output leaves (NOTE [Segment runners]). A span never runs in chunks.

What a call writes in the Python objects it is given is found as in-place writes are (NOTE [Python
state written in forward] in :mod:`autockpt.planner.trace.python_state`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import warnings
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map_only

from autockpt.errors import TraceError, describe_error, warn_at_the_callers_line
from autockpt.planner.core.batch_split import batch_size_of, take_samples
from autockpt.planner.core.fake_copies import fake_copy, parameter_sharing_copy
from autockpt.planner.core.fake_mode import PlanningFakeMode
from autockpt.planner.core.memory_tracker import MemoryTracker, flat_tensors
from autockpt.planner.trace.cut_points import SEGMENT_CROSSING_WEIGHT, RunCosts
from autockpt.planner.trace.fx_graph import Segment, TracedModel, trace_model
from autockpt.planner.trace.inplace_writes import WriteRecorder
from autockpt.planner.trace.opaque_modules import weigh_opaque
from autockpt.planner.trace.python_state import python_objects, state_of

Tracing = Literal["auto", "fx", "forward-hooks"]
"""How :func:`autockpt.plan` finds segments: fx with the module chain as fallback, fx alone, or
the chain."""

#: A link is looked into when it holds more than DESCEND_SHARE of the chain's bytes and its
#: own calls more than COVERED_SHARE of its bytes (NOTE [Module chain]).
DESCEND_SHARE, COVERED_SHARE = 1 / 3, 0.5
#: Samples a real copy's calls are recorded on (NOTE [Module chain], *Measuring it*).
RECORDED_SAMPLES = 16


@dataclass(frozen=True)
class ModuleChain:
    """A model's chain of module-level segments (NOTE [Module chain]).

    It has the attributes of :class:`~autockpt.planner.trace.fx_graph.TracedModel` the planner
    reads, so measurement and solving run unchanged.

    Attributes:
        segments: one per link, in call order; ``module_paths`` holds the module's path.
        regions: runs of links that may be recomputed as one, as ``(first, end)`` positions
            (NOTE [Module spans]); one of a single link may run in chunks.
        region_segments: one segment per region, with its links' module paths.
        fake_module: the copy steps are measured on: fake when the forward runs on fake
            tensors, else a real copy sharing the model's parameters.
        fake_mode: the fake tensor mode of ``fake_module``; ``None`` for a real copy.
        note: why the fallback is used and what it does, one sentence (the plan's warning).
    """

    segments: tuple[Segment, ...]
    regions: tuple[tuple[int, int], ...]
    region_segments: tuple[Segment, ...]
    fake_module: torch.nn.Module
    fake_mode: FakeTensorMode | None
    note: str


def trace_or_find_modules(
    model: torch.nn.Module, example_inputs: Sequence[Any], *, tracing: Tracing = "auto"
) -> TracedModel | ModuleChain:
    """The fx chain of :func:`~autockpt.planner.trace.fx_graph.trace_model`, or the module chain
    when fx fails.

    Falling back warns (the message is also ``ModuleChain.note``), and so does keeping a
    submodule fx cannot trace whole (the message is also in ``TracedModel.notes``); a large one
    sends the model to the module chain (NOTE [Opaque submodules]).

    Args:
        model: the model to plan.
        example_inputs: positional inputs at the training batch size; a dict or other nest of
            tensors sends the model to the fallback directly (the fx stages take tensors).
        tracing: ``"forward-hooks"`` skips fx and finds the module chain, without a warning
            (the caller asked for it; the chain's note still says so); ``"fx"`` never falls
            back: where fx does not trace the whole model, :class:`TraceError`.

    Returns:
        A :class:`~autockpt.planner.trace.fx_graph.TracedModel`, or a :class:`ModuleChain`.

    Raises:
        TraceError: neither fx nor forward hooks find a chain (the message gives both reasons),
            or, with ``tracing="fx"``, fx does not.
    """
    name = type(model).__name__
    if tracing == "forward-hooks":
        return find_module_chain(model, example_inputs, why="module-level segments asked for")
    if all(isinstance(x, torch.Tensor) or not _is_nest(x) for x in example_inputs):
        try:
            traced = trace_model(model, example_inputs)
            if not traced.opaque:
                return traced
            descend, why = weigh_opaque(model, example_inputs, traced)
            if not descend or tracing == "fx":  # NOTE [Opaque submodules]
                warn_at_the_callers_line(why)
                return dataclasses.replace(traced, notes=(*traced.notes, why))
        except TraceError as error:
            why = f"torch.fx cannot trace {name} ({_one_line(error.__cause__ or error)})"
    else:
        why = f"{name} takes a dict or another nest of tensors, which the torch.fx planner does not"
    if tracing == "fx":
        raise TraceError(f"{why}; tracing='fx' asked for no fallback")
    chain = find_module_chain(model, example_inputs, why=why)
    warn_at_the_callers_line(chain.note)
    return chain


def find_module_chain(
    model: torch.nn.Module, example_inputs: Sequence[Any], *, why: str
) -> ModuleChain:
    """Run ``model`` once with forward hooks and choose its chain (NOTE [Module chain]).

    Args:
        model: the model (left unchanged: the run is on a copy).
        example_inputs: positional inputs at the training batch size.
        why: why torch.fx did not trace it, the note's first clause.

    Returns:
        The chain, with the copy its steps are measured on. A real copy (when the forward
        does not run on fake tensors) shares the model's parameter memory; its calls are
        recorded on the first ``RECORDED_SAMPLES`` samples, and its steps measured at a batch
        that fits the budget (NOTE [Scaled real measurement]).

    Raises:
        TraceError: no submodule qualifies as a link.
    """
    mode = PlanningFakeMode()
    fake_mode: FakeTensorMode | None = mode
    copied: torch.nn.Module
    measured_on = ""
    try:
        copied = fake_copy(model, mode)
        calls = _record_calls(copied, example_inputs, mode)
    except Exception as error:  # data-dependent ops and the like: any failure means "run it"
        fake_mode = None
        calls = _record_calls(parameter_sharing_copy(model), _few_samples(example_inputs), None)
        # A fresh copy to measure on: the recording's may hold its forward's graph (a
        # pytorch-forecasting model keeps each step's outputs in a list). Modules sit in
        # reference cycles, and plan() pauses the cyclic collector: collected here, now.
        gc.collect()
        copied = parameter_sharing_copy(model)
        measured_on = (
            "; measured on real tensors, since the forward does not run on fake ones "
            f"({describe_error(error)})"
        )
    links = _choose_links(calls)
    if not links:
        raise TraceError(
            f"{why}, and no submodule runs once per forward to be recomputed on its own; "
            "make the forward traceable by torch.fx or move its work into submodules"
        )
    reasons = [calls[i].keep_reason for i in links]
    segments = module_segments(
        [[calls[i].path] for i in links],
        keep_reasons=reasons,
        state_notes=[calls[i].state_note for i in links],
    )
    regions = _choose_spans([calls[i] for i in links])
    region_segments = module_segments(
        [[calls[i].path for i in links[first:end]] for first, end in regions],
        keep_reasons=[next(filter(None, reasons[first:end]), "") for first, end in regions],
    )
    note = (
        f"{why}; planning {len(segments)} module-level segments found with forward hooks, "
        f"recompute, chunks of single modules and micro-batches{measured_on}"
    )
    return ModuleChain(
        segments=segments,
        regions=regions,
        region_segments=region_segments,
        fake_module=copied,
        fake_mode=fake_mode,
        note=note,
    )


def module_segments(
    groups: Sequence[Sequence[str]],
    *,
    keep_reasons: Sequence[str] = (),
    state_notes: Sequence[str] = (),
) -> tuple[Segment, ...]:
    """One segment per group of module paths (a link, or a span of links), in order, with its
    ``keep_reason`` and ``state_note`` if given; no fx nodes."""
    reasons = list(keep_reasons) or [""] * len(groups)
    notes = list(state_notes) or [""] * len(groups)
    return tuple(
        Segment(
            index=index,
            name=group[0] if len(group) == 1 else f"{group[0]}..{group[-1]}",
            node_names=(),
            module_paths=tuple(group),
            input_names=(),
            output_names=(),
            keep_reason=reason,
            state_note=note,
        )
        for index, (group, reason, note) in enumerate(zip(groups, reasons, notes, strict=True))
    )


@dataclass
class _Call:
    """One module call seen by the hooks.

    Attributes:
        path: the module's path in the model ("" for the root).
        parent: index of the call it ran inside (None for the root's call).
        start_bytes / end_bytes: live bytes when it started and when it returned.
        children: indices of the calls that ran directly inside it, in order.
        is_link: whether it may be a link (NOTE [Module chain]).
        inputs: weak references to the storages of its tensor arguments.
        keep_reason: why it must not be recomputed (NOTE [In-place writes], NOTE [Python
            state written in forward]), or "".
        state_note: what object it writes that a recompute must see as forward did (NOTE
            [Python state written in forward]), or "".
        input_bytes: bytes of the storages its tensor arguments use (what recomputing from
            it keeps).
    """

    path: str
    parent: int | None
    start_bytes: int
    end_bytes: int = 0
    children: list[int] = field(default_factory=list)
    is_link: bool = True
    inputs: list[weakref.ref[torch.UntypedStorage]] = field(default_factory=list)
    keep_reason: str = ""
    state_note: str = ""
    input_bytes: int = 0
    python_state: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)

    @property
    def held_bytes(self) -> int:
        """Bytes the call leaves alive: what it saves for backward and returns."""
        return max(self.end_bytes - self.start_bytes, 0)


class _CallRecorder:
    """Pre- and post-forward hooks that build the call tree with each call's held bytes."""

    def __init__(self, tracker: MemoryTracker) -> None:
        self.tracker = tracker
        self.calls: list[_Call] = []
        self.stack: list[int] = []

    def started(self, path: str, arguments: Any) -> None:
        parent = self.stack[-1] if self.stack else None
        call = _Call(path, parent, self.tracker.current_bytes)
        # Weak: holding them would keep them alive, and change the bytes each call holds.
        storages = {id(s): s for s in (t.untyped_storage() for t in flat_tensors(arguments))}
        call.inputs = [weakref.ref(storage) for storage in storages.values()]
        call.input_bytes = sum(storage.nbytes() for storage in storages.values())
        args, kwargs = arguments
        objects = python_objects((*args, *kwargs.values()))
        call.python_state = [(value, state_of(value)) for value in objects]
        self.calls.append(call)
        if parent is not None:
            self.calls[parent].children.append(len(self.calls) - 1)
        self.stack.append(len(self.calls) - 1)

    def finished(self) -> None:
        call = self.calls[self.stack.pop()]
        call.end_bytes = self.tracker.current_bytes
        # NOTE [Python state written in forward]
        for value, before in call.python_state:
            if call.keep_reason or call.state_note or state_of(value) == before:
                continue
            written = f"{call.path or 'it'} writes to the {type(value).__name__} it is given"
            if isinstance(value, (list, dict)):
                # The runner rebuilds lists and dicts it passes (pytree containers): a
                # recompute's write would not reach the caller's.
                call.keep_reason = f"{written} (a recompute would write another one)"
            else:
                call.state_note = f"{written}: recomputed with it as forward found it"
        call.python_state = []

    def written(self, op: str, storage: torch.UntypedStorage) -> None:
        """An op wrote ``storage`` in place: every call begun so far that reads it is kept, as
        backward could not recompute it (NOTE [In-place writes])."""
        for call in self.calls:
            if not call.keep_reason and any(ref() is storage for ref in call.inputs):
                call.keep_reason = f"{op} writes in place to an input of {call.path or 'it'}"


def _record_calls(
    model: torch.nn.Module, example_inputs: Sequence[Any], mode: FakeTensorMode | None
) -> list[_Call]:
    """The call tree of one forward of ``model`` (a copy), on fake tensors of ``mode`` or, with
    ``None``, on the real inputs."""
    tracker = MemoryTracker()
    recorder = _CallRecorder(tracker)
    writes = WriteRecorder(recorder.written)
    handles = []
    for path, module in model.named_modules():
        handles.append(
            module.register_forward_pre_hook(
                lambda _, args, kwargs, p=path: recorder.started(p, (args, kwargs)),
                with_kwargs=True,
            )
        )
        handles.append(module.register_forward_hook(lambda *_: recorder.finished()))
    try:
        with mode if mode is not None else contextlib.nullcontext(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inputs = list(example_inputs)
            if mode is not None:
                inputs = tree_map_only(torch.Tensor, mode.from_tensor, inputs)
            with tracker, writes:
                model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    calls = recorder.calls
    num_calls = Counter(call.path for call in calls)
    for call in calls:
        parent_path = calls[call.parent].path if call.parent is not None else None
        # A link's module runs once, and is reached through its parent in the module tree
        # (the planned module replaces it on that path only).
        call.is_link = (
            num_calls[call.path] == 1
            and parent_path is not None
            and (parent_path == "" or call.path.startswith(parent_path + "."))
        )
    return calls


def _few_samples(example_inputs: Sequence[Any]) -> list[Any]:
    """The first ``RECORDED_SAMPLES`` samples of the batch (all of it where it is not larger):
    a real forward's held bytes, in proportion, are what the chain is chosen by."""
    size = batch_size_of(example_inputs)
    if size is None or size <= RECORDED_SAMPLES:
        return list(example_inputs)
    return take_samples(example_inputs, slice(0, RECORDED_SAMPLES), batch_size=size)


def _choose_links(calls: list[_Call]) -> list[int]:
    """The chain, as call indices in call order (NOTE [Module chain])."""
    if not calls:
        return []

    def links_under(index: int) -> list[int]:
        return [child for child in calls[index].children if calls[child].is_link]

    chain = links_under(0)
    while chain:
        total = sum(calls[i].held_bytes for i in chain)
        largest = max(chain, key=lambda i: calls[i].held_bytes)
        below = links_under(largest)
        covered = sum(calls[i].held_bytes for i in below)
        if (
            not below
            or calls[largest].held_bytes <= DESCEND_SHARE * total
            or covered <= COVERED_SHARE * calls[largest].held_bytes
        ):
            break
        position = chain.index(largest)
        chain[position : position + 1] = below
    return chain


def _choose_spans(links: Sequence[_Call]) -> tuple[tuple[int, int], ...]:
    """Runs of links that may be recomputed as one (NOTE [Module spans]), as ``(first, end)``.

    The cuts of NOTE [Cut points] at the units' weight, over the links: each link's held
    bytes are its weight, and what a span starting at a link keeps is that link's input. A
    link that must be kept is a run of its own (a span around it could not be recomputed).
    """
    count = len(links)
    crossing = np.array([0.0, *(float(c.input_bytes) for c in links[1:]), 0.0])
    weights = np.array([float(c.held_bytes) for c in links])
    cuts = set(RunCosts(weights, crossing, count).choose(SEGMENT_CROSSING_WEIGHT, range(count + 1)))
    for position, link in enumerate(links):
        if link.keep_reason or link.state_note:  # a span puts back no Python state
            cuts |= {position, position + 1}
    ordered = sorted(cuts)
    return tuple(zip(ordered, ordered[1:], strict=False))


def _is_nest(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple))


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
