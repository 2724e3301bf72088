"""The training run: loss parity with and without a plan, exact resume, the budget enforced.

Planning a step is the slow part of a run on the CPU, so the runs are made once per module and
several tests read them.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import autockpt
from autockpt.cli import main
from autockpt.cli.plot import plot_available
from autockpt.errors import DeviceError
from autockpt.training.forecasts.scoring_sample import validation_sample
from autockpt.training.host.progress import JsonLinesReporter
from autockpt.training.loop.train import Trainer
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.schedule import learning_rate_factor
from autockpt.training.options.settings import SAMPLE_DATA, resolve_device, resolve_precision
from autockpt.training.setup.prepare import prepare
from autockpt.training.setup.runs import (
    BEST_FILE,
    LAST_FILE,
    PLAN_FILE,
    RunFolder,
    saved_model_config,
)
from tft.data.normalize import Normalizer
from tft.data.windows import load_windows
from tft.model.config import TFTConfig, get_preset
from tft.model.transformer import TemporalFusionTransformer

# Two epochs of three steps: enough for the schedule, validation, best/last files and resume.
# At the default learning rate (0.001) six steps leave the untrained quantile head inverted (its
# 0.1 output above its 0.9 output for every window), so validation coverage would be 0.0 and
# say nothing; at 0.005 the quantiles sort themselves out within the run.
# The batch size is the tests' own (8), not the preset's: the shares of the unplanned peak
# the tight runs budget for are tuned to it.
RUN = [
    *("--preset", "tiny", "--quiet", "--epochs", "2", "--max-steps-per-epoch", "3"),
    *("--seed", "5", "--lr", "0.005", "--batch-size", "8"),
]


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
    """Every segment recomputed, otherwise the same run but for a budget far above the step,
    so that every step's peak is measured (without one none is, NOTE [Enforcing the budget])."""
    measured = ("--vram-budget", "1GB", "--memory-check-every", "1")
    out = tmp_path_factory.mktemp("runs") / "all"
    return train(out, "--use-gradient-checkpointing", *measured)


def run_files() -> list[str]:
    """The files of a finished run folder, sorted (the plan's picture where matplotlib is)."""
    picture = ["plan.png"] if plot_available() else []
    return [
        "best.pt",
        "columns.json",
        "config.json",
        "last.pt",
        "metrics.jsonl",
        "naive.json",
        "plan.json",
        *picture,
    ]


