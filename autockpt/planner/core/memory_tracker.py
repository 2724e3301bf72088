"""Counting live tensor bytes: the accounting the planner predicts and the trainer enforces.

NOTE [Tracked bytes]
A :class:`MemoryTracker` is a dispatch mode: every tensor an aten op returns is looked at, and
the storage behind it is counted once, from the op that created it until the storage is freed
(a weak reference's callback). Views share their base's storage and so cost nothing. Tensors
that already exist when tracking starts (parameters, optimizer state, the input batch) are
counted only when registered with :meth:`MemoryTracker.register`.

On CUDA this count predicted the caching allocator's ``max_memory_allocated`` within 1% on a
TFT-shaped model; on the CPU it is the budget itself (there is no allocator to ask). Under
``FakeTensorMode`` it gives the same count with no real memory, which is how the planner
measures a step in well under a second. Fake kernels under-report a few ops (the oneDNN LSTM's
workspace is 0 bytes there): those ops are sized by running them for real, see
:class:`RealSizeOracle`. A few lay their outputs out otherwise than the real kernel (batch norm
on a transposed input), which changes what later ops copy: those outputs are laid out as the
real kernel lays them, found the same way.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from autockpt.planner.core.dispatch_mode import OpMode

OpObserver = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]
#: Told of every storage the tracker starts or stops counting: ``(key, size, counted)``, the
#: key the storage's ``id``, ``counted`` true when it starts (see :class:`MemoryTracker`).
StorageListener = Callable[[int, int, bool], None]

# Ops whose fake/meta kernels return a smaller output than the real kernel: a workspace that
# only the real implementation allocates (the LSTMs), or a reduced loss returned as a view of
# the whole element-wise buffer (these CPU losses: the scalar holds ``numel * 4`` bytes for as
# long as it lives). See NOTE [Tracked bytes].
_UNDER_REPORTED_OPS: frozenset[Any] = frozenset(
    op
    for op in (
        getattr(torch.ops.aten, "mkldnn_rnn_layer", None),
        getattr(torch.ops.aten, "_cudnn_rnn", None),
        torch.ops.aten.mse_loss,
        torch.ops.aten.smooth_l1_loss,
        torch.ops.aten.binary_cross_entropy,
    )
    if op is not None
)


# Ops whose fake/meta kernels lay their output out otherwise than the real kernel: batch norm
# on a transposed input (PatchTST's BatchNorm1d over (batch, features, patches) views) writes a
# contiguous output for real, while the meta kernel keeps the input's strides. The layout
# decides what later ops copy (a linear on the transposed-back output clones it for real, not on
# fake tensors): PatchTST's step was under-predicted by 7%. See NOTE [Tracked bytes].
_RELAID_OPS: frozenset[Any] = frozenset(
    op
    for op in (
        getattr(torch.ops.aten.native_batch_norm, "default", None),
        getattr(torch.ops.aten._native_batch_norm_legit, "default", None),
        getattr(torch.ops.aten._native_batch_norm_legit, "no_stats", None),
    )
    if op is not None
)


# Queries of a tensor's metadata that reach dispatch modes: they allocate nothing and are not
# work, so the tracker passes them through without counting (under fake tensors ``prim.device``
# alone is over half of all calls).
_METADATA_OPS: frozenset[Any] = frozenset(
    (
        torch.ops.prim.device.default,
        torch.ops.prim.layout.default,
        torch.ops.aten.sym_size.int,
        torch.ops.aten.sym_stride.int,
        torch.ops.aten.sym_numel.default,
        torch.ops.aten.sym_storage_offset.default,
        torch.ops.aten.is_contiguous.default,
    )
)


class RealSizeOracle:
    """Sizes the outputs of under-reporting ops, and lays out those of re-laid ops, by running
    them for real on zeros.

    Only shapes matter, so the op runs once per distinct input signature, on the device the
    fake tensors stand for (cuDNN's reserve exists only on CUDA; the LSTM's inputs are small,
    ``(B, T, hidden)``), and the answer is cached.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], list[int]] = {}
        self._layouts: dict[tuple[Any, ...], list[tuple[int, ...]]] = {}

    def output_bytes(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
        """Real storage bytes of each tensor output of ``func(*args, **kwargs)``."""
        key = (func, _signature(args), _signature(tuple(kwargs.items())))
        if key not in self._cache:
            self._cache[key] = self._run_for_real(func, args, kwargs)
        return self._cache[key]

    @staticmethod
    def _run_for_real(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
        def real_zeros(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return torch.zeros(value.shape, dtype=value.dtype, device=value.device)
            return value

        from torch._subclasses.fake_tensor import unset_fake_temporarily

        # Not under no_grad: the oneDNN LSTM skips its workspace when grad mode is off.
        with unset_fake_temporarily():
            out = func.overloadpacket(*tree_map(real_zeros, args), **tree_map(real_zeros, kwargs))
        return [
            t.untyped_storage().nbytes()
            for t in tree_flatten(out)[0]
            if isinstance(t, torch.Tensor)
        ]

    def relaid(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        """``out`` (fake) with each tensor laid out as the real kernel lays it out (strides
        found by running ``func`` for real once per signature, inputs laid out as given)."""
        key = (func, _signature(args, strides=True), _signature(tuple(kwargs.items())))
        if key not in self._layouts:
            self._layouts[key] = self._real_strides(func, args, kwargs)
        strides = iter(self._layouts[key])

        def relay(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            stride = next(strides, None)
            if stride is None or tuple(value.stride()) == stride:
                return value
            return torch.empty_strided(value.shape, stride, dtype=value.dtype, device=value.device)

        return tree_map(relay, out)

    @staticmethod
    def _real_strides(
        func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[tuple[int, ...]]:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        def real_zeros(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return torch.zeros(value.shape, dtype=value.dtype, device=value.device).as_strided(
                    value.shape, value.stride()
                )
            return value

        with unset_fake_temporarily():
            out = func(*tree_map(real_zeros, args), **tree_map(real_zeros, kwargs))
        return [tuple(t.stride()) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def sized_for_real(func: Any) -> bool:
    """Whether ``func``'s outputs are sized by running it for real (NOTE [Tracked bytes]):
    its fake kernel under-reports them."""
    return func.overloadpacket in _UNDER_REPORTED_OPS


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a nest of tuples, lists and dicts (each counted as its own
    elements, whatever storage it shares)."""
    return sum(t.numel() * t.element_size() for t in flat_tensors(value))


def storage_bytes(value: Any) -> int:
    """Bytes of the storages behind the tensors in a nest of tuples, lists and dicts, each
    storage counted once however many tensors view it (meta tensors hold none)."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in flat_tensors(value)
        if t.device.type != "meta"
    }
    return sum(storages.values())


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nest of tuples, lists and dicts (a faster, narrower ``tree_flatten``)."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[torch.Tensor] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def _signature(values: tuple[Any, ...], *, strides: bool = False) -> tuple[Any, ...]:
    flat, _ = tree_flatten(values)
    return tuple(
        (tuple(v.shape), v.dtype, str(v.device), tuple(v.stride()) if strides else ())
        if isinstance(v, torch.Tensor)
        else repr(v)
        for v in flat
    )


class MemoryTracker(OpMode):
    """Counts the bytes of live tensor storages while active (a context manager).

    Args:
        initial: tensors that exist before tracking starts and count towards the total
            (parameters, gradients, optimizer state, the batch). See :func:`tensors_of`.
        observer: called after every op as ``observer(func, args, kwargs, out)``; the planner
            uses it to attribute memory and time to segments.
        size_oracle: sizes ops whose fake kernels under-report; pass one when tracking fake
            tensors.
        listener: told when each storage starts and stops being counted (the planner's
            record of a step, NOTE [One record, many plans]).

    Example:
        >>> with MemoryTracker(initial=tensors_of(model, optimizer)) as tracker:
        ...     loss = model(x).sum(); loss.backward(); optimizer.step()
        >>> tracker.peak_bytes
    """

    def __init__(
        self,
        *,
        initial: Iterable[torch.Tensor] = (),
        observer: OpObserver | None = None,
        size_oracle: RealSizeOracle | None = None,
        listener: StorageListener | None = None,
    ) -> None:
        super().__init__()
        self._listener = listener
        self.current_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, weakref.ref[Any]] = {}
        self._observer = observer
        self._size_oracle = size_oracle
        for tensor in initial:
            self.register(tensor)

    def register(self, tensor: torch.Tensor, *, num_bytes: int | None = None) -> None:
        """Count ``tensor``'s storage from now until it is freed (once per storage)."""
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        size = storage.nbytes() if num_bytes is None else num_bytes
        self._live[key] = weakref.ref(storage, lambda _ref: self._release(key, size))
        self.current_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        if self._listener is not None:
            self._listener(key, size, True)

    def add_bytes(self, num_bytes: int) -> None:
        """Count ``num_bytes`` that no tensor here holds (state measured elsewhere) from now on."""
        self.current_bytes += num_bytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now."""
        self.peak_bytes = self.current_bytes

    def _release(self, key: int, size: int) -> None:
        if self._live.pop(key, None) is not None:
            self.current_bytes -= size
            if self._listener is not None:
                self._listener(key, size, False)

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = func(*args, **kwargs)
        if func in _METADATA_OPS:
            return out  # allocates nothing; the most frequent call under fake tensors
        if self._size_oracle is not None and func in _RELAID_OPS:
            out = self._size_oracle.relaid(func, args, kwargs, out)
        outputs = flat_tensors(out)
        if self._size_oracle is not None and func.overloadpacket in _UNDER_REPORTED_OPS:
            sizes: list[int | None] = list(self._size_oracle.output_bytes(func, args, kwargs))
        else:
            sizes = [None] * len(outputs)
        # A view or an in-place result shares an input's storage: it allocates nothing new.
        input_storages = {id(t.untyped_storage()) for t in flat_tensors((args, kwargs))}
        for tensor, size in zip(outputs, sizes, strict=False):
            if id(tensor.untyped_storage()) not in input_storages:
                self.register(tensor, num_bytes=size)
        if self._observer is not None:
            self._observer(func, args, kwargs, out)
        return out


def tensors_of(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> list[torch.Tensor]:
    """Parameters, their gradients, buffers and optimizer state: what a step keeps alive."""
    tensors: list[torch.Tensor] = []
    for parameter in module.parameters():
        tensors.append(parameter)
        if parameter.grad is not None:
            tensors.append(parameter.grad)
    tensors.extend(module.buffers())
    if optimizer is not None:
        for state in optimizer.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return tensors
