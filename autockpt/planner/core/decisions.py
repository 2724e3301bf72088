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


@dataclass(frozen=True)
class OptionAction:
    """What one of the solver's options does to the chain positions it covers, as a value:
    the solver carries it through, decoding turns it into a :class:`SegmentAction`, pricing
    keys its timings by it, and the report shows its :attr:`label`. Nothing reads an action
    back out of its label.

    Attributes:
        recompute: drop the positions' interiors after forward and rebuild them in backward.
        num_chunks: run the recompute in this many pieces along the batch.
        selective: recompute only the cheap ops (NOTE [Selective recompute]).
        region: a region of several segments (or a link's own) recomputed as one unit: the
            same action as ``recompute``, told apart in the plan's reasons.
    """

    recompute: bool = False
    num_chunks: int = 1
    selective: bool = False
    region: bool = False

    @property
    def label(self) -> str:
        """What the plan's table says for it: ``keep``, ``recompute``, ``recompute cheap
        ops``, ``recompute region``, ``recompute region in 4 chunks``."""
        if not self.recompute:
            return "keep"
        if self.selective:
            return SELECTIVE
        label = "recompute region" if self.region or self.num_chunks > 1 else "recompute"
        return f"{label} in {self.num_chunks} chunks" if self.num_chunks > 1 else label


#: The plan's reason for a segment recomputed selectively (NOTE [Selective recompute]).
SELECTIVE = "recompute cheap ops"
#: The options' actions without chunks.
KEEP_OPTION = OptionAction()
RECOMPUTE_OPTION = OptionAction(recompute=True)
SELECTIVE_OPTION = OptionAction(recompute=True, selective=True)
REGION_OPTION = OptionAction(recompute=True, region=True)

Parallelism = Literal["single", "ddp", "fsdp"]
"""How the ranks share the work: one process, DistributedDataParallel, or FSDP2."""
