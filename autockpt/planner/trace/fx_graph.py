"""Stage 1: trace a model with torch.fx and cut its graph into a chain of candidate segments.

The chain's segments are runs of the graph's compute nodes in execution order, cut where few bytes
cross (NOTE [Cut points] in :mod:`autockpt.planner.trace.cut_points`); runs of segments form the
units and regions that may also be recomputed as one.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from autockpt.errors import TraceError, first_line
from autockpt.planner.core.fake_copies import fake_copy, storages
from autockpt.planner.core.fake_mode import PlanningFakeMode
from autockpt.planner.core.output_structure import (
    OutputStructure,
    RebuildingCodeGen,
    flatten_output,
    needs_structure,
)
from autockpt.planner.core.train_eval import training_mode
from autockpt.planner.trace.autograd_regions import autograd_notes, recording_autograd
from autockpt.planner.trace.cut_points import choose_cuts
from autockpt.planner.trace.inplace_writes import WriteRecorder, keep_reason
from autockpt.planner.trace.output_head import OutputHead, cut_before_head
from autockpt.planner.trace.python_arguments import (
    keep_specialized_names,
    plain_python_defaults,
    same_value,
    specialized_arguments,
)

#: torch.nn modules the tracer keeps whole although they have children or fused kernels. Other
#: torch.nn modules are kept whole only when they have no children (Linear, LayerNorm, ...):
#: containers such as TransformerEncoder are traced through, so their insides can be cut.
LEAF_MODULE_TYPES: tuple[type[torch.nn.Module], ...] = (
    torch.nn.LSTM,
    torch.nn.GRU,
    torch.nn.RNN,
    torch.nn.MultiheadAttention,
)

COMPUTE_OPS = frozenset({"call_function", "call_method", "call_module"})


@dataclass(frozen=True)
class Segment:
    """A contiguous run of compute nodes of the traced graph.

    Attributes:
        index: position in the chain, from 0.
        name: readable name from the modules its nodes belong to.
        node_names: the fx nodes it covers, in order.
        module_paths: the modules its nodes run in (outermost first, deduplicated).
        input_names: nodes outside the segment whose values it reads (parameters excluded).
        output_names: nodes inside it whose values are read after it.
        keep_reason: why it must never be recomputed (NOTE [In-place writes] in
            :mod:`autockpt.planner.trace.inplace_writes`); empty when it may be.
        state_note: a module-level segment that writes to a Python object it is given (a
            Hugging Face ``Cache``): recomputed whole with that object as forward found it,
            never in chunks or in a span (NOTE [Python state written in forward]); "" else.
    """

    index: int
    name: str
    node_names: tuple[str, ...]
    module_paths: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    keep_reason: str = ""
    state_note: str = ""


@dataclass(frozen=True)
class TracedModel:
    """A model's graph and its chain of candidate segments.

    Attributes:
        graph_module: the traced module; shares parameters with the original model.
        segments: the chain, in execution order.
        node_output_bytes: bytes of new storage each compute node's output takes (views: 0).
        storage_owner: for a node whose output is a view, the node that allocated its storage.
        regions: runs of segments that may be recomputed as one, as ``(first, end)`` segment
            indices covering the chain in order (NOTE [Cut points] in
            :mod:`autockpt.planner.trace.cut_points`).
        region_segments: each region as one segment.
        fake_module: a copy of ``graph_module`` on fake tensors of ``fake_mode`` (see
            :func:`autockpt.planner.core.fake_copies.fake_copy`), made once here for the sizes and
            reused by every measurement (copying a large graph module is not free).
        fake_mode: the fake tensor mode of ``fake_module``.
        units: runs of segments that may be recomputed as one, as ``(first, end)`` segment
            indices covering the chain; one per segment unless in-place writes cut them
            finer (NOTE [Cut points]).
        unit_segments: each unit as one segment.
        opaque: submodules torch.fx could not trace, kept whole (one node each), with fx's
            reason.
        notes: what the plan should say about how the model was traced.
    """

    graph_module: fx.GraphModule
    segments: tuple[Segment, ...]
    node_output_bytes: dict[str, int]
    storage_owner: dict[str, str]
    regions: tuple[tuple[int, int], ...]
    region_segments: tuple[Segment, ...]
    fake_module: fx.GraphModule
    fake_mode: FakeTensorMode
    units: tuple[tuple[int, int], ...] = ()
    unit_segments: tuple[Segment, ...] = ()
    opaque: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


#: How many submodules that do not trace may be kept whole before the model counts as untraceable.
MAX_OPAQUE_MODULES = 64


class _Tracer(fx.Tracer):
    def __init__(self, opaque_paths: set[str]) -> None:
        super().__init__()
        self.opaque_paths = opaque_paths
        self.output_structure: OutputStructure | None = None

    def create_args_for_root(
        self, root_fn: Callable[..., Any], is_module: bool, concrete_args: Any = None
    ) -> tuple[Any, list[Any]]:
        fn, args = super().create_args_for_root(root_fn, is_module, concrete_args)

        def flat_fn(*inputs: Any) -> Any:
            # NOTE [Output structure]: the graph returns the output's tensors, flat.
            output = fn(*inputs)
            if not needs_structure(output):
                return output
            leaves, self.output_structure = flatten_output(output)
            return tuple(leaves)

        return flat_fn, args

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.opaque_paths or isinstance(m, LEAF_MODULE_TYPES):
            return True
        is_torch_nn = type(m).__module__.startswith(("torch.nn", "torch.ao.nn"))
        return is_torch_nn and next(iter(m.children()), None) is None


def trace_model(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    target_num_segments: int = 24,
    cut_before: OutputHead | None = None,
) -> TracedModel:
    """Trace ``model`` and cut its graph into a chain of segments (see NOTE [Cut points]).

    Args:
        model: any ``nn.Module`` whose forward torch.fx can trace.
        example_inputs: positional inputs at the training batch size (only shapes are used:
            the sizes come from a run on fake tensors).
        target_num_segments: how finely to cut where cutting is cheap.
        cut_before: the model's head: the graph ends before it, returning its input, weight
            and bias (NOTE [Loss over positions in chunks]).

    Returns:
        The traced graph module and its segments.

    Raises:
        TraceError: torch.fx cannot trace the model (the message says why).
    """
    failed: dict[str, str] = {}
    graph = trace_graph(model, opaque=failed)
    if cut_before is not None:
        graph = cut_before_head(graph, cut_before)
    _check_constants_given(model, graph, example_inputs)
    called = {str(n.target) for n in graph.nodes if n.op == "call_module"}
    opaque = {path: reason for path, reason in failed.items() if path in called}
    graph_module = fx.GraphModule(model, graph, class_name=f"Traced{type(model).__name__}")
    fake_mode = PlanningFakeMode()
    fake_module = fake_copy(graph_module, fake_mode)
    try:
        node_bytes, owners, writes = node_output_bytes(fake_module, fake_mode, example_inputs)
    except Exception as error:  # a submodule kept whole that reads tensor values, most likely
        if not opaque:
            raise
        path, reason = next(iter(opaque.items()))
        raise TraceError(
            f"submodule {path} does not trace ({reason}) and does not run on fake tensors "
            f"({type(error).__name__})"
        ) from None
    compute_nodes = [n for n in graph.nodes if n.op in COMPUTE_OPS]
    if not compute_nodes:
        raise TraceError(f"{type(model).__name__} has no operations to plan")
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"]
    cuts = choose_cuts(
        compute_nodes,
        node_bytes,
        owners,
        writes,
        placeholders,
        target_num_segments=target_num_segments,
    )

    def build(bounds: list[int]) -> tuple[Segment, ...]:
        return _build_segments(graph, compute_nodes, bounds, writes=writes, owners=owners)

    def spans(bounds: list[int]) -> tuple[tuple[int, int], ...]:
        # Each level's bounds are segment bounds: its runs as segment indices.
        return tuple(
            (cuts.segments.index(start), cuts.segments.index(end))
            for start, end in zip(bounds[:-1], bounds[1:], strict=True)
        )

    return TracedModel(
        graph_module=graph_module,
        segments=build(cuts.segments),
        node_output_bytes=node_bytes,
        storage_owner=owners,
        regions=spans(cuts.regions),
        region_segments=build(cuts.regions),
        fake_module=fake_module,
        fake_mode=fake_mode,
        units=spans(cuts.units),
        unit_segments=build(cuts.units),
        opaque=opaque,
        notes=autograd_notes(graph),
    )


def trace_graph(
    model: torch.nn.Module,
    *,
    in_training_mode: bool = True,
    opaque: dict[str, str] | None = None,
) -> fx.Graph:
    """Trace ``model``; a submodule that does not trace is kept whole and tracing retried.

    torch.nn's own containers (``TransformerEncoderLayer``'s fast-path checks, for one) branch
    on tensor properties; keeping such a module whole loses only the cut points inside it.
    The model is traced as it trains, after ``model.train()``, and left in the modes it was in
    (NOTE [Modes and the traced graph]). The graph returns the output's tensors and its code
    rebuilds the output's types around them (NOTE [Output structure]). A forward that traces
    only with its plain Python arguments fixed at their defaults is traced so
    (NOTE [Python arguments]). Custom autograd Functions are kept as one call each, and
    grad-mode and autocast regions as nodes that switch the mode (NOTE [Autograd in the traced
    graph]).

    Args:
        model: the model to trace.
        in_training_mode: ``False`` traces it in the modes its modules are in.
        opaque: when given, filled with the path of each submodule kept whole and fx's
            reason (one that ends up inside another kept whole is listed too).
    """
    opaque_paths: set[str] = set()
    constants: dict[str, Any] = {}
    while True:
        tracer = _Tracer(opaque_paths)
        try:
            modes = training_mode(model) if in_training_mode else contextlib.nullcontext()
            # NOTE [Autograd in the traced graph]: Functions and regions become nodes.
            with modes, recording_autograd(tracer):
                graph = tracer.trace(model, concrete_args=constants or None)
            keep_specialized_names(graph, constants)
            if tracer.output_structure is not None:
                graph.set_codegen(RebuildingCodeGen(tracer.output_structure))
            return graph
        except Exception as error:  # fx raises many types; all mean "not traceable here"
            failing_path = next(reversed(tracer.module_stack), "") if tracer.module_stack else ""
            reason = first_line(error)
            if not constants and (defaults := plain_python_defaults(type(model).forward)):
                # NOTE [Python arguments]: once more, with those arguments as constants.
                constants = defaults
                opaque_paths.clear()
                if opaque is not None:
                    opaque.clear()
                continue
            if (
                failing_path
                and failing_path not in opaque_paths
                and len(opaque_paths) < MAX_OPAQUE_MODULES
            ):
                opaque_paths.add(failing_path)
                if opaque is not None:
                    opaque[failing_path] = reason
                continue
            raise TraceError(
                f"torch.fx cannot trace {type(model).__name__}: {reason}; wrap "
                "shape-dependent helpers with torch.fx.wrap or pass inputs as plain tensors"
            ) from error


def _check_constants_given(
    model: torch.nn.Module, graph: fx.Graph, example_inputs: Sequence[Any]
) -> None:
    """Refuse example inputs that give an argument the graph holds as a constant another value
    (NOTE [Python arguments]): the graph would plan a step that is not the model's."""
    constants = specialized_arguments(graph)
    parameters = list(inspect.signature(type(model).forward).parameters)[1:]
    for name, value in zip(parameters, example_inputs, strict=False):
        if name in constants and not same_value(value, constants[name]):
            raise TraceError(
                f"torch.fx cannot trace {type(model).__name__} with {name}={value!r}: it traces "
                f"only with {name}={constants[name]!r}, its default"
            )


