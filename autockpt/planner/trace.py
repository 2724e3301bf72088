"""Stage 1: trace a model with torch.fx and cut its graph into a chain of candidate segments.

NOTE [Cut points]
A segment is a contiguous run of the traced graph's compute nodes, in execution order. Any
such run can be recomputed in backward: its inputs are the values it reads from earlier nodes,
its outputs the values later nodes read. What a checkpointed segment keeps alive between forward
and backward is its *boundary* (inputs and outputs), while its interior is rebuilt in backward,
all at once. So good cut points sit where few bytes cross: inside the per-variable GRNs of a
TFT's variable selection network every value is (B, T, V, H), but the embeddings that enter
them are (B, T, V, 8) and the weighted sum that leaves is (B, T, H).

The cuts are chosen by a small dynamic program over the node order that minimises

    weight * sum(bytes crossing each cut) + sum(segment bytes ** 2) / total bytes

The first term is what recomputed segments must keep (their boundaries); the second stands in
for the largest interior that backward rebuilds at once (it falls as segments get smaller, and
falls fastest where one segment is much larger than the rest). Where cuts are cheap this gives
about sqrt(total / crossing) segments; where every cut is expensive (inside a TFT's per-variable
GRNs) the region stays whole, and a later stage runs it in chunks instead.

The DP runs twice. With weight 1 it gives the *segments*, the chain's positions, each of which
may be kept or recomputed alone. With weight 3 it gives the *regions* (and every region edge is
made a segment edge too): runs of segments whose outer boundary is small (a TFT's per-variable GRNs and their
weighted sum form one), which may be recomputed as one unit and, when batch-separable, in
chunks, so that backward rebuilds only a piece of them at a time.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from autockpt.errors import TraceError
from autockpt.planner.fake import fake_copy, storages

#: torch.nn modules the tracer keeps whole although they have children or fused kernels. Other
#: torch.nn modules are kept whole only when they have no children (Linear, LayerNorm, ...):
#: containers such as TransformerEncoder are traced through, so their insides can be cut.
LEAF_MODULE_TYPES: tuple[type[torch.nn.Module], ...] = (
    torch.nn.LSTM,
    torch.nn.GRU,
    torch.nn.RNN,
    torch.nn.MultiheadAttention,
)

#: How much a byte crossing a cut counts against a byte of interior (NOTE [Cut points]), for
#: segments (fine: each may be recomputed on its own) and for regions (coarse: runs of
#: segments that may be recomputed as one, in chunks). A recomputed region keeps its boundary
#: through forward and backward, and backward adds the boundary's gradient.
SEGMENT_CROSSING_WEIGHT = 1.0
REGION_CROSSING_WEIGHT = 3.0

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
    """

    index: int
    name: str
    node_names: tuple[str, ...]
    module_paths: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


@dataclass(frozen=True)
class TracedModel:
    """A model's graph and its chain of candidate segments.

    Attributes:
        graph_module: the traced module; shares parameters with the original model.
        segments: the chain, in execution order.
        node_output_bytes: bytes of new storage each compute node's output takes (views: 0).
        storage_owner: for a node whose output is a view, the node that allocated its storage.
        regions: runs of segments that may be recomputed as one, as ``(first, end)`` segment
            indices covering the chain in order (NOTE [Cut points]).
        region_segments: each region as one segment.
        fake_module: a copy of ``graph_module`` on fake tensors of ``fake_mode`` (see
            :func:`autockpt.planner.fake.fake_copy`), made once here for the sizes and reused by
            every measurement (copying a large graph module is not free).
        fake_mode: the fake tensor mode of ``fake_module``.
    """

    graph_module: fx.GraphModule
    segments: tuple[Segment, ...]
    node_output_bytes: dict[str, int]
    storage_owner: dict[str, str]
    regions: tuple[tuple[int, int], ...]
    region_segments: tuple[Segment, ...]
    fake_module: fx.GraphModule
    fake_mode: FakeTensorMode


#: How many submodules that do not trace may be kept whole before the model counts as untraceable.
MAX_OPAQUE_MODULES = 64


class _Tracer(fx.Tracer):
    def __init__(self, opaque_paths: set[str]) -> None:
        super().__init__()
        self.opaque_paths = opaque_paths

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
) -> TracedModel:
    """Trace ``model`` and cut its graph into a chain of segments (see NOTE [Cut points]).

    Args:
        model: any ``nn.Module`` whose forward torch.fx can trace.
        example_inputs: positional inputs at the training batch size (only shapes are used:
            the sizes come from a run on fake tensors).
        target_num_segments: how finely to cut where cutting is cheap.

    Returns:
        The traced graph module and its segments.

    Raises:
        TraceError: torch.fx cannot trace the model (the message says why).
    """
    graph = trace_graph(model)
    graph_module = fx.GraphModule(model, graph, class_name=f"Traced{type(model).__name__}")
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_module = fake_copy(graph_module, fake_mode)
    node_bytes, owners = node_output_bytes(fake_module, fake_mode, example_inputs)
    compute_nodes = [n for n in graph.nodes if n.op in COMPUTE_OPS]
    if not compute_nodes:
        raise TraceError(f"{type(model).__name__} has no operations to plan")
    costs = _CutCosts(compute_nodes, node_bytes, owners, target_num_segments)
    everywhere = range(len(compute_nodes) + 1)
    region_bounds = costs.choose(REGION_CROSSING_WEIGHT, everywhere)
    # Every region edge is also a segment edge, so regions are runs of whole segments.
    bounds = sorted(set(costs.choose(SEGMENT_CROSSING_WEIGHT, everywhere)) | set(region_bounds))
    segments = _build_segments(graph, compute_nodes, bounds)
    regions = tuple(
        (bounds.index(start), bounds.index(end))
        for start, end in zip(region_bounds[:-1], region_bounds[1:], strict=True)
    )
    return TracedModel(
        graph_module=graph_module,
        segments=segments,
        node_output_bytes=node_bytes,
        storage_owner=owners,
        regions=regions,
        region_segments=_build_segments(graph, compute_nodes, region_bounds),
        fake_module=fake_module,
        fake_mode=fake_mode,
    )


