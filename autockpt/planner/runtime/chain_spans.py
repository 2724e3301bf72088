"""Recomputing a run of module calls as one: the module chain's spans.

NOTE [Module spans]
On the module chain (NOTE [Module chain]) a link recomputed on its own is one
``torch.utils.checkpoint`` call, which keeps the link's inputs until backward. In a chain of
links whose only saved tensors are their inputs (a ``Linear`` after a ``Linear``), each input is
the output of the link before, so recomputing the links one by one saves nothing: every saved
tensor becomes a kept input. A *span* recomputes consecutive links as one: only what enters
it from outside is kept, and backward rebuilds the whole span at once, as an fx region does.

The links are called by the model's own forward, one at a time, with whatever Python runs
between them (the *glue*), so a span is not one function that ``checkpoint`` could run. It does
what non-reentrant checkpoint does, over several calls:

- *Forward.* Each link runs under ``saved_tensors_hooks`` whose pack hook keeps no tensor, only
  its place in the span's order; the glue runs outside them and saves what it saves. Each
  argument of a link is recorded by where it came from: a tensor an earlier link of the span
  returned (the same tensor object, not written in place since), which is not kept, or anything
  else (an input of the span, a tensor the glue computed), which is kept, as checkpoint keeps
  its inputs. The RNG and autocast states before each link are kept too.
- *Backward.* The first unpack reruns the span's links in order, from the kept arguments and
  the outputs it recomputes, each with its RNG and autocast state, and puts the buffers back
  afterwards (NOTE [Segment runners]). What the rerun saves is handed out in the forward's
  order, each tensor dropped once unpacked; a second backward through the same graph reruns
  the span again. A rerun that saves a different number of tensors raises.

So the glue may do anything: a link fed by a tensor the glue computed keeps that input (in
effect the span is cut there), and what the glue saves stays saved. In eval, under
``no_grad`` and while ``torch.compile`` traces (dynamo traces ``checkpoint``, not these hooks),
each link runs as it would alone: plainly, or checkpointed on its own.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten
from torch.utils.checkpoint import checkpoint, get_device_states, set_device_states

from autockpt.planner.runtime.segment_runners import SegmentObserver, buffers_restored

#: Where a link's argument comes from: ``(None, value)`` kept, or ``(call, leaf)`` the leaf of
#: an earlier call's output.
_Source = tuple[int | None, Any]

#: An unpacked slot of a rerun: its tensor was handed out.
_TAKEN = object()


@dataclass
class _LinkCall:
    """One link call of a span's forward: what its rerun needs."""

    forward: Callable[..., Any]
    spec: TreeSpec
    sources: list[_Source]
    cpu_rng: torch.Tensor
    device_rng: tuple[list[int], list[torch.Tensor]] | None
    autocast: list[tuple[str, dict[str, Any]]]