def node_output_bytes(
    fake_module: fx.GraphModule, mode: FakeTensorMode, example_inputs: Sequence[torch.Tensor]
) -> tuple[dict[str, int], dict[str, str], dict[str, tuple[str, ...]]]:
    """New storage bytes of each node's output, for views the node owning their storage, and
    for each node that writes in place the nodes owning what it writes (NOTE [In-place writes]).

    Measured by a forward pass of ``fake_module`` (on fake tensors of ``mode``) under no_grad.
    """
    with mode, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interpreter = _SizeInterpreter(fake_module)
        with interpreter.recorder:
            interpreter.run(*[mode.from_tensor(x) for x in example_inputs])
    return interpreter.sizes, interpreter.owners, interpreter.writes


class _SizeInterpreter(fx.Interpreter):
    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.sizes: dict[str, int] = {}
        self.owners: dict[str, str] = {}
        self.writes: dict[str, tuple[str, ...]] = {}
        self.recorder = WriteRecorder(lambda _, storage: self._written.append(storage))
        self._written: list[torch.UntypedStorage] = []
        # The node that allocated each storage, by id; the storages stay referenced for the
        # whole pass so that their ids are never reused.
        self._owner_of: dict[int, str] = {}
        self._alive: list[torch.UntypedStorage] = []

    def run_node(self, n: fx.Node) -> object:
        self._written.clear()
        result = super().run_node(n)
        # A storage an earlier node allocated is an earlier value: this node writes it in place.
        owners = (self._owner_of.get(id(storage)) for storage in self._written)
        written = tuple(dict.fromkeys(owner for owner in owners if owner is not None))
        if written:
            self.writes[n.name] = written
        self._written.clear()
        total = 0
        for storage in storages(result):
            if id(storage) in self._owner_of:
                self.owners.setdefault(n.name, self._owner_of[id(storage)])
            else:
                self._owner_of[id(storage)] = n.name
                self._alive.append(storage)
                total += storage.nbytes()
        self.sizes[n.name] = total
        return result


