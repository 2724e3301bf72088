"""Per-rank memory: what one of several data-parallel ranks holds, from the one-process step.

NOTE [Per-rank accounting]
The planner measures one process training the per-rank batch (NOTE [Step accounting]). With
``N`` ranks each rank runs that same step, but holds the model's states differently:

- ``single``: one process; nothing changes.
- ``ddp`` (DistributedDataParallel, as :func:`autockpt.training.host.distributed.wrap` builds it): every rank
  holds all parameters ``P`` and all optimizer state ``O``. Gradients are views of DDP's bucket
  storage (``gradient_as_bucket_view=True``), allocated once and zeroed in place between steps,
  so all of ``G`` is live for the whole step, where one process with ``set_to_none`` holds none
  before its backward. With ``gradient_as_bucket_view=False`` the buckets would be a second copy
  of ``G``; we do not build DDP that way.
- ``fsdp`` (FSDP2 ``fully_shard``, full shard, reshard after forward): every parameter is split
  along dim 0 into ``N`` pieces of ``ceil(d0 / N)`` rows, so each rank holds
  ``ceil(d0 / N) * (numel / d0)`` elements of it (rank 0 holds the most: the figures here are
  rank 0's, the largest). Its gradient and its optimizer state tensors shaped like it are
  split the same way; scalar optimizer state (Adam's ``step``) stays whole on every rank.
  While a unit (:func:`fsdp_unit_paths`) runs forward or backward its parameters are gathered
  whole, and the root unit (every parameter not in a leaf unit) stays gathered from the start
  of forward to the end of backward. The *gathered working set* is therefore the root's
  unsharded parameters plus, for the largest leaf unit, its unsharded parameters and its
  unsharded gradients waiting for the reduce-scatter, each counted twice (the tensors and the
  flat buffer of the collective that fills or empties them), all padded to ``N`` shards.

The planner applies the difference as one constant added to every byte count of the measured
step (:attr:`RankShare.offset_bytes`), i.e. subtracted from the budget (the budget carries it:
NOTE [One budget] in :mod:`autockpt.planner.core.step_budget`):

    ddp:   + G
    fsdp:  - (P - P/N) - (O - O/N) + gathered

This is exact for the states at the start of the step and an upper bound at every other
moment: a rank's gradients at any moment are at most the one process's at the same moment
(sharded ones are smaller, the unit in flight is the same), so they are not subtracted; at the
optimizer step, where all gradients are sharded (FSDP) or the one process holds them too (DDP),
the true per-rank figure is lower by ``G - G/N`` plus the working set (FSDP) or by ``G`` (DDP).
The working set is an estimate: FSDP's buffers live at different moments (the largest unit
need not be in flight at the step's peak, the root's own collectives are not counted twice)
and the allocator rounds. The states per rank (``parameters_bytes``, ``gradients_bytes``,
``optimizer_state_bytes``) are exact for rank 0, the largest; the tests check them against the
shards of a real two-rank run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autockpt.planner.core.decisions import Parallelism
from autockpt.planner.measure.optimizers import make_optimizer
from autockpt.planner.simulate.step_profile import OptimizerSpec

#: The unit name of parameters that belong to no leaf unit (FSDP's root unit).
ROOT_UNIT = ""


@dataclass(frozen=True)
class ParameterLayout:
    """One parameter as the accounting sees it.

    Attributes:
        name: its ``named_parameters()`` name.
        shape: its shape (FSDP splits dim 0).
        element_size: bytes per element.
        trainable: whether it has a gradient and optimizer state.
        unit: the FSDP unit it belongs to (a module path), or ``ROOT_UNIT``.
        state_bytes_per_byte: optimizer state shaped like it, in bytes per byte of it
            (AdamW: 2.0, SGD with momentum: 1.0).
        scalar_state_bytes: optimizer state not shaped like it (kept whole on every rank).
    """

    name: str
    shape: tuple[int, ...]
    element_size: int
    trainable: bool = True
    unit: str = ROOT_UNIT
    state_bytes_per_byte: float = 0.0
    scalar_state_bytes: int = 0

    @property
    def num_bytes(self) -> int:
        """Bytes of the whole parameter."""
        return math.prod(self.shape) * self.element_size

    def shard_bytes(self, world_size: int) -> int:
        """Bytes rank 0 holds of it when split along dim 0 into ``world_size`` pieces."""
        rows = self.shape[0] if self.shape else 1
        per_row = self.num_bytes // rows if rows else 0
        return math.ceil(rows / world_size) * per_row

    def state_bytes(self, world_size: int) -> int:
        """Optimizer state rank 0 holds for it (the whole state when ``world_size`` is 1)."""
        if not self.trainable:
            return 0
        return round(self.state_bytes_per_byte * self.shard_bytes(world_size)) + (
            self.scalar_state_bytes
        )


@dataclass(frozen=True)
class RankShare:
    """What one rank holds of the model's states, and how it differs from one process.

    Attributes:
        world_size: ranks training together.
        parallelism: how they share the work.
        parameters_bytes: parameter bytes one rank holds between steps (FSDP: its shards).
        gradients_bytes: gradient bytes one rank holds after backward (FSDP: its shards).
        optimizer_state_bytes: optimizer state one rank holds.
        gathered_bytes: FSDP's gathered working set (0 otherwise; NOTE [Per-rank accounting]).
        offset_bytes: added to every byte count of the one-process step to bound one rank's.
    """

    world_size: int
    parallelism: Parallelism
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    gathered_bytes: int
    offset_bytes: int


def rank_share(
    layouts: Sequence[ParameterLayout], *, world_size: int, parallelism: Parallelism
) -> RankShare:
    """One rank's states under ``parallelism`` on ``world_size`` ranks (NOTE [Per-rank accounting]).

    Args:
        layouts: every parameter of the model (see :func:`parameter_layouts`).
        world_size: ranks training together, at least 1.
        parallelism: ``"single"`` (needs ``world_size == 1``), ``"ddp"`` or ``"fsdp"``.

    Returns:
        The per-rank figures and the offset the planner applies.

    Raises:
        ValueError: ``world_size`` below 1, or ``"single"`` with several ranks.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be at least 1")
    if parallelism == "single" and world_size != 1:
        raise ValueError(f"parallelism 'single' is one process, not world_size={world_size}")
    trainable = [p for p in layouts if p.trainable]
    parameters = sum(p.num_bytes for p in layouts)
    gradients = sum(p.num_bytes for p in trainable)
    state = sum(p.state_bytes(1) for p in trainable)
    if parallelism != "fsdp":
        return RankShare(
            world_size=world_size,
            parallelism=parallelism,
            parameters_bytes=parameters,
            gradients_bytes=gradients,
            optimizer_state_bytes=state,
            gathered_bytes=0,
            offset_bytes=gradients if parallelism == "ddp" else 0,
        )
    sharded_parameters = sum(p.shard_bytes(world_size) for p in layouts)
    sharded_state = sum(p.state_bytes(world_size) for p in trainable)
    gathered = _gathered_bytes(layouts, world_size)
    return RankShare(
        world_size=world_size,
        parallelism=parallelism,
        parameters_bytes=sharded_parameters,
        gradients_bytes=sum(p.shard_bytes(world_size) for p in trainable),
        optimizer_state_bytes=sharded_state,
        gathered_bytes=gathered,
        offset_bytes=gathered - (parameters - sharded_parameters) - (state - sharded_state),
    )


