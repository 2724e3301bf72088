"""``autockpt demo`` on the bundled sample learns something a naive forecast does not: it
finds the planted order flow (NOTE [Planted order flow] in ``tft.synthetic.planted``), beats the naive
forecasts, and ``interpret`` ranks the flow first among the past inputs. It also says what it
planned and on what data, and writes a run folder. It plans once, for half of the plain step
(NOTE [A budget decided from the plain step])."""

from __future__ import annotations

from pathlib import Path

import pytest

import autockpt
from autockpt.cli import main
from autockpt.training.forecasts.interpret import interpret
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.runs import BEST_FILE, LAST_FILE, PLAN_FILE, RunFolder


def test_the_demo_plans_once_for_half_of_the_plain_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[object] = []
    original = autockpt.plan

    def counted(*args: object, **kwargs: object) -> autockpt.Plan:
        calls.append(args[2])
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(autockpt, "plan", counted)
    out = tmp_path / "demo"
    short = ["--epochs", "1", "--max-steps-per-epoch", "2"]
    assert main(["demo", "--seed", "0", "--out", str(out), *short]) == 0
    assert len(calls) == 1 and callable(calls[0])
    plan = autockpt.Plan.model_validate_json((out / PLAN_FILE).read_text())
    assert plan.budget_bytes == plan.unplanned_peak_bytes // 2 and plan.fits
    # The run's saved settings hold the budget decided, for a resume or predict.
    assert RunFolder(out).read_config()["vram_budget"] == str(plan.budget_bytes)
    stdout = capsys.readouterr().out
    half = autockpt.format_bytes(plan.budget_bytes)
    assert f"planning for {half} instead" in stdout, stdout


@pytest.mark.slow
def test_the_demo_beats_the_naive_forecasts_and_finds_the_planted_flow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--seed", "0", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "planning for" in stdout and "using the bundled sample" in stdout
    assert (out / LAST_FILE).is_file() and (out / BEST_FILE).is_file()
    records = RunFolder(out).read_metrics()
    summary = next(r for r in records if r["kind"] == "summary")
    best = min((r for r in records if r["kind"] == "epoch"), key=lambda r: r["val_loss"])
    assert summary["best_val_skill"] > 0.05, summary
    # The flow leads the return, so the first step is where the model gains most.
    first, *later = best["val_skill_by_step"]
    assert first > max(later) and first > 0.1, best["val_skill_by_step"]
    encoder = interpret(out, SAMPLE_DATA, device="cpu", max_windows=2000).encoder
    assert next(iter(encoder)) == "order_flow", encoder