def test_a_run_writes_every_file(plain_run: Path) -> None:
    assert sorted(p.name for p in plain_run.iterdir()) == run_files()
    steps = step_records(plain_run)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert all(r["peak_bytes"] is None and not r["peak_measured"] for r in steps)  # no budget
    epochs = [r for r in RunFolder(plain_run).read_metrics() if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    assert all(0.0 < r["val_coverage"] <= 1.0 and r["val_mae"] > 0 for r in epochs)
    # NOTE [Naive forecasts]: each epoch scores them, and the model's skill over the better.
    for record in epochs:
        assert set(record["val_naive"]) == {"no_change", "quantiles"}
        best = min(s["loss"] for s in record["val_naive"].values())
        assert record["val_skill"] == pytest.approx(1 - record["val_loss"] / best)
        assert len(record["val_skill_by_step"]) == len(record["val_loss_by_step"])
    summary = RunFolder(plain_run).read_metrics()[-1]
    assert summary["kind"] == "summary" and summary["stopped"] == "finished"
    assert summary["budget_bytes"] is None and summary["within_budget"] is None
    config = TrainConfig.model_validate_json((plain_run / "config.json").read_text())
    assert config.preset == "tiny" and config.out == plain_run
    columns = json.loads((plain_run / "columns.json").read_text())
    assert [column["name"] for column in columns] == pq.read_schema(config.data).names
    assert {column["role"] for column in columns} == {"timestamp", "symbol", "target", "observed"}
    checkpoint = RunFolder(plain_run).load_checkpoint(LAST_FILE)
    assert {"model", "optimizer", "scheduler", "rng", "normalizer", "model_config"} <= set(
        checkpoint
    )
    assert checkpoint["epoch"] == 2 and checkpoint["global_step"] == 6
    assert "optimizer" not in RunFolder(plain_run).load_checkpoint(BEST_FILE)


def test_validation_metrics_are_those_of_best_pt(plain_run: Path) -> None:
    # Recomputed here from the saved weights with the metrics written out by hand: the
    # trainer's evaluate() is not used.
    epochs = [r for r in RunFolder(plain_run).read_metrics() if r["kind"] == "epoch"]
    logged = [r for r in epochs if r["improved"]][-1]
    # Validation scores a sample spread evenly over the part (NOTE [Scores in proportion]):
    # the sample's windows, as many as it logged, out of every one.
    assert logged["val_windows_spread"] and logged["val_windows"] < logged["val_windows_of"]
    _check_scores_by_hand(plain_run, "validation", logged["val_windows"], logged, "val")


def test_test_windows_are_scored_by_best_pt_at_the_end(plain_run: Path) -> None:
    """NOTE [Test windows at the end of a run]: every test window, the best checkpoint's
    forecasts, beside the naive forecasts' on the same windows."""
    summary = RunFolder(plain_run).read_metrics()[-1]
    assert summary["kind"] == "summary" and summary["test_windows"] > 0
    _check_scores_by_hand(plain_run, "test", summary["test_windows"], summary, "test")
    assert set(summary["test_naive"]) == {"no_change", "quantiles"}
    naive = min(v["loss"] for v in summary["test_naive"].values())
    assert summary["test_skill"] == pytest.approx(1 - summary["test_loss"] / naive)
    assert summary["test_loss"] != summary["best_val_loss"]


def _check_scores_by_hand(
    run: Path, part: str, num_windows: int, logged: dict, prefix: str
) -> None:
    best = RunFolder(run).load_checkpoint(BEST_FILE)
    config = TFTConfig.from_dict(best["model_config"])
    normalizer = Normalizer.from_dict(best["normalizer"])
    model = TemporalFusionTransformer(config)
    model.load_state_dict(best["model"])
    model.eval()
    data = load_windows(
        SAMPLE_DATA,
        encoder_length=config.encoder_length,
        horizon=config.horizon,
        normalizer=normalizer,
    )
    windows = getattr(data, part)
    positions = np.arange(num_windows)
    if num_windows < len(windows):  # the run's default sample: the floor's count, spread
        positions = validation_sample(windows.run_counts, None, windows_per_epoch=0).positions
    assert positions is not None and len(positions) == num_windows
    batch = windows.batch(positions)
    assert part != "test" or num_windows == len(data.test)
    with torch.no_grad():
        prediction = model(*batch.inputs()).double()  # (N, H, Q)
    target = batch.target.double()[..., None]  # (N, H, 1)
    levels = torch.tensor(config.quantiles, dtype=torch.float64)
    error = target - prediction
    pinball = torch.maximum(levels * error, (levels - 1) * error)
    median = prediction[..., list(config.quantiles).index(0.5)]
    scale = torch.tensor(normalizer.target.std, dtype=torch.float64)[batch.symbol_index, None]
    median_error = (median - batch.target.double()) * scale
    inside = (target[..., 0] >= prediction[..., 0]) & (target[..., 0] <= prediction[..., -1])
    assert 0.0 < float(inside.double().mean()) < 1.0  # the fixture's coverage says something
    assert logged[f"{prefix}_loss"] == pytest.approx(float(pinball.mean()), rel=1e-5)
    assert logged[f"{prefix}_mae"] == pytest.approx(float(median_error.abs().mean()), rel=1e-5)
    rmse = float(median_error.square().mean().sqrt())
    assert logged[f"{prefix}_rmse"] == pytest.approx(rmse, rel=1e-5)
    assert logged[f"{prefix}_coverage"] == pytest.approx(float(inside.double().mean()), abs=1e-12)


def test_the_tracked_peak_matches_the_prediction(checkpointed_run: Path) -> None:
    plan = plan_of(checkpointed_run)
    peak = max(r["peak_bytes"] for r in step_records(checkpointed_run))
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


# Not slow (3 s on top of the shared plain run): the README's test command must catch a resume
# that loses the random streams.
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


#: Share of the unplanned peak the tight runs budget for: the plan recomputes, chunks and
#: splits the batch (asserted where it matters).
TIGHT_FRACTION = 0.3


def shape(plan: autockpt.Plan) -> tuple[object, ...]:
    """What a plan does to a step (not its timings): budget, pieces, and per segment."""
    segments = tuple((s.name, s.recomputed, s.num_chunks) for s in plan.segments)
    return plan.budget_bytes, plan.num_micro_batches, segments


def train_with_a_replan(out: Path, budget: int, *, interrupt: bool) -> list[autockpt.Plan]:
    """A dropout-on run under ``budget`` whose step 2 is reported over it (so the trainer
    re-plans for 90% of it), stopped after epoch 1 and resumed when ``interrupt``; returns
    every plan the run wrote, in order."""
    plans: list[autockpt.Plan] = []
    write_plan, append = RunFolder.write_plan, RunFolder.append_metrics
    enforce = Trainer.enforce_budget

    def record_plan(self: RunFolder, plan_json: str) -> None:
        plans.append(autockpt.Plan.model_validate_json(plan_json))
        write_plan(self, plan_json)

    def over_at_step_two(self: Trainer, peak_bytes: int) -> None:
        over = self.state.global_step == 2 and self.budget_bytes is not None
        enforce(self, self.budget_bytes + 1 if over else peak_bytes)

    def append_then_interrupt(self: RunFolder, records: list[dict]) -> None:
        records = list(records)
        append(self, records)
        if any(r["kind"] == "epoch" for r in records):
            raise KeyboardInterrupt

    args = ["train", str(SAMPLE_DATA), *RUN, "--vram-budget", str(budget), "--out", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunFolder, "write_plan", record_plan)
        patch.setattr(Trainer, "enforce_budget", over_at_step_two)
        if not interrupt:
            assert main(args) == 0
            return plans
        with pytest.MonkeyPatch.context() as stop:
            stop.setattr(RunFolder, "append_metrics", append_then_interrupt)
            assert main(args) == 130
        assert RunFolder(out).load_checkpoint(LAST_FILE)["epoch"] == 1
        assert main(["train", "--resume", str(out), "--quiet"]) == 0
    return plans


@pytest.mark.slow
def test_resume_is_exact_with_recompute_chunks_micro_batches_and_a_replan(
    plain_run: Path, tmp_path: Path, fixed_time_model: object
) -> None:
    budget = int(plan_of(plain_run).unplanned_peak_bytes * TIGHT_FRACTION)
    whole = tmp_path / "whole"
    plans = train_with_a_replan(whole, budget, interrupt=False)
    resumed = tmp_path / "resumed"
    resumed_plans = train_with_a_replan(resumed, budget, interrupt=True)
    # The run planned, re-planned tighter at step 2; the resume planned the run's budget, then
    # the tightened one, and chose the same plans.
    assert [p.budget_bytes for p in plans] == [budget, int(budget * 0.9)]
    assert [shape(p) for p in resumed_plans] == [shape(p) for p in [*plans, *plans]]
    assert any(p.num_recomputed > 0 for p in plans)
    assert any(s.num_chunks > 1 for p in plans for s in p.segments)
    assert any(p.num_micro_batches > 1 for p in plans)
    assert get_preset("tiny").dropout > 0
    expected = RunFolder(whole).load_checkpoint(LAST_FILE)
    actual = RunFolder(resumed).load_checkpoint(LAST_FILE)
    assert actual["epoch"] == expected["epoch"] == 2
    torch.testing.assert_close(actual["model"], expected["model"], rtol=0, atol=0)
    torch.testing.assert_close(actual["optimizer"]["state"], expected["optimizer"]["state"])
    assert [r["loss"] for r in step_records(resumed)] == [r["loss"] for r in step_records(whole)]


@pytest.mark.slow
def test_tracked_peak_stays_under_a_tight_budget(plain_run: Path, tmp_path: Path) -> None:
    unplanned = plan_of(plain_run)
    budget = (unplanned.unplanned_peak_bytes + unplanned.minimum_feasible_bytes) // 2
    out = train(tmp_path / "tight", "--vram-budget", str(budget))
    plan = plan_of(out)
    assert plan.num_recomputed > 0 or plan.num_micro_batches > 1
    steps = step_records(out)
    assert all(r["budget_bytes"] == budget for r in steps)
    assert max(r["peak_bytes"] for r in steps if r["peak_measured"]) <= budget
    summary = RunFolder(out).read_metrics()[-1]
    assert summary["within_budget"] and summary["num_replans"] == 0


@pytest.mark.slow
def test_a_step_over_the_budget_triggers_a_logged_replan(tmp_path: Path) -> None:
    config = TrainConfig(
        data=SAMPLE_DATA, preset="tiny", batch_size=8, vram_budget="10MB", max_steps_per_epoch=1
    )
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


def test_the_run_trains_with_the_optimizer_planning_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One optimizer factory: planning counts (and times) what the run's factory makes, and the
    run trains with what the same factory makes (its class and every setting)."""
    given: list[object] = []
    planner = autockpt.plan

    def spy(*args: Any, **kwargs: Any) -> autockpt.Plan:
        given.append(kwargs["optimizer"])
        return planner(*args, **kwargs)

    monkeypatch.setattr(autockpt, "plan", spy)
    config = TrainConfig(
        data=SAMPLE_DATA,
        preset="tiny",
        batch_size=8,
        max_steps_per_epoch=1,
        lr=0.004,
        weight_decay=0.03,
    )
    setup = prepare(config)
    trainer = Trainer(setup, RunFolder.create(tmp_path / "run"), JsonLinesReporter(io.StringIO()))
    assert given and all(callable(spec) for spec in given)
    planned = given[-1](list(setup.model.parameters()))  # type: ignore[operator]
    assert type(planned) is type(trainer.optimizer)
    assert planned.defaults == trainer.optimizer.defaults
    assert trainer.optimizer.defaults["lr"] == 0.004
    assert trainer.optimizer.defaults["weight_decay"] == 0.03


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


def test_a_run_plans_in_the_process_it_trains_in(
    plain_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE [Tuning the host process]: a tiny step trains on one thread, so its plan must be
    # timed on one thread too, not on the two the process started with.
    from autockpt.planner import pipeline
    from autockpt.planner.timing.stopwatch import Stopwatch

    timed_on: list[int] = []
    original = pipeline.Stopwatch.plain_step

    def record(self: Stopwatch, pieces: int = 1) -> object:
        timed_on.append(self.threads)
        return original(self, pieces)

    monkeypatch.setattr(pipeline.Stopwatch, "plain_step", record)
    # NOTE [Threads chosen from the plain step]: one planning, not one for the step's size
    # and another for the budget.
    plans: list[autockpt.Plan] = []
    original_plan = autockpt.plan

    def counted(*args: object, **kwargs: object) -> autockpt.Plan:
        plans.append(original_plan(*args, **kwargs))  # type: ignore[arg-type]
        return plans[-1]

    monkeypatch.setattr(autockpt, "plan", counted)
    # Tight enough to need a plan, loose enough that a real step of a few samples fits, so
    # that the planner times the real model (NOTE [Timing at a batch that fits]).
    budget = int(plan_of(plain_run).unplanned_peak_bytes * 0.6)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        out = train(tmp_path / "tuned", "--vram-budget", str(budget), "--max-steps-per-epoch", "1")
        assert torch.get_num_threads() == 2  # put back when the run ends
    finally:
        torch.set_num_threads(threads)
    planned = plan_of(out)
    assert planned.num_recomputed > 0 or planned.num_micro_batches > 1
    assert len(plans) == 1 and plans[0].budget_bytes == budget
    assert timed_on and set(timed_on) == {1}
    first = RunFolder(out).read_metrics()[0]
    assert "1 torch thread(s)" in first["message"]


def test_a_run_saved_before_categorical_inputs_existed_still_matches_its_model() -> None:
    config = get_preset("tiny", static_cardinalities=[2])
    saved = config.model_dump(mode="json")
    for field in ("observed_categorical_cardinalities", "known_categorical_cardinalities"):
        del saved[field]
    assert saved_model_config({"model_config": saved}) == config.model_dump(mode="json")
    assert saved_model_config({"model_config": {"hidden_size": -1}}) == {"hidden_size": -1}
