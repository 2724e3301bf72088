"""What a plan's options cost in seconds: estimated from FLOPs and bytes, or timed for real.

NOTE [Time model]
Where the real model is not timed (NOTE [Measured step time] in
:mod:`autockpt.planner.timing.stopwatch` says where it is), the seconds of a piece of work are
estimated as

    num_ops * op_overhead_s + flops / flops_per_s + moved_bytes / bytes_per_s

with the three rates measured on the target device when the planner first needs them (a
matrix product for ``flops_per_s``, an elementwise add on a large tensor for ``bytes_per_s``,
many tiny ops for ``op_overhead_s``; about a tenth of a second on a CPU, cached per device).
The calibration's tensors fit half of what the budget leaves beside the model's parameters,
optimizer state and batch (down to 64x64 matrices and 64K-element vectors): on CUDA the full
sizes (4096x4096, 64M elements) took about 0.7 GB of the card the user said was full, and the
caching allocator is emptied afterwards so that nvidia-smi does not keep showing it.
A selective recompute (NOTE [Selective recompute]) also pays, for every op of its segment,
twice what a Python dispatch mode adds to an op (timed on tiny ops under a mode that only
runs them): on the zoo's 10-20 ms CPU steps that made recomputing every segment selectively
slower than recomputing it whole (nanoGPT 2.05x against 1.81x).
A plain step is three forwards; recomputing a segment costs its forward again; ``k`` chunks
and ``m`` micro-batches pay the per-op overhead again for every extra piece. It ranks actions
the right way round on a GPU, where FLOPs dominate; on a CPU it missed by a factor of three on
small models and the wrong way round on ``tft-225`` (chunks that measured faster than keeping).

NOTE [Timed options]
With the real model timed, an option's cost is measured only once the solver is about to choose it.
Until then it carries an estimate; the solver solves, and if its choice rests on estimates, those
are timed and it solves again, until the plan it picks is timed throughout
(:meth:`~autockpt.planner.solve.option_pricing.OptionPricing.time_choice`; each round times
something new, so it ends). For that to find the fastest plan, an estimate must not be above what
timing can give, for options whose time nothing predicts: a region in chunks is estimated at minus
its kept time (the cheapest it could possibly be: free), so every chunk count that fits the budget
is timed before one is chosen, and micro-batches at no extra time. A region recomputed whole is
estimated at its forward time. A segment inside a region, recomputed on its own, is not timed (its
inputs are not kept from the plain step): its forward time in the plain step is its cost. An
option's cost is what its timed pieces take less what the same positions took in the plain step; one
measured faster than keeping has a negative cost.

What "the fastest plan that fits" means here: the fastest among the plans that fit and that the
planner examined. The staged widening (NOTE [Planning]) examines regions, chunks and
micro-batches only when plain recompute cannot fit; within a stage a plan may chunk a region
more than the budget needs, or chunk a region the budget does not need chunked at all, when
that was timed faster. A budget the plain step meets gets the plain step, recomputing nothing
and timing nothing, even where chunks might be faster: the plain step is the one a user
compares against, its gradients are bit for bit the model's with dropout on (chunks draw masks
per piece), and planning without a budget stays as cheap as it was.

A timed run is one run (short ones: the median of up to three), so a plan is only as sure as
the host is quiet: on a host with other work the same piece's time moved by 2x between
processes, and the choice between neighbouring chunk counts with it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from autockpt.errors import describe_error
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.timing.calibration import TimeModel
from autockpt.planner.timing.stopwatch import Stopwatch

_T = TypeVar("_T")


@dataclass(frozen=True)
class Cost:
    """Seconds an option adds to a step.

    Attributes:
        seconds: the cost, measured or estimated.
        timing: what to time to replace the estimate (NOTE [Timed options]); ``None`` when
            nothing will.
    """

    seconds: float
    timing: Hashable | None = None


class StepCosts(Protocol):
    """Seconds of a step and of the options that change it (NOTE [Time model])."""

    @property
    def source(self) -> str:
        """How the seconds were found, for the plan's notes ("" when estimated)."""
        ...

    def unplanned_step_s(self) -> float:
        """Forward, backward and optimizer step of the plain model."""
        ...

    def recompute_s(
        self,
        first: int,
        end: int,
        *,
        chunks: int = 1,
        pieces: int = 1,
        input_batch_dims: Sequence[int | None] | None = None,
        selective: bool = False,
    ) -> Cost:
        """Seconds that recomputing chain positions ``first..end-1`` as one unit, in ``chunks``
        pieces of the batch, adds to a step split into ``pieces`` micro-batches; with
        ``selective``, its cheap ops only (NOTE [Selective recompute])."""
        ...

    def micro_batch_s(self, pieces: int) -> Cost:
        """Seconds that splitting the plain step into ``pieces`` micro-batches adds."""
        ...

    def take(self, timings: Iterable[Hashable]) -> bool:
        """Time what ``timings`` name; whether anything was timed that was not before."""
        ...


