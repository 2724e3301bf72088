"""What a forward does to autograd, kept in the traced graph: custom autograd Functions, and
grad-mode and autocast regions.

NOTE [Autograd in the traced graph]
torch.fx records the tensor operations a forward calls and nothing else. Three things a forward
can do change what backward computes without being tensor operations, and plain fx drops all
three, silently:

- a custom ``torch.autograd.Function``: fx traces through ``Function.apply`` and records its
  forward's operations, so the traced model takes the gradient of that forward instead of the
  backward the user wrote (a gradient reversal layer's gradients come out with the wrong sign,
  a straight-through estimator's get clamp's);
- a ``torch.no_grad``, ``enable_grad``, ``set_grad_enabled`` or ``inference_mode`` region: its
  operations are recorded like any other, so the traced model takes gradients through it (a
  frozen teacher computed under ``no_grad`` gets gradients, and an optimizer updates it);
- a ``torch.autocast`` region: its operations run at the precision around the model (float32
  where the user asked for bfloat16: other values, twice the memory and the time).

While a model is traced, :func:`recording_autograd` stands in for these calls. A Function called
on traced values becomes one node that calls its ``apply`` (a leaf: its forward and the backward
the user wrote run as written, whether the segment that holds it is kept, recomputed or run in
chunks). Each region's entry and exit become nodes that switch the mode and restore the one
they found, as the context managers do: a model run under ``no_grad`` for evaluation is still
under it after a region. The cut points never fall inside a region (:func:`cuts_inside_regions`),
so a segment recomputed in backward enters and leaves each region it holds, as the forward did
(torch's checkpoint runs the recompute under ``enable_grad`` and the autocast state of the
forward; the region's own nodes then switch as the forward did). A segment holding any of these
nodes is not offered a selective recompute (NOTE [Selective recompute]): its policy sees the
Function's operations, not the Function.

A forward's own ``torch.utils.checkpoint`` calls are a fourth thing, which changes no gradient:
the reentrant kind is a Function and is kept so; the non-reentrant kind (``use_reentrant=False``,
torch's advice) is no Function, fx traces through it, and the traced model runs the checkpointed
code as plain operations. Recomputing is the plan's to decide, so that is kept, but said: the
nodes each such call made are marked (``USER_CHECKPOINT_META``) and the plan's notes count the
calls, because the plain step the plan reports and predicts against is then the model without
them, not the one the user runs (the zoo's ``self_checkpointed``: 1.42x predicted against that
plain step, 1.01x against the user's own).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx
import torch.utils.checkpoint
from torch.autograd import grad_mode
from torch.utils._pytree import tree_leaves

#: Attribute naming, on the function a Function's node calls, the Function class it applies.
FUNCTION_CLASS_ATTRIBUTE = "autograd_function_class"
#: The generator a non-reentrant ``torch.utils.checkpoint`` call runs around its function, by
#: its name in each torch version, newest first (torch 2.15 calls the first, 2.13-2.14 the second).
CHECKPOINT_GENERATORS = (
    "_checkpoint_without_reentrant_generator_impl",
    "_checkpoint_without_reentrant_generator",
)
#: Key, in the meta of a node a forward's own non-reentrant checkpoint call made, of that call's
#: number (NOTE [Autograd in the traced graph]).
USER_CHECKPOINT_META = "user_checkpoint"


def enter_grad_mode(enabled: bool) -> bool:
    """Switch gradient recording on or off; the mode it found, for :func:`exit_grad_mode`."""
    previous = torch.is_grad_enabled()
    torch._C._set_grad_enabled(enabled)
    return previous


def exit_grad_mode(previous: bool) -> None:
    """Restore the gradient mode :func:`enter_grad_mode` found."""
    torch._C._set_grad_enabled(previous)


def enter_inference_mode(enabled: bool) -> Any:
    """Enter ``torch.inference_mode(enabled)``; the context, for :func:`exit_inference_mode`."""
    context = torch._C._InferenceMode(enabled)
    context.__enter__()
    return context


def exit_inference_mode(context: Any) -> None:
    """Leave the inference mode :func:`enter_inference_mode` entered."""
    context.__exit__(None, None, None)


def enter_autocast(
    device_type: str, dtype: torch.dtype | None, enabled: bool, cache_enabled: bool | None
) -> torch.autocast:
    """Enter ``torch.autocast`` with these settings; the region, for :func:`exit_autocast`."""
    region = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    region.__enter__()
    return region


def exit_autocast(region: torch.autocast) -> None:
    """Leave the autocast region :func:`enter_autocast` entered, restoring what it found."""
    region.__exit__(None, None, None)


ENTERS = frozenset({enter_grad_mode, enter_inference_mode, enter_autocast})
EXITS = frozenset({exit_grad_mode, exit_inference_mode, exit_autocast})


def changes_autograd(node: fx.Node) -> bool:
    """Whether ``node`` enters or leaves a region, or applies a custom Function."""
    if node.op != "call_function":
        return False
    return node.target in ENTERS or node.target in EXITS or _applied_class(node) is not None


def _applied_class(node: fx.Node) -> type | None:
    return getattr(node.target, FUNCTION_CLASS_ATTRIBUTE, None)


def applied_functions(graph: fx.Graph) -> list[str]:
    """The names of the custom Function classes the graph applies as leaves, in order."""
    names = (_applied_class(node) for node in graph.nodes if node.op == "call_function")
    return list(dict.fromkeys(cls.__name__ for cls in names if cls is not None))


def region_kinds(graph: fx.Graph) -> list[str]:
    """The kinds of region the graph enters (``no_grad``, ``autocast``, ...), in order."""
    kinds = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in ENTERS:
            continue
        if node.target is enter_autocast:
            kinds.append(f"autocast({node.args[1]})")
        elif node.target is enter_inference_mode:
            kinds.append("inference_mode")
        else:
            kinds.append("enable_grad" if node.args[0] else "no_grad")
    return list(dict.fromkeys(kinds))


def autograd_notes(graph: fx.Graph) -> tuple[str, ...]:
    """What the plan says of the Functions and regions the graph keeps and of the forward's own
    checkpoint calls traced through (NOTE [Autograd in the traced graph])."""
    notes = []
    if functions := applied_functions(graph):
        notes.append(
            "custom autograd Functions kept as one call each, with their own backward: "
            + ", ".join(functions)
        )
    if regions := region_kinds(graph):
        notes.append(f"{', '.join(regions)} regions inside forward kept, never cut")
    if calls := own_checkpoint_calls(graph):
        notes.append(
            f"forward calls torch.utils.checkpoint itself ({calls} "
            f"{'call' if calls == 1 else 'calls'}, use_reentrant=False): traced through, "
            "so the plan decides what is recomputed; the plain step's peak here is the model's "
            "without those checkpoints, and its time too where the step is not timed"
        )
    return tuple(notes)


def own_checkpoint_calls(graph: fx.Graph) -> int:
    """How many non-reentrant torch.utils.checkpoint calls of the forward the graph traced
    through (NOTE [Autograd in the traced graph])."""
    return len(
        {n.meta[USER_CHECKPOINT_META] for n in graph.nodes if USER_CHECKPOINT_META in n.meta}
    )


def cuts_inside_regions(compute_nodes: Sequence[fx.Node]) -> set[int]:
    """Cut positions (a cut at ``p`` falls between compute nodes ``p - 1`` and ``p``) inside a
    region: after its entry, up to and including its exit; to the end of the graph for an entry
    that nothing exits (``torch.set_grad_enabled(False)`` called as a function)."""
    position = {node: i for i, node in enumerate(compute_nodes)}
    forbidden: set[int] = set()
    for node in compute_nodes:
        if node.op != "call_function" or node.target not in ENTERS:
            continue
        exits = [position[user] for user in node.users if user.target in EXITS]
        end = max(exits, default=len(compute_nodes) - 1)
        forbidden.update(range(position[node] + 1, end + 1))
    return forbidden


@contextlib.contextmanager
def recording_autograd(tracer: fx.Tracer) -> Iterator[None]:
    """While ``tracer`` traces, record custom Functions and grad-mode and autocast regions as
    nodes (NOTE [Autograd in the traced graph]); everything is put back on exit."""
    patches = _patches(tracer)
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    try:
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _traces(values: Any) -> bool:
    return any(isinstance(leaf, fx.Proxy) for leaf in tree_leaves(values))


def _patches(tracer: fx.Tracer) -> list[tuple[type | ModuleType, str, Any]]:
    """The methods and functions replaced while tracing, as (class or module, name,
    replacement)."""

    def node(target: Callable[..., Any], *args: Any) -> fx.Proxy:
        return tracer.create_proxy("call_function", target, args, {})

    def region(enter: Callable[[Any], Any], enabled: Callable[[Any], bool]) -> tuple[Any, Any]:
        def entered(self: Any) -> None:
            self._traced_entry = node(enter, enabled(self))

        def left(self: Any, *_: Any) -> None:
            node(EXIT_OF[enter], self._traced_entry)

        return entered, left

    def grad_mode_set(self: Any, mode: bool) -> None:
        # set_grad_enabled switches when made (it works called as a function, too), and again
        # on __enter__; its __exit__ restores the mode it found. While tracing, none of them
        # switches the real mode: each is a node.
        self.prev, self.mode = True, mode
        self._traced_entry = node(enter_grad_mode, mode)

    def autocast_entered(self: torch.autocast) -> torch.autocast:
        settings = (self.device, self.fast_dtype, self._enabled, self._cache_enabled)
        self._traced_entry = node(enter_autocast, *settings)  # type: ignore[attr-defined]
        return self

    def autocast_left(self: torch.autocast, *_: Any) -> None:
        node(exit_autocast, self._traced_entry)  # type: ignore[attr-defined]

    callers: dict[type, Callable[..., Any]] = {}
    # A classmethod written in Python up to torch 2.14, one written in C (no ``__func__``)
    # from 2.15: bound through the descriptor, either calls the original for ``cls``.
    original_apply = torch.autograd.Function.__dict__["apply"]

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if not _traces((args, kwargs)):
            return original_apply.__get__(None, cls)(*args, **kwargs)
        if cls not in callers:
            callers[cls] = _function_caller(cls)
        return tracer.create_proxy("call_function", callers[cls], args, kwargs)

    checkpoints = [0]

    def marking(original: Callable[..., Iterator[None]]) -> Callable[..., Iterator[None]]:
        def checkpointed(fn: Any, *args: Any, **kwargs: Any) -> Iterator[None]:
            # torch's checkpoint runs this generator's first step, the function, then its
            # second: the nodes made in between are the checkpointed code's.
            inner = original(fn, *args, **kwargs)
            next(inner)
            before = next(reversed(tracer.graph.nodes), None)
            yield
            if _traces((args, kwargs)):
                checkpoints[0] += 1
                node = before.next if before is not None else next(iter(tracer.graph.nodes), None)
                while node is not None and node.op != "root":
                    node.meta[USER_CHECKPOINT_META] = checkpoints[0]
                    node = node.next
            with contextlib.suppress(StopIteration):
                next(inner)

        return checkpointed

    # Private and renamed across torch versions: the one this torch's checkpoint calls (none
    # found: no note, nothing else changes).
    checkpoint_module = torch.utils.checkpoint
    generators = [
        (checkpoint_module, name, marking(checkpoint_module.__dict__[name]))
        for name in CHECKPOINT_GENERATORS
        if name in checkpoint_module.__dict__
    ][:1]

    no_grad_in, no_grad_out = region(enter_grad_mode, lambda _: False)
    enable_in, enable_out = region(enter_grad_mode, lambda _: True)
    inference_in, inference_out = region(enter_inference_mode, lambda self: self.mode)
    return [
        (grad_mode.no_grad, "__enter__", no_grad_in),
        (grad_mode.no_grad, "__exit__", no_grad_out),
        (grad_mode.enable_grad, "__enter__", enable_in),
        (grad_mode.enable_grad, "__exit__", enable_out),
        (grad_mode.set_grad_enabled, "__init__", grad_mode_set),
        (grad_mode.set_grad_enabled, "__enter__", lambda self: None),
        (grad_mode.set_grad_enabled, "__exit__", no_grad_out),
        (grad_mode.inference_mode, "__enter__", inference_in),
        (grad_mode.inference_mode, "__exit__", inference_out),
        (torch.amp.autocast_mode.autocast, "__enter__", autocast_entered),
        (torch.amp.autocast_mode.autocast, "__exit__", autocast_left),
        (torch.autograd.Function, "apply", classmethod(apply)),
        *generators,
    ]


EXIT_OF: dict[Callable[..., Any], Callable[..., Any]] = {
    enter_grad_mode: exit_grad_mode,
    enter_inference_mode: exit_inference_mode,
}


def _function_caller(cls: type) -> Callable[..., Any]:
    """The target of a node that applies the Function ``cls``: fx names it in the graph's code
    (``apply_GradientReversal(x)``) and calls it as any function."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return cls.apply(*args, **kwargs)  # type: ignore[attr-defined]

    call.__name__ = call.__qualname__ = f"apply_{cls.__name__}"
    setattr(call, FUNCTION_CLASS_ATTRIBUTE, cls)
    return call
