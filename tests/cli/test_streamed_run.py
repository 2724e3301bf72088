"""A run streamed from a row cache trains, validates and predicts as the in-memory one does."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from autockpt.cli import main
from autockpt.training.forecasts import predict as predict_module
from autockpt.training.options.settings import SAMPLE_DATA

STEPS = ["--preset", "tiny", "--epochs", "1", "--max-steps-per-epoch", "4", "--quiet"]


def _records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["kind"] == kind]


def test_a_streamed_run_has_the_in_memory_losses_and_forecasts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    memory, streamed = tmp_path / "runs" / "memory", tmp_path / "runs" / "streamed"
    assert main(["train", str(SAMPLE_DATA), *STEPS, "--out", str(memory)]) == 0
    # 10MB is below what the sample's rows need in memory: the run streams (default cache).
    args = ["train", str(SAMPLE_DATA), *STEPS[:-1], "--out", str(streamed)]
    assert main([*args, "--max-host-memory", "10MB"]) == 0
    assert "streamed from the row cache" in capsys.readouterr().out
    caches = list((tmp_path / "runs" / "data-cache").iterdir())
    assert [cache.name.startswith("sample-") for cache in caches] == [True]
    for kind in ("step", "epoch"):
        for a, b in zip(_records(memory, kind), _records(streamed, kind), strict=True):
            for key in ("loss", "train_loss", "val_loss"):
                if key in a:
                    assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (kind, key)
    summary = _records(streamed, "summary")[0]
    assert 0.0 <= summary["data_wait_share"] < 1.0

    # Forecasts a few windows per row group: the same table as the in-memory run's.
    monkeypatch.setattr(predict_module, "ROW_GROUP_WINDOWS", 1000)
    outputs = {}
    for run in (memory, streamed):
        outputs[run] = tmp_path / f"{run.name}.parquet"
        assert main(["predict", str(run), str(SAMPLE_DATA), "-o", str(outputs[run])]) == 0
    assert len(list((tmp_path / "runs" / "data-cache").iterdir())) == 1  # predict reused it
    assert pq.ParquetFile(outputs[streamed]).metadata.num_row_groups > 10
    expected, got = pq.read_table(outputs[memory]), pq.read_table(outputs[streamed])
    assert got.schema == expected.schema and got.num_rows == expected.num_rows
    for name in ("timestamp", "symbol", "horizon_step"):
        assert got[name].equals(expected[name])
    for name in ("actual", "q0.1", "q0.5", "q0.9"):
        assert got[name].to_numpy() == pytest.approx(expected[name].to_numpy(), rel=1e-4, abs=1e-9)


def test_a_bad_host_memory_size_ends_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--preset", "tiny", "--max-host-memory", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "max_host_memory" in err or "--max-host-memory" in err
    assert "1GB" in err
