"""How a compiled plan runs: its segments, the graphs dynamo made and the frames it ran eagerly.

Plans the TFT (``tft-225`` by default) eagerly at fractions of its unplanned peak, and the plain
step with every segment a region of its own (the compiled search's third candidate, NOTE
[Per-region budgets]), compiles each planned module with ``torch.compile`` and runs two steps,
then prints, per plan, the segments, the recomputed and chunked ones, the graphs dynamo compiled
and the frames it gave up on (the recompile limit: NOTE [A segment's own code under
torch.compile]).

    python benchmarks/compiled_segments.py                      # tft-225, aot_eager
    python benchmarks/compiled_segments.py --backend inductor   # minutes on a CPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autockpt  # noqa: E402
from autockpt.planner.plan_types import Plan  # noqa: E402
from benchmarks.compile_budget import Workload, tft_workload  # noqa: E402
from tests.helpers import MLPStack  # noqa: E402


def every_segment_a_region(plan: Plan) -> Plan:
    """``plan`` with every segment a graph of its own at region budget 0."""
    segments = [segment.model_copy(update={"compile_fraction": 0.0}) for segment in plan.segments]
    return plan.model_copy(update={"segments": segments})


def compiled_run(work: Workload, plan: Plan, backend: str) -> dict[str, float]:
    """Two steps of ``plan`` compiled: graphs made, frames run eagerly by the limit, seconds."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    planned = torch.compile(autockpt.apply(work.model, plan), backend=backend)
    started = time.perf_counter()
    for _ in range(2):
        work.model.zero_grad(set_to_none=True)
        autockpt.training_step(
            planned,
            plan,
            work.inputs,
            work.targets,
            work.loss_fn,
            loss_reduction=work.loss_reduction,
        )
    fallbacks = sum(n for why, n in counters["unimplemented"].items() if "recompile limit" in why)
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "fallbacks": fallbacks,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tft-225")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.25])
    parser.add_argument("--backend", default="aot_eager", help="aot_eager (default) or inductor")
    parser.add_argument(
        "--mlp-blocks",
        type=int,
        default=0,
        help="plan a residual MLP of this many blocks instead of the TFT (24: 11 segments)",
    )
    args = parser.parse_args(argv)
    if args.mlp_blocks:
        torch.manual_seed(0)
        x = torch.randn(args.batch_size, 32)
        work = Workload(
            f"MLP of {args.mlp_blocks} blocks",
            MLPStack(32, args.mlp_blocks, dropout=0.0),
            (x,),
            (torch.randn(args.batch_size, 1),),
            torch.nn.functional.mse_loss,
            "mean",
            torch.device("cpu"),
        )
    else:
        work = tft_workload(args.preset, args.batch_size, torch.device("cpu"))
    common = {"loss_fn": work.loss_fn, "example_targets": work.targets}
    plain = autockpt.plan(
        work.model, work.inputs, 10**12, use_gradient_checkpointing=False, **common
    )
    plans = {"plain, every segment a region": every_segment_a_region(plain)}
    for fraction in args.fractions:
        budget = int(plain.predicted_peak_bytes * fraction)
        plans[f"eager plan at {fraction:g} of the peak"] = autockpt.plan(
            work.model, work.inputs, budget, **common
        )
    print(
        f"{work.name}, batch {args.batch_size}, backend {args.backend}, torch {torch.__version__}"
    )
    print(
        "| plan | segments | recomputed | chunked | regions | graphs | eager fallbacks | 2 steps |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, plan in plans.items():
        run = compiled_run(work, plan, args.backend)
        recomputed = sum(s.recomputed for s in plan.segments)
        chunked = sum(s.num_chunks > 1 for s in plan.segments)
        regions = sum(s.compile_fraction is not None for s in plan.segments)
        print(
            f"| {name} | {len(plan.segments)} | {recomputed} | {chunked} | {regions} | "
            f"{run['graphs']:.0f} | {run['fallbacks']:.0f} | {run['seconds']:.1f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
