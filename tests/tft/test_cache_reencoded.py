"""A streamed folder's row cache re-encodes only the symbols whose files changed or went, and
gives what a build of the folder as it is now gives, warm-up and unknown-category counts
included (NOTE [A cache re-encoded where its files changed])."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
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
from tft.data.windows import WindowedData
from tft.errors import DataError

DATES = {"split_fractions": None, "split_times": ("2024-01-10", "2024-01-15")}


def _trader_folder(sample: Path, root: Path) -> Path:
    """The sample as daily files per contract, with a session category and an exchange (a
    static column) in every file, and ES's first bars of one indicator still warming up."""
    folder = write_folder(sample, root)
    for index, path in enumerate(sorted(folder.rglob("*.parquet"))):
        table = pq.read_table(path)
        session = np.where(np.arange(table.num_rows) % 2 == 0, "day", "night")
        table = table.append_column("session", pa.array(session))
        table = table.append_column("exchange", pa.array(["CME"] * table.num_rows))
        if index == 0:  # ES's first day
            values = table["volatility_3"].to_numpy().copy()
            values[:5] = np.nan
            column = table.schema.get_field_index("volatility_3")
            table = table.set_column(column, "volatility_3", pa.array(values, pa.float32()))
        pq.write_table(table, path)
    return folder


def _day(folder: Path, symbol: str, index: int) -> Path:
    return sorted((folder / f"symbol={symbol}").iterdir())[index]


def _rewrite(day: Path, *, last_bar: bool = True, **names: str) -> None:
    """A late fix to a day's file: written again without its last bar, or with a text
    column's values renamed (``session="auction"``)."""
    table = pq.read_table(day)
    if not last_bar:
        table = table.slice(0, table.num_rows - 1)
    for column, value in names.items():
        values = pa.array([value] * table.num_rows)
        table = table.set_column(table.schema.get_field_index(column), column, values)
    pq.write_table(table, day)


def _assert_reencoded(
    folder: Path, cache: Path, fresh: Path, symbol: str, why: str, **options
) -> WindowedData:
    """The cache re-encodes ``symbol``'s rows alone, to what a build of the folder gives."""
    lines: list[str] = []
    again = _stream(folder, cache, lines, **options)
    files = list(folder.glob(f"symbol={symbol}/*.parquet"))
    kept = int(np.sum(again.whole.rows.symbol_index == again.symbols.index(symbol)))
    assert again.cache_use == (
        f"reused the encoded rows of 1 of 2 symbols and encoded again the {kept:,} rows of "
        f"{symbol} from {len(files)} files ({why} held them)"
    )
    assert _encoded_rows(lines) == sum(pq.read_metadata(path).num_rows for path in files)
    built = _stream(folder, fresh, **options)
    assert built.cache_use == "built"
    _assert_identical(built, again)
    assert again.columns == built.columns  # each column's warm-up and unknown rows
    assert _stream(folder, cache, **options).cache_use == "reused"
    return again


