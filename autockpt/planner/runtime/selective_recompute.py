"""Selective recompute: a segment rebuilt in backward from its matrix products' kept outputs.

NOTE [Selective recompute]
Recomputing a segment runs its whole forward again, matrix products included, which is most
of its time. Yet most of a segment's saved bytes are usually the outputs of the cheap ops
between them: activations (GELU, ELU, SiLU), norms, dropout masks, gates, residual sums. A
segment recomputed *selectively* keeps the outputs of its matrix products, convolutions and
attention kernels (``KEPT_OPS``), each held from forward to backward as a plain step holds
it, and rebuilds only the rest: it saves the cheap ops' bytes for a fraction of the
recompute's time. torch's selective activation checkpointing does the work
(``create_selective_checkpoint_contexts``): during forward it stores the kept ops' outputs,
and during the recompute it hands them back instead of running those ops again.

It is one more option per segment of a traced model (NOTE [Chain levels]), with the numbers of
the profile in which every segment is recomputed selectively, and a cost of the cheap ops'
share of the segment's forward (the time model's estimate, NOTE [Time model]; the final plan
is timed whole where the planner times the real model, NOTE [Whole-plan timing]). A stored
output must not change before backward (``h = linear(x); h.mul_(2)`` would hand the recompute
a product already doubled; torch refuses that in backward): no segment that may be recomputed
writes in place, since the segments are cut before each write and the piece from the write on
is only ever kept (NOTE [In-place writes]). It is not offered in chunks, for regions, or on
the forward-hook path, whose runners recompute whole links.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from autockpt.planner.trace.autograd_regions import changes_autograd
from autockpt.planner.trace.fx_graph import Segment, TracedModel
from autockpt.planner.trace.module_chain import ModuleChain

_aten = torch.ops.aten

#: Ops whose outputs a selective recompute keeps: the expensive ones (NOTE [Selective recompute]).
KEPT_OPS = frozenset(
    {
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten.baddbmm.default,
        _aten.convolution.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
    }
)


def keeps_expensive_outputs(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """The selective policy: keep what ``KEPT_OPS`` produce, recompute everything else."""
    if op in KEPT_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts(
    recompute_context: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> tuple[contextlib.AbstractContextManager[None], contextlib.AbstractContextManager[None]]:
    """The checkpoint ``context_fn`` pair of a selective recompute; ``recompute_context``, when
    given, is entered around the recompute too (the runner's buffers put back)."""
    forward, recompute = create_selective_checkpoint_contexts(keeps_expensive_outputs)
    if recompute_context is None:
        return forward, recompute
    return forward, _nested(recompute_context(), recompute)


@contextlib.contextmanager
def _nested(
    outer: contextlib.AbstractContextManager[Any], inner: contextlib.AbstractContextManager[Any]
) -> Any:
    # The runner's context is outside torch's: the copies that put buffers back must not pass
    # through the selective mode, which would look them up among the forward's ops.
    with outer, inner:
        yield


#: The ``context_fn`` for a compiled region: dynamo reads it as the selective policy.
COMPILED_CONTEXT_FN = functools.partial(
    create_selective_checkpoint_contexts, keeps_expensive_outputs
)


def may_recompute_selectively(traced: TracedModel | ModuleChain, segment: Segment) -> bool:
    """Whether ``segment`` may be recomputed selectively (NOTE [Selective recompute]): a
    segment of a traced model that may be recomputed at all, and holds no custom Function and
    no grad-mode or autocast region (NOTE [Autograd in the traced graph]): the policy would
    see the operations inside, not the Function or the region."""
    if not isinstance(traced, TracedModel) or segment.keep_reason:
        return False
    nodes = {node.name: node for node in traced.graph_module.graph.nodes}
    return not any(changes_autograd(nodes[name]) for name in segment.node_names)
