"""The GPU check's settings and steps: what each step runs and how its result is judged.

:class:`Settings` holds one mode's shapes and budget (:data:`GPU`, :data:`CPU`); :class:`Check`
runs the steps in order (the ``gpu`` tests, ``memory_time.py`` twice, ``make-data``, and the
planned and unplanned training runs on the emulated card) and keeps a :class:`StepResult` for
each. The order and the overall flow are in ``gpu_check.py``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_check_subprocess import BENCHMARKS, REPO, cli_command, run_logged, tail


@dataclass(frozen=True)
class Settings:
    """What the check runs in one mode."""

    device: str
    preset: str
    batch_size: int
    batch_granularity: int
    card: str
    """The emulated card (a budget string)."""
    num_features: int
    """Feature columns for make-data: the loader adds 5 derived from OHLCV."""
    days: int
    memory_time_steps: int
    train_steps: int
    precisions: tuple[str, ...]
    """The planned run's precisions, one row each; the unplanned run takes the first."""


GPU = Settings(
    device="cuda",
    preset="tft-225",
    batch_size=32,
    batch_granularity=32,
    card="4GiB",
    num_features=220,
    days=15,
    memory_time_steps=5,
    train_steps=3,
    precisions=("fp32", "bf16"),
)
CPU = Settings(
    device="cpu",
    preset="tiny",
    batch_size=8,
    batch_granularity=8,
    card="3MiB",
    num_features=1,
    days=3,
    memory_time_steps=2,
    train_steps=3,
    precisions=("fp32", "bf16"),
)


@dataclass
class StepResult:
    name: str
    status: str
    """ok, failed, skipped or missing."""
    detail: str
    seconds: float
    log: str


# ---------------------------------------------------------------------------- the steps