class Span:
    """Consecutive links recomputed as one (NOTE [Module spans]).

    Args:
        index: the segment's index (what the observer is told).
        num_links: how many links the span covers, in call order.
        recompute: rebuild the span in backward; off, the links run as they are (measured).
        stateful_modules: modules whose buffers the links update (put back after a rerun).
        observer: told when the span starts (its first link) and ends (its last).
    """

    def __init__(
        self,
        index: int,
        num_links: int,
        *,
        recompute: bool,
        stateful_modules: Sequence[torch.nn.Module],
        observer: SegmentObserver | None,
    ) -> None:
        self.index = index
        self.num_links = num_links
        self.recompute = recompute
        self.stateful_modules = tuple(stateful_modules)
        self.observer = observer
        self.current: _SpanRun | None = None

    def link(self, position: int, forward: Callable[..., Any]) -> Callable[..., Any]:
        """The ``forward`` to give the span's ``position``-th link, whose own is ``forward``."""

        def span_link(*args: Any, **kwargs: Any) -> Any:
            return self.call(position, forward, args, kwargs)

        return span_link

    def call(
        self,
        position: int,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run one link of the span, recording it for backward when recomputing."""
        if torch.compiler.is_compiling():
            if not self.recompute:
                return forward(*args, **kwargs)
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        recording = self.recompute and torch.is_grad_enabled()
        if not recording and self.observer is None:
            return forward(*args, **kwargs)
        run = self.current
        if run is None or run.next_position != position:
            # A new forward (or one that skipped links): the span starts here.
            run = self.current = _SpanRun(self)
            if self.observer is not None:
                self.observer.segment_started(self.index)
        output = (
            run.call(forward, args, kwargs) if recording else run.observed(forward, args, kwargs)
        )
        run.next_position = position + 1
        if position == self.num_links - 1:
            self.current = None
            if self.observer is not None:
                self.observer.segment_finished(self.index, tuple(run.kept), output)
        return output


class _SpanRun:
    """One forward through a span: what backward needs to rerun it."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.next_position = 0
        self.calls: list[_LinkCall] = []
        # Each call's output tensors, by weak reference, with their versions then.
        self.outputs: list[list[tuple[weakref.ref[torch.Tensor], int] | None]] = []
        self.kept: list[torch.Tensor] = []
        self.num_packed = 0
        self.rerun: list[Any] | None = None

    def observed(self, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
        """Run a link plainly, only remembering the span's inputs for the observer."""
        if not self.calls and not self.kept:
            self.kept = [leaf for leaf in tree_flatten((args, kwargs))[0] if _is_tensor(leaf)]
        return forward(*args, **kwargs)

    def call(self, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if _is_tensor(leaf)]
        device_type = next((t.device.type for t in tensors if t.device.type != "cpu"), "cuda")
        device_module = getattr(torch, device_type, None)
        device_rng = None
        if getattr(device_module, "_initialized", False):
            device_rng = get_device_states(*tensors)
        autocast = [
            (kind, _autocast_state(kind))
            for kind in dict.fromkeys(("cpu", device_type))
            if torch.amp.is_autocast_available(kind)
        ]
        self.calls.append(
            _LinkCall(
                forward,
                spec,
                [self._source_of(leaf) for leaf in leaves],
                torch.get_rng_state(),
                device_rng,
                autocast,
            )
        )
        with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
            output = forward(*args, **kwargs)
        self.outputs.append(
            [
                (weakref.ref(leaf), leaf._version) if _is_tensor(leaf) else None
                for leaf in tree_flatten(output)[0]
            ]
        )
        return output

    def _source_of(self, leaf: Any) -> _Source:
        if _is_tensor(leaf):
            version = leaf._version
            for call, outputs in enumerate(self.outputs):
                for position, made in enumerate(outputs):
                    if made is not None and made[0]() is leaf and version == made[1]:
                        return call, position
            self.kept.append(leaf)
        return None, leaf

    def _pack(self, _: torch.Tensor) -> tuple[_SpanRun, int]:
        # The tensor is not kept: the rerun makes it again (the handle keeps this run alive).
        self.num_packed += 1
        return self, self.num_packed - 1

    def take(self, slot: int) -> torch.Tensor:
        """The ``slot``-th tensor the span's forward saved, made again by a rerun."""
        if self.rerun is None or self.rerun[slot] is _TAKEN:
            self._rerun()
        assert self.rerun is not None
        value = self.rerun[slot]
        self.rerun[slot] = _TAKEN
        return value

    def _rerun(self) -> None:
        saved: list[Any] = []

        def keep(tensor: torch.Tensor) -> None:
            saved.append(tensor.detach() if tensor.requires_grad else tensor)

        outputs: list[list[Any]] = []
        devices = sorted({d for c in self.calls if c.device_rng for d in c.device_rng[0]})
        with (
            torch.random.fork_rng(devices=devices),
            torch.enable_grad(),
            buffers_restored(self.span.stateful_modules),
            torch.autograd.graph.saved_tensors_hooks(keep, _never_unpacked),
        ):
            for call in self.calls:
                torch.set_rng_state(call.cpu_rng)
                if call.device_rng is not None:
                    set_device_states(*call.device_rng)
                leaves = [
                    value if origin is None else outputs[origin][value]
                    for origin, value in call.sources
                ]
                args, kwargs = tree_unflatten(leaves, call.spec)
                with contextlib.ExitStack() as stack:
                    for kind, state in call.autocast:
                        stack.enter_context(torch.autocast(kind, **state))
                    output = call.forward(*args, **kwargs)
                outputs.append(tree_flatten(output)[0])
        if len(saved) != self.num_packed:
            raise RuntimeError(
                f"recomputing a span of {len(self.calls)} module calls saved {len(saved)} "
                f"tensors for backward where its forward saved {self.num_packed}: the modules "
                "do not run the same operations twice; plan them with use_gradient_checkpointing"
                "=False or make their forward deterministic"
            )
        self.rerun = saved


def _unpack(handle: tuple[_SpanRun, int]) -> torch.Tensor:
    run, slot = handle
    return run.take(slot)


def _never_unpacked(_: None) -> torch.Tensor:
    raise AssertionError("a span's rerun runs no backward")


def _autocast_state(device_type: str) -> dict[str, Any]:
    return {
        "enabled": torch.is_autocast_enabled(device_type),
        "dtype": torch.get_autocast_dtype(device_type),
        "cache_enabled": torch.is_autocast_cache_enabled(),
    }


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)
