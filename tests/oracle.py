"""An independent count of a real training step's live tensor bytes, for checking the planner.

NOTE [Oracle counter]
The planner predicts a step's peak with its own ``MemoryTracker`` on fake tensors; checking that
prediction with the same tracker on real tensors would let a bug in the tracker (an op whose
outputs it misses, a starting tensor it forgets) cancel out on both sides. So the tests measure
with :class:`LiveBytes`, which shares no code with the planner's accounting:

- it is keyed by the address of each storage's memory (``data_ptr``), not by Python identity;
- it counts every tensor any op returns, with no list of ops to skip or to resize, and no
  special case for views or in-place results (they share an address already counted);
- the bytes live before the step (parameters, gradients, buffers, optimizer state, the batch)
  are read from the model, the optimizer and the batch here, not through ``tensors_of``;
- :func:`measured_step` runs the planned step through the public ``autockpt.apply`` and
  ``autockpt.training_step`` only, with its own optimizer.

A storage is counted from the first op that returns it until it is freed: a weak reference to
its Python object calls back when the memory goes (PyTorch keeps a storage's Python object alive
exactly as long as the storage, so the callback is the release of the memory itself).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import TorchDispatchMode

import autockpt


def _leaves(value: Any) -> Iterable[torch.Tensor]:
    """Every tensor in a nest of tuples, lists and dicts (written here, not the planner's)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)


class LiveBytes(TorchDispatchMode):
    """Peak and current bytes of the distinct CPU storages held since it started (a context
    manager; NOTE [Oracle counter])."""

    def __init__(self) -> None:
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        # address -> (bytes, the weak reference whose callback releases them)
        self._held: dict[int, tuple[int, weakref.ref[Any]]] = {}

    def hold(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage until it is freed (an address counts once); fake and
        meta tensors hold no memory (planning makes many)."""
        if tensor.device.type == "meta" or is_fake(tensor):
            return
        storage = tensor.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or address in self._held:
            return

        def release(_: Any, address: int = address) -> None:
            freed, _ref = self._held.pop(address, (0, None))
            self.current_bytes -= freed

        self._held[address] = (size, weakref.ref(storage, release))
        self.current_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in _leaves(out):
            self.hold(tensor)
        return out


def starting_tensors(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: Sequence[Any]
) -> list[torch.Tensor]:
    """What is live when a training step starts: parameters, their gradients, buffers,
    optimizer state and the batch, read from each directly."""
    tensors = [*model.parameters(), *model.buffers(), *_leaves(list(batch))]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for per_parameter in optimizer.state.values():
        tensors += [v for v in per_parameter.values() if isinstance(v, torch.Tensor)]
    return tensors


def distinct_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (by address)."""
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(sizes.values())


def sum_loss(output: Any) -> torch.Tensor:
    """The sum of every floating-point tensor in a model's output (what a plan without a loss
    function assumes)."""
    return torch.stack([t.float().sum() for t in _leaves(output) if t.is_floating_point()]).sum()


def measured_step(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    plan: autockpt.Plan | None = None,
    *,
    loss_fn: Callable[..., torch.Tensor] = sum_loss,
    targets: Sequence[Any] = (),
    seed: int = 0,
    num_pieces: int = 1,
    loss_reduction: Literal["mean", "sum"] = "sum",
) -> tuple[int, torch.Tensor, dict[str, torch.Tensor]]:
    """One real AdamW step on a copy of ``model`` (planned with ``plan`` if given), counted by
    :class:`LiveBytes` from a start read off the model, optimizer and batch.

    The optimizer state exists before the step (made by a zero-gradient step whose parameter
    change is undone), as in the middle of training.

    Args:
        num_pieces: without a plan, accumulate gradients over this many equal slices of the
            batch, written out here (what micro-batches of any model would cost; the loss
            adds over samples then).
        loss_reduction: whether ``loss_fn`` is a mean or a sum over samples, for the
            micro-batches of a plan (``training_step``'s argument).

    Returns:
        (peak bytes, the step's loss, gradients by parameter name).
    """
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    weights = copy.deepcopy(model.state_dict())
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    model.load_state_dict(weights)
    optimizer.zero_grad(set_to_none=True)
    runner = autockpt.apply(model, plan) if plan is not None else model
    torch.manual_seed(seed)
    counter = LiveBytes()
    for tensor in starting_tensors(model, optimizer, [*inputs, *targets]):
        counter.hold(tensor)
    with counter:
        if plan is None and num_pieces > 1:
            loss, batch = torch.zeros(()), len(inputs[0])
            for piece in range(num_pieces):
                rows = slice(piece * batch // num_pieces, (piece + 1) * batch // num_pieces)
                part = loss_fn(model(*(x[rows] for x in inputs)), *(t[rows] for t in targets))
                part.backward()
                loss += part.detach()
                del part
        else:
            loss = autockpt.training_step(
                runner, plan, inputs, targets, loss_fn, loss_reduction=loss_reduction
            )
        optimizer.step()
    gradients = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return counter.peak_bytes, loss, gradients


def assert_same_gradients(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """The same parameters have gradients in both steps, and each is the same."""
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name)


def profiled_peak_bytes(run: Callable[[], None]) -> int:
    """The most bytes ``run`` holds at once above what was allocated when it started, summed
    here from the profiler's memory events (the allocator's, so a compiled step's buffers,
    which no dispatch mode sees, count too)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        run()
    events = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()  # negative for a free
        peak = max(peak, live)
    return peak