class Check:
    """Runs the steps in order, keeping their results."""

    def __init__(self, settings: Settings, out: Path, timeout_s: float, compile_: bool) -> None:
        self.settings = settings
        self.out = out
        self.timeout_s = timeout_s
        self.compile = compile_
        self.results: list[StepResult] = []
        self.largest_batch: int | None = None
        self.card_bytes: int | None = None

    def record(self, name: str, status: str, detail: str, seconds: float, log: Path) -> None:
        result = StepResult(name, status, detail, seconds, str(log.relative_to(self.out)))
        self.results.append(result)
        print(f"[{status}] {name}: {detail} ({seconds:.0f} s)", flush=True)

    def gpu_tests(self) -> None:
        log = self.out / "pytest_gpu.log"
        files = sorted(
            str(path.relative_to(REPO))
            for path in (REPO / "tests").rglob("test_*.py")
            if "mark.gpu" in path.read_text(errors="replace")
        )
        if importlib.util.find_spec("pytest") is None:
            log.write_text("pytest is not installed\n")
            self.record(
                "pytest -m gpu",
                "failed",
                "pytest is not installed here; bring its wheels "
                "(pytest, pluggy, iniconfig, packaging)",
                0.0,
                log,
            )
            return
        if not files:
            log.write_text("no test file uses the gpu marker\n")
            self.record("pytest -m gpu", "missing", "no test is marked gpu", 0.0, log)
            return
        junit = self.out / "pytest_gpu.xml"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "-rs",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            *files,
        ]
        code, seconds = run_logged(command, log, self.timeout_s)
        summary = tail(log, 1).strip("= ")
        tests = _test_outcomes(junit)
        (self.out / "gpu_tests.json").write_text(json.dumps(tests, indent=2) + "\n")
        summary += f"; {len(tests)} tests named in gpu_tests.json"
        if code is None:
            status = "failed"
            summary = f"timed out after {self.timeout_s:.0f} s"
        elif code == 0:
            skipped_only = "skipped" in summary and "passed" not in summary
            # On the CPU the GPU tests skip by design; on a GPU a skip means they did not run.
            status = (
                ("skipped" if self.settings.device == "cpu" else "failed") if skipped_only else "ok"
            )
        elif code == 5:
            status = "missing"
        else:
            status = "failed"
        self.record("pytest -m gpu", status, summary, seconds, log)

    def memory_time(self, *, largest: bool) -> None:
        s = self.settings
        label = f"largest batch for {s.card}" if largest else f"batch {s.batch_size}"
        name = f"memory_time {s.preset}, {label}"
        stem = "memory_time_largest" if largest else f"memory_time_b{s.batch_size}"
        result_path, log = self.out / f"{stem}.json", self.out / f"{stem}.log"
        command = [
            sys.executable,
            str(BENCHMARKS / "memory_time.py"),
            "--preset",
            s.preset,
            "--device",
            s.device,
            "--steps",
            str(s.memory_time_steps),
            "--json",
            str(result_path),
        ]
        if largest:
            # Fractions of an unplanned peak many times the card say little here: autockpt at
            # the card itself (added by --batch-size-for) and at its minimum are the rows.
            command += [
                "--batch-size-for",
                s.card,
                "--batch-granularity",
                str(s.batch_granularity),
                "--budget-fractions",
                "none",
            ]
        else:
            command += ["--batch-size", str(s.batch_size)]
        if self.compile and not largest:
            command.append("--compile")
        code, seconds = run_logged(command, log, self.timeout_s)
        if code != 0 or not result_path.exists():
            why = f"timed out after {self.timeout_s:.0f} s" if code is None else tail(log)
            self.record(name, "failed", why, seconds, log)
            return
        result = json.loads(result_path.read_text())
        rows = result["rows"]
        broken = [r["strategy"] for r in rows if r["budget_held"] is False]
        if largest:
            self.largest_batch = result["meta"]["batch_size"]
        detail = f"batch {result['meta']['batch_size']}; " + "; ".join(
            _row_summary(r) for r in rows if r["strategy"].startswith("autockpt")
        )
        if broken:
            detail = "budget NOT held by " + ", ".join(broken) + "; " + detail
        self.record(name, "failed" if broken else "ok", detail, seconds, log)

    def cli(self, cli_args: list[str], stem: str, *, emulate: bool) -> dict[str, Any]:
        """Run the CLI in a subprocess; returns its report (exit code, entry, CUDA peaks)."""
        report_path, log = self.out / f"{stem}.report.json", self.out / f"{stem}.log"
        card = self.card_bytes if emulate and self.settings.device == "cuda" else None
        code, seconds = run_logged(
            cli_command(cli_args, card_bytes=card, report=report_path), log, self.timeout_s
        )
        report: dict[str, Any] = {}
        if report_path.exists():
            report = json.loads(report_path.read_text())
        report.update(seconds=seconds, log=log, process_exit=code)
        return report

    def make_data(self) -> Path | None:
        s = self.settings
        data = self.out / "bars.parquet"
        report = self.cli(
            [
                "make-data",
                str(data),
                "--features",
                str(s.num_features),
                "--days",
                str(s.days),
                "--symbols",
                "ES",
                "--seed",
                "0",
            ],
            "make_data",
            emulate=False,
        )
        ok = report.get("exit_code") == 0 and data.exists()
        detail = (
            f"{s.days} days, {s.num_features} features -> {data.name}"
            if ok
            else tail(report["log"])
        )
        self.record(
            "make-data",
            "ok" if ok else "failed",
            _with_entry(detail, report),
            report["seconds"],
            report["log"],
        )
        return data if ok else None

    def train_pair(self, data: Path) -> None:
        """The planned run in each precision, then the unplanned one in the first."""
        s = self.settings
        batch = 4 * s.batch_size
        if self.largest_batch is not None:
            batch = min(batch, self.largest_batch)
        common = [
            "train",
            str(data),
            "--preset",
            s.preset,
            "--vram-budget",
            s.card,
            "--device",
            s.device,
            "--batch-size",
            str(batch),
            "--epochs",
            "1",
            "--max-steps-per-epoch",
            str(s.train_steps),
            "--quiet",
        ]
        for precision in s.precisions:
            folder = f"train_autockpt_{precision}"
            shutil.rmtree(self.out / folder, ignore_errors=True)  # from an earlier check
            planned = self.cli(
                [*common, "--precision", precision, "--out", str(self.out / folder)],
                folder,
                emulate=True,
            )
            summary = _summary(self.out / folder)
            judge = self._judge_planned_cuda if s.device == "cuda" else self._judge_planned_cpu
            judge(batch, precision, planned, summary)
        shutil.rmtree(self.out / "train_none", ignore_errors=True)
        unplanned = self.cli(
            [
                *common,
                "--precision",
                s.precisions[0],
                "--no-gradient-checkpointing",
                "--out",
                str(self.out / "train_none"),
            ],
            "train_none",
            emulate=True,
        )
        if s.device == "cuda":
            self._judge_unplanned_cuda(batch, unplanned)
        else:
            self._judge_unplanned_cpu(batch, unplanned, _summary(self.out / "train_none"))

    def _judge_planned_cuda(
        self,
        batch: int,
        precision: str,
        planned: dict[str, Any],
        summary: dict[str, Any] | None,
    ) -> None:
        card = self.card_bytes or 0
        context = planned.get("context_bytes")
        visible = planned.get("visible_peak_bytes")
        allocated = planned.get("max_allocated_bytes")
        trained = planned.get("exit_code") == 0 and summary is not None
        # A re-plan (after a step over the budget, or an out-of-memory retry) means a plan
        # under-predicted its step: the check fails on it, whatever the run ended with.
        held = visible is not None and visible <= card and _no_replans(summary)
        detail = (
            f"batch {batch}, {precision}: predicted {_gib(_get(summary, 'predicted_peak_bytes'))}"
            f"; context {_gib(context)} + max allocated {_gib(allocated)}, + max reserved "
            f"{_gib(planned.get('max_reserved_bytes'))} = {_gib(visible)} of {_gib(card)}"
        )
        if summary is not None:
            # NOTE [What the first card must measure]: what the plan took as stand-ins.
            slack = summary.get("measured_allocator_slack")
            detail += (
                f"; the run measured context {_gib(summary.get('measured_context_bytes'))} "
                f"(planned {_gib(summary.get('planned_context_bytes'))}), allocator slack "
                + ("?" if slack is None else f"{slack:.0%}")
                + f"; {summary.get('global_step')} steps, {summary.get('num_replans')} re-plans"
            )
        if not trained:
            detail = f"did not train ({planned.get('error') or tail(planned['log'])}); " + detail
        self.record(
            f"train autockpt on the emulated card, {precision}",
            "ok" if trained and held else "failed",
            _with_entry(detail, planned),
            planned["seconds"],
            planned["log"],
        )

    def _judge_unplanned_cuda(self, batch: int, unplanned: dict[str, Any]) -> None:
        out_of_memory = bool(unplanned.get("out_of_memory")) or (
            unplanned.get("exit_code") not in (0, None)
            and "out of memory" in Path(unplanned["log"]).read_text(errors="replace").lower()
        )
        detail = f"batch {batch}: " + (
            "ran out of memory, as expected"
            if out_of_memory
            else f"did not run out of memory (exit {unplanned.get('exit_code')}, reserved peak "
            f"{_gib(unplanned.get('max_reserved_bytes'))}): the batch is too small to show "
            "the difference"
        )
        self.record(
            "train no checkpointing on the emulated card",
            "ok" if out_of_memory else "failed",
            _with_entry(detail, unplanned),
            unplanned["seconds"],
            unplanned["log"],
        )

    def _judge_planned_cpu(
        self,
        batch: int,
        precision: str,
        planned: dict[str, Any],
        summary: dict[str, Any] | None,
    ) -> None:
        card = self.card_bytes or 0
        if summary is None:
            detail = (
                f"batch {batch}, {precision}: did not finish "
                f"({planned.get('error') or tail(planned['log'])})"
            )
            status = "failed"
        else:
            peak = summary.get("peak_bytes")
            held = (
                bool(summary.get("within_budget"))
                and peak is not None
                and peak <= card
                and _no_replans(summary)
            )
            status = "ok" if held else "failed"
            detail = (
                f"batch {batch}, {precision}: predicted "
                f"{_mib(summary.get('predicted_peak_bytes'))}, tracked peak {_mib(peak)} of "
                f"{_mib(card)} ({'held' if held else 'NOT held'}), "
                f"{summary.get('global_step')} steps, {summary.get('num_replans')} re-plans"
            )
        self.record(
            f"train autockpt under the CPU budget, {precision}",
            status,
            _with_entry(detail, planned),
            planned["seconds"],
            planned["log"],
        )

    def _judge_unplanned_cpu(
        self, batch: int, unplanned: dict[str, Any], summary: dict[str, Any] | None
    ) -> None:
        card = self.card_bytes or 0
        if summary is None:
            detail = (
                f"batch {batch}: did not finish "
                f"({unplanned.get('error') or tail(unplanned['log'])})"
            )
            status = "failed"
        else:
            peak = summary.get("peak_bytes")
            over = peak is not None and peak > card
            status = "ok" if over else "failed"
            detail = (
                f"batch {batch}: tracked peak {_mib(peak)} of {_mib(card)} ("
                + (
                    "over the budget, as expected"
                    if over
                    else "under the budget: the batch is too small to show the difference"
                )
                + ")"
            )
        self.record(
            "train no checkpointing under the CPU budget",
            status,
            _with_entry(detail, unplanned),
            unplanned["seconds"],
            unplanned["log"],
        )


