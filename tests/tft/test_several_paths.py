"""Several data paths given together are one dataset (NOTE [Several data paths]): the shell's
expansion of an unquoted pattern reads as the folder does, unrelated files and folders as the
one file of their rows, in memory and streamed, in any order, a file named twice read once; a
run keeps the paths and reads them again; a path that is not there, or a bar in two of them,
is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from autockpt.cli import main
from tests.tft.test_parquet_folder import WINDOW, assert_same_windows, write_folder
from tft.data.sources.data_source import DataSource
from tft.data.streamed.row_cache import cache_folder
from tft.data.streamed.streamed_windows import stream_windows
from tft.data.windows import load_windows
from tft.errors import DataError

TRAIN = ["--preset", "tiny", "--no-gradient-checkpointing", "--quiet", "--epochs", "1"]
TRAIN += ["--max-steps-per-epoch", "2"]


def _split_in_two(sample_parquet: Path, root: Path) -> tuple[Path, Path]:
    """The sample's bars before its tenth day in ``root/early/bars.parquet``, the rest in
    ``root/late/more/bars.parquet``: two unrelated paths, one file name."""
    table = pq.read_table(sample_parquet)
    days = pc.strftime(table["timestamp"], format="%Y-%m-%d")
    cut = sorted(set(days.to_pylist()))[9]
    early, late = root / "early" / "bars.parquet", root / "late" / "more" / "bars.parquet"
    for path, rows in ((early, pc.less(days, cut)), (late, pc.greater_equal(days, cut))):
        path.parent.mkdir(parents=True)
        pq.write_table(table.filter(rows), path)
    return early, late


def test_the_shells_expansion_of_a_pattern_reads_as_the_folder(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    files = sorted(str(path) for path in folder.glob("symbol=*/*.parquet"))  # the shell's
    data = load_windows(files, **WINDOW)
    assert_same_windows(load_windows(folder, **WINDOW), data)
    roles = {column.name: column.role for column in data.columns}
    assert roles["symbol"] == "symbol"  # the key of the folders the paths have in common


def test_unrelated_paths_read_as_the_one_file_of_their_rows(
    sample_parquet: Path, tmp_path: Path
) -> None:
    early, late = _split_in_two(sample_parquet, tmp_path)
    one = load_windows(sample_parquet, **WINDOW)
    assert_same_windows(one, load_windows([late, early.parent], **WINDOW))  # a file, a folder
    source = DataSource.of([early, early.parent, late])
    assert len(source.files()) == 2  # the early file named twice is read once
    assert_same_windows(one, load_windows(source, **WINDOW))
    streamed = stream_windows([late, early], tmp_path / "cache", max_host_bytes=1 << 20, **WINDOW)
    assert_same_windows(one, streamed)
    # The order they are given in names the same dataset, and the same cache.
    assert cache_folder(tmp_path, [late, early]) == cache_folder(tmp_path, [early, late])
    assert cache_folder(tmp_path, [early, late]) != cache_folder(tmp_path, early)


def test_a_bar_in_two_paths_names_both_files(sample_parquet: Path, tmp_path: Path) -> None:
    early, late = _split_in_two(sample_parquet, tmp_path)
    fix = tmp_path / "fix.parquet"
    pq.write_table(pq.read_table(early).slice(50, 1), fix)
    for read in (
        lambda: load_windows([early, late, fix], **WINDOW),
        lambda: stream_windows(
            [early, late, fix], tmp_path / "cache", max_host_bytes=1 << 20, **WINDOW
        ),
    ):
        with pytest.raises(DataError) as error:
            read()
        message = str(error.value)
        assert "\n" not in message
        assert "early/bars.parquet" in message and "fix.parquet" in message, message


def test_a_path_that_is_not_there_is_one_line_and_nothing_is_written(
    sample_parquet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    early, _ = _split_in_two(sample_parquet, tmp_path)
    missing = tmp_path / "nope.parquet"
    out = tmp_path / "run"
    assert main(["train", str(early), str(missing), *TRAIN, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{missing}: no such file or folder" in error
    assert not out.exists()


def test_train_on_several_paths_trains_as_on_their_folder_and_a_resume_reads_them_again(
    sample_parquet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    files = sorted(str(path) for path in folder.glob("symbol=*/*.parquet"))
    losses = []
    for name, data in (("paths", files), ("folder", [str(folder)])):
        assert main(["train", *data, *TRAIN, "--out", str(tmp_path / name)]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        losses.append([line["loss"] for line in lines if line.get("kind") == "step"])
    assert losses[0] == losses[1] and len(losses[0]) == 2
    stored = json.loads((tmp_path / "paths" / "config.json").read_text())
    assert stored["data"] == sorted(str(Path(file).resolve()) for file in files)
    assert main(["train", "--resume", str(tmp_path / "paths"), "--epochs", "2", "--quiet"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["step"] for line in lines if line.get("kind") == "step"] == [3, 4]
    # Forecasts for one day of each contract: the windows of those two files alone.
    out = tmp_path / "forecasts.parquet"
    two = [files[0], files[-1]]  # symbol=ES/<first day>, symbol=NQ/<last day>
    assert main(["predict", str(tmp_path / "paths"), *two, "-o", str(out)]) == 0
    forecasts = pq.read_table(out)
    assert set(forecasts["symbol"].to_pylist()) == {"ES", "NQ"}
    days = set(pc.strftime(forecasts["timestamp"], format="%Y-%m-%d").to_pylist())
    assert days == {Path(file).stem for file in two}
