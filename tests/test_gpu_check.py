"""The GPU check (``benchmarks/gpu_check.py``) can fail: a planned run that re-planned fails it,
on a card and on the CPU alike; and its whole flow runs on the CPU (``--cpu``), so it is known
to run before a card is lent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_check_steps import CPU, GPU, Check  # noqa: E402


def _judged(settings: Any, tmp_path: Path, replans: int) -> list[str]:
    """The statuses the check gives a planned and an unplanned run, the planned one having
    re-planned ``replans`` times; everything else as a run that held its budget."""
    check = Check(settings, tmp_path, timeout_s=1.0, compile_=False)
    check.card_bytes = 1000
    log = tmp_path / "train.log"
    log.write_text("out of memory\n")
    planned = {"exit_code": 0, "visible_peak_bytes": 900, "seconds": 1.0, "log": log}
    unplanned = {"exit_code": 1, "out_of_memory": True, "seconds": 1.0, "log": log}
    summary = {"num_replans": replans, "within_budget": True, "peak_bytes": 900, "global_step": 3}
    if settings.device == "cuda":
        check._judge_planned_cuda(8, "fp32", planned, summary)
        check._judge_unplanned_cuda(8, unplanned)
    else:
        check._judge_planned_cpu(8, "fp32", planned, summary)
        check._judge_unplanned_cpu(8, unplanned, {**summary, "peak_bytes": 2000})
    return [result.status for result in check.results]


@pytest.mark.parametrize("settings", [GPU, CPU], ids=["cuda", "cpu"])
def test_a_planned_run_that_re_planned_fails_the_check(settings: Any, tmp_path: Path) -> None:
    assert _judged(settings, tmp_path, replans=0) == ["ok", "ok"]
    assert _judged(settings, tmp_path, replans=1)[0] == "failed"


@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "cpu-check"
    done = subprocess.run(
        # Each step up to 15 minutes: beside other tests (CI's slow stage) a step took over
        # the default 4.
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_check.py"),
            "--cpu",
            "--out",
            str(out),
            "--timeout",
            "900",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    results = json.loads((out / "summary.json").read_text())["steps"]
    statuses = {result["name"]: result["status"] for result in results}
    for precision in ("fp32", "bf16"):  # one row each, predicted beside the measured peak
        name = f"train autockpt under the CPU budget, {precision}"
        assert statuses[name] == "ok", statuses
        detail = next(r["detail"] for r in results if r["name"] == name)
        assert "predicted" in detail and "tracked peak" in detail, detail
    # Every test the gpu step ran is named (on the CPU they skip, but they are listed).
    tests = json.loads((out / "gpu_tests.json").read_text())
    assert tests and all(t["outcome"] == "skipped" for t in tests), tests
    environment = json.loads((out / "environment.json").read_text())
    assert {"torch", "cuda_version", "cudnn_version", "driver_version"} <= environment.keys()
