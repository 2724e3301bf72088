"""Training on several processes started by ``torchrun``: one rank per device, DDP or FSDP2.

NOTE [Distributed training]
``torchrun --nproc-per-node N -m autockpt train ...`` starts N copies of the command line, each
with ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` set. Each rank owns one device (``cuda:LOCAL_RANK``
over NCCL, or the CPU over gloo) and the budget is per rank, as each rank owns one card.

- Data: every rank reads the same shuffled order (``seed + epoch``) in global batches of
  ``world_size * batch_size`` windows and keeps its own contiguous slice, so the ranks see
  disjoint windows and, together, exactly the batch a single process would with the global
  batch size. DDP averages the gradients, and each rank's loss is a mean over its equal slice,
  so the step equals the single-process step (up to float rounding).
- Plan: rank 0 plans for its per-rank batch and broadcasts the plan's JSON; every rank runs
  that plan, and the run log records each rank's plan digest. A re-plan is decided on the
  largest peak over the ranks, so all ranks re-plan together.
- Micro-batches: under DDP gradients are synchronised on the last piece only (``no_sync`` for
  the rest). Under FSDP every piece reduce-scatters its gradients into the shards: deferring
  the sync (``set_requires_gradient_sync(False)``) would keep every unit's unsharded gradient
  until the last piece, a whole copy of the gradients on each rank, which is what FSDP is
  there to avoid (NOTE [Per-rank accounting] counts them sharded).
- Files: rank 0 alone prints, logs and writes the run folder. ``last.pt`` keeps every rank's
  random state, the world size and the strategy; a resume must use the same of both. Under
  FSDP the model and optimizer states are gathered whole (``full_state_dict``) onto rank 0,
  which writes them in the same layout as one process does, and each rank loads its shard
  back from them.

NOTE [FSDP and the planned model]
``--strategy fsdp`` applies FSDP2's ``fully_shard`` to the planned model (:func:`shard`): each leaf
unit (NOTE [FSDP units] in :mod:`autockpt.planner.measure.sharding`), then the planned root. FSDP
swaps a module's parameter entries between the sharded and the gathered tensors, so every view of
the model must reach parameters through the same module objects. The planned module, its graph and
each recomputed segment's subgraph resolve every attribute path through the model's own tables of
modules and parameters (NOTE [The planned module] in :mod:`autockpt.planner.runtime.planned_graph`),
so a parameter read inside a recomputed segment is the gathered one (were they copies, recomputed
segments would read the stale unsharded originals and their gradients would be lost). The original
model is part of the sharded module afterwards: the trainer evaluates and saves through the planned
root, and does not re-plan (planning needs the whole parameters; a run that goes over its budget is
resumed with a lower one instead).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autockpt import Parallelism, Plan
from autockpt.errors import AutockptError, ConfigError
from autockpt.planner.measure.sharding import fsdp_unit_paths
from autockpt.planner.runtime.planned_graph import planned_forward_of
from autockpt.training.host.progress import Record
from autockpt.training.options.user_errors import USER_ERRORS
from tft.data.windows import Batch

_T = TypeVar("_T")


class OtherRankError(AutockptError):
    """Rank 0 hit a user error in a step every rank takes together (planning)."""


@dataclass(frozen=True)
class World:
    """This process's place among the ranks; ``World()`` is a single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Whether this rank prints, logs and writes files."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def device(self, device: torch.device) -> torch.device:
        """The device this rank owns: ``cuda:LOCAL_RANK`` on CUDA, else ``device`` itself."""
        if device.type == "cuda" and self.is_distributed:
            return torch.device("cuda", self.local_rank)
        return device

    def mean(self, value: float) -> float:
        """The mean of ``value`` over the ranks."""
        if not self.is_distributed:
            return value
        return float(sum(self.all_gather(value))) / self.world_size

    def max(self, value: int) -> int:
        """The largest ``value`` over the ranks."""
        if not self.is_distributed:
            return value
        return max(self.all_gather(value))

    def all_gather(self, value: _T) -> list[_T]:
        """Every rank's ``value``, in rank order (a picklable object)."""
        if not self.is_distributed:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered


#: One process, no ranks: what every function assumes unless told otherwise.
SINGLE_PROCESS = World()


def world_from_environment(environ: Mapping[str, str] | None = None) -> World:
    """The world ``torchrun`` describes in ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; else one process.

    Raises:
        ConfigError: the variables are set but are not whole numbers that make sense together.
    """
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return World()
    try:
        world_size = int(env["WORLD_SIZE"])
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise ConfigError(
            f"WORLD_SIZE={env.get('WORLD_SIZE')!r}, RANK={env.get('RANK')!r} and "
            f"LOCAL_RANK={env.get('LOCAL_RANK')!r} must be whole numbers; start several "
            "processes with torchrun --nproc-per-node N -m autockpt train ..."
        ) from None
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ConfigError(
            f"RANK={rank} is not within WORLD_SIZE={world_size}; start several processes with "
            "torchrun --nproc-per-node N -m autockpt train ..."
        )
    return World(rank=rank, world_size=world_size, local_rank=local_rank)


@contextmanager
def process_group(world: World, device: torch.device) -> Iterator[None]:
    """Join the other ranks for the block (NCCL on CUDA, gloo on the CPU), then leave.

    Nothing happens for a single process. ``MASTER_ADDR``/``MASTER_PORT`` come from torchrun.
    """
    if not world.is_distributed:
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        rank=world.rank,
        world_size=world.world_size,
        device_id=device if device.type == "cuda" else None,
    )
    try:
        yield
    except BaseException:
        dist.destroy_process_group()
        raise
    # Leave together: gloo aborted a rank (SIGABRT, "terminate called without an active
    # exception") that tore down its group while its peer was still finishing.
    dist.barrier()
    dist.destroy_process_group()


