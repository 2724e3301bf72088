"""``autockpt train --compile``: the option reaches the config, and the trainer's steps compile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autockpt.cli import main
from autockpt.cli.parser import build_parser, overrides
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.runs import RunFolder

RUN = [
    *("--preset", "tiny", "--quiet", "--epochs", "1", "--max-steps-per-epoch", "2"),
    *("--seed", "5", "--dropout", "0", "--use-gradient-checkpointing"),
]


def test_compile_flag_reaches_the_config() -> None:
    args = build_parser().parse_args(["train", "--compile"])
    assert TrainConfig(**overrides(args)).compile is True
    args = build_parser().parse_args(["train"])
    assert TrainConfig(**overrides(args)).compile is False


def _losses(out: Path) -> list[float]:
    return [r["loss"] for r in RunFolder(out).read_metrics() if r["kind"] == "step"]


@pytest.mark.slow
def test_a_compiled_run_compiles_its_steps_and_keeps_the_losses(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    assert main(["train", str(SAMPLE_DATA), *RUN, "--out", str(tmp_path / "eager")]) == 0
    torch._dynamo.reset()
    counters.clear()
    compiled_out = tmp_path / "compiled"
    assert main(["train", str(SAMPLE_DATA), *RUN, "--compile", "--out", str(compiled_out)]) == 0
    assert counters["stats"]["unique_graphs"] > 0, "the planned steps went through torch.compile"
    eager, compiled = _losses(tmp_path / "eager"), _losses(compiled_out)
    assert len(eager) == 2
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_a_compiled_run_with_a_budget_plans_the_compiled_step_and_holds_it(
    tmp_path: Path,
) -> None:
    """With --compile and a budget, the plan is searched among compiled steps (NOTE [Compiled
    plans]) and the trainer counts its steps with the allocator, not a dispatch mode (under
    which a compiled step would run eagerly and be held to the wrong peak)."""
    from autockpt.planner.plan_types import Plan

    run = [*RUN[: RUN.index("--use-gradient-checkpointing")], "--max-steps-per-epoch", "3"]
    eager_plan = tmp_path / "eager.json"
    assert main(["plan", str(SAMPLE_DATA), *run[:2], "--quiet", "--json", str(eager_plan)]) == 0
    # The eager step's peak: the plain compiled step fits under it (inductor fuses), so the
    # search stops at its first compile.
    budget = Plan.model_validate_json(eager_plan.read_text()).unplanned_peak_bytes
    out = tmp_path / "compiled"
    args = ["train", str(SAMPLE_DATA), *run, "--compile", "--vram-budget", str(budget)]
    assert main([*args, "--out", str(out)]) == 0
    plan = Plan.model_validate_json(RunFolder(out).file("plan.json").read_text())
    assert plan.compile_fraction == 1.0 and plan.predicted_peak_bytes <= budget
    assert any("1 compiles" in note for note in plan.notes), plan.notes
    records = RunFolder(out).read_metrics()
    summary = next(r for r in records if r["kind"] == "summary")
    assert summary["within_budget"] and summary["num_replans"] == 0, summary
    measured = [r["peak_bytes"] for r in records if r["kind"] == "step" and r["peak_measured"]]
    assert measured and max(measured) <= budget
    # Counted by the allocator: within 5% of what the search measured, not the eager figure.
    assert abs(max(measured) - plan.predicted_peak_bytes) <= 0.05 * plan.predicted_peak_bytes