def _gathered_bytes(layouts: Sequence[ParameterLayout], world_size: int) -> int:
    """Root unsharded, plus the largest leaf unit's unsharded parameters and gradients."""

    def whole(layout: ParameterLayout) -> int:
        return world_size * layout.shard_bytes(world_size)  # padded to N shards

    root = sum(whole(p) for p in layouts if p.unit == ROOT_UNIT)
    by_unit: dict[str, int] = {}
    for layout in layouts:
        if layout.unit != ROOT_UNIT:
            gradient = whole(layout) if layout.trainable else 0
            # Twice each: the tensors, and the flat buffer of the collective that fills them
            # (all-gather) or empties them (reduce-scatter).
            by_unit[layout.unit] = by_unit.get(layout.unit, 0) + 2 * (whole(layout) + gradient)
    return root + max(by_unit.values(), default=0)


def fsdp_unit_paths(model: torch.nn.Module) -> list[str]:
    """The modules FSDP shards as units of their own: every module with parameters that the
    traced forward calls whole (Linear, LayerNorm, Embedding, LSTM, ...).

    NOTE [FSDP units]: FSDP2 gathers a unit's parameters in a forward pre-hook of the unit's
    module. The planned model runs the traced graph, which calls only the tracer's leaf
    modules; a container such as a TFT's variable selection network is traced through and its
    ``forward`` never runs, so its hooks would never fire. Units are therefore the called
    leaves; parameters that the graph reads directly (a module's own ``nn.Parameter`` used in
    an einsum) belong to the root unit, gathered for the whole forward and backward.

    Raises:
        TraceError: torch.fx cannot trace the model.
    """
    from autockpt.planner.trace.fx_graph import trace_graph  # trace imports measure, which is heavy

    graph = trace_graph(model)
    paths: list[str] = []
    for node in graph.nodes:
        if node.op == "call_module" and str(node.target) not in paths:
            module = model.get_submodule(str(node.target))
            if next(module.parameters(), None) is not None:
                paths.append(str(node.target))
    return paths


