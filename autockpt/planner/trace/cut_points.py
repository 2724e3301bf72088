"""Where to cut a traced graph: the chain's segments, and the units and regions over them.

NOTE [Cut points]
A segment is a contiguous run of the traced graph's compute nodes, in execution order. Any
such run can be recomputed in backward: its inputs are the values it reads from earlier nodes,
its outputs the values later nodes read. What a checkpointed segment keeps alive between forward
and backward is its *boundary* (inputs and outputs), while its interior is rebuilt in backward,
all at once. So good cut points sit where few bytes cross: inside the per-variable GRNs of a
TFT's variable selection network every value is (B, T, V, H), but the embeddings that enter
them are (B, T, V, 8) and the weighted sum that leaves is (B, T, H).

The cuts are chosen by a small dynamic program over the node order that minimises

    weight * sum(bytes crossing each cut) + sum(segment bytes ** 2) / total bytes

The first term is what recomputed segments must keep (their boundaries); the second stands in
for the largest interior that backward rebuilds at once (it falls as segments get smaller, and
falls fastest where one segment is much larger than the rest). Where cuts are cheap this gives
about sqrt(total / crossing) segments; where every cut is expensive (inside a TFT's per-variable
GRNs) the region stays whole, and a later stage runs it in chunks instead.

The DP runs twice, over the positions NOTE [In-place writes] allows. With weight 1 it gives
the *units*; with weight 3 the *regions* (every region edge is made a unit edge too): runs
whose outer boundary is small (a TFT's per-variable GRNs and their weighted sum form one),
which may be recomputed as one and, when batch-separable, in chunks, so that backward
rebuilds only a piece of them at a time.

The chain's positions, the *segments*, are the units cut once more just before each in-place
write to a value made in the same unit: a BatchNorm followed by ``ReLU(inplace=True)`` is cut
between the two. The piece after such a cut reads a value it writes, so it is only ever kept
(NOTE [In-place writes]); the piece before it may be recomputed alone. That is the cheapest
plan for a convolution stem at full resolution (recompute the convolution and BatchNorm, keep
the ReLU's output that the pooling saves anyway): on a ResNet-18 (batch 16, 128x128) it
lowers the minimum from 82% to 78% of the unplanned peak without optimizer state, from 88% to
85% with AdamW's (docs/benchmarks.md). The DP cannot find such cuts, since the value
that crosses them is large, so each unit is also offered whole (NOTE [Chain levels] in
:mod:`autockpt.planner.solve.chain_builder`). Without in-place writes the segments are the units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch.fx as fx

from autockpt.planner.trace.autograd_regions import cuts_inside_regions
from autockpt.planner.trace.inplace_writes import forbidden_cuts

#: How much a byte crossing a cut counts against a byte of interior (NOTE [Cut points]), for
#: units (fine: each may be recomputed on its own) and for regions (coarse: runs of units
#: that may be recomputed as one, in chunks). A recomputed region keeps its boundary through
#: forward and backward, and backward adds the boundary's gradient.
SEGMENT_CROSSING_WEIGHT = 1.0
REGION_CROSSING_WEIGHT = 3.0


@dataclass(frozen=True)
class Cuts:
    """Cut positions at three levels (0 first, the node count last; a cut at ``p`` falls
    between compute nodes ``p - 1`` and ``p``), each level's a subset of the one before.

    Attributes:
        segments: the chain's positions.
        units: runs of segments that may be recomputed as one.
        regions: runs of units that may be recomputed as one, and in chunks.
    """

    segments: list[int]
    units: list[int]
    regions: list[int]


def choose_cuts(
    compute_nodes: list[fx.Node],
    node_bytes: Mapping[str, int],
    owners: Mapping[str, str],
    writes: Mapping[str, Sequence[str]],
    placeholders: Sequence[str],
    *,
    target_num_segments: int,
) -> Cuts:
    """The three levels of NOTE [Cut points].

    Args:
        compute_nodes: the graph's compute nodes, in execution order.
        node_bytes: new storage bytes of each node's output.
        owners: for a node whose output is a view, the node owning its storage.
        writes: for each node writing in place, the nodes owning what it writes.
        placeholders: the graph's inputs.
        target_num_segments: how finely to cut where cutting is cheap.
    """
    count = len(compute_nodes)
    costs = _node_costs(compute_nodes, node_bytes, owners, target_num_segments)
    positions = {node.name: i for i, node in enumerate(compute_nodes)}
    forbidden = forbidden_cuts(positions, writes, placeholders)
    # NOTE [Autograd in the traced graph]: a grad-mode or autocast region is never cut.
    forbidden |= cuts_inside_regions(compute_nodes)
    allowed = [p for p in range(count + 1) if p not in forbidden or p in (0, count)]
    # Just after each in-place write to an input: what comes before it is only ever kept
    # (NOTE [In-place writes]), and should be no more than it must.
    after_input_writes = {
        positions[writer] + 1
        for writer, written in writes.items()
        if any(owner in placeholders for owner in written)
    }
    regions = sorted(
        set(costs.choose(REGION_CROSSING_WEIGHT, allowed)) | (after_input_writes & set(allowed))
    )
    units = sorted(set(costs.choose(SEGMENT_CROSSING_WEIGHT, allowed)) | set(regions))
    # Just before each in-place write to a value made earlier in the graph (not an input).
    before_writes = {
        positions[writer]
        for writer, written in writes.items()
        if any(owner in positions for owner in written)
    }
    return Cuts(segments=sorted(set(units) | (before_writes - {0})), units=units, regions=regions)


class RunCosts:
    """The DP of NOTE [Cut points] over any sequence of pieces: each piece's bytes, and the
    bytes crossing each position between them.

    Args:
        weights: bytes of each piece, in order.
        crossing: for each position ``p`` (``0`` before the first piece, ``len(weights)`` after
            the last), the bytes made before it and read at or after it.
        target_num_segments: how finely to cut where cutting is cheap.
    """

    def __init__(self, weights: np.ndarray, crossing: np.ndarray, target_num_segments: int) -> None:
        self.crossing = crossing
        self.prefix = np.concatenate([[0.0], np.cumsum(weights)])
        self.total = max(float(self.prefix[-1]), 1.0)
        # A small price per segment keeps the DP from cutting at every free position.
        self.per_segment = self.total / (50.0 * max(target_num_segments, 1))

    def choose(self, crossing_weight: float, allowed: Sequence[int]) -> list[int]:
        """Cut positions (0 first, the piece count last) among ``allowed`` that minimise the
        cost of NOTE [Cut points]."""
        points = np.array(list(allowed), dtype=np.int64)
        best = np.full(len(points), np.inf)
        best[0] = 0.0
        previous = np.zeros(len(points), dtype=np.int64)
        for index in range(1, len(points)):
            end = points[index]
            size = self.prefix[end] - self.prefix[points[:index]]
            cost = (
                best[:index]
                + size * size / self.total
                + crossing_weight * self.crossing[end]
                + self.per_segment
            )
            start = int(np.argmin(cost))
            best[index] = cost[start]
            previous[index] = start
        chosen = [len(points) - 1]
        while chosen[-1] > 0:
            chosen.append(int(previous[chosen[-1]]))
        return [int(points[i]) for i in reversed(chosen)]


def _node_costs(
    compute_nodes: list[fx.Node],
    node_bytes: Mapping[str, int],
    owners: Mapping[str, str],
    target_num_segments: int,
) -> RunCosts:
    """The DP's quantities over the compute nodes: each node's bytes, and what crosses."""
    count = len(compute_nodes)
    position = {node: i for i, node in enumerate(compute_nodes)}
    weights = np.array([node_bytes.get(n.name, 0) for n in compute_nodes], dtype=np.float64)
    # A storage lives until the last use of the node that made it or of any view of it.
    last_use = {
        node.name: max((position.get(user, count) for user in node.users), default=position[node])
        for node in compute_nodes
    }
    for view, owner in owners.items():
        if owner in last_use and view in last_use:
            last_use[owner] = max(last_use[owner], last_use[view])
    # crossing[p]: bytes produced before position p and read at or after it.
    delta = np.zeros(count + 1, dtype=np.float64)
    for node in compute_nodes:
        last = last_use[node.name]
        start = position[node] + 1
        if last >= start:
            delta[start] += weights[position[node]]
            delta[last + 1 if last < count else count] -= weights[position[node]]
    crossing = np.cumsum(delta)
    crossing[count] = 0.0
    return RunCosts(weights, crossing, target_num_segments)
