"""A quoted glob pattern is one dataset, as a folder is (NOTE [A folder of files as one
dataset]): the files it matches, hive keys read below its leading folder, in memory and
streamed. Several paths given together: tests/tft/test_several_paths.py."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from autockpt.cli import main
from tests.tft.test_parquet_folder import WINDOW, assert_same_windows, write_folder
from tft.data.sources.data_source import DataSource, is_pattern, pattern_base
from tft.data.streamed.streamed_windows import stream_windows
from tft.data.windows import load_windows
from tft.errors import DataError

# Five of the sample's days: a pattern that picks a part of the folder.
LATE_DAYS = "2024-01-1[5-9]"
FIRST_LATE_DAY, LAST_LATE_DAY = "2024-01-15", "2024-01-19"


def _late_days_alone(sample_parquet: Path, root: Path) -> Path:
    """The sample's bars of :data:`LATE_DAYS`, in the folder layout of :func:`write_folder`."""
    table = pq.read_table(sample_parquet)
    days = pc.strftime(table["timestamp"], format="%Y-%m-%d")
    late = table.filter(
        pc.and_(pc.greater_equal(days, FIRST_LATE_DAY), pc.less_equal(days, LAST_LATE_DAY))
    )
    late_file = root.parent / "late.parquet"
    pq.write_table(late, late_file)
    return write_folder(late_file, root)


def test_a_pattern_reads_the_files_it_matches_with_the_folders_keys(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    (folder / "symbol=NQ" / "notes.csv").write_text("a,b\n1,2\n")  # not matched by *.parquet
    every_day = folder / "symbol=*" / "*.parquet"
    assert is_pattern(every_day) and pattern_base(every_day) == folder
    assert_same_windows(load_windows(sample_parquet, **WINDOW), load_windows(every_day, **WINDOW))
    # A part of the folder: the same rows as a folder holding only those files.
    late = folder / "symbol=*" / f"{LATE_DAYS}.parquet"
    alone = _late_days_alone(sample_parquet, tmp_path / "late")
    assert len(DataSource.of(late).files()) == len(DataSource.of(alone).files()) == 10
    assert_same_windows(load_windows(alone, **WINDOW), load_windows(late, **WINDOW))
    roles = {column.name: column.role for column in load_windows(late, **WINDOW).columns}
    assert roles["symbol"] == "symbol"  # the key of the folders below the pattern's base


def test_a_pattern_streamed_gives_its_windows_in_memory(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    late = folder / "symbol=*" / f"{LATE_DAYS}.parquet"
    streamed = stream_windows(late, tmp_path / "cache", max_host_bytes=1 << 20, **WINDOW)
    assert_same_windows(load_windows(late, **WINDOW), streamed)


def test_a_pattern_that_matches_nothing_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bars").mkdir()
    with pytest.raises(DataError) as error:
        load_windows(tmp_path / "bars" / "*.parquet", **WINDOW)
    message = str(error.value)
    assert "\n" not in message and "*.parquet: matches no data file" in message
    assert "quote it" in message


def test_a_file_whose_name_holds_a_bracket_is_a_file(sample_parquet: Path, tmp_path: Path) -> None:
    odd = tmp_path / "bars[2024].parquet"
    odd.write_bytes(sample_parquet.read_bytes())
    assert not is_pattern(odd)
    assert_same_windows(load_windows(sample_parquet, **WINDOW), load_windows(odd, **WINDOW))


def test_train_takes_a_pattern_and_a_resume_reads_it_again(
    sample_parquet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    pattern = folder / "symbol=*" / f"{LATE_DAYS}.parquet"
    alone = _late_days_alone(sample_parquet, tmp_path / "late")
    common = ["--preset", "tiny", "--no-gradient-checkpointing", "--quiet", "--epochs", "1"]
    common += ["--max-steps-per-epoch", "2"]
    losses = []
    for name, data in (("pattern", pattern), ("alone", alone)):
        assert main(["train", str(data), *common, "--out", str(tmp_path / name)]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        losses.append([line["loss"] for line in lines if line.get("kind") == "step"])
    assert losses[0] == losses[1] and len(losses[0]) == 2
    stored = json.loads((tmp_path / "pattern" / "config.json").read_text())
    assert stored["data"] == str(pattern.resolve())  # the pattern, read again on resume
    assert main(["train", "--resume", str(tmp_path / "pattern"), "--epochs", "2", "--quiet"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["step"] for line in lines if line.get("kind") == "step"] == [3, 4]
