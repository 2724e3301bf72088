"""A source with no row cache of its own grows from the cache of fewer of its files beside it
(NOTE [A cache grown from another]): ``predict`` on the run's folder and a new day's files
given beside it encodes only the new rows; what grows is what a build gives, and the cache it
grew from stays as it was."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from autockpt.cli import main
from tests.tft.test_cache_growth import (
    _assert_identical,
    _encoded_rows,
    _hold_back_last_day,
    _stream,
)
from tests.tft.test_parquet_folder import write_folder
from tests.tft.test_streamed_windows import _assert_same


def _new_day_apart(folder: Path, root: Path) -> Path:
    """Each contract's last day taken out of ``folder`` and written to ``root`` (its own
    ``symbol=`` folders: the symbol lives only in the folders' names)."""
    for path, table in _hold_back_last_day(folder):
        moved = root / path.parent.name / path.name
        moved.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, moved)
    return root


def test_the_folder_and_a_new_day_beside_it_grow_from_the_folders_cache(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    today = _new_day_apart(folder, tmp_path / "today")
    caches = tmp_path / "data-cache"
    trained = _stream(folder, caches / "bars")  # the run's cache, its scales fitted
    given = {"normalizer": trained.normalizer, "split_fractions": None}
    _stream(folder, caches / "bars", **given)  # predict on the folder: the run's cache serves
    early = folder / "symbol=*" / "2024-01-0*.parquet"  # fewer of the files, encoded alike
    assert _stream(early, caches / "early", **given).cache_use is not None
    lines: list[str] = []
    both = _stream([folder, today], caches / "both", lines, **given)
    new_rows = sum(pq.read_metadata(path).num_rows for path in today.rglob("*.parquet"))
    assert _encoded_rows(lines) == new_rows
    assert both.cache_use is not None and both.cache_use.startswith(
        f"reused the encoded rows of the row cache bars's 36 files and encoded the {new_rows:,} "
        "rows of 2 new files"
    )
    built = _stream([folder, today], tmp_path / "elsewhere" / "fresh", **given)
    assert built.cache_use == "built"
    _assert_identical(built, both)
    assert _stream(folder, caches / "bars", **given).cache_use == "reused"  # left as it was
    # A file of the folder changed since: nothing to grow from.
    day = sorted((folder / "symbol=ES").iterdir())[1]
    pq.write_table(pq.read_table(day).slice(1), day)
    assert _stream([folder, today], caches / "again", **given).cache_use == "built"


def test_a_split_by_dates_grows_from_the_cache_fitted_so_and_a_split_by_shares_builds(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    today = _new_day_apart(folder, tmp_path / "today")
    caches = tmp_path / "data-cache"
    _stream(folder, caches / "a-by-shares")  # the same files, scales fitted on other rows
    dates = {"split_fractions": None, "split_times": ("2024-01-10", "2024-01-15")}
    _stream(folder, caches / "bars", **dates)
    grown = _stream([folder, today], caches / "both", **dates)
    assert grown.cache_use is not None and "the row cache bars's 36 files" in grown.cache_use
    _assert_same(_stream([folder, today], tmp_path / "elsewhere" / "fresh", **dates), grown)
    # By shares, the training rows (and so the scales) move with the new day.
    assert _stream([folder, today], caches / "shares-both").cache_use == "built"


def test_predict_on_the_runs_folder_and_a_new_day_encodes_only_that_day(
    sample_parquet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    today = _new_day_apart(folder, tmp_path / "today")
    run, cache = tmp_path / "run", tmp_path / "my-cache"
    train = ["train", str(folder), "--preset", "tiny", "--no-gradient-checkpointing"]
    options = ["--epochs", "1", "--max-steps-per-epoch", "2", "--max-host-memory", "1MB"]
    assert main([*train, *options, "--data-cache", str(cache), "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    forecasts = tmp_path / "forecasts.parquet"
    assert main(["predict", str(run), str(folder), str(today), "-o", str(forecasts)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    new_rows = sum(pq.read_metadata(path).num_rows for path in today.rglob("*.parquet"))
    assert (
        f"reused the encoded rows of the row cache my-cache's 36 files and encoded the "
        f"{new_rows:,} rows of 2 new files" in said
    ), said
    last = max(pc.max(pq.read_table(path)["timestamp"]).value for path in today.rglob("*.parquet"))
    assert int(pc.max(pq.read_table(forecasts)["timestamp"]).value) == last
