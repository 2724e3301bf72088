"""The linear layer whose output is the model's output, and the graph cut just before it.

NOTE [Loss over positions in chunks]
A language model's last layer maps each position's features to a score for every word of its
vocabulary. At one sequence of 2048 tokens and 32000 words the scores alone are 250 MiB; a
cross-entropy over them keeps as many bytes again for backward (its log-probabilities) and makes
two more of that size in backward (their gradient, then the scores'). With one sequence there
is no batch to split, and recomputing the layers upstream leaves all of it: a Llama-style
decoder of 4 layers of width 256 peaked at 1147 MiB and could not be planned under 974 MiB
(with the loss in chunks and its layers recomputed, 361 MiB).

Where the loss adds up one term per position (a mean or a sum over positions, ignored labels
and label smoothing included), the head and the loss can run together in chunks of positions:
each chunk's scores, its loss and their gradients are computed in forward and the scores
dropped before the next chunk (NOTE [Gradients in forward]), so at most one chunk's scores
exist at a time. The chunks' losses, each weighted by its share of the whole
(:mod:`autockpt.planner.runtime.chunked_loss`), add up to the loss of the whole.

Which heads: the model's output, or one tensor of the structure it returns (a Hugging Face
``CausalLMOutput``'s logits, a dict's, a tuple's), must be the output of one ``nn.Linear`` that
nothing else in the forward reads (a causal language model's logits); where several are, the
widest (the vocabulary). The step is then planned as
the model's graph cut before that layer, returning the layer's input with its weight and bias,
and the loss as the head and the user's loss run in chunks. A model torch.fx does not trace (or
keeps a large submodule of whole) is cut as a module instead
(:mod:`autockpt.planner.runtime.head_cut`), its head found by a forward on fake tensors: the
``nn.Linear`` whose output tensor is the model's (or in it), nothing run or written after it. Chunks make
at most ``CHUNK_SCORES_BYTES`` of scores each, and there are at least ``MIN_LOSS_CHUNKS``. That the loss adds up over
positions, and how (:class:`~autockpt.planner.measure.loss_positions.LossOverPositions`), is
established by experiment, as batch separability is: a loss that shifts its labels by a
position, or normalises over the whole sequence, is not chunked.

It is a step-level action, like micro-batches: :func:`autockpt.training_step` runs it. The
planned model called directly while it trains returns the whole scores (its output, as the
model's), computed from the same cut graph; in eval it runs the model's own forward.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map_only

from autockpt.planner.core.fake_copies import fake_copy
from autockpt.planner.core.fake_mode import PlanningFakeMode
from autockpt.planner.core.output_structure import (
    OutputSlot,
    OutputStructure,
    RebuildingCodeGen,
    flatten_output,
)
from autockpt.planner.core.train_eval import training_mode


@dataclass(frozen=True)
class OutputHead:
    """The ``nn.Linear`` whose output is the model's output.

    Attributes:
        node: its node in the traced graph ("" when found by running the model).
        path: its module path (``"lm_head"``).
        input_node: the node of the features it maps (the head's input; "" when found by
            running the model).
        logits_features: its ``out_features`` (the vocabulary of a language model).
        has_bias: whether it adds a bias.
        leaf: its output's place among the tensors (and other values) of the structure the
            model returns (:mod:`autockpt.planner.core.output_structure`); ``None``: the
            model returns it alone.
        structure: that structure (``None`` with ``leaf``).
    """

    node: str
    path: str
    input_node: str
    logits_features: int
    has_bias: bool
    leaf: int | None = None
    structure: OutputStructure | None = None

    @property
    def slot(self) -> OutputSlot | None:
        """Where the scores sit in the model's output, for the loss."""
        if self.leaf is None or self.structure is None:
            return None
        return OutputSlot(self.structure, self.leaf)


def find_output_head(model: torch.nn.Module, graph: fx.Graph) -> OutputHead | str:
    """The head of ``model`` (traced into ``graph``), or why it has none that chunks can take."""
    output = next(node for node in graph.nodes if node.op == "output")
    structure = graph._codegen.structure if isinstance(graph._codegen, RebuildingCodeGen) else None
    leaves = list(output.args[0]) if structure is not None else [output.args[0]]
    found = [
        (index, node)
        for index, node in enumerate(leaves)
        if isinstance(node, fx.Node)
        and node.op == "call_module"
        and type(model.get_submodule(str(node.target))) is torch.nn.Linear
    ]
    if not found:
        last = leaves[-1] if structure is None else None
        if isinstance(last, fx.Node) and last.op == "call_module":
            module = model.get_submodule(str(last.target))
            return f"its output comes from {type(module).__name__}, not from an nn.Linear"
        return "no tensor of its output is the output of an nn.Linear"
    # The widest: a language model's vocabulary, beside any smaller head it returns too.
    index, last = max(
        found, key=lambda item: (model.get_submodule(str(item[1].target)).out_features, item[0])
    )
    module = model.get_submodule(str(last.target))
    assert isinstance(module, torch.nn.Linear)
    if len(last.users) != 1 or leaves.count(last) != 1 or len(last.args) != 1 or last.kwargs:
        return f"the output of {last.target} is read inside the forward too"
    features = last.args[0]
    if not isinstance(features, fx.Node):
        return f"{last.target} maps a constant"
    return OutputHead(
        node=last.name,
        path=str(last.target),
        input_node=features.name,
        logits_features=module.out_features,
        has_bias=module.bias is not None,
        leaf=index if structure is not None else None,
        structure=structure,
    )