class EstimatedCosts:
    """Costs from the time model and the kept step's counted work (NOTE [Time model])."""

    def __init__(self, time_model: TimeModel, kept: StepProfile, *, source: str = "") -> None:
        self.time_model = time_model
        #: Why the step is estimated, for the plan's notes ("" where that needs no word).
        self.source = source
        self.forward_s = [
            time_model.seconds(
                flops=s.forward_flops, moved_bytes=s.forward_moved_bytes, num_ops=s.forward_num_ops
            )
            for s in kept.segments
        ]
        self.num_ops = [s.forward_num_ops for s in kept.segments]
        # A selective recompute skips the matrix products, which do nearly all the FLOPs, but
        # every op of the segment passes through torch's Python dispatch mode twice (caching in
        # forward, replaying in the recompute).
        self.cheap_forward_s = [
            time_model.seconds(
                flops=0, moved_bytes=s.forward_moved_bytes, num_ops=s.forward_num_ops
            )
            + 2 * s.forward_num_ops * time_model.mode_overhead_s
            for s in kept.segments
        ]

    def unplanned_step_s(self) -> float:
        return 3 * sum(self.forward_s)

    def recompute_s(
        self,
        first: int,
        end: int,
        *,
        chunks: int = 1,
        pieces: int = 1,
        input_batch_dims: Sequence[int | None] | None = None,
        selective: bool = False,
    ) -> Cost:
        if selective:
            return Cost(sum(self.cheap_forward_s[first:end]))
        # Each extra chunk pays the per-op overhead again, in the forward and in backward.
        overhead = 2 * (chunks - 1) * sum(self.num_ops[first:end]) * self.time_model.op_overhead_s
        return Cost(sum(self.forward_s[first:end]) + overhead)

    def micro_batch_s(self, pieces: int) -> Cost:
        # Forward and backward (twice the forward's ops) pay the overhead again per piece.
        return Cost(3 * (pieces - 1) * sum(self.num_ops) * self.time_model.op_overhead_s)

    def take(self, timings: Iterable[Hashable]) -> bool:
        return False


@dataclass(frozen=True)
class _Piece:
    region: int
    samples: int
    input_batch_dims: tuple[int | None, ...]


@dataclass(frozen=True)
class _PlainStep:
    pieces: int


