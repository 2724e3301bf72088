"""The plans that fit, timed whole on the real model, side by side: the fastest is the plan.

NOTE [Whole-plan timing]
The solver adds up per-option costs: each segment's recompute, each region's pieces, the
micro-batches' overhead (NOTE [Timed options]). On a small step those sums miss what only a
whole step shows: a checkpoint's fixed cost, the loss and optimizer bookkeeping of every
micro-batch, caches warmed or not by the step around a piece. On the zoo's 10 ms steps the plan
chosen that way took 1.57x where four micro-batches took 1.46x, and an LSTM's 5.61x where they
took 1.83x. So where the planner times the real model (the CPU, NOTE [Measured step time]; a
model torch.fx did not trace too, in whole steps, NOTE [Timing a module chain]), the final
choice is made by timing:

- *Candidates.* The cheapest solution at each micro-batch count (the solver's choice is one
  of them), the ``MAX_CANDIDATES`` cheapest by the estimate, each measured on fake tensors and
  kept only if that measurement fits the budget. With fewer than two there is nothing to
  compare.
- *Timing.* The plain step and every candidate run forward, loss and backward on the real
  model, the micro-batches of a candidate each with its backward, one after the other in
  rounds, so that a noisy moment slows every plan of its round alike; the order rotates every
  round, so that none always follows the same other one (the allocator and the caches hold
  what the run before left). Gradients come from
  ``torch.autograd.grad`` (no ``.grad`` is written) and buffers are put back after each run.
  At least ``MIN_ROUNDS`` rounds, more while the rounds so far took under ``ROUNDS_S``
  seconds, at most ``MAX_ROUNDS``: a step of a few milliseconds gets many rounds within that
  second (the zoo's ``keyword_arguments``, a 3 ms step, came out at 1.12-1.51x from one
  planning to the next with 7 rounds, 1.37-1.61x with 25, measured 1.56-1.71x), a long step
  the least.
- *At the whole batch.* Where the runs use fewer samples than the batch (NOTE [Timing at a
  batch that fits]), a plan that fits the budget at the whole batch by its own measurement is
  timed there, as training will run it, where its step and what the runs hold beside it (their
  copy of the samples timed, the regions' inputs) fit the budget's usable bytes; every
  candidate then runs at the whole batch and the plain step on its line. Otherwise a plan runs
  on the samples timed and half of them, its time read off the line through the two, if each
  of its micro-batches holds a sample for each chunk there. The line is the fallback, not the
  first choice: a plan's micro-batches on a few samples are pieces of two or three samples,
  which cost more than their share of a piece of sixteen, so the line stands for less than the
  plan takes (the zoo at 50%, fastest of 40, the line through 11 and 22 of 64 samples against
  the plan run at 64: `shared_block`'s 4 micro-batches 2.35 against 3.37 ms, 30% under;
  `keyword_arguments`' 13% under; `dataclass_output`'s 2%; the plain steps' lines 0-9%). And a
  plan that cuts finer than the samples cannot run there at all: ``tft-225`` at 25% of its
  peak is timed on 6 of its 32 samples, and neither 8 micro-batches nor 32 chunks of its
  variable selection run on 3 (the sums of options had put those 32 chunks at 1.05x the plain
  step and 8 micro-batches at 1.10x; the trainer measured 1.47x and 1.23x).
- *Choice.* The candidate with the lowest fastest time (of its rounds); its predicted extra
  time is that less the plain step's fastest, from the same rounds, and the plain step the plan
  reports is that fastest, with the optimizer step added: a plain step timed apart (a few runs,
  segment by segment) put the zoo's 3-5 ms steps anywhere from 3.1 to 4.9 ms between plannings
  of one model, and its ratio to a plan's time from other runs with them. The fastest, not the
  median: a plan's run right after another's can pay for what that one left, which a training
  run, repeating one plan, does not (on a VM where mapping a page is slow, `tft-225`'s plain
  step took 1.6-3.4 s alternating with a chunked plan, 1.7-1.8 s settled), and the noise of a
  busy host only ever adds time. The plan's notes list every candidate's ratio to the plain
  step.
- *Once a planning.* A stage whose sums say stop has its fit timed whole (NOTE [Planning],
  3), a later stage may find the same fit, and the final choice times it beside the others: each
  plan is run once a planning and read from its rounds after that, the plain step run again
  beside the plans not yet timed. Plans from different rounds are compared by their time over
  the plain step's in their own rounds, as a noisy moment slows the plain step beside them too.
  On ``tft-225`` (batch 32, 1.2-1.7 s a planned step on this CPU) each planning at 50% and 25%
  of its peak had timed one plan three times: in two stages and again among the final three.
- *Failure.* Where a run fails (a model that refuses a piece of its batch), nothing more is
  timed whole: the solver's sums stand for the plan, and its notes say why.

The optimizer step is the same for every plan and is not timed here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autockpt.planner.measure.scaled_step import real_step_bytes
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_decoding import Decision
from autockpt.planner.timing.real_batch import RealBatch
from autockpt.planner.timing.timing_room import on_line

#: Plans timed whole at most (NOTE [Whole-plan timing]).
MAX_CANDIDATES = 3
#: Rounds of timing: at least, at most, and the seconds after which no more are started.
MIN_ROUNDS, MAX_ROUNDS, ROUNDS_S = 3, 25, 1.0


@dataclass(frozen=True)
class TimedChoice:
    """The fastest candidate and what the timing found.

    Attributes:
        decision / profile: the chosen plan and its fake-tensor measurement.
        extra_s: its fastest step time less the plain step's, from the same rounds.
        plain_s: the plain step's fastest time in those rounds, the optimizer step added: the
            plain step the plan reports, beside the plan's time from the same rounds.
        note: one sentence for the plan's notes.
    """

    decision: Decision
    profile: StepProfile
    extra_s: float
    plain_s: float
    note: str


class StepRunner:
    """Runs whole steps of plans on the real model, with what the stopwatch already holds:
    the model, the caller's batch and loss, training's threads and autocast."""

    def __init__(self, stopwatch: RealBatch) -> None:
        self.stopwatch = stopwatch

    def can_run(self, decision: Decision) -> bool:
        """Whether ``decision`` runs as planned on every sample count it is timed at: each
        micro-batch holds a sample for each chunk (NOTE [Timing at a batch that fits])."""
        chunks = max((a.num_chunks for a in decision.actions), default=1)
        return min(self.sample_counts()) >= decision.num_micro_batches * chunks

    def sample_counts(self) -> tuple[int, ...]:
        """The samples plans are timed at: the whole batch where the runs use it, else the
        runs' samples and half of them, for a line to the whole batch."""
        watch = self.stopwatch
        if watch.batch_size >= watch.whole_batch_size:
            return (watch.batch_size,)
        return (watch.batch_size, watch.room.lower_samples)

    def fits_whole(self, profile: StepProfile, usable_bytes: int) -> bool:
        """Whether a plan measured as ``profile`` may run at the whole batch where the runs
        use fewer samples: its real step and what the runs hold beside it fit
        ``usable_bytes``."""
        watch = self.stopwatch
        return (
            watch.batch_size < watch.whole_batch_size and self.whole_bytes(profile) <= usable_bytes
        )

    def whole_bytes(self, profile: StepProfile) -> int:
        """The most real bytes a run at the whole batch of the plan measured as ``profile``
        holds: its step (the caller's model and batch included) and the runs' own copies."""
        return real_step_bytes(profile) + self.stopwatch.held_bytes()

    def seconds(self, decision: Decision | None, samples: int | None = None) -> Callable[[], float]:
        """A function timing one forward, loss and backward of ``decision`` (``None``: the
        plain step) on the real model, on the leading ``samples`` the runs use (default: all
        of them; more: the caller's whole batch)."""
        watch = self.stopwatch
        if decision is None:
            return watch.step_run(watch.plain_module(), 1, samples)
        module = watch.planned_module(decision.segments, decision.actions)
        return watch.step_run(module, decision.num_micro_batches, samples)

    def whole_batch_s(self, counts: Sequence[int], fastest: Sequence[float]) -> float:
        """A plan's seconds at the whole batch, from its fastest run at each of ``counts``
        (:meth:`sample_counts`, or the whole batch alone)."""
        if len(counts) == 1:  # the whole batch itself
            return fastest[0]
        (high, low), (high_s, low_s) = counts, fastest
        return on_line(low_s, low, high_s, high, self.stopwatch.whole_batch_size)


