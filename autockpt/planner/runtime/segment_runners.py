"""Rebuilding a traced graph so that chosen segments recompute in backward.

NOTE [Segment runners]
The planned module is the traced graph with each recomputed segment's nodes replaced by one
call to a *runner*. A runner is a plain callable, not an ``nn.Module``, so the planned module's
``state_dict()`` keys stay those of the original model (the segment's parameters are reached
through the shared root, not registered twice). A runner calls
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, preserve_rng_state=True)``:
non-reentrant because the reentrant variant drops gradients of tensors passed inside tuples
(an LSTM's ``(h, c)``), and with the RNG state preserved so dropout draws the same masks when
the segment is recomputed. Modules that update buffers in forward (BatchNorm's running
statistics) would update them a second time during the recompute; the runner's recompute
context puts those buffers back as they were, so a planned step changes the model's state
exactly as a plain step does.

A runner with ``num_chunks > 1`` splits its batch-carrying inputs into that many pieces (each along
the dimension that carries the batch: dim 0 for ``(B, T, H)``, dim 1 for a variable-major ``(V, B *
T, E)``), checkpoints each piece separately and concatenates the outputs along theirs: in backward
only one piece's interior is rebuilt at a time. That is only correct for a segment where no
operation mixes samples, which :mod:`autockpt.planner.measure.separability` establishes before the
planner may choose it.

NOTE [Segment runners under torch.compile]
Dynamo turns a ``checkpoint`` call into a region whose operations the partitioner recomputes
in backward, and takes a ``context_fn`` there as a selective-checkpointing policy (it calls
the plain function behind a bound method without its ``self``: the ``TypeError`` a compiled
plan used to raise). While compiling the runner passes none (a segment recomputed
selectively passes torch's selective policy alone, NOTE [Selective recompute]): recompute in a
compiled graph replays no buffer update (AOTAutograd applies the forward's mutations once), so
there is nothing to put back; the eager contexts are what eager runs need. (The debugging backend
``"eager"`` skips AOTAutograd: there a checkpointed BatchNorm in training mode fails, as it does
under ``torch.utils.checkpoint`` without autockpt.)

NOTE [Chunks under torch.compile]
Chunks bound the backward's peak only if one chunk's interior is rebuilt at a time. Eager, the
autograd engine does that: each chunk's checkpoint recomputes when its gradient arrives. In one
compiled graph the whole step's backward is one compiled call, and inductor runs the
recomputes of all the chunks in it before their gradients need them: the TFT ``tft-225`` (batch
32) planned with its variable GRNs recomputed in 32 chunks peaked at 785 MiB compiled against
298 MiB eager. So while compiling each chunk is a graph of its own (graph breaks around it,
:func:`~autockpt.planner.runtime.compiled_backend.graph_of_its_own`): its backward is a
compiled call of its own, run chunk by chunk as eagerly, and the same plan compiled peaked at
251 MiB (inductor fusing inside each chunk), at about the same step time.

NOTE [A segment's own code under torch.compile]
Where a segment breaks the graph (a region of its own, each chunk a graph of its own), dynamo
starts again on the runner's frames: ``__call__``, the lambda in it, ``_run``, ``_chunked``,
``_checkpointed``, and the compiled_backend functions that break. It keeps its compiled
entries, and counts recompiles, per code object, guarded on what the frame reads (the runner,
its subgraph's class): runners sharing one class's code made one entry per segment on each of
those code objects, and past ``torch._dynamo.config.recompile_limit`` (8) dynamo ran the rest
eagerly without a word: a 12-block model planned with compile at 45% of its peak, and every
segment past the eighth of the compiled search's regions. So each runner is an instance of a
class of its own (:func:`runner_class`) whose functions are copies with code objects of their
own, nested ones included (:func:`own_code`), each named for its segment: each code object
sees one segment, and its entries are that segment's (a step with gradients and one without,
a last chunk of another size). A module-level plan's links (NOTE [Module chain]) are the same:
each link's call is its own code, and it keeps one runner class for all its calls (a class a
call would be new code, compiled again, every step). No limit is raised, and a user's
``torch.compile(planned)`` gets the same. The copies are made once a runner (microseconds).
"""

from __future__ import annotations

import contextlib
import operator
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import torch
import torch.fx as fx
from torch.utils.checkpoint import checkpoint

from autockpt.planner.core.decisions import SegmentAction
from autockpt.planner.core.memory_tracker import flat_tensors
from autockpt.planner.runtime.compiled_backend import graph_of_its_own, in_own_graph
from autockpt.planner.runtime.selective_recompute import COMPILED_CONTEXT_FN, selective_contexts
from autockpt.planner.trace.fx_graph import COMPUTE_OPS, Segment