def parameter_layouts(
    model: torch.nn.Module,
    *,
    optimizer: OptimizerSpec = "adamw",
    unit_paths: Sequence[str] = (),
) -> list[ParameterLayout]:
    """The layout of every parameter of ``model``, with its optimizer state and FSDP unit.

    The optimizer's state per parameter is found by stepping it once on a small fake
    parameter of each dtype: no real memory is used.
    """
    owner_of: dict[str, str] = {}
    for path in unit_paths:
        for name, _ in model.get_submodule(path).named_parameters():
            owner_of[f"{path}.{name}"] = path
    layouts = []
    state_by_dtype: dict[torch.dtype, tuple[float, int]] = {}
    for name, parameter in model.named_parameters():
        dtype = parameter.dtype
        if parameter.requires_grad and dtype not in state_by_dtype:
            state_by_dtype[dtype] = _optimizer_state_shape(optimizer, dtype)
        per_byte, scalar = (
            state_by_dtype.get(dtype, (0.0, 0)) if parameter.requires_grad else (0, 0)
        )
        layouts.append(
            ParameterLayout(
                name=name,
                shape=tuple(parameter.shape),
                element_size=parameter.element_size(),
                trainable=parameter.requires_grad,
                unit=owner_of.get(name, ROOT_UNIT),
                state_bytes_per_byte=float(per_byte),
                scalar_state_bytes=int(scalar),
            )
        )
    return layouts


def _optimizer_state_shape(optimizer: OptimizerSpec, dtype: torch.dtype) -> tuple[float, int]:
    """(state bytes shaped like a parameter per byte of it, scalar state bytes) per parameter."""
    with FakeTensorMode():
        probe = torch.nn.Parameter(torch.zeros(4, 3, dtype=dtype))
        made = make_optimizer(optimizer, [probe])
        if made is None:
            return 0.0, 0
        probe.grad = torch.zeros_like(probe)
        made.step()
        like = scalar = 0
        for value in made.state[probe].values():
            if isinstance(value, torch.Tensor):
                size = value.untyped_storage().nbytes()
                if value.shape == probe.shape:
                    like += size
                else:
                    scalar += size
    return like / (probe.numel() * probe.element_size()), scalar
