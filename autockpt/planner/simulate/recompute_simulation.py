"""The profile of a step with some segments recomputed, worked out from the kept step's record.

NOTE [Recompute simulated]
A segment recomputed (``torch.utils.checkpoint``, non-reentrant) changes three things about the
kept step's memory, each readable off the record (NOTE [One record, many plans]):

1. Its forward saves nothing for backward. A storage its forward made that is still live when
   its forward ends, that nothing after it reads and that is not one of its outputs (the
   model's output may be read by no op), was live only because autograd saved it: recomputed,
   it is freed after the last op that read it (a weight's cast, which autocast's cache holds,
   at the loss's end), and is absent until the segment's backward begins.
2. Its backward begins by running its forward again, up to the op that makes the last tensor
   it saves (the checkpoint's early stop): on top of what is live once the backward before it
   released what it frees, its forward's storages are made once more in their order, those its
   forward freed freed again, and the others held to the end of the rerun; the saved ones then
   live on as in the kept step.
3. Where its forward saved anything, the checkpoint holds its inputs until its backward has run,
   where the kept step may have freed one earlier (one read by an op that saves nothing).

What the simulation does not model, and how each is handled:

- the non-reentrant checkpoint releases a recomputed tensor as backward unpacks it, where the
  kept step releases it after the node: a segment's backward may read a few hundred bytes high
  (a bias gradient made while a freed value still counts);
- a module's own Python locals (a leaf module kept whole) live until it returns, not until
  their last read: underestimated by the simulation;
- in-place writes, a Python object holding a tensor: not seen.

So a segment is measured, not simulated, where its forward writes in place into a storage
another segment made (and that segment too), runs an op whose outputs are sized by running it for
real (a loss computed inside the model), or holds a custom autograd Function, a grad-mode or
autocast region, a checkpoint of the model's own, a submodule kept whole (attention, one fx
could not trace), or scaled dot-product attention with dropout (whose recomputed backward
measured above the simulation: 2 MiB on a tied-embedding language model in float32, 16 KiB on
nanoGPT in bfloat16; the cause was not found). :func:`unsure_segments` and the record's
``unsure`` name them.

A recurrent layer kept whole (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``; its workspace sized by
running it for real) is simulated where the kept step attributes backward ops to its segment
(:func:`recurrent_segments`, the record's ``needs_own_backward``): the TFT's LSTM segment, alone
or with every other segment recomputed, at one and two micro-batches, in float32 and bfloat16,
simulates to the byte on the sample's model and on ``tft-225``. Where no backward op is
attributed to it (an LSTM or GRU in the first segment of the zoo's models, whose backward ops
the kept step counts as the next segment's; why was not found), the rerun has nowhere to go;
simulated anyway, those steps read 65-82 KiB over, and they are measured.

One under-read is known and not excluded: nanoGPT in bfloat16 without dropout, whose last
segment computes the loss inside the model and returns it beside the logits, holds 52 KiB more
when the loss starts with that segment recomputed than the simulation says (the logits' size in
bfloat16 and a weight's cast); the plan's own measurement catches what this costs. Elsewhere,
over the zoo and the user-steps corpus, the simulated peak is the measured one or above it by
at most a few hundred bytes (``benchmarks/simulated_profiles.py``).

None of these is trusted: the plan the planner chooses is measured on fake tensors before it is
handed back (NOTE [Planning], step 4), and a plan the simulation placed under the budget that the
measurement puts over it is solved again below. The simulation serves the profiles the chain
model is built from (every segment, every unit, every region recomputed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate

import torch.nn.functional as F
from torch import fx
from torch.nn.modules.rnn import RNNBase

from autockpt.planner.simulate.step_profile import SegmentProfile, StepProfile
from autockpt.planner.simulate.step_record import StepRecord
from autockpt.planner.trace.autograd_regions import USER_CHECKPOINT_META, changes_autograd
from autockpt.planner.trace.fx_graph import LEAF_MODULE_TYPES, Segment, TracedModel


def unsure_segments(traced: TracedModel) -> set[int]:
    """The segments whose graph holds what the simulation does not model (NOTE [Recompute
    simulated]): a custom autograd Function, a grad-mode or autocast region, a checkpoint
    the forward calls itself, a submodule kept whole (attention, one fx could not trace; a
    recurrent layer is the record's to judge), scaled dot-product attention with dropout."""
    modules = dict(traced.graph_module.named_modules())

    def unmodelled(node: fx.Node) -> bool:
        if changes_autograd(node) or USER_CHECKPOINT_META in node.meta:
            return True
        if node.op == "call_function" and node.target is F.scaled_dot_product_attention:
            dropout = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
            return not (isinstance(dropout, (int, float)) and dropout == 0.0)
        if node.op != "call_module":
            return False
        module = modules.get(str(node.target))
        return (isinstance(module, LEAF_MODULE_TYPES) and not isinstance(module, RNNBase)) or (
            str(node.target) in traced.opaque
        )

    return _segments_holding(traced, unmodelled)


def recurrent_segments(traced: TracedModel) -> set[int]:
    """The segments holding a recurrent layer kept whole (``nn.LSTM``, ``nn.GRU``,
    ``nn.RNN``): simulated only where the kept step attributes backward ops to them
    (``StepRecord.needs_own_backward``, NOTE [Recompute simulated])."""
    modules = dict(traced.graph_module.named_modules())
    return _segments_holding(
        traced,
        lambda node: (
            node.op == "call_module" and isinstance(modules.get(str(node.target)), RNNBase)
        ),
    )


def _segments_holding(traced: TracedModel, holds: Callable[[fx.Node], bool]) -> set[int]:
    nodes = {node.name: node for node in traced.graph_module.graph.nodes}
    return {
        segment.index
        for segment in traced.segments
        if any(holds(nodes[name]) for name in segment.node_names if name in nodes)
    }


def unmodelled_segments(record: StepRecord, kept: StepProfile) -> set[int]:
    """The segments of the step ``record`` was taken beside (measured as ``kept``) that the
    simulation leaves to measurement: ``record.unsure``, and the recurrent ones whose
    backward the kept step attributed to none of their ops."""
    steps = [entry for entry in kept.timeline if entry[1] != "optimizer"]
    return record.unsure | (record.needs_own_backward - _backward_ops(steps).keys())


def _backward_ops(steps: Sequence[tuple[int, str, int]]) -> dict[int, list[int]]:
    """Each segment's backward ops, as indices of the kept step's timeline ``steps``."""
    backward_ops: dict[int, list[int]] = {}
    for k, (_, phase, segment) in enumerate(steps):
        if phase == "backward" and segment >= 0:
            backward_ops.setdefault(segment, []).append(k)
    return backward_ops


def base_runs(base: Sequence[Segment], segments: Sequence[Segment]) -> list[tuple[int, int]] | None:
    """Each of ``segments`` as a run ``(first, end)`` of the ``base`` segments, in order and
    covering them; ``None`` where they are not such runs."""
    index_of = {name: segment.index for segment in base for name in segment.node_names}
    runs, expected = [], 0
    for segment in segments:
        indices = {index_of.get(name, -1) for name in segment.node_names}
        first, end = min(indices, default=-1), max(indices, default=-2) + 1
        if first != expected or indices != set(range(first, end)):
            return None
        runs.append((first, end))
        expected = end
    return runs if expected == len(base) else None


def simulated_profile(
    record: StepRecord,
    kept: StepProfile,
    base: Sequence[Segment],
    segments: Sequence[Segment],
    recompute: Sequence[bool],
) -> StepProfile | None:
    """The step run as ``segments`` (runs of the ``base`` segments ``kept`` was measured on,
    with ``record`` beside it), those flagged in ``recompute`` recomputed (NOTE [Recompute
    simulated]); ``None`` where ``segments`` are not runs of ``base``, or a run recomputed
    holds a segment the simulation does not model (``record.unsure``; a recurrent layer's
    whose backward the kept step attributed to no op of it)."""
    runs = base_runs(base, segments)
    steps = [entry for entry in kept.timeline if entry[1] != "optimizer"]
    backward_ops = _backward_ops(steps)
    unsure = record.unsure | (record.needs_own_backward - backward_ops.keys())
    if runs is None or any(
        again and unsure.intersection(range(first, end))
        for (first, end), again in zip(runs, recompute, strict=True)
    ):
        return None
    count = len(steps)
    change = [0] * (count + 1)  # bytes added to the kept step's live bytes, from an op on

    def add(start: int, stop: int, size: int) -> None:
        start, stop = max(start, 0), min(stop, count)
        if start < stop:
            change[start] += size
            change[stop] -= size

    backward_start = next((k for k, e in enumerate(steps) if e[1] == "backward"), count)
    reruns: dict[int, tuple[int, int]] = {}  # run index -> (first backward op, rerun's peak)
    absent: dict[int, tuple[int, int]] = {}  # storage -> ops it is not live at, as (start, stop)
    held: dict[int, tuple[int, int]] = {}  # storage -> ops it is live at beyond the kept step
    for position, ((first, end), again) in enumerate(zip(runs, recompute, strict=True)):
        ops = [k for b in range(first, end) for k in backward_ops.get(b, ())]
        if not again or not ops:
            continue
        backward_first, backward_end = min(ops), max(ops) + 1
        forward_first, forward_end = record.forward_ops[first][0], record.forward_ops[end - 1][1]
        own = [i for i, s in enumerate(record.storages) if first <= s.made_by < end]
        # What a run hands on that no later segment reads: the model's output.
        handed_on = {
            i
            for b in range(first, end)
            for i in record.output_storages[b]
            if not any(reader > b for reader in record.storages[i].read_by)
        }
        saved = [
            i
            for i in own
            if record.storages[i].freed > forward_end
            and record.storages[i].last_read < forward_end
            and i not in handed_on
        ]
        for index in saved:  # 1. saved only for backward: absent until the rerun
            stored = record.storages[index]
            # A weight's cast lives in autocast's cache to the region's end (the loss's).
            read = backward_start if stored.cast_weight else stored.last_read + 1
            read = max(read, stored.born + 1)
            absent[index] = (read, min(backward_first, stored.freed))
            add(*absent[index], -stored.size_bytes)
        # 3. held by the checkpoint until its backward has run, where its forward saved
        # anything (with nothing saved, nothing holds the checkpoint after its forward)
        inputs = {i for b in range(first, end) for i in record.input_storages[b]} if saved else ()
        for index in inputs:
            stored = record.storages[index]
            if stored.born < forward_first and stored.freed < backward_end:
                held[index] = (stored.freed, max(backward_end, held.get(index, (0, 0))[1]))
        # 2. the rerun of its forward, on top of what is live before its backward; it stops
        # once the last tensor saved is made again (the checkpoint's early stop)
        rerun_end = max((record.storages[i].born for i in saved), default=forward_first - 1) + 1
        rerun = [0] * (max(rerun_end - forward_first, 0) + 1)
        for index in own:
            stored = record.storages[index]
            if stored.born >= rerun_end:
                continue
            born = min(max(stored.born - forward_first, 0), len(rerun) - 1)
            freed = stored.freed - forward_first if stored.freed < rerun_end else len(rerun)
            rerun[born] += stored.size_bytes
            if freed < len(rerun):
                rerun[freed] -= stored.size_bytes
        reruns[position] = (backward_first, max(accumulate(rerun), default=0))
    for index, (freed, until) in held.items():
        add(freed, until, record.storages[index].size_bytes)
    shifts = list(accumulate(change))
    live = [entry[0] + shift for entry, shift in zip(steps, shifts, strict=False)]

    # A rerun starts once the backward before it is done with what it freed.
    def live_at(index: int, k: int) -> bool:
        stored = record.storages[index]
        start, stop = absent.get(index, (0, 0))
        kept_live = stored.born <= k < stored.freed and not start <= k < stop
        start, stop = held.get(index, (0, 0))
        return kept_live or start <= k < stop

    released: dict[int, int] = {}
    for index, stored in enumerate(record.storages):
        freed = max(stored.freed, held.get(index, (0, 0))[1])
        if freed < count and live_at(index, freed - 1) and not live_at(index, freed):
            released[freed] = released.get(freed, 0) + stored.size_bytes
    reruns = {
        position: (first_op, rerun_peak - released.get(first_op, 0))
        for position, (first_op, rerun_peak) in reruns.items()
    }
    run_of_base = {b: i for i, (first, end) in enumerate(runs) for b in range(first, end)}
    return _profile(record, kept, segments, runs, live, steps, shifts, reruns, run_of_base)


def _profile(
    record: StepRecord,
    kept: StepProfile,
    segments: Sequence[Segment],
    runs: list[tuple[int, int]],
    live: list[int],
    steps: list[tuple[int, str, int]],
    shifts: list[int],
    reruns: dict[int, tuple[int, int]],
    run_of_base: dict[int, int],
) -> StepProfile:
    """The :class:`StepProfile` of the simulated live bytes, as the step's recorder would
    have written it for ``segments`` (NOTE [Step accounting])."""

    def shift_at(k: int) -> int:
        return shifts[min(k, len(shifts) - 1)] if shifts else 0

    profiles = []
    for (first, end), segment in zip(runs, segments, strict=True):
        start_op = record.forward_ops[first][0]
        profiles.append(
            SegmentProfile(
                start_bytes=kept.segments[first].start_bytes + shift_at(start_op),
                forward_num_ops=sum(s.forward_num_ops for s in kept.segments[first:end]),
                input_sizes=tuple(record.input_sizes.get(n, 0) for n in segment.input_names),
                output_bytes=sum(record.output_sizes.get(n, 0) for n in segment.output_names),
            )
        )
        profiles[-1].input_bytes = sum(profiles[-1].input_sizes)
        profiles[-1].forward_peak_bytes = profiles[-1].start_bytes
    for position in range(len(profiles) - 1):
        profiles[position].end_bytes = profiles[position + 1].start_bytes
    if profiles:
        loss_op = record.forward_ops[runs[-1][1] - 1][1]
        profiles[-1].end_bytes = kept.segments[-1].end_bytes + shift_at(loss_op)
    phase_peak = dict(kept.phase_peak_bytes)
    for phase in ("forward", "loss", "backward"):
        phase_peak[phase] = 0
    timeline: list[tuple[int, str, int]] = []
    previous = -1  # the run whose forward ran last: ops between runs sit on top of it
    for (_, phase, base_index), now in zip(steps, live, strict=True):
        position = run_of_base.get(base_index, -1)
        timeline.append((now, phase, position))
        phase_peak[phase] = max(phase_peak[phase], now)
        if phase == "forward":
            owner = position if position >= 0 else previous
            if owner >= 0:
                profiles[owner].forward_peak_bytes = max(profiles[owner].forward_peak_bytes, now)
            elif profiles:
                profiles[0].forward_peak_bytes = max(profiles[0].forward_peak_bytes, now)
            previous = owner
        elif phase == "backward" and position >= 0:
            profiles[position].backward_peak_bytes = max(
                profiles[position].backward_peak_bytes, now
            )
        elif phase == "backward":
            phase_peak["loss"] = max(phase_peak["loss"], now)
    for position, (backward_first, rerun_peak) in reruns.items():
        before = live[backward_first - 1] if backward_first > 0 else kept.start_bytes
        spike = before + rerun_peak
        profiles[position].backward_peak_bytes = max(profiles[position].backward_peak_bytes, spike)
        phase_peak["backward"] = max(phase_peak["backward"], spike)
    optimizer = [entry for entry in kept.timeline if entry[1] == "optimizer"]
    peak = max([kept.start_bytes, *live, *phase_peak.values()])
    return StepProfile(
        start_bytes=kept.start_bytes,
        parameter_bytes=kept.parameter_bytes,
        optimizer_state_bytes=kept.optimizer_state_bytes,
        input_bytes=kept.input_bytes,
        gradient_bytes=kept.gradient_bytes,
        segments=profiles,
        phase_peak_bytes=phase_peak,
        peak_bytes=peak,
        timeline=timeline + optimizer,
    )