def trace_graph(model: torch.nn.Module) -> fx.Graph:
    """Trace ``model``; a submodule that does not trace is kept whole and tracing retried.

    torch.nn's own containers (``TransformerEncoderLayer``'s fast-path checks, for one) branch
    on tensor properties; keeping such a module whole loses only the cut points inside it.
    """
    opaque_paths: set[str] = set()
    while True:
        tracer = _Tracer(opaque_paths)
        try:
            return tracer.trace(model)
        except Exception as error:  # fx raises many types; all mean "not traceable here"
            failing_path = next(reversed(tracer.module_stack), "") if tracer.module_stack else ""
            if (
                failing_path
                and failing_path not in opaque_paths
                and len(opaque_paths) < MAX_OPAQUE_MODULES
            ):
                opaque_paths.add(failing_path)
                continue
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise TraceError(
                f"torch.fx cannot trace {type(model).__name__}: {reason}; wrap "
                "shape-dependent helpers with torch.fx.wrap or pass inputs as plain tensors"
            ) from error


def node_output_bytes(
    fake_module: fx.GraphModule, mode: FakeTensorMode, example_inputs: Sequence[torch.Tensor]
) -> tuple[dict[str, int], dict[str, str]]:
    """New storage bytes of each node's output, and for views the node owning their storage.

    Measured by a forward pass of ``fake_module`` (on fake tensors of ``mode``) under no_grad.
    """
    with mode, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interpreter = _SizeInterpreter(fake_module)
        interpreter.run(*[mode.from_tensor(x) for x in example_inputs])
    return interpreter.sizes, interpreter.owners


class _SizeInterpreter(fx.Interpreter):
    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.sizes: dict[str, int] = {}
        self.owners: dict[str, str] = {}
        # Storages stay referenced for the whole pass so that their ids are never reused.
        self._seen: dict[int, tuple[object, str]] = {}

    def run_node(self, n: fx.Node) -> object:
        result = super().run_node(n)
        total = 0
        for storage in storages(result):
            if id(storage) in self._seen:
                self.owners.setdefault(n.name, self._seen[id(storage)][1])
            else:
                self._seen[id(storage)] = (storage, n.name)
                total += storage.nbytes()
        self.sizes[n.name] = total
        return result


class _CutCosts:
    """The quantities of NOTE [Cut points] over the compute nodes, and the DP that uses them."""

    def __init__(
        self,
        compute_nodes: list[fx.Node],
        node_bytes: dict[str, int],
        owners: dict[str, str],
        target_num_segments: int,
    ) -> None:
        count = len(compute_nodes)
        position = {node: i for i, node in enumerate(compute_nodes)}
        weights = np.array([node_bytes.get(n.name, 0) for n in compute_nodes], dtype=np.float64)
        # A storage lives until the last use of the node that made it or of any view of it.
        last_use = {
            node.name: max(
                (position.get(user, count) for user in node.users), default=position[node]
            )
            for node in compute_nodes
        }
        for view, owner in owners.items():
            if owner in last_use and view in last_use:
                last_use[owner] = max(last_use[owner], last_use[view])
        # crossing[p]: bytes produced before position p and read at or after it.
        delta = np.zeros(count + 1, dtype=np.float64)
        for node in compute_nodes:
            last = last_use[node.name]
            start = position[node] + 1
            if last >= start:
                delta[start] += weights[position[node]]
                delta[last + 1 if last < count else count] -= weights[position[node]]
        self.crossing = np.cumsum(delta)
        self.crossing[count] = 0.0
        self.prefix = np.concatenate([[0.0], np.cumsum(weights)])
        self.total = max(float(self.prefix[-1]), 1.0)
        # A small price per segment keeps the DP from cutting at every free position.
        self.per_segment = self.total / (50.0 * max(target_num_segments, 1))

    def choose(self, crossing_weight: float, allowed: Sequence[int] | range) -> list[int]:
        """Cut positions (0 first, the node count last) among ``allowed`` that minimise the
        cost of NOTE [Cut points]."""
        points = np.array(list(allowed), dtype=np.int64)
        best = np.full(len(points), np.inf)
        best[0] = 0.0
        previous = np.zeros(len(points), dtype=np.int64)
        for index in range(1, len(points)):
            end = points[index]
            size = self.prefix[end] - self.prefix[points[:index]]
            cost = (
                best[:index]
                + size * size / self.total
                + crossing_weight * self.crossing[end]
                + self.per_segment
            )
            start = int(np.argmin(cost))
            best[index] = cost[start]
            previous[index] = start
        chosen = [len(points) - 1]
        while chosen[-1] > 0:
            chosen.append(int(previous[chosen[-1]]))
        return [int(points[i]) for i in reversed(chosen)]


def _build_segments(
    graph: fx.Graph, compute_nodes: list[fx.Node], bounds: list[int]
) -> tuple[Segment, ...]:
    segments: list[Segment] = []
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