def _get(summary: dict[str, Any] | None, key: str) -> Any:
    return None if summary is None else summary.get(key)


def _test_outcomes(junit: Path) -> list[dict[str, str]]:
    """Each test pytest ran (its id and outcome), read from its JUnit XML; none where pytest
    wrote none."""
    import xml.etree.ElementTree as ElementTree

    if not junit.exists():
        return []
    tests = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome})
    return tests


def _no_replans(summary: dict[str, Any] | None) -> bool:
    """Whether a run's summary records no re-plan (none: not known, which fails too)."""
    return summary is not None and summary.get("num_replans") == 0


def _summary(run_dir: Path) -> dict[str, Any] | None:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return None
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    summaries = [r for r in records if r.get("kind") == "summary"]
    return summaries[-1] if summaries else None


def _with_entry(detail: str, report: dict[str, Any]) -> str:
    entry = report.get("entry", "")
    return f"{detail} [via {entry}]" if entry and "__main__" in entry else detail


def _row_summary(row: dict[str, Any]) -> str:
    if row["failed"]:
        return f"{row['strategy']}: {row['failed']}"
    held = {True: "held", False: "NOT held", None: "?"}[row["budget_held"]]
    ratio = row["ratio_to_no_checkpointing"]
    return f"{row['strategy']}: {held}" + (f", {ratio:.2f}x time" if ratio is not None else "")


def _gib(num_bytes: int | None) -> str:
    return "?" if num_bytes is None else f"{num_bytes / 2**30:.2f} GiB"


def _mib(num_bytes: int | None) -> str:
    return "?" if num_bytes is None else f"{num_bytes / 2**20:.2f} MiB"
