"""Plans kept per shape bucket, so that every batch the data gives runs under a plan made for
a shape at least as large as its own.

NOTE [Plans that follow the shapes of a run]
A plan holds for the batches no larger than the one it was measured at (NOTE [Shapes a plan
holds for] in :mod:`autockpt.planner.core.batch_split`). A run whose batches vary (dynamic
padding, the last batch of an epoch, packing) meets shapes no single plan made at its first
batch holds for, so :class:`PlansByShape` keeps several and decides, before each step:

- a batch some plan covers runs with the smallest plan that covers it (a short sequence after a
  long one, the last batch of an epoch): nothing is planned for it;
- a batch no plan covers is planned for, before its step, at its *bucket*: each dimension seen
  to vary between batches (the positions of a padded batch, the samples of a last batch) goes
  up to the next power of two (or the user's ``bucket`` function), the others stay as they are.
  The batch is grown to that shape by repeating its own values (:func:`padded_to`), so the plan
  also covers the longer batches of its bucket that come later: a run plans once per bucket.
  Where the model refuses the grown batch (a position table shorter than the bucket) or the
  bucket cannot fit the budget, the plan is made at the batch's own shape;
- past ``max_plans`` plans, the next is made for the largest shape seen so far along every
  varying dimension, so planning stops once the longest batch has come;
- a declared maximum (``max_shape``) plans once, at the first batch, for the largest shape:
  every batch under it is covered;
- with ``replan=False`` a batch no plan covers is refused in one line (:class:`ShapeError`).

Planning forks the random streams (as every ``autockpt.plan`` call does), so the run's losses,
data order and dropout masks are the plain run's whatever was planned mid-run.

Under several ranks every rank must decide alike (rank 0 plans for all and the others wait on
its plan), but each holds a batch of its own, padded to its own length: each rank's shapes are
gathered first and every rank decides on the largest of them (:func:`batch_over_ranks`).

Memory is re-measured for each new bucket, never extrapolated from another: a step's peak is
linear in the batch only where every op is separable along it, and attention is quadratic in
the positions; a new measurement costs one planning (a few seconds) per bucket.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from autockpt.errors import ConfigError, InfeasibleBudgetError, PlanningError, ShapeError
from autockpt.planner.core.batch_split import (
    BatchShapes,
    LeafDim,
    batch_shapes,
    beyond_plan,
    declared_sizes,
    padded_to,
    read_max_shape,
    suggested_maximum,
)
from autockpt.planner.plan_types import Plan

Runner = TypeVar("Runner")

#: How many plans a run keeps by default before it plans for the largest shape seen.
MAX_PLANS = 8


def next_power_of_two(size: int) -> int:
    """The bucket a size goes up to by default: the next power of two (itself if it is one)."""
    return 1 << max(size - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True)
class ShapeFollowing:
    """How a run follows the shapes its data gives (NOTE [Plans that follow the shapes of a
    run]).

    Attributes:
        replan: plan a batch no plan covers before its step (``True``), or refuse it in one
            line (``False``).
        max_plans: plans made at most before planning for the largest shape seen.
        max_shape: the batch's leading dimensions at their largest (``(16, 2048)``: 16
            samples of 2048 positions), planned for once at the first batch.
        bucket: the size a varying dimension is planned up to; default the next power of two.
    """

    replan: bool = True
    max_plans: int = MAX_PLANS
    max_shape: tuple[int, ...] | None = None
    bucket: Callable[[int], int] = next_power_of_two

    def __post_init__(self) -> None:
        if self.max_plans < 1:
            raise ConfigError(f"max_plans={self.max_plans} keeps no plan; pass 1 or more")

    @staticmethod
    def read(max_shape: Sequence[int] | None, *, replan: bool, max_plans: int) -> ShapeFollowing:
        """The settings as a public signature takes them (checked: :class:`ConfigError`)."""
        return ShapeFollowing(
            replan=replan, max_plans=max_plans, max_shape=read_max_shape(max_shape)
        )


@dataclasses.dataclass(frozen=True)
class Planned(Generic[Runner]):
    """One plan of a run: the batch shapes it was made for, the plan, and what runs it."""

    shapes: BatchShapes
    plan: Plan
    runner: Runner


class PlansByShape(Generic[Runner]):
    """The plans of a run, one per shape bucket (NOTE [Plans that follow the shapes of a run]).

    ``runner`` is whatever the caller keeps beside each plan: the planned module for
    :class:`~autockpt.shape_planner.ShapePlanner`, nothing for a callback that puts the
    plan into the user's module itself.
    """

    def __init__(self, following: ShapeFollowing, *, refusal: str) -> None:
        self.following = following
        self._refusal = refusal
        self.planned: list[Planned[Runner]] = []
        self.planning_s = 0.0
        """Seconds spent planning, every plan of the run together."""
        self._seen: list[BatchShapes] = []
        self._varying: set[LeafDim] = set()

    @property
    def num_plans(self) -> int:
        """Plans made (or taken from a checkpoint) in this run."""
        return len(self.planned)

    @property
    def plans(self) -> list[Plan]:
        """Every plan of the run, in the order they were made."""
        return [entry.plan for entry in self.planned]

    def covering(self, shapes: BatchShapes) -> Planned[Runner] | None:
        """The smallest plan that holds for a batch of ``shapes``, or ``None``."""
        fitting = [entry for entry in self.planned if entry.shapes.covers(shapes)]
        return min(fitting, key=lambda entry: entry.shapes.num_elements(), default=None)

    def add(self, shapes: BatchShapes, plan: Plan, runner: Runner) -> Planned[Runner]:
        """Keep a plan made elsewhere (a checkpoint's) for batches of up to ``shapes``."""
        entry = Planned(shapes, plan, runner)
        self.planned.append(entry)
        self._seen.append(shapes)
        return entry

    def follow(
        self,
        inputs: Sequence[Any],
        targets: Sequence[Any],
        make: Callable[[list[Any], list[Any]], tuple[Plan, Runner]],
    ) -> Planned[Runner]:
        """The plan this batch runs with: one that covers it, or one made now by ``make`` at
        the batch's bucket (NOTE [Plans that follow the shapes of a run]).

        Raises:
            ShapeError: no plan covers the batch and ``replan`` is off.
        """
        shapes = batch_shapes(inputs, targets)
        found = self.covering(shapes)
        if found is not None:
            return found
        if self.planned and not self.following.replan:
            largest = max(self.planned, key=lambda entry: entry.shapes.num_elements())
            maximum = suggested_maximum(shapes, *(entry.shapes for entry in self.planned))
            raise ShapeError(
                beyond_plan(
                    largest.shapes,
                    shapes,
                    f"{self._refusal.format(max_shape=maximum)}, or let it plan each new "
                    "shape (replan=True)",
                )
            )
        target = self._target(shapes)
        self._seen.append(shapes)
        started = time.perf_counter()
        try:
            if target == shapes:
                plan, runner = make(list(inputs), list(targets))
            else:
                try:
                    plan, runner = make(*padded_to(inputs, targets, target))
                except (PlanningError, InfeasibleBudgetError):
                    # The model refuses the grown batch (a position table shorter than the
                    # bucket), or the bucket cannot fit: the batch's own shape.
                    target = shapes
                    plan, runner = make(list(inputs), list(targets))
        finally:
            self.planning_s += time.perf_counter() - started
        entry = Planned(target, plan, runner)
        self.planned.append(entry)
        return entry

    def _target(self, shapes: BatchShapes) -> BatchShapes:
        """The shapes to plan for so that this batch and the later ones of its bucket fit."""
        maximum = self.following.max_shape
        if maximum is not None and not self.planned:
            declared = declared_sizes(shapes, maximum)
            if all(shapes.size(leaf, dim) <= size for (leaf, dim), size in declared.items()):
                return shapes.resized(declared)
        for seen in self._seen:
            self._varying |= seen.differing_dims(shapes)
        varying = {
            (leaf, dim)
            for leaf, dim in self._varying
            if leaf < len(shapes.shapes) and dim < len(shapes.shapes[leaf] or ())
        }
        if len(self.planned) >= self.following.max_plans:
            # Past the bound: the largest of every varying dimension seen, this batch's too.
            same = [seen for seen in self._seen if _same_ranks(seen, shapes)]
            sizes = {
                (leaf, dim): max(seen.size(leaf, dim) for seen in [*same, shapes])
                for leaf, dim in varying
            }
        else:
            bucket = self.following.bucket
            sizes = {
                (leaf, dim): max(bucket(shapes.size(leaf, dim)), shapes.size(leaf, dim))
                for leaf, dim in varying
            }
        return shapes.resized(sizes) if sizes else shapes


def _same_ranks(one: BatchShapes, other: BatchShapes) -> bool:
    """The same structure, each tensor with as many dimensions."""
    return one.structure == other.structure and all(
        len(a or ()) == len(b or ()) for a, b in zip(one.shapes, other.shapes, strict=True)
    )


def batch_over_ranks(batch: Any, world_size: int) -> Any:
    """The batch grown to the largest shapes any rank holds now, where several ranks train
    (NOTE [Plans that follow the shapes of a run]): each rank's batch can be padded to another
    length, and every rank must decide alike whether to plan. One rank: the batch itself."""
    if world_size == 1 or not torch.distributed.is_initialized():
        return batch
    mine = batch_shapes((batch,), ())
    everyone: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(everyone, mine)
    same = [shapes for shapes in everyone if shapes.structure == mine.structure]
    sizes = {
        (leaf, dim): max(shapes.size(leaf, dim) for shapes in same)
        for leaf, shape in enumerate(mine.shapes)
        for dim in range(len(shape or ()))
    }
    largest = mine.resized(sizes)
    if largest == mine:
        return batch
    (grown,), _ = padded_to((batch,), (), largest)
    return grown


def plan_from_rank_zero(make: Callable[[], Plan], world_size: int) -> Plan:
    """The plan rank 0 makes with ``make``, on every rank (one broadcast); one rank: made."""
    if world_size == 1 or not torch.distributed.is_initialized():
        return make()
    sent = [make().model_dump_json() if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(sent, src=0)
    assert sent[0] is not None, "rank 0 sends its plan"
    return Plan.model_validate_json(sent[0])