def times_in_rounds(
    runs: Sequence[Callable[[], float]], min_rounds: int, max_rounds: int, rounds_s: float
) -> list[list[float]]:
    """Each of ``runs``' seconds in every round, the order rotating every round so that none
    always runs right after the same other one (NOTE [Whole-plan timing]): at least
    ``min_rounds``, more while the rounds so far took under ``rounds_s`` seconds, at most
    ``max_rounds``."""
    times: list[list[float]] = [[] for _ in runs]
    started = time.perf_counter()
    rounds = 0
    while rounds < min_rounds or (rounds < max_rounds and time.perf_counter() - started < rounds_s):
        for index in [*range(rounds % len(runs), len(runs)), *range(rounds % len(runs))]:
            times[index].append(runs[index]())
        rounds += 1
    return times


def _plan_key(decision: Decision, at_whole_batch: bool) -> tuple[object, ...]:
    """What identifies a plan timed whole: its segments, actions and pieces, and where it ran."""
    return (
        tuple(decision.spans),
        tuple(decision.actions),
        decision.num_micro_batches,
        at_whole_batch,
    )


@dataclass(frozen=True)
class _Timed:
    """One plan's timing: its fastest seconds at the whole batch, and the plain step's fastest
    in the same rounds (on its line where the runs use fewer samples)."""

    seconds: float
    plain_s: float
    rounds: int


