"""The training run: loss parity with and without a plan, exact resume, the budget enforced.

Planning a step is the slow part of a run on the CPU, so the runs are made once per module and
several tests read them.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch

import autockpt
from autockpt.cli import main
from autockpt.errors import DeviceError
from autockpt.training.config import TrainConfig
from autockpt.training.prepare import prepare
from autockpt.training.progress import JsonLinesReporter
from autockpt.training.runs import BEST_FILE, LAST_FILE, PLAN_FILE, RunFolder
from autockpt.training.schedule import learning_rate_factor
from autockpt.training.settings import SAMPLE_DATA, resolve_device, resolve_precision
from autockpt.training.train import Trainer

# Two epochs of three steps: enough for the schedule, validation, best/last files and resume.
RUN = ["--preset", "tiny", "--quiet", "--epochs", "2", "--max-steps-per-epoch", "3", "--seed", "5"]


def step_records(run: Path) -> list[dict]:
    return [r for r in RunFolder(run).read_metrics() if r["kind"] == "step"]


def train(out: Path, *extra: str) -> Path:
    assert main(["train", str(SAMPLE_DATA), *RUN, *extra, "--out", str(out)]) == 0
    return out


def plan_of(run: Path) -> autockpt.Plan:
    return autockpt.Plan.model_validate_json((run / PLAN_FILE).read_text())


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Nothing recomputed."""
    return train(tmp_path_factory.mktemp("runs") / "plain", "--no-gradient-checkpointing")


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every segment recomputed, otherwise the same run."""
    return train(tmp_path_factory.mktemp("runs") / "all", "--use-gradient-checkpointing")


def test_a_run_writes_every_file(plain_run: Path) -> None:
    assert sorted(p.name for p in plain_run.iterdir()) == [
        "best.pt",
        "config.json",
        "last.pt",
        "metrics.jsonl",
        "plan.json",
    ]
    steps = step_records(plain_run)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(r["loss"]) and r["peak_bytes"] > 0 for r in steps)
    epochs = [r for r in RunFolder(plain_run).read_metrics() if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    assert all(0.0 <= r["val_coverage"] <= 1.0 and r["val_mae"] > 0 for r in epochs)
    summary = RunFolder(plain_run).read_metrics()[-1]
    assert summary["kind"] == "summary" and summary["stopped"] == "finished"
    config = TrainConfig.model_validate_json((plain_run / "config.json").read_text())
    assert config.preset == "tiny" and config.out == plain_run
    checkpoint = RunFolder(plain_run).load_checkpoint(LAST_FILE)
    assert {"model", "optimizer", "scheduler", "rng", "normalizer", "model_config"} <= set(
        checkpoint
    )
    assert checkpoint["epoch"] == 2 and checkpoint["global_step"] == 6
    assert "optimizer" not in RunFolder(plain_run).load_checkpoint(BEST_FILE)


def test_the_tracked_peak_matches_the_prediction_without_a_budget(plain_run: Path) -> None:
    plan = plan_of(plain_run)
    peak = max(r["peak_bytes"] for r in step_records(plain_run))
    assert abs(peak - plan.predicted_peak_bytes) <= 0.1 * plan.predicted_peak_bytes


def test_losses_equal_with_and_without_checkpointing(
    plain_run: Path, checkpointed_run: Path
) -> None:
    assert not any(s.recomputed for s in plan_of(plain_run).segments)
    assert all(s.recomputed for s in plan_of(checkpointed_run).segments)
    losses = [[r["loss"] for r in step_records(run)] for run in (plain_run, checkpointed_run)]
    assert len(losses[0]) == 6
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
    weights = [
        RunFolder(run).load_checkpoint(LAST_FILE)["model"] for run in (plain_run, checkpointed_run)
    ]
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_resume_continues_exactly(
    plain_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Interrupt a second run as a kill would, right after epoch 1 is saved.
    append = RunFolder.append_metrics

    def append_then_interrupt(self: RunFolder, records: list[dict]) -> None:
        records = list(records)
        append(self, records)
        if any(r["kind"] == "epoch" for r in records):
            raise KeyboardInterrupt

    monkeypatch.setattr(RunFolder, "append_metrics", append_then_interrupt)
    resumed = tmp_path / "resumed"
    args = ["train", str(SAMPLE_DATA), *RUN, "--no-gradient-checkpointing", "--out", str(resumed)]
    assert main(args) == 130
    assert RunFolder(resumed).load_checkpoint(LAST_FILE)["epoch"] == 1
    monkeypatch.setattr(RunFolder, "append_metrics", append)
    assert main(["train", "--resume", str(resumed), "--quiet"]) == 0

    expected = RunFolder(plain_run).load_checkpoint(LAST_FILE)
    actual = RunFolder(resumed).load_checkpoint(LAST_FILE)
    assert actual["epoch"] == expected["epoch"] == 2
    torch.testing.assert_close(actual["model"], expected["model"], rtol=0, atol=0)
    torch.testing.assert_close(actual["optimizer"]["state"], expected["optimizer"]["state"])
    assert [r["loss"] for r in step_records(resumed)] == [
        r["loss"] for r in step_records(plain_run)
    ]


@pytest.mark.slow
def test_tracked_peak_stays_under_a_tight_budget(plain_run: Path, tmp_path: Path) -> None:
    unplanned = plan_of(plain_run)
    budget = (unplanned.unplanned_peak_bytes + unplanned.minimum_feasible_bytes) // 2
    out = train(tmp_path / "tight", "--vram-budget", str(budget))
    plan = plan_of(out)
    assert plan.num_recomputed > 0 or plan.num_micro_batches > 1
    steps = step_records(out)
    assert all(r["budget_bytes"] == budget for r in steps)
    assert max(r["peak_bytes"] for r in steps) <= budget
    summary = RunFolder(out).read_metrics()[-1]
    assert summary["within_budget"] and summary["num_replans"] == 0


@pytest.mark.slow
def test_a_step_over_the_budget_triggers_a_logged_replan(tmp_path: Path) -> None:
    config = TrainConfig(data=SAMPLE_DATA, preset="tiny", vram_budget="10MB", max_steps_per_epoch=1)
    setup = prepare(config)
    run = RunFolder.create(tmp_path / "run")
    trainer = Trainer(setup, run, JsonLinesReporter(io.StringIO()))
    trainer.enforce_budget(11_000_000)
    assert trainer.state.num_replans == 1
    assert trainer.state.planning_budget_bytes == 9_000_000
    assert "re-planned for" in trainer.pending[-1]["message"]
    assert plan_of(run.path).budget_bytes == 9_000_000
    trainer.enforce_budget(9_000_000)  # within the 10 MB budget: nothing happens
    assert trainer.state.num_replans == 1


def test_learning_rate_warms_up_then_decays_to_zero() -> None:
    factor = learning_rate_factor(TrainConfig(warmup_fraction=0.1), total_steps=100)
    assert factor(0) == pytest.approx(0.1)
    assert factor(9) == pytest.approx(1.0)
    assert factor(55) == pytest.approx(0.5, abs=0.02)
    assert factor(100) == pytest.approx(0.0)
    constant = learning_rate_factor(TrainConfig(lr_schedule="constant"), total_steps=100)
    assert constant(0) == constant(99) == 1.0


def test_devices_and_precisions_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_precision("auto", torch.device("cpu")) is None
    assert resolve_precision("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(DeviceError, match="fp16 needs a CUDA GPU"):
        resolve_precision("fp16", torch.device("cpu"))