def find_head_by_running(model: torch.nn.Module, example_inputs: Sequence[Any]) -> OutputHead | str:
    """The head of a model torch.fx does not trace, found by one forward on fake tensors: the
    ``nn.Linear`` whose output tensor is the model's output, called last and not written after;
    or why there is none."""
    mode = PlanningFakeMode()
    copied = fake_copy(model, mode)
    outputs: dict[str, tuple[torch.Tensor, int]] = {}
    order: list[str] = []

    def record(path: str) -> Any:
        def hook(_: torch.nn.Module, __: Any, output: Any) -> None:
            order.append(path)
            if isinstance(output, torch.Tensor):
                outputs[path] = (output, output._version)

        return hook

    handles = [
        module.register_forward_hook(record(path))
        for path, module in copied.named_modules()
        if path
    ]
    try:
        with mode, torch.no_grad(), training_mode(copied):
            inputs = tree_map_only(torch.Tensor, mode.from_tensor, list(example_inputs))
            output = copied(*inputs)
    except Exception as error:  # a forward that needs real values: no head found this way
        return f"its forward does not run on fake tensors ({type(error).__name__})"
    finally:
        for handle in handles:
            handle.remove()
    leaves, structure = flatten_output(output)
    made = {
        index: [path for path, (tensor, _) in outputs.items() if tensor is leaf]
        for index, leaf in enumerate(leaves)
        if isinstance(leaf, torch.Tensor)
    }
    heads = [
        (index, paths[-1])
        for index, paths in made.items()
        if paths and type(model.get_submodule(paths[-1])) is torch.nn.Linear
    ]
    if not heads:
        paths = [paths[-1] for paths in made.values() if paths]
        if isinstance(output, torch.Tensor) and paths:
            module = model.get_submodule(paths[0])
            return f"its output comes from {type(module).__name__}, not from an nn.Linear"
        return "no tensor of its output is the output of an nn.Linear"
    # The widest: a language model's vocabulary, beside any smaller head it returns too.
    leaf, path = max(heads, key=lambda item: (model.get_submodule(item[1]).out_features, item[0]))
    module = model.get_submodule(path)
    assert isinstance(module, torch.nn.Linear)
    if sum(leaf_value is leaves[leaf] for leaf_value in leaves) != 1:
        return f"the output of {path} is returned twice"
    # Calls finish inner first: after the head, only the modules it sits in may finish.
    after = order[len(order) - order[::-1].index(path) :]
    if any(not path.startswith(f"{other}.") for other in after):
        return f"submodules run after {path}"
    if outputs[path][1] != leaves[leaf]._version:
        return f"the output of {path} is written after it"
    return OutputHead(
        node="",
        path=path,
        input_node="",
        logits_features=module.out_features,
        has_bias=module.bias is not None,
        leaf=None if isinstance(output, torch.Tensor) else leaf,
        structure=None if isinstance(output, torch.Tensor) else structure,
    )


def cut_before_head(graph: fx.Graph, head: OutputHead) -> fx.Graph:
    """A copy of ``graph`` without ``head``'s node, returning ``(features, weight, bias,
    *others)``: the head's input, its parameters (``bias`` None when it has none), and the
    other values of the model's output in order (``head.structure`` rebuilds it)."""
    cut = copy.deepcopy(graph)
    nodes = {node.name: node for node in cut.nodes}
    output = next(node for node in cut.nodes if node.op == "output")
    leaves = list(output.args[0]) if head.leaf is not None else [output.args[0]]
    others = [leaf for index, leaf in enumerate(leaves) if index != head.leaf]
    with cut.inserting_before(output):
        weight = cut.get_attr(f"{head.path}.weight")
        bias = cut.get_attr(f"{head.path}.bias") if head.has_bias else None
    output.args = (
        (nodes[head.input_node], weight, bias, *(others if head.leaf is not None else ())),
    )
    cut.erase_node(nodes[head.node])
    cut.set_codegen(fx.graph.CodeGen())  # a flat tuple; the output is rebuilt around the head
    cut.lint()
    return cut


def output_around(head: OutputHead, cut_output: Sequence[Any]) -> Any:
    """The model's output from its cut graph's ``(features, weight, bias, *others)``: the
    head applied, in its place among the others."""
    scores = torch.nn.functional.linear(*cut_output[:3])
    if head.leaf is None or head.structure is None:
        return scores
    leaves = list(cut_output[3:])
    leaves.insert(head.leaf, scores)
    return head.structure.rebuild(leaves)