def timed_side_by_side(
    decisions: Sequence[Decision], runner: StepRunner, *, at_whole_batch: bool
) -> tuple[float, list[float], int]:
    """The plain step and ``decisions`` run in rounds (NOTE [Whole-plan timing]): the plain
    step's fastest seconds at the whole batch, each decision's, and the rounds run.

    Args:
        decisions: plans that fit.
        runner: runs steps on the real model.
        at_whole_batch: run the decisions at the whole batch (each must
            :meth:`~StepRunner.fits_whole`), the plain step still on the samples timed.
    """
    watch = runner.stopwatch
    plans = [None, *decisions]
    candidate_counts = (watch.whole_batch_size,) if at_whole_batch else runner.sample_counts()
    counts = [runner.sample_counts(), *[candidate_counts] * len(decisions)]
    runs = [
        runner.seconds(d, n)
        for d, plan_counts in zip(plans, counts, strict=True)
        for n in plan_counts
    ]

    def isolated(run: Callable[[], float]) -> float:
        with watch.isolated():
            seconds = run()
        watch.runs.spent_s += seconds  # the notes' seconds of runs count these too
        return seconds

    times = times_in_rounds(
        [functools.partial(isolated, run) for run in runs], MIN_ROUNDS, MAX_ROUNDS, ROUNDS_S
    )
    fastest = iter([min(t) for t in times])
    at_whole = [
        runner.whole_batch_s(plan_counts, [next(fastest) for _ in plan_counts])
        for plan_counts in counts
    ]
    return at_whole[0], at_whole[1:], len(times[0])


class PlanTimings:
    """The plans one planning times whole, each timed once (NOTE [Whole-plan timing], *Once
    a planning*): a plan asked for again, by a later stage or by the final choice, is read
    from its earlier rounds."""

    def __init__(self) -> None:
        self._timed: dict[tuple[object, ...], _Timed] = {}

    def fastest(
        self,
        candidates: Sequence[tuple[Decision, StepProfile]],
        runner: StepRunner,
        optimizer_s: float,
        *,
        at_whole_batch: bool = False,
    ) -> TimedChoice:
        """Time the candidates not yet timed in rounds with the plain step; the fastest of all
        of them, each by its time over the plain step's in its own rounds.

        Args:
            candidates: plans that fit, each with its fake-tensor measurement (one is timed
                against the plain step alone).
            runner: runs steps on the real model.
            optimizer_s: the optimizer step's seconds (the same for every plan, not timed
                here), added to the plain step's for each candidate's ratio against it.
            at_whole_batch: run the candidates at the whole batch (each must
                :meth:`~StepRunner.fits_whole`), the plain step still on the samples timed.
        """
        watch = runner.stopwatch
        keys = [_plan_key(d, at_whole_batch) for d, _ in candidates]
        new = {k: fit for k, fit in zip(keys, candidates, strict=True) if k not in self._timed}
        if new:
            if at_whole_batch:
                # NOTE [Planning's own peak]: these runs hold the plans' steps at the whole batch.
                watch.whole_batch_peak_bytes = max(
                    [
                        watch.whole_batch_peak_bytes,
                        *(runner.whole_bytes(p) for _, p in new.values()),
                    ]
                )
            plain, each, run_rounds = timed_side_by_side(
                [d for d, _ in new.values()], runner, at_whole_batch=at_whole_batch
            )
            for key, seconds in zip(new, each, strict=True):
                self._timed[key] = _Timed(seconds, plain, run_rounds)
        entries = [self._timed[k] for k in keys]

        def ratio(entry: _Timed) -> float:
            return 1.0 + (entry.seconds - entry.plain_s) / max(entry.plain_s + optimizer_s, 1e-9)

        best = min(range(len(entries)), key=lambda i: ratio(entries[i]))
        decision, profile = candidates[best]
        chosen = entries[best]
        described = ", ".join(
            f"{_describe(d)} {ratio(e):.2f}x" for (d, _), e in zip(candidates, entries, strict=True)
        )
        where = (
            f" at the whole batch ({watch.whole_batch_size} samples; the plain step's time read "
            f"off its line through {' and '.join(map(str, runner.sample_counts()))} samples)"
            if at_whole_batch
            else ""
        )
        earlier = len(candidates) - len(new)
        rounds_said = f"{max(e.rounds for e in entries)} rounds" + (
            f"; {earlier} of them timed earlier in this planning, in rounds of their own"
            if earlier
            else ""
        )
        note = (
            f"timed {len(candidates)} plans that fit whole{where} against the plain step "
            f"({rounds_said}): {described}; took the fastest"
            if len(candidates) > 1
            else f"timed the plan whole{where} against the plain step ({rounds_said}): {described}"
        )
        return TimedChoice(
            decision, profile, chosen.seconds - chosen.plain_s, chosen.plain_s + optimizer_s, note
        )


def _describe(decision: Decision) -> str:
    recomputed = sum(a.recompute for a in decision.actions)
    chunks = max((a.num_chunks for a in decision.actions), default=1)
    parts = [f"{recomputed} recomputed"]
    if chunks > 1:
        parts.append(f"chunks up to {chunks}")
    if decision.num_micro_batches > 1:
        parts.append(f"{decision.num_micro_batches} micro-batches")
    return "(" + ", ".join(parts) + ")"
