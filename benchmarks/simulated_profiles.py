"""Every segment recomputed, simulated from the kept step's record against measured on fake
tensors (NOTE [Recompute simulated]), over the zoo and the user-steps corpus.

For each model, at each level the chain model reads (the segments, the units, the regions), the
step with every segment recomputed is measured on fake tensors and worked out from the record of
the kept step; printed: the measured peak, the simulated one's difference, the largest
difference of a segment's backward peak and of what a segment leaves alive, and the seconds of
each. A model whose recomputed segments hold what the simulation does not model is measured, and
its row says why.

    python3 benchmarks/simulated_profiles.py
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autockpt.planner.core.decisions import SegmentAction  # noqa: E402
from autockpt.planner.measure.step_measurer import StepMeasurer  # noqa: E402
from autockpt.planner.simulate.recompute_simulation import (  # noqa: E402
    simulated_profile,
    unmodelled_segments,
)
from autockpt.planner.simulate.step_spec import StepSpec  # noqa: E402
from autockpt.planner.solve.chain_terms import kept_increments  # noqa: E402
from autockpt.planner.trace.fx_graph import TracedModel  # noqa: E402
from autockpt.planner.trace.module_chain import trace_or_find_modules  # noqa: E402
from tests.user_steps import STEPS  # noqa: E402
from tests.zoo import ZOO  # noqa: E402

LEVELS = (("segments", "segments"), ("units", "unit_segments"), ("regions", "region_segments"))


def rows(name: str, model: Any, inputs: Any, loss_fn: Any, targets: Any) -> list[str]:
    """The table's rows for one model, a row per level."""
    traced = trace_or_find_modules(model.train(), inputs)
    if not isinstance(traced, TracedModel):
        return [f"| {name} | - | forward hooks: measured | | | | |"]
    measurer = StepMeasurer(traced, StepSpec(model, inputs, targets, loss_fn, "adamw"))
    record = measurer.record
    assert record is not None
    found = []
    for level, attribute in LEVELS:
        segments = getattr(traced, attribute)
        recompute = [not s.keep_reason for s in segments]
        started = time.perf_counter()
        measured = measurer.measure(segments, [SegmentAction(recompute=r) for r in recompute])
        measured_s = time.perf_counter() - started
        started = time.perf_counter()
        simulated = simulated_profile(record, measurer.kept, traced.segments, segments, recompute)
        simulated_s = time.perf_counter() - started
        if simulated is None:
            unsure = sorted(unmodelled_segments(record, measurer.kept))
            found.append(
                f"| {name} | {level} | measured: segments {unsure} not modelled | "
                f"{measured.peak_bytes / 2**20:.3f} MiB | | | {measured_s * 1e3:.0f} ms / - |"
            )
            continue
        backward = max(
            abs(s.backward_peak_bytes - m.backward_peak_bytes)
            for s, m in zip(simulated.segments, measured.segments, strict=True)
        )
        kept = max(
            abs(s - m)
            for s, m in zip(kept_increments(simulated), kept_increments(measured), strict=True)
        )
        difference = simulated.peak_bytes / measured.peak_bytes - 1
        found.append(
            f"| {name} | {level} ({len(segments)}) | {measured.peak_bytes / 2**20:.3f} MiB | "
            f"{difference:+.2%} | {backward:,} B | {kept:,} B | "
            f"{measured_s * 1e3:.0f} ms / {simulated_s * 1e3:.1f} ms |"
        )
    return found


def main() -> int:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    print(
        "| model | level (segments) | measured peak | simulated peak | largest backward "
        "difference | largest kept difference | measured / simulated |"
    )
    print("|---|---|---|---|---|---|---|")
    cases: list[tuple[str, Any]] = [(f"zoo: {n}", c) for n, c in ZOO.items()]
    cases += [(f"steps: {n}", s) for n, s in STEPS.items() if s.needs is None]
    for name, case in cases:
        try:
            model = case.build()
            if name.startswith("zoo"):
                inputs, targets = case.batch(case.test_batch_size)
            else:
                inputs, targets = case.batch()
            for row in rows(name, model, inputs, case.loss_fn, targets):
                print(row, flush=True)
        except Exception as error:  # a model this comparison cannot run: said, not hidden
            print(f"| {name} | - | not run: {type(error).__name__}: {str(error)[:80]} | | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
