"""A streamed folder's row cache grows by a new day's file, encoding only that day's rows, and
gives what a build of the grown folder gives (NOTE [A cache grown by new files])."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from autockpt.cli import main
from tests.tft.test_parquet_folder import ROLE_ARRAYS, write_folder
from tests.tft.test_streamed_windows import _assert_same
from tft.data.streamed.streamed_windows import stream_windows
from tft.data.windows import WindowedData, load_windows

WINDOW = {"encoder_length": 12, "horizon": 3}
MEMORY = 1 << 30


def _hold_back_last_day(folder: Path) -> list[tuple[Path, object]]:
    """Remove each contract's last daily file, returning them to be written back."""
    held = []
    for contract in sorted(folder.glob("symbol=*")):
        last = sorted(contract.iterdir())[-1]
        held.append((last, pq.read_table(last)))
        last.unlink()
    return held


def _stream(folder: Path, cache: Path, lines: list[str] | None = None, **options) -> WindowedData:
    progress = lines.append if lines is not None else None
    return stream_windows(
        folder, cache, max_host_bytes=MEMORY, chunk_rows=500, progress=progress, **WINDOW, **options
    )


def _encoded_rows(lines: list[str]) -> int:
    """The rows the encoding pass read, from its last progress line."""
    last = [line for line in lines if "(encoding the rows)" in line][-1]
    return int(re.search(r"of ([\d,]+) rows", last).group(1).replace(",", ""))


def _assert_identical(a: WindowedData, b: WindowedData) -> None:
    for part in ("train", "validation", "test", "whole"):
        np.testing.assert_array_equal(getattr(a, part).starts, getattr(b, part).starts)
    for name in ROLE_ARRAYS:
        np.testing.assert_array_equal(getattr(a.whole.rows, name), getattr(b.whole.rows, name))


def test_a_new_day_with_the_runs_normaliser_encodes_only_that_day(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    held = _hold_back_last_day(folder)
    trained = _stream(folder, tmp_path / "cache")  # the run's cache, its scales fitted
    normalizer = trained.normalizer
    _stream(folder, tmp_path / "cache", normalizer=normalizer, split_fractions=None)
    old_files = len(list(folder.rglob("*.parquet")))
    for path, table in held:
        pq.write_table(table, path)
    new_rows = sum(table.num_rows for _, table in held)
    lines: list[str] = []
    grown = _stream(folder, tmp_path / "cache", lines, normalizer=normalizer, split_fractions=None)
    assert _encoded_rows(lines) == new_rows
    assert grown.cache_use is not None and grown.cache_use.startswith(
        f"reused the encoded rows of its {old_files} files and encoded the {new_rows:,} rows of "
        "2 new files"
    )
    built = _stream(folder, tmp_path / "fresh", normalizer=normalizer, split_fractions=None)
    assert built.cache_use == "built"
    _assert_identical(built, grown)
    # A later run fitting its own scales by shares rebuilds: its training rows moved.
    lines.clear()
    refitted = _stream(folder, tmp_path / "cache", lines)
    assert _encoded_rows(lines) == 41_400 and refitted.cache_use == "built"


def test_a_split_by_dates_grows_when_the_new_day_is_past_the_first_date(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    held = _hold_back_last_day(folder)
    dates = {"split_fractions": None, "split_times": ("2024-01-10", "2024-01-15")}
    _stream(folder, tmp_path / "cache", **dates)
    for path, table in held:
        pq.write_table(table, path)
    lines: list[str] = []
    grown = _stream(folder, tmp_path / "cache", lines, **dates)
    assert _encoded_rows(lines) == sum(table.num_rows for _, table in held)
    _assert_same(_stream(folder, tmp_path / "fresh", **dates), grown)


def test_a_split_by_shares_refits_its_scales_on_a_new_day(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    held = _hold_back_last_day(folder)
    _stream(folder, tmp_path / "cache")
    for path, table in held:
        pq.write_table(table, path)
    lines: list[str] = []
    again = _stream(folder, tmp_path / "cache", lines)  # the shares' cuts moved with the day
    assert again.cache_use == "built" and _encoded_rows(lines) == 41_400
    _assert_identical(_stream(folder, tmp_path / "fresh"), again)


def test_a_new_bar_before_its_symbols_last_rebuilds_and_is_sorted_in(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    day = sorted((folder / "symbol=ES").iterdir())[5]
    table = pq.read_table(day)
    early, late = table.slice(0, 100), table.slice(100)
    pq.write_table(late, day)
    first = _stream(folder, tmp_path / "cache", split_fractions=None)
    pq.write_table(early, day.with_name("morning-fix.parquet"))
    grown = _stream(folder, tmp_path / "cache", normalizer=first.normalizer, split_fractions=None)
    assert grown.cache_use == "built"
    assert len(grown.whole.rows.time_ns) == len(first.whole.rows.time_ns) + early.num_rows
    # The folder in memory, sorted, with the same scales (its columns list the key last).
    memory = load_windows(folder, normalizer=first.normalizer, split_fractions=None, **WINDOW)
    _assert_same(memory, grown)


def test_an_unchanged_folder_is_reused(sample_parquet: Path, tmp_path: Path) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    assert _stream(folder, tmp_path / "cache").cache_use == "built"
    assert _stream(folder, tmp_path / "cache").cache_use == "reused"


def test_predict_on_the_folder_with_a_new_day_encodes_only_that_day(
    sample_parquet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    held = _hold_back_last_day(folder)
    run, cache = tmp_path / "run", tmp_path / "my-cache"
    train = ["train", str(folder), "--preset", "tiny", "--no-gradient-checkpointing"]
    options = ["--epochs", "1", "--max-steps-per-epoch", "2", "--max-host-memory", "1MB"]
    assert main([*train, *options, "--data-cache", str(cache), "--out", str(run), "--quiet"]) == 0
    old_files = len(list(folder.rglob("*.parquet")))
    for path, table in held:
        pq.write_table(table, path)
    capsys.readouterr()
    forecasts = tmp_path / "forecasts.parquet"
    assert main(["predict", str(run), str(folder), "-o", str(forecasts)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    new_rows = sum(table.num_rows for _, table in held)
    assert (
        f"reused the encoded rows of its {old_files} files and encoded the {new_rows:,} rows of "
        "2 new files" in said
    )
    last = max(int(pc.max(table["timestamp"]).value) for _, table in held)
    assert int(pc.max(pq.read_table(forecasts)["timestamp"]).value) == last
