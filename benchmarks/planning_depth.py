"""Planning time against depth: a GPT-style decoder at 4 to 64 layers, planned at a share of its
plain step's peak (issue 65's depth table).

The decoder is written as people write one (token and position embeddings, pre-norm blocks of
causal SDPA attention and a 4x MLP, a final norm and a head to the vocabulary, the loss a
cross-entropy of the logits against the next tokens), width 128, 4 heads, a batch of 4 x 128
tokens, AdamW's state held. For each depth the plain step's peak is planned for first (an
unlimited budget), then ``plan()`` runs ``--repeats`` times at ``--share`` of it. Reported per
depth: fx nodes of the traced model, the plan's segments, the median seconds of ``plan()``, the
plan's predicted peak and step seconds, and what one planning did: its steps on fake tensors
(``profile_step`` calls) and its runs of the real model (backward passes on real tensors).

    python3 benchmarks/planning_depth.py                         # 4, 8, 16, 32, 64 layers
    python3 benchmarks/planning_depth.py --depths 4 32 --share 0.8 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import autockpt
import autockpt.planner.measure.step_measurer as step_measurer

WIDTH, HEADS, TOKENS, BATCH, VOCAB = 128, 4, 128, 4, 512


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm_1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.norm_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, K, T, C/K)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm_2(x))


class Decoder(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(TOKENS, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (B, T, V)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@contextmanager
def counted() -> Iterator[dict[str, int]]:
    """Steps on fake tensors (``profile_step`` calls) and backward passes on real tensors (the
    planner's timed runs: whole steps, segments, plans timed whole) while active."""
    counts = {"fake_steps": 0, "real_runs": 0}
    profile, backward, grad = (
        step_measurer.profile_step,
        torch.autograd.backward,
        torch.autograd.grad,
    )

    def counting_profile(*args: Any, **kwargs: Any) -> Any:
        counts["fake_steps"] += 1
        return profile(*args, **kwargs)

    def real(tensors: Any) -> bool:
        first = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
        return (
            isinstance(first, torch.Tensor)
            and not isinstance(first, FakeTensor)
            and first.device.type != "meta"
        )

    def counting_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        counts["real_runs"] += real(tensors)
        return backward(tensors, *args, **kwargs)

    def counting_grad(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        counts["real_runs"] += real(outputs)
        return grad(outputs, *args, **kwargs)

    step_measurer.profile_step = counting_profile  # type: ignore[assignment]
    torch.autograd.backward, torch.autograd.grad = counting_backward, counting_grad  # type: ignore[assignment]
    try:
        yield counts
    finally:
        step_measurer.profile_step = profile  # type: ignore[assignment]
        torch.autograd.backward, torch.autograd.grad = backward, grad  # type: ignore[assignment]


def bench_depth(depth: int, share: float, repeats: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Decoder(depth).train()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=generator)
    targets = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=generator)
    options: dict[str, Any] = {"loss_fn": next_token_loss, "example_targets": (targets,)}
    plain = autockpt.plan(model, (ids,), 2**50, **options)
    budget = int(plain.unplanned_peak_bytes * share)
    seconds: list[float] = []
    plan, last = None, {}
    for _ in range(repeats):
        with counted() as counts:
            started = time.perf_counter()
            plan = autockpt.plan(model, (ids,), budget, **options)
            seconds.append(time.perf_counter() - started)
        last = dict(counts)
    assert plan is not None
    return {
        "depth": depth,
        "fx_nodes": len(torch.fx.symbolic_trace(model).graph.nodes),
        "segments": len(plan.segments),
        "recomputed": plan.num_recomputed,
        "median_s": statistics.median(seconds),
        "seconds": seconds,
        "budget_bytes": budget,
        "peak_bytes": plan.predicted_peak_bytes,
        "step_s": plan.unplanned_step_s + plan.predicted_extra_s,
        **last,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--share", type=float, default=0.8, help="budget: share of the peak")
    parser.add_argument("--repeats", type=int, default=3, help="plan() calls per depth")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"| layers | fx nodes | segments (recomputed) | planning, median of {args.repeats} | "
        f"budget ({args.share:.0%}) | plan's peak | predicted step | fake steps | real runs |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for depth in args.depths:
        row = bench_depth(depth, args.share, args.repeats)
        print(
            f"| {depth} | {row['fx_nodes']} | {row['segments']} ({row['recomputed']}) | "
            f"{row['median_s']:.1f} s | {autockpt.format_bytes(row['budget_bytes'])} | "
            f"{autockpt.format_bytes(row['peak_bytes'])} | {row['step_s'] * 1e3:.0f} ms | "
            f"{row['fake_steps']} | {row['real_runs']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
