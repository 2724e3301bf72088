"""What selective recompute buys on the zoo, against recomputing every segment whole.

For each zoo model at its benchmark batch, one real AdamW step counted by the tests' own
``LiveBytes`` (``tests/oracle.py``, which shares no code with the planner's accounting):

* plain: nothing recomputed;
* recompute all: every segment that may be recomputed, whole (``use_gradient_checkpointing=True``);
* selective all: every segment the planner may recompute selectively (NOTE [Selective
  recompute]) rebuilding only its cheap ops, the rest kept;

each as a share of the plain peak, and the two recomputing steps' times against the plain step
(alternating in one process, the median of ``--repeats`` pairs). Models planned through forward
hooks have no selective option ("-").

    python benchmarks/selective_reach.py [--only nanogpt,tied_weights] [--repeats 5]
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the zoo and the oracle live in the tests package

from zoo import chosen_models, plan_quietly, step_ratio, zoo_parser  # noqa: E402

import autockpt  # noqa: E402
from autockpt.planner.measure.fake_step import default_loss  # noqa: E402
from autockpt.planner.runtime.selective_safety import selective_segments  # noqa: E402
from autockpt.planner.trace.module_chain import trace_or_find_modules  # noqa: E402
from tests.oracle import measured_step  # noqa: E402
from tests.zoo import ZOO  # noqa: E402
from tests.zoo.case import ZooCase  # noqa: E402


def all_selective(model: torch.nn.Module, case: ZooCase) -> autockpt.Plan | None:
    """The plain plan with every segment the probe allows recomputed selectively."""
    inputs, targets = case.batch(case.bench_batch_size)
    plain = plan_quietly(model, (inputs, targets), 10**12, case.loss_fn)
    if plain.tracing != "fx":
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        allowed = selective_segments(trace_or_find_modules(model, inputs), inputs)
    if not allowed:
        return None
    segments = [
        s.model_copy(update={"recomputed": True, "selective": True}) if i in allowed else s
        for i, s in enumerate(plain.segments)
    ]
    return plain.model_copy(update={"segments": segments})


def row(case: ZooCase, repeats: int) -> str:
    torch.manual_seed(0)
    model = case.build()
    batch = case.batch(case.bench_batch_size)
    inputs, targets = batch
    options: dict[str, Any] = {
        "loss_fn": case.loss_fn or default_loss,
        "targets": targets,
        "loss_reduction": case.loss_reduction,
    }
    plain_peak = measured_step(model, inputs, **options)[0]
    extra: dict[str, Any] = {}
    if case.loss_fn is not None:
        extra = {"loss_fn": case.loss_fn, "example_targets": targets}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recompute = autockpt.plan(model, inputs, 10**12, use_gradient_checkpointing=True, **extra)
    selective = all_selective(model, case)
    cells = [str(sum(s.selective for s in selective.segments)) if selective else "-"]
    for plan in (recompute, selective):
        if plan is None:
            cells += ["-", "-"]
            continue
        peak = measured_step(model, inputs, plan, **options)[0]
        cells += [
            f"{peak / plain_peak:.0%}",
            f"{step_ratio(model, plan, batch, case, repeats):.2f}x",
        ]
    return f"| {case.name} | {len(recompute.segments)} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> None:
    parser = zoo_parser(
        __doc__.splitlines()[0], repeats=5, repeats_help="timed step pairs per plan"
    )
    options = parser.parse_args(argv)
    names = chosen_models(options)
    print(
        "| model | segments | selective | recompute all: peak | time | selective all: peak | time |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        print(row(ZOO[name], options.repeats), flush=True)


if __name__ == "__main__":
    main()
