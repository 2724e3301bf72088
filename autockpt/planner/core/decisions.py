"""What a plan decides, the words the solver writes and the runtime and the saved plan read:
for each segment an action, and how the ranks share the work.

NOTE [Adding an action]
An action (keep, recompute, recompute cheap ops, a region in chunks; micro-batches beside them)
is a field of :class:`SegmentAction` and :class:`OptionAction` here. What a new one (offloading
saved activations to host memory, say) touches today, in the order planning meets it:

1. *Here*: its field on both values, its :attr:`OptionAction.label` (the report's word), and
   the plan's saved form (:class:`~autockpt.planner.plan_types.SegmentPlan`, read back by
   :mod:`autockpt.planner.apply`).
2. *Runtime*: the segment runner that performs it (:mod:`autockpt.planner.runtime`:
   ``planned_graph`` for a traced model, ``planned_chain`` for a module chain, both building
   on ``segment_runners``). The fake-tensor step measures whatever the runtime runs, so
   :mod:`autockpt.planner.measure` needs nothing new to measure a plan holding it.
3. *Its profile*: what the chain model is built from (``chain_positions.Profiles``) gains the
   step with every position doing the action, measured by ``solve/widening.py`` in the stage
   that offers it, or worked out from the kept step's record
   (:mod:`autockpt.planner.simulate`, NOTE [Recompute simulated]) where the simulation models it.
4. *The options and their price*: ``chain_builder`` offers it per position from that profile
   (``_terms``, ``_options``); its seconds come from the time model
   (:mod:`autockpt.planner.timing.time_model`: the estimate, and on the CPU the real model
   timed, ``option_pricing`` keying timings by the :class:`OptionAction` itself); a transfer
   to the host needs a bandwidth the time model does not have yet.
5. *Decoding and the report*: ``chain_decoding.decode`` turns the option into the
   :class:`SegmentAction` (no label is parsed), ``whole_plan_timing`` runs it whole as the
   runtime does, and the report's rows (``report_rows``, ``plan_report``) say it.

Where the chain model's lower bound for plain recompute
(``chain_terms.recompute_lower_bound_bytes``) or the refusal's minimum should count the action,
those read its profile too. The aim (issue on planning that keeps up with training) is three
places: the simulator, the runtime and the report; steps 3 and 4 are not yet that.
"""

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
