"""Naming the operation that mixes samples, once the probe found that something does.

The probe (:mod:`autockpt.planner.measure.separability`) knows only that a model's outputs for a few
samples differ from those of each sample run alone. To say *what* mixes them, the model is
run again on the same probe batches, one operation at a time, and the culprit is the first
operation whose inputs all agree sample by sample while its output does not (or that fails
on a single sample, as BatchNorm1d does in training). Values with no tensor among their
inputs (``torch.arange(x.shape[0])``) cannot mix samples and count as agreeing.

* A traced model is run node by node: every probe run advances through the graph in
  lockstep, and each value is freed after its last use, so the search holds what one
  forward holds.
* A model that does not trace is run with forward hooks on every submodule, recording each
  call's inputs and outputs; the culprit is the first call to finish (so the innermost
  module) whose inputs agree and outputs do not. An operation the forward runs outside any
  submodule is reported as the forward of the module that runs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from autockpt.planner.measure.per_sample_probe import agrees, tensors_in

_MIXES = "mixes samples"


def first_mixing_node(graph_module: fx.GraphModule, runs: Sequence[Sequence[Any]]) -> str | None:
    """Which node of ``graph_module`` mixes samples first ("BatchNorm2d at layer1.0.bn1
    mixes samples"), or None when no single node does.

    Args:
        graph_module: the traced model (a probe's copy: it runs several times).
        runs: the positional inputs of each probe run: the larger batch, the smaller batch,
            then each sample of the larger one alone.
    """
    interpreters = [fx.Interpreter(graph_module, garbage_collect_values=True) for _ in runs]
    for interpreter, args in zip(interpreters, runs, strict=True):
        interpreter.env = {}
        interpreter.args_iter = iter(graph_module.graph.process_inputs(*args))
    agreeing: dict[fx.Node, bool] = {}
    for node in graph_module.graph.nodes:
        if node.op == "output":
            return None
        inputs = [n for n in node.all_input_nodes if tensors_in(interpreters[0].env[n])]
        values = []
        for interpreter in interpreters:
            try:
                value = interpreter.run_node(node)
            except Exception as error:  # it refuses one sample (BatchNorm1d in training)
                return f"{describe_node(graph_module, node)} {_MIXES} ({_fails(error)})"
            interpreter.env[node] = value
            values.append(value)
        ok = not inputs or agrees(values[0], values[1], values[2:], unbatched="equal")
        if not ok and all(agreeing[n] for n in inputs):
            return f"{describe_node(graph_module, node)} {_MIXES}"
        agreeing[node] = ok
        for interpreter in interpreters:
            for dead in interpreter.user_to_last_uses.get(node, []):
                del interpreter.env[dead]
    return None


def describe_node(graph_module: fx.GraphModule, node: fx.Node) -> str:
    """``BatchNorm2d at layer1.0.bn1`` for a module call, ``Tensor.mean (node mean_1) in
    blocks.2`` for an operation."""
    if node.op == "call_module":
        module = graph_module.get_submodule(str(node.target))
        return f"{type(module).__name__} at {node.target}"
    if node.op == "call_method":
        what = f"Tensor.{node.target}"
    else:
        what = getattr(node.target, "__name__", str(node.target))
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    where = f"in {path}" if path else "in the model's forward"
    return f"{what} (node {node.name}) {where}"


@dataclass
class _Call:
    path: str
    kind: str
    inputs: Any = None
    outputs: Any = None
    finished: int = -1


@dataclass
class _Recording:
    calls: list[_Call] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    num_finished: int = 0
    failed_in: int | None = None
    error: BaseException | None = None


def first_mixing_call(model: torch.nn.Module, runs: Sequence[Sequence[Any]]) -> str | None:
    """Which module call of ``model`` mixes samples first, the innermost ("BatchNorm2d at
    layer1.0.bn1 mixes samples"), or None when no single call does.

    Args:
        model: a probe's copy of the model (its buffers may change).
        runs: as for :func:`first_mixing_node`.
    """
    recordings = [_record(model, args) for args in runs]
    for recording in recordings:
        if recording.failed_in is not None:
            call = recording.calls[recording.failed_in]
            return f"{_describe_call(model, call)} {_MIXES} ({_fails(recording.error)})"
    reference = recordings[0].calls
    if any([c.path for c in r.calls] != [c.path for c in reference] for r in recordings[1:]):
        return None  # the runs took different paths through the model: nothing to line up
    for index in sorted(range(len(reference)), key=lambda i: reference[i].finished):
        calls = [recording.calls[index] for recording in recordings]
        inputs_agree = agrees(
            calls[0].inputs, calls[1].inputs, [c.inputs for c in calls[2:]], unbatched="equal"
        )
        outputs_agree = agrees(
            calls[0].outputs, calls[1].outputs, [c.outputs for c in calls[2:]], unbatched="equal"
        )
        if inputs_agree and not outputs_agree:
            return f"{_describe_call(model, reference[index])} {_MIXES}"
    return None


def _record(model: torch.nn.Module, args: Sequence[Any]) -> _Recording:
    recording = _Recording()

    def started(path: str, module: torch.nn.Module, inputs: Any, kwargs: Any) -> None:
        recording.running.append(len(recording.calls))
        recording.calls.append(_Call(path, type(module).__name__, _copied((inputs, kwargs))))

    def finished(module: torch.nn.Module, inputs: Any, kwargs: Any, outputs: Any) -> None:
        call = recording.calls[recording.running.pop()]
        call.outputs = _copied(outputs)
        call.finished = recording.num_finished
        recording.num_finished += 1

    with _hooks(model, started, finished):
        try:
            model(*args)
        except Exception as error:  # it refuses one sample: name where
            recording.failed_in = recording.running[-1] if recording.running else 0
            recording.error = error
    return recording


@contextlib.contextmanager
def _hooks(model: torch.nn.Module, started: Any, finished: Any) -> Iterator[None]:
    handles = []
    for path, module in model.named_modules():
        handles.append(
            module.register_forward_pre_hook(
                lambda m, a, k, p=path: started(p, m, a, k), with_kwargs=True
            )
        )
        handles.append(module.register_forward_hook(finished, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _copied(value: Any) -> Any:
    """Detached copies of the tensors in ``value`` (later in-place ops must not change them)."""
    return [t.detach().clone() for t in tensors_in(value)]


def _describe_call(model: torch.nn.Module, call: _Call) -> str:
    if call.path:
        return f"{call.kind} at {call.path}"
    return f"an operation in the forward of {type(model).__name__} itself"


def _fails(error: BaseException | None) -> str:
    return f"it refuses a single sample: {type(error).__name__}"