class SegmentObserver(Protocol):
    """Receives the start and end of every segment's forward (the planner's measurements)."""

    def segment_started(self, index: int) -> None: ...

    def segment_finished(self, index: int, inputs: tuple[Any, ...], outputs: Any) -> None: ...


class SegmentRunner:
    """Runs one segment's subgraph, recomputed and chunked as planned (NOTE [Segment runners]).

    Each runner is an instance of a class of its own whose functions have code objects of
    their own (NOTE [A segment's own code under torch.compile]).
    """

    # The compiled_backend functions the runner breaks graphs in, called through the runner
    # so that each runner's class holds copies of its own.
    _in_own_graph = staticmethod(in_own_graph)
    _graph_of_its_own = staticmethod(graph_of_its_own)

    def __new__(cls, index: int = -1, *args: Any, **kwargs: Any) -> SegmentRunner:
        if cls is not SegmentRunner:
            return super().__new__(cls)
        return super().__new__(runner_class(index))

    def __init__(
        self,
        index: int,
        module: Callable[..., Any],
        action: SegmentAction,
        stateful_modules: Sequence[torch.nn.Module],
        observer: SegmentObserver | None,
    ) -> None:
        self.index = index
        self.module = module
        self.action = action
        self.stateful_modules = tuple(stateful_modules)
        self.observer = observer
        # fx's code generator names call targets by these.
        self.__name__ = f"segment_{index}"
        self.__module__ = __name__

    def __call__(self, *inputs: Any) -> Any:
        if self.observer is not None:
            self.observer.segment_started(self.index)
        outputs = self._in_own_graph(self.action.region_fraction, lambda: self._run(inputs))
        if self.observer is not None:
            self.observer.segment_finished(self.index, inputs, outputs)
        return outputs

    def _run(self, inputs: tuple[Any, ...]) -> Any:
        if not self.action.recompute:
            return self.module(*inputs)
        if self.action.num_chunks <= 1:
            return self._checkpointed(*inputs)
        return self._chunked(inputs)

    def _checkpointed(self, *inputs: Any) -> Any:
        if torch.compiler.is_compiling():
            # NOTE [Segment runners under torch.compile]
            if self.action.selective:
                return checkpoint(
                    self.module,
                    *inputs,
                    use_reentrant=False,
                    preserve_rng_state=True,
                    context_fn=COMPILED_CONTEXT_FN,
                )
            return checkpoint(self.module, *inputs, use_reentrant=False, preserve_rng_state=True)
        return checkpoint(
            self.module,
            *inputs,
            use_reentrant=False,
            preserve_rng_state=True,
            context_fn=self._contexts,
        )

    def _chunked(self, inputs: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        num_chunks = self.action.num_chunks
        if not torch.compiler.is_compiling():
            # A batch smaller than the plan's runs no empty chunk (NOTE [Shapes a plan holds
            # for]); compiled, a graph is made per shape and its chunks are the plan's.
            rows = [
                int(value.shape[dim])
                for value, dim in zip(inputs, self.action.input_batch_dims, strict=True)
                if dim is not None
            ]
            num_chunks = max(min([num_chunks, *rows]), 1)
        split = [
            torch.tensor_split(value, num_chunks, dim=dim) if dim is not None else None
            for value, dim in zip(inputs, self.action.input_batch_dims, strict=True)
        ]
        pieces = []
        for chunk in range(num_chunks):
            chunk_inputs = [
                parts[chunk] if parts is not None else value
                for value, parts in zip(inputs, split, strict=True)
            ]
            # NOTE [Chunks under torch.compile]
            pieces.append(self._graph_of_its_own(self._checkpointed, *chunk_inputs))
        return tuple(
            torch.cat(list(parts), dim=dim)
            for parts, dim in zip(
                zip(*pieces, strict=True), self.action.output_batch_dims, strict=True
            )
        )

    def _contexts(self) -> tuple[contextlib.AbstractContextManager[None], Any]:
        if self.action.selective:
            return selective_contexts(lambda: buffers_restored(self.stateful_modules))
        return contextlib.nullcontext(), buffers_restored(self.stateful_modules)


#: The functions a runner's class holds copies of (NOTE [A segment's own code under
#: torch.compile]): every frame dynamo may start on while a segment runs.
_OWN_CODE = ("__call__", "_run", "_checkpointed", "_chunked", "_in_own_graph", "_graph_of_its_own")


def runner_class(index: int) -> type[SegmentRunner]:
    """A subclass of :class:`SegmentRunner` for segment ``index`` whose :data:`_OWN_CODE`
    functions have code objects of their own; ``SegmentRunner(index, ...)`` makes one each
    time, so a caller making a runner a call keeps one class."""
    return class_of_its_own(SegmentRunner, f"segment_{index}", _OWN_CODE)


_T = TypeVar("_T")


def class_of_its_own(base: type[_T], label: str, names: Sequence[str]) -> type[_T]:
    """A subclass of ``base`` whose functions ``names`` (static methods too) are copies with
    code objects of their own (:func:`own_code`), named for ``label``."""
    functions: dict[str, Any] = {}
    for name in names:
        function = base.__dict__[name]
        if isinstance(function, staticmethod):
            functions[name] = staticmethod(own_code(function.__func__, label))
        else:
            functions[name] = own_code(function, label)
    return type(f"{base.__name__}_{label}", (base,), functions)


def own_code(function: Callable[..., Any], label: str) -> Callable[..., Any]:
    """``function`` with a code object of its own, and of their own for the functions defined
    in it (its lambdas), their qualified names ending in ``label``: dynamo keeps its compiled
    entries, and counts recompiles, per code object."""
    code = _code_copy(function.__code__, label)
    copy = types.FunctionType(
        code, function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = code.co_qualname
    copy.__module__ = function.__module__
    copy.__doc__ = function.__doc__
    return copy


def _code_copy(code: types.CodeType, label: str) -> types.CodeType:
    constants = tuple(
        _code_copy(constant, label) if isinstance(constant, types.CodeType) else constant
        for constant in code.co_consts
    )
    # The name too: code objects that compare equal are taken for one another where dynamo
    # builds the bytecode of a frame it resumes (a lambda of one segment stood for all).
    return code.replace(
        co_consts=constants,
        co_name=f"{code.co_name}_{label}",
        co_qualname=f"{code.co_qualname}_{label}",
    )


@contextlib.contextmanager
def buffers_restored(modules: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Put the buffers of ``modules`` back as they were on exit (recompute must not update them)."""
    saved = [
        (buffer, buffer.detach().clone())
        for module in modules
        for buffer in module.buffers(recurse=False)
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def build_segmented_module(
    graph_module: fx.GraphModule,
    segments: Sequence[Segment],
    actions: Sequence[SegmentAction],
    *,
    observer: SegmentObserver | None = None,
) -> fx.GraphModule:
    """The traced graph with each recomputed segment replaced by a runner call.

    Args:
        graph_module: the traced model (its root holds the parameters).
        segments: the chain, covering every compute node in order.
        actions: one per segment.
        observer: when given, every segment (kept ones too) runs through a runner that reports
            to it; the planner uses this to measure.

    Returns:
        A module with the traced model's call signature, sharing its parameters.
    """
    assert len(segments) == len(actions), "one action per segment"
    source = graph_module.graph
    nodes_by_name = {node.name: node for node in source.nodes}
    segment_of: dict[str, int] = {
        name: segment.index for segment in segments for name in segment.node_names
    }
    graph = fx.Graph()
    # The code generator rebuilds the model's output types (NOTE [Output structure]); fx
    # offers no public getter for it.
    graph.set_codegen(source._codegen)
    env: dict[str, fx.Node] = {}

    def lookup(node: fx.Node) -> fx.Node:
        if node.name not in env:
            # get_attr nodes are copied where first needed.
            env[node.name] = graph.node_copy(node, lookup)
        return env[node.name]

    emitted: set[int] = set()
    for node in source.nodes:
        if node.op == "placeholder":
            env[node.name] = graph.node_copy(node, lookup)
        elif node.op == "output":
            graph.node_copy(node, lookup)
        elif node.op in COMPUTE_OPS:
            index = segment_of[node.name]
            action = actions[index]
            if not action.recompute and action.region_fraction is None and observer is None:
                env[node.name] = graph.node_copy(node, lookup)
            elif index not in emitted:
                emitted.add(index)
                segment = segments[index]
                runner = SegmentRunner(
                    index,
                    _segment_module(graph_module, segment, nodes_by_name),
                    action,
                    _stateful_modules(graph_module, segment, nodes_by_name),
                    observer,
                )
                call = graph.call_function(
                    runner, tuple(lookup(nodes_by_name[name]) for name in segment.input_names)
                )
                for position, name in enumerate(segment.output_names):
                    env[name] = graph.call_function(operator.getitem, (call, position))
    planned = fx.GraphModule(graph_module, graph, class_name=type(graph_module).__name__)
    return planned


def _segment_module(
    graph_module: fx.GraphModule, segment: Segment, nodes_by_name: dict[str, fx.Node]
) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for name in segment.input_names:
        env[name] = graph.placeholder(name)

    def lookup(node: fx.Node) -> fx.Node:
        if node.name not in env:
            assert node.op == "get_attr", f"{node.name} is read before it is computed"
            env[node.name] = graph.node_copy(node, lookup)
        return env[node.name]

    for name in segment.node_names:
        env[name] = graph.node_copy(nodes_by_name[name], lookup)
    graph.output(tuple(env[name] for name in segment.output_names))
    return fx.GraphModule(graph_module, graph, class_name=f"Segment{segment.index}")


def _stateful_modules(
    graph_module: fx.GraphModule, segment: Segment, nodes_by_name: dict[str, fx.Node]
) -> list[torch.nn.Module]:
    """Modules whose buffers the segment may write in forward: those it calls (and their
    children: a module kept whole may hold BatchNorm) and those whose buffers it reads
    (``F.batch_norm(x, self.running_mean, ...)`` written out, NOTE [In-place writes])."""
    modules: dict[int, torch.nn.Module] = {}
    for name in segment.node_names:
        node = nodes_by_name[name]
        if node.op == "call_module":
            for module in graph_module.get_submodule(str(node.target)).modules():
                if any(True for _ in module.buffers(recurse=False)):
                    modules[id(module)] = module
        for arg in node.all_input_nodes:
            owner_path, _, attribute = str(arg.target).rpartition(".")
            owner = graph_module.get_submodule(owner_path) if arg.op == "get_attr" else None
            if owner is not None and attribute in owner._buffers:
                modules[id(owner)] = owner
    return list(modules.values())


def adopt_state_of(planned: torch.nn.Module, original: torch.nn.Module) -> None:
    """Give ``planned`` exactly ``original``'s ``state_dict()`` keys, sharing the tensors.

    The traced module only holds the attributes its forward reads; a parameter the forward
    never uses would otherwise be missing, and fx registers every buffer as persistent.
    """
    expected = original.state_dict(keep_vars=True)
    present = planned.state_dict(keep_vars=True)
    for name, tensor in expected.items():
        if name not in present:
            owner_path, _, attribute = name.rpartition(".")
            owner = _ensure_module_path(planned, owner_path)
            if isinstance(tensor, torch.nn.Parameter):
                owner.register_parameter(attribute, tensor)
            else:
                owner.register_buffer(attribute, tensor)
    for name in set(present) - set(expected):
        owner_path, _, attribute = name.rpartition(".")
        owner = planned.get_submodule(owner_path)
        if attribute in owner._buffers:
            owner._non_persistent_buffers_set.add(attribute)
    # fx registers attributes in the order the graph first uses them; put them back in the
    # original's order so state_dict() lists the keys the same way.
    for path, module in original.named_modules(remove_duplicate=False):
        try:
            counterpart = planned.get_submodule(path)
        except AttributeError:
            continue
        for table in ("_modules", "_parameters", "_buffers"):
            ours: dict[str, object] = getattr(counterpart, table)
            theirs: dict[str, object] = getattr(module, table)
            order = [key for key in theirs if key in ours]
            order += [key for key in ours if key not in theirs]
            reordered = {key: ours[key] for key in order}
            ours.clear()
            ours.update(reordered)


def _ensure_module_path(root: torch.nn.Module, path: str) -> torch.nn.Module:
    module = root
    for part in path.split(".") if path else []:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    return module


def collect_segment_grad_fns(
    inputs: Sequence[Any], outputs: Any, visit: Callable[[Any], None]
) -> None:
    """Call ``visit`` on every autograd node between a segment's outputs and its inputs."""
    stop = {
        value.grad_fn
        for value in inputs
        if isinstance(value, torch.Tensor) and value.grad_fn is not None
    }
    pending: list[Any] = [t.grad_fn for t in flat_tensors(outputs) if t.grad_fn is not None]
    seen: set[int] = set()
    while pending:
        grad_fn = pending.pop()
        if grad_fn is None or id(grad_fn) in seen or grad_fn in stop:
            continue
        seen.add(id(grad_fn))
        if type(grad_fn).__name__ == "AccumulateGrad":
            continue
        visit(grad_fn)
        pending.extend(next_fn for next_fn, _ in grad_fn.next_functions)