def test_a_changed_or_removed_file_reencodes_its_symbol_alone(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = _trader_folder(sample_parquet, tmp_path / "bars")
    held = _hold_back_last_day(folder)
    trained = _stream(folder, tmp_path / "cache")  # the run's cache, its scales fitted
    given = {"normalizer": trained.normalizer}  # a resumed run: its scales, split by shares
    _stream(folder, tmp_path / "cache", **given)
    for path, table in held:  # the last day grows the cache: its files' symbols kept too
        pq.write_table(table, path)
    assert "new files" in str(_stream(folder, tmp_path / "cache", **given).cache_use)
    _rewrite(_day(folder, "NQ", 2), last_bar=False)
    fresh = tmp_path / "fresh"
    _assert_reencoded(folder, tmp_path / "cache", fresh / "1", "NQ", "1 changed file", **given)
    # ES's first day gone: its warm-up rows go with it, its second day's first row is dropped
    # (no bar before it to take the log return against).
    _day(folder, "ES", 0).unlink()
    again = _assert_reencoded(
        folder, tmp_path / "cache", fresh / "2", "ES", "1 removed file", **given
    )
    assert all("warm-up" not in (column.note or "") for column in again.columns)
    # NQ's first day gone too: its times are no bar's now, and the shares' cuts move.
    _day(folder, "NQ", 0).unlink()
    cuts = again.split_cuts_ns
    again = _assert_reencoded(
        folder, tmp_path / "cache", fresh / "3", "NQ", "1 removed file", **given
    )
    assert again.split_cuts_ns != cuts
    # A new session name on NQ's last day: not among the run's categories, coded unknown.
    _rewrite(_day(folder, "NQ", -1), session="auction")
    again = _assert_reencoded(
        folder, tmp_path / "cache", fresh / "4", "NQ", "1 changed file", **given
    )
    session = next(column for column in again.columns if column.name == "session")
    assert session.unknown_rows == pq.read_metadata(_day(folder, "NQ", -1)).num_rows


def test_a_split_by_dates_reencodes_a_change_past_its_first_date_and_rebuilds_one_before(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = _trader_folder(sample_parquet, tmp_path / "bars")
    _stream(folder, tmp_path / "cache", **DATES)
    late = _day(folder, "ES", -3)
    assert late.stem >= DATES["split_times"][0]
    _rewrite(late, last_bar=False)
    _assert_reencoded(
        folder, tmp_path / "cache", tmp_path / "fresh", "ES", "1 changed file", **DATES
    )
    # A training day changed: the scales fitted on it move, so the whole cache is built.
    _rewrite(_day(folder, "NQ", 1), last_bar=False)
    lines: list[str] = []
    again = _stream(folder, tmp_path / "cache", lines, **DATES)
    assert again.cache_use == "built"
    assert _encoded_rows(lines) == sum(
        pq.read_metadata(path).num_rows for path in folder.rglob("*.parquet")
    )
    _assert_identical(_stream(folder, tmp_path / "fresh-again", **DATES), again)


def test_a_split_by_shares_rebuilds_on_a_changed_file(sample_parquet: Path, tmp_path: Path) -> None:
    folder = _trader_folder(sample_parquet, tmp_path / "bars")
    _stream(folder, tmp_path / "cache")
    _rewrite(_day(folder, "ES", -1), last_bar=False)  # the shares' cuts move with the bar
    assert _stream(folder, tmp_path / "cache").cache_use == "built"


def test_predict_after_a_late_fix_encodes_that_contract_alone(
    sample_parquet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _trader_folder(sample_parquet, tmp_path / "bars")
    run, cache = tmp_path / "run", tmp_path / "my-cache"
    train = ["train", str(folder), "--preset", "tiny", "--no-gradient-checkpointing"]
    options = ["--epochs", "1", "--max-steps-per-epoch", "2", "--max-host-memory", "1MB"]
    assert main([*train, *options, "--data-cache", str(cache), "--out", str(run), "--quiet"]) == 0
    _rewrite(_day(folder, "ES", -2), last_bar=False)
    capsys.readouterr()
    forecasts = tmp_path / "forecasts.parquet"
    assert main(["predict", str(run), str(folder), "-o", str(forecasts)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "reused the encoded rows of 1 of 2 symbols and encoded again the" in said, said
    files = len(list(folder.glob("symbol=ES/*.parquet")))
    assert f"rows of ES from {files} files (1 changed file held them)" in said, said
    assert forecasts.is_file()


def test_a_static_column_changed_in_one_file_is_refused_as_a_build_refuses_it(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = _trader_folder(sample_parquet, tmp_path / "bars")
    trained = _stream(folder, tmp_path / "cache")
    _rewrite(_day(folder, "ES", -1), exchange="CBOT")
    with pytest.raises(DataError) as refused:
        _stream(folder, tmp_path / "cache", normalizer=trained.normalizer)
    with pytest.raises(DataError) as built:
        _stream(folder, tmp_path / "fresh", normalizer=trained.normalizer)
    assert str(refused.value) == str(built.value)
    assert "exchange" in str(refused.value)