class MeasuredCosts:
    """Costs timed on the real model (NOTE [Measured step time], NOTE [Timed options]).

    Args:
        stopwatch: times the real model.
        regions: the traced model's regions, as ``(first, end)`` chain positions.
        batch_size: the whole batch.
        fallback: the costs to give instead if timing fails (the model refuses to run for
            real, the host runs out of memory); ``source`` then says why.
    """

    def __init__(
        self,
        stopwatch: Stopwatch,
        regions: Sequence[tuple[int, int]],
        batch_size: int,
        *,
        fallback: StepCosts,
    ) -> None:
        self.stopwatch = stopwatch
        self.batch_size = batch_size
        self.fallback = fallback
        self.failure = ""
        self._region_of = {span: index for index, span in enumerate(regions)}
        self._timed: set[Hashable] = set()

    @property
    def source(self) -> str:
        if self.failure:
            return timing_failed(self.failure)
        own = (
            "; the plain step is the model's own, its torch.utils.checkpoint calls recomputing "
            "(NOTE [The model's own checkpoints, timed])"
            if self.stopwatch.own_model is not None
            else ""
        )
        return f"timed on the real model{self.stopwatch.runs_said()}{own}"

    def unplanned_step_s(self) -> float:
        return self._guarded(
            lambda: self.stopwatch.plain_step_s() + self.stopwatch.optimizer_s(),
            self.fallback.unplanned_step_s,
        )

    def recompute_s(
        self,
        first: int,
        end: int,
        *,
        chunks: int = 1,
        pieces: int = 1,
        input_batch_dims: Sequence[int | None] | None = None,
        selective: bool = False,
    ) -> Cost:
        if selective:
            return self._selective(first, end)
        return self._guarded(
            lambda: self._recompute(first, end, chunks, pieces, input_batch_dims),
            lambda: self.fallback.recompute_s(
                first, end, chunks=chunks, pieces=pieces, input_batch_dims=input_batch_dims
            ),
        )

    def _selective(self, first: int, end: int) -> Cost:
        """A selective recompute is not timed alone: the timed forward of the positions, scaled
        by the share of it the estimate gives their cheap ops (NOTE [Selective recompute])."""
        whole = self.fallback.recompute_s(first, end).seconds
        cheap = self.fallback.recompute_s(first, end, selective=True).seconds
        share = cheap / whole if whole > 0 else 1.0
        return self._guarded(
            lambda: Cost(share * sum(self.stopwatch.plain_step().forward_s[first:end])),
            lambda: Cost(cheap),
        )

    def micro_batch_s(self, pieces: int) -> Cost:
        return self._guarded(
            lambda: self._micro_batch(pieces), lambda: self.fallback.micro_batch_s(pieces)
        )

    def take(self, timings: Iterable[Hashable]) -> bool:
        new = [t for t in timings if t not in self._timed]
        # Once timing has failed nothing more can be timed: the estimates stand, and the
        # solver's choice is final (saying "timed something new" here would ask forever).
        return self._guarded(lambda: self._take(new), lambda: False)

    def _recompute(
        self,
        first: int,
        end: int,
        chunks: int,
        pieces: int,
        input_batch_dims: Sequence[int | None] | None,
    ) -> Cost:
        forward_s = sum(self.stopwatch.plain_step().forward_s[first:end])
        kept_s = self._kept_piece_s(first, end, pieces) * pieces
        region = self._region_of.get((first, end))
        samples = -(-self.batch_size // pieces) // chunks  # a chunk of the largest micro-batch
        # Not timed where its inputs were not kept, or where they must be cut (to a chunk, or
        # to the samples the runs use: NOTE [Timing at a batch that fits]) and cannot be.
        cut = samples < self.batch_size or samples > self.stopwatch.batch_size
        if region is None or (cut and input_batch_dims is None):
            return Cost(forward_s)
        timing = _Piece(region, samples, tuple(input_batch_dims or ()))
        if timing in self._timed:
            piece_s = self.stopwatch.region_piece_s(region, samples, timing.input_batch_dims)
            return Cost(pieces * chunks * piece_s - kept_s)
        return Cost(-kept_s if chunks > 1 else forward_s, timing)

    def _micro_batch(self, pieces: int) -> Cost:
        if pieces == 1:
            return Cost(0.0)
        timing = _PlainStep(pieces)
        if timing not in self._timed:
            return Cost(0.0, timing)
        whole = self.stopwatch.plain_step()
        return Cost(pieces * self.stopwatch.plain_step(pieces).total_s - whole.total_s)

    def _take(self, timings: Sequence[Hashable]) -> bool:
        for timing in timings:
            if isinstance(timing, _Piece):
                self.stopwatch.region_piece_s(
                    timing.region, timing.samples, timing.input_batch_dims
                )
            elif isinstance(timing, _PlainStep):
                self.stopwatch.plain_step(timing.pieces)
            self._timed.add(timing)
        return bool(timings)

    def _kept_piece_s(self, first: int, end: int, pieces: int) -> float:
        """Forward and backward of positions ``first..end-1`` kept, on the largest piece:
        timed once that micro-batch count is, else the whole batch's time scaled."""
        if pieces == 1 or _PlainStep(pieces) not in self._timed:
            piece = -(-self.batch_size // pieces)
            return self.stopwatch.plain_step().kept_s(first, end) * piece / self.batch_size
        return self.stopwatch.plain_step(pieces).kept_s(first, end)

    def _guarded(self, timed: Callable[[], _T], estimated: Callable[[], _T]) -> _T:
        return guarded(self, timed, estimated)

    @property
    def sums_stand(self) -> bool:
        """Whether a plan's timed sums stand for its time against the plain step the plan
        reports: not where that is the model's own step (NOTE [The model's own checkpoints,
        timed]), which the options are not priced against."""
        return self.stopwatch.own_model is None

    def whole_runs(self) -> Stopwatch | None:
        """Where plans are timed whole (NOTE [Whole-plan timing]): the stopwatch, unless
        timing has failed."""
        return None if self.failure else self.stopwatch


class _Failing(Protocol):
    failure: str


def timing_failed(failure: str) -> str:
    """The costs' source where timing the real model failed with ``failure``."""
    return f"estimated: timing the real model failed ({failure})"


def guarded(costs: _Failing, timed: Callable[[], _T], estimated: Callable[[], _T]) -> _T:
    """``timed()``, or ``estimated()`` from the first time timing fails on (``costs.failure``
    then says how)."""
    if not costs.failure:
        try:
            return timed()
        except Exception as error:  # noqa: BLE001 - a model that cannot be timed is estimated
            costs.failure = describe_error(error)
    return estimated()


def timed_s(
    costs: StepCosts,
    first: int,
    end: int,
    *,
    chunks: int = 1,
    pieces: int = 1,
    input_batch_dims: Sequence[int | None] | None = None,
    selective: bool = False,
) -> float:
    """:meth:`StepCosts.recompute_s`'s seconds, timed first where they can be: what a plan's
    decided run of positions ``first..end-1`` adds."""

    def cost() -> Cost:
        return costs.recompute_s(
            first,
            end,
            chunks=chunks,
            pieces=pieces,
            input_batch_dims=input_batch_dims,
            selective=selective,
        )

    found = cost()
    if found.timing is not None and costs.take([found.timing]):
        found = cost()
    return found.seconds
