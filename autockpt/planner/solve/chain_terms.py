"""What a profile says per chain position, and how that scales with micro-batches.

The chain memory model (NOTE [Chain memory model] in :mod:`autockpt.planner.solve.chain_solver`)
reads each position's increments: what it leaves alive for later ones, its forward and backward
peaks above what came before, its boundary. These helpers take them from a measured
:class:`~autockpt.planner.simulate.step_profile.StepProfile`, fit them between the whole batch and
half of it, and say which micro-batch counts there are and how large their pieces are.
"""

from __future__ import annotations

from autockpt.planner.core.decisions import OptionAction
from autockpt.planner.simulate.step_profile import StepProfile
from autockpt.planner.solve.chain_solver import Option

#: Micro-batch counts the planner may split a batch-separable step into.
MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16, 32)


def kept_increments(profile: StepProfile) -> list[int]:
    """Bytes each segment of a profile leaves alive for later ones (``kept_bytes``)."""
    starts = [profile.start_bytes, *(s.end_bytes for s in profile.segments[:-1])]
    return [s.end_bytes - start for s, start in zip(profile.segments, starts, strict=True)]


def recompute_lower_bound_bytes(kept: StepProfile) -> int:
    """A peak no plan of plain recomputes, segment by segment, can go below, from the kept
    profile alone.

    While segment ``i`` runs backward, a plan holds what the kept step holds then, less at
    most what earlier segments had left alive when ``i`` started forward (a recomputed
    segment keeps only its boundary): its own interior, rebuilt if recomputed, the gradients
    and the state are the same. So every such plan peaks at least at
    ``backward_peak_i - (start_i - start)`` for every ``i``. The planner skips measuring the
    all-recomputed step when the budget is below this.
    """
    return max(
        (s.backward_peak_bytes - (s.start_bytes - kept.start_bytes) for s in kept.segments),
        default=0,
    )


def profile_terms(profile: StepProfile) -> dict[str, list[float]]:
    """Per-segment increments of a profile (NOTE [Chain memory model])."""
    kept = [float(b) for b in kept_increments(profile)]
    forward, backward, io = [], [], []
    previous_end = profile.start_bytes
    for segment in profile.segments:
        forward.append(float(max(segment.forward_peak_bytes - previous_end, 0)))
        backward.append(float(max(segment.backward_peak_bytes - previous_end, 0)))
        io.append(float(segment.input_bytes + segment.output_bytes))
        previous_end = segment.end_bytes
    return {
        "start": [float(profile.start_bytes)],
        "kept": kept,
        "forward": forward,
        "backward": backward,
        "io": io,
        "loss": [float(max(profile.phase_peak_bytes.get("loss", 0) - previous_end, 0))],
        "optimizer": [float(profile.phase_peak_bytes.get("optimizer", 0))],
    }


def extrapolate(
    whole: dict[str, list[float]],
    half: dict[str, list[float]],
    half_share: float,
    share: float,
) -> dict[str, list[float]]:
    """Fit ``a + c * s`` through the whole batch (``s = 1``) and the largest of two pieces
    (``s = half_share``), and read it at ``share``, the largest piece's share of the batch."""
    fitted = {}
    for key, values in whole.items():
        slopes = [(w - h) / (1.0 - half_share) for w, h in zip(values, half[key], strict=True)]
        fitted[key] = [max(w - c, 0.0) + c * share for w, c in zip(values, slopes, strict=True)]
    # Optimizer state and parameters do not shrink with the batch; from two pieces on, the
    # gradients are live before each piece starts, as in the half-batch profile.
    fitted["optimizer"] = whole["optimizer"]
    fitted["start"] = half["start"]
    return fitted


def option_at(
    action: OptionAction,
    terms: dict[str, list[float]],
    index: int,
    extra_s: float,
    *,
    span: int = 1,
) -> Option:
    return Option(
        action=action,
        kept_bytes=int(terms["kept"][index]),
        forward_bytes=int(terms["forward"][index]),
        backward_bytes=int(terms["backward"][index]),
        extra_s=extra_s,
        span=span,
    )


def micro_batch_counts(batch_size: int, possible: bool) -> list[int]:
    """Micro-batch counts to consider: those of ``MICRO_BATCH_CHOICES`` up to the batch size.

    A count need not divide the batch: the pieces are ``torch.tensor_split``'s, the first ones a
    sample larger, and the plan is measured on the largest.
    """
    if not possible:
        return [1]
    return [m for m in MICRO_BATCH_CHOICES if m <= batch_size]


def piece_share(batch_size: int, num_micro_batches: int) -> float:
    """The largest piece's share of the batch when it is split into ``num_micro_batches``."""
    return len(batch_pieces(batch_size, num_micro_batches)[0]) / batch_size


def batch_pieces(batch_size: int, num_pieces: int) -> list[range]:
    """The samples of each piece, as ``torch.tensor_split`` cuts them."""
    size, extra = divmod(batch_size, num_pieces)
    starts = [i * size + min(i, extra) for i in range(num_pieces + 1)]
    return [range(a, b) for a, b in zip(starts, starts[1:], strict=False)]
