"""``predict`` on the run's own file reads it through the row cache the run named with
``--data-cache`` (NOTE [Row cache]): its rows were encoded with the run's normaliser, so a
second build beside the run folders would only cost the time and the disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from autockpt.cli import main
from autockpt.training.options.data_source import CACHE_FOLDER


def test_predict_reuses_the_cache_the_run_named(
    sample_parquet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    train = ["train", str(sample_parquet), "--preset", "tiny", "--vram-budget", "8MB"]
    options = ["--epochs", "1", "--max-steps-per-epoch", "2", "--max-host-memory", "1MB"]
    # A relative cache folder: the run keeps it absolute, for a predict run from elsewhere.
    assert main([*train, *options, "--data-cache", "my-cache", "--out", "run", "--quiet"]) == 0
    rows = tmp_path / "my-cache" / "rows.json"
    built = rows.stat().st_mtime_ns
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    output = ["-o", "forecasts.parquet"]
    assert main(["predict", str(tmp_path / "run"), str(sample_parquet), *output]) == 0
    assert rows.stat().st_mtime_ns == built  # read, not rebuilt
    assert not (tmp_path / CACHE_FOLDER).exists()  # and no second cache beside the runs
    assert (elsewhere / "forecasts.parquet").is_file()