def agree_on_plan(world: World, make_plan: Callable[[], Plan]) -> Plan:
    """Rank 0 plans and sends the plan's JSON to every rank; all ranks return the same plan.

    Raises:
        AutockptError, TFTError: on rank 0, what planning raised; on the others, :class:`OtherRankError`
            with its message (so no rank waits for a plan that will not come).
    """
    if not world.is_distributed:
        return make_plan()
    message: list[Any] = [None]
    if world.is_main:
        try:
            message = [("plan", make_plan().model_dump_json())]
        except USER_ERRORS as error:
            dist.broadcast_object_list([("error", str(error))], src=0)
            raise
    dist.broadcast_object_list(message, src=0)
    kind, text = message[0]
    if kind == "error":
        raise OtherRankError(f"rank 0 could not plan: {text}")
    return Plan.model_validate_json(text)


def main_first(world: World, work: Callable[[], _T]) -> _T:
    """Run ``work`` on rank 0, then on the other ranks once rank 0 has finished it.

    For work whose first run writes what later runs reuse (the row cache of a streamed file,
    NOTE [Row cache] in tft/data/streamed/row_cache.py): the ranks do not build it side by side.

    Raises:
        AutockptError, TFTError: on rank 0, what ``work`` raised; on the others, :class:`OtherRankError`
            with its message (so no rank waits for work that will not finish).
    """
    if not world.is_distributed:
        return work()
    if world.is_main:
        try:
            result = work()
        except USER_ERRORS as error:
            world.all_gather(str(error))
            raise
        world.all_gather(None)
        return result
    failures = [text for text in world.all_gather(None) if text is not None]
    if failures:
        raise OtherRankError(f"rank 0 could not read the data: {failures[0]}")
    return work()


def plan_digest(plan: Plan) -> str:
    """A short fingerprint of a plan (the first 16 hex digits of the SHA-256 of its JSON)."""
    return hashlib.sha256(plan.model_dump_json().encode()).hexdigest()[:16]


def rank_slice(batch: Batch, world: World) -> Batch:
    """This rank's contiguous share of a global batch; equal shares when the size divides."""
    if not world.is_distributed:
        return batch
    size = len(batch.target)
    begin = size * world.rank // world.world_size
    end = size * (world.rank + 1) // world.world_size
    return Batch(*(tensor[begin:end] for tensor in batch))


def resolve_parallelism(
    strategy: str | None,
    world_size: int,
    *,
    how: str = "start them with torchrun --nproc-per-node N -m autockpt train ...",
) -> Parallelism:
    """What ``--strategy`` means on ``world_size`` ranks: ``single``, ``ddp`` (default) or ``fsdp``.

    Raises:
        ConfigError: a strategy was given for one process.
    """
    if world_size == 1:
        if strategy is not None:
            raise ConfigError(
                f"--strategy {strategy} needs several ranks; {how}, or drop --strategy for "
                "one process"
            )
        return "single"
    if strategy not in (None, "ddp", "fsdp"):
        raise ConfigError(f"--strategy {strategy!r} is not one of ddp, fsdp")
    return "fsdp" if strategy == "fsdp" else "ddp"


def wrap(
    planned: torch.nn.Module,
    world: World,
    device: torch.device,
    *,
    parallelism: Parallelism = "ddp",
    model: torch.nn.Module | None = None,
) -> torch.nn.Module:
    """The planned model as the ranks train it: itself for one process, under DDP, or FSDP2.

    Under DDP gradients live in DDP's buckets (``gradient_as_bucket_view``), so DDP adds no
    second copy of them; they stay allocated between steps (NOTE [Per-rank accounting]).
    Under FSDP see :func:`shard`; ``model`` is the model the plan was applied to.
    """
    if not world.is_distributed:
        return planned
    if parallelism == "fsdp":
        assert model is not None, "FSDP shards the model's own modules"
        return shard(planned, model)
    return DistributedDataParallel(
        planned,
        device_ids=[device] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
    )


def shard(planned: torch.nn.Module, model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 over the planned model: every leaf unit, then the root (NOTE [FSDP and the
    planned model]). Returns ``planned``, now an ``FSDPModule`` sharing ``model``'s modules.

    Raises:
        ConfigError: the plan is not a traced graph, or the model holds parameters of its own
            outside every submodule (FSDP could not reach them from the segments).
    """
    from torch.distributed.fsdp import fully_shard

    if planned_forward_of(planned) is None:
        raise ConfigError(
            "--strategy fsdp needs a model that torch.fx traces (this plan has module-level "
            "segments); use --strategy ddp"
        )
    if next(model.parameters(recurse=False), None) is not None:
        raise ConfigError(
            f"--strategy fsdp needs every parameter of {type(model).__name__} inside a "
            "submodule; move its own parameters into one, or use --strategy ddp"
        )
    unit_paths = fsdp_unit_paths(model)
    for path in unit_paths:
        fully_shard(model.get_submodule(path))
    fully_shard(planned)
    return planned


class SilentReporter:
    """The reporter of every rank but rank 0: it shows nothing."""

    def start(self, *, num_epochs: int, first_epoch: int, steps_per_epoch: int) -> None:
        del num_epochs, first_epoch, steps_per_epoch

    def step(self, record: Record) -> None:
        del record

    def epoch(self, record: Record) -> None:
        del record

    def event(self, record: Record) -> None:
        del record

    def progress(self, record: Record) -> None:
        del record

    def finish(self, summary: Record) -> None:
        del summary
