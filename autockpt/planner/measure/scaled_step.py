"""Real steps measured at batches that fit the budget, and read off a line at the whole batch.

NOTE [Scaled real measurement]
A model whose forward does not run on fake tensors is measured on a real copy (NOTE [Module
chain]): every measurement is a real step on the device the model is planned for. At the whole
batch that is the very step that does not fit: planning a pytorch-forecasting TFT at half its
peak took 265 MiB of real tensors against a 67.6 MiB budget. So the copy shares the model's
parameter memory (:func:`~autockpt.planner.core.fake_copies.parameter_sharing_copy`; only its
gradients are new), and the steps run at smaller batches:

1. The plain step runs at ``PROBE_SAMPLES`` samples, then twice as many, and so on, while its
   real bytes (everything live but the optimizer state, which exists on meta tensors only), the
   caller's batch held outside the copy and a set of gradients (live before a micro-batch) fit
   ``ROOM_SHARE`` of the budget's usable bytes; a doubling runs only where the line through the
   two before says it fits, with the margin of step 3. A line through two tiny batches is no guide:
   there the peak is where the gradients are made, and the activations barely show.
2. Where the whole batch would not fit that share, each measurement runs at ``high`` samples
   per piece, the last doubling that fit, and at half of that, and every count of the profile (bytes per segment and per phase, FLOPs, bytes
   moved) is read off the line through the two at the whole batch: activations, inputs and what
   each segment keeps grow with the batch; parameters, gradients and optimizer state do not, and
   come out the same. A piece is never smaller than the chunks it is cut into.
3. A peak read off the line is taken ``LINE_MARGIN`` higher than the line says. A step whose
   real bytes, so read, fit the budget's usable bytes is then measured whole, exactly: the plans
   that fit are measured whole, and the line stands only for steps over the budget (the kept
   step, options that do not fit), where it gives the chain model's terms and "does not fit".
   Where every doubling up to the whole batch fits, every step is measured whole.

The line is exact for what grows in proportion to the batch and misses what grows otherwise (a
padded length that is the batch's longest sequence, a peak that moves from where the gradients are
made to where activations are: 4.7% low on a residual MLP read at 16x its points). So planning
peaks near the budget's usable bytes, less the optimizer state (which a real step of the copy
never holds), and the plan's predicted peak is measured whole. A plan the line puts within the
margin under the budget is not taken on its word: the search aims lower by what it is over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from autockpt.planner.simulate.step_profile import StepProfile

#: Samples of the smaller probe step (the larger takes twice as many).
PROBE_SAMPLES = 2
#: Share of the budget's usable bytes a measured real step may take, with the caller's batch
#: and a set of gradients: the rest is margin (the gradients cover micro-batch pieces, which
#: start with them; other plans hold less than the plain step).
ROOM_SHARE = 0.9
#: How much higher a peak read off the line is taken to be than the line says (NOTE [Scaled
#: real measurement], step 3).
LINE_MARGIN = 0.1
#: Pieces of fewer samples than this are not worth a line: measured whole.
MIN_SCALED_BATCH = 8


@dataclass(frozen=True)
class ScaledBatches:
    """Samples per piece the real steps are measured at (``low`` is half of ``high``)."""

    low: int
    high: int


def real_step_bytes(profile: StepProfile) -> int:
    """The real bytes a measured real step held at its peak: all of its phases but the
    optimizer's, whose state and step the planner adds as numbers (meta tensors)."""
    peaks = [v for phase, v in profile.phase_peak_bytes.items() if phase != "optimizer"]
    return max(peaks, default=profile.peak_bytes) - profile.optimizer_state_bytes


def scaled_batches(
    probe: Callable[[int], StepProfile],
    batch_size: int,
    *,
    room_bytes: int,
    held_bytes: int,
) -> ScaledBatches | None:
    """The batches to measure real steps at so that they fit ``room_bytes`` (steps 1 and 2 of
    NOTE [Scaled real measurement]), or ``None`` where the whole batch fits (or is too small
    to scale).

    Args:
        probe: the plain step measured at a number of samples.
        batch_size: the whole batch.
        room_bytes: real bytes planning may hold: the budget's usable bytes.
        held_bytes: bytes held outside the measured steps meanwhile (the caller's batch).
    """
    if batch_size < MIN_SCALED_BATCH:
        return None
    allowed = ROOM_SHARE * room_bytes
    samples, fitting, measured, extra_bytes = PROBE_SAMPLES, 0, (0, 0), held_bytes
    while samples < batch_size:
        if fitting > PROBE_SAMPLES:
            # The next doubling is run only where the line through the last two says it
            # fits, margin included: a probe over the room is what this is here to avoid.
            growth = measured[1] - measured[0]
            if (measured[1] + 2 * growth) * (1.0 + LINE_MARGIN) + extra_bytes > allowed:
                break
        profile = probe(samples)
        # Pieces of micro-batches start with every gradient live: room for them too.
        extra_bytes = held_bytes + profile.gradient_bytes
        if real_step_bytes(profile) + extra_bytes > allowed:
            break
        measured = (measured[1], real_step_bytes(profile))
        fitting, samples = samples, 2 * samples
    else:
        return None  # every batch up to the whole one fits: measured whole
    # At least a few samples per point of the line, whatever the room: a planning step over
    # it is better than no plan (the plan reports planning's peak either way).
    high = max(fitting, 2 * PROBE_SAMPLES)
    return ScaledBatches(low=high // 2, high=high)


def scaled_profile(
    low: StepProfile, high: StepProfile, low_size: int, high_size: int, size: int
) -> StepProfile:
    """Every count of two profiles of one step at ``low_size`` and ``high_size`` samples per
    piece, read at ``size`` on the line through them (none below zero)."""
    share = (size - low_size) / (high_size - low_size)

    def at(a: int, b: int) -> int:
        return max(round(a + (b - a) * share), 0)

    def scaled(a: object, b: object) -> object:
        values = {
            f.name: at(getattr(a, f.name), getattr(b, f.name))
            for f in dataclasses.fields(a)  # type: ignore[arg-type]
            if isinstance(getattr(a, f.name), int)
        }
        return dataclasses.replace(a, **values)  # type: ignore[type-var]

    profile = scaled(low, high)
    assert isinstance(profile, StepProfile)
    profile.timeline = []  # a small batch's, op by op: not the whole batch's
    profile.segments = [
        scaled(a, b)  # type: ignore[misc]
        for a, b in zip(low.segments, high.segments, strict=True)
    ]
    profile.phase_peak_bytes = {
        phase: at(value, high.phase_peak_bytes.get(phase, value))
        for phase, value in low.phase_peak_bytes.items()
    }
    profile.peak_bytes = max(profile.peak_bytes, *profile.phase_peak_bytes.values(), 0)
    # The line's error, counted against it (step 3): peaks read LINE_MARGIN higher.
    margin = 1.0 + LINE_MARGIN
    profile.phase_peak_bytes = {k: int(v * margin) for k, v in profile.phase_peak_bytes.items()}
    profile.peak_bytes = int(profile.peak_bytes * margin)
    return profile