def _build_segments(
    graph: fx.Graph,
    compute_nodes: list[fx.Node],
    bounds: list[int],
    *,
    writes: dict[str, tuple[str, ...]] | None = None,
    owners: dict[str, str] | None = None,
) -> tuple[Segment, ...]:
    """Segments between consecutive ``bounds``; with the in-place ``writes`` and storage
    ``owners`` of :func:`node_output_bytes`, each says whether it may be recomputed."""
    segments: list[Segment] = []
    positions = {node.name: i for i, node in enumerate(compute_nodes)}
    names_used: Counter[str] = Counter()
    order = {node: i for i, node in enumerate(graph.nodes)}
    for index, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        members = compute_nodes[start:end]
        member_set = set(members)
        inputs: list[str] = []
        for node in members:
            for arg in node.all_input_nodes:
                if arg not in member_set and arg.op != "get_attr" and arg.name not in inputs:
                    inputs.append(arg.name)
        last_order = order[members[-1]]
        outputs = [n.name for n in members if any(order[user] > last_order for user in n.users)]
        shared, paths = _module_paths(members)
        base = shared or (paths[0] if paths else members[0].name)
        names_used[base] += 1
        name = base if names_used[base] == 1 else f"{base}#{names_used[base]}"
        segments.append(
            Segment(
                index=index,
                name=name,
                node_names=tuple(n.name for n in members),
                module_paths=tuple(paths),
                input_names=tuple(inputs),
                output_names=tuple(outputs),
                keep_reason=keep_reason(
                    [n.name for n in members], inputs, positions, writes, owners or {}
                )
                if writes
                else "",
            )
        )
    return tuple(segments)


def _module_paths(nodes: list[fx.Node]) -> tuple[str, list[str]]:
    """The deepest module path all nodes share, and the distinct paths in order of first use."""
    paths: list[str] = []
    for node in nodes:
        stack = node.meta.get("nn_module_stack") or {}
        path = next(reversed(stack.values()))[0] if stack else ""
        if node.op == "call_module":
            path = str(node.target)
        if path and path not in paths:
            paths.append(path)
    if not paths:
        return "", []
    common = paths[0].split(".")
    for path in paths[1:]:
        parts = path.split(".")
        length = 0
        while length < min(len(common), len(parts)) and common[length] == parts[length]:
            length += 1
        common = common[:length]
    return ".".join(common), paths


def segments_from_node_lists(
    graph: fx.Graph, node_lists: Sequence[Sequence[str]]
) -> tuple[Segment, ...]:
    """Rebuild the chain from each segment's node names (as a saved plan lists them)."""
    compute_nodes = [n for n in graph.nodes if n.op in COMPUTE_OPS]
    bounds = [0]
    for names in node_lists:
        bounds.append(bounds[-1] + len(names))
    return _build_segments(graph, compute_nodes, bounds)
