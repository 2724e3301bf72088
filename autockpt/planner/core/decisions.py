"""What a plan decides, the words the solver writes and the runtime and the saved plan read:
for each segment an action, and how the ranks share the work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SegmentAction:
    """What to do with one segment in the planned module.

    Attributes:
        recompute: drop its interior after forward and rebuild it in backward.
        num_chunks: run it in this many pieces along the batch (only with ``recompute``).
        input_batch_dims: for each of the segment's inputs, the dimension that carries the
            batch (split into pieces), or ``None`` (passed whole to every piece).
        output_batch_dims: for each output, the dimension the pieces are joined along.
        selective: recompute only its cheap ops, the outputs of its matrix products kept
            (NOTE [Selective recompute]; only with ``recompute``, in one piece).
        region_fraction: compiled, the segment is a graph of its own at this activation
            memory budget (NOTE [Per-region budgets]); None: it is traced with its neighbours.
    """

    recompute: bool = False
    num_chunks: int = 1
    input_batch_dims: tuple[int | None, ...] = ()
    output_batch_dims: tuple[int, ...] = ()
    selective: bool = False
    region_fraction: float | None = None


KEEP = SegmentAction()


#: The chain option's label, and the plan's reason for a segment recomputed selectively
#: (NOTE [Selective recompute]).
SELECTIVE = "recompute cheap ops"

Parallelism = Literal["single", "ddp", "fsdp"]
"""How the ranks share the work: one process, DistributedDataParallel, or FSDP2."""
