"""A folder of Parquet files is one dataset (NOTE [A folder of files as one dataset]): files in
any order, hive keys as columns, schemas unified where that is safe, and each way a folder can
be wrong refused in one line naming the file and the column."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from autockpt.cli import main
from tft.data.windows import WindowedData, load_windows
from tft.errors import DataError

WINDOW = {"encoder_length": 12, "horizon": 3}
ROLE_ARRAYS = ("observed", "known", "categorical", "static", "target", "time_ns", "symbol_index")


def write_folder(source: Path, root: Path) -> Path:
    """``source``'s bars as a trader's export: a folder per contract (``symbol=ES``, the
    symbol only in the folder's name), a file per day, written last day first, beside the
    ``_SUCCESS`` marker Spark leaves."""
    table = pq.read_table(source)
    for symbol in pc.unique(table["symbol"]).to_pylist():
        rows = table.filter(pc.equal(table["symbol"], symbol)).drop_columns(["symbol"])
        days = pc.strftime(rows["timestamp"], format="%Y-%m-%d")
        for day in reversed(pc.unique(days).to_pylist()):
            out = root / f"symbol={symbol}" / f"{day}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows.filter(pc.equal(days, day)), out)
    (root / "_SUCCESS").write_text("")
    return root


def assert_same_windows(one_file: WindowedData, folder: WindowedData) -> None:
    for part in ("train", "validation", "test", "whole"):
        np.testing.assert_array_equal(getattr(one_file, part).starts, getattr(folder, part).starts)
    for name in ROLE_ARRAYS:
        np.testing.assert_array_equal(
            getattr(folder.whole.rows, name), getattr(one_file.whole.rows, name), err_msg=name
        )
    assert folder.symbols == one_file.symbols
    assert folder.split_cuts_ns == one_file.split_cuts_ns


def test_a_hive_folder_of_daily_files_reads_as_the_one_file(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    assert_same_windows(load_windows(sample_parquet, **WINDOW), load_windows(folder, **WINDOW))
    roles = {column.name: column.role for column in load_windows(folder, **WINDOW).columns}
    assert roles["symbol"] == "symbol"  # found in the folders' names


def _two_files(tmp_path: Path, first: dict, second: dict) -> Path:
    folder = tmp_path / "two"
    folder.mkdir()
    times = np.datetime64("2026-03-02T14:30", "ns") + np.arange(200) * np.timedelta64(1, "m")
    rng = np.random.default_rng(0)
    for name, extra, part in (
        ("a.parquet", first, slice(0, 100)),
        ("b.parquet", second, slice(100, 200)),
    ):
        close = 100 * np.exp(np.cumsum(rng.normal(0, 1e-3, 100)))
        pq.write_table(pa.table({"timestamp": times[part], "close": close, **extra}), folder / name)
    return folder


def test_an_integer_column_in_one_file_and_floats_in_another_read_as_floats(
    tmp_path: Path,
) -> None:
    folder = _two_files(tmp_path, {"volume": np.arange(100)}, {"volume": np.arange(100) + 0.5})
    data = load_windows(folder, split_fractions=None, **WINDOW)
    assert len(data.whole) == 199 - 14  # every bar but the first; a window at each start
    assert "volume" in data.observed_columns


@pytest.mark.parametrize(
    ("first", "second", "words"),
    [
        (
            {"volume": np.arange(100)},
            {"volume": [str(v) for v in range(100)]},
            "column 'volume' is int64 in a.parquet and string in b.parquet",
        ),
    ],
)
def test_types_that_cannot_be_unified_are_named_with_both_files(
    tmp_path: Path, first: dict, second: dict, words: str
) -> None:
    with pytest.raises(DataError, match=words):
        load_windows(_two_files(tmp_path, first, second), **WINDOW)


def test_the_same_bar_in_two_files_is_refused_naming_both(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    day = sorted((folder / "symbol=ES").iterdir())[3]
    again = pq.read_table(day).slice(100, 1)
    pq.write_table(again, folder / "symbol=ES" / "late-fix.parquet")
    with pytest.raises(DataError) as refused:
        load_windows(folder, **WINDOW)
    message = str(refused.value)
    assert "\n" not in message
    assert f"is in both symbol=ES/{day.name} and symbol=ES/late-fix.parquet" in message
    assert "the bar of ES at " in message


def test_what_a_folder_holds_that_cannot_be_read_is_named(
    sample_parquet: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    (empty / "_logs").mkdir(parents=True)
    with pytest.raises(DataError, match="is a folder with no data files in it"):
        load_windows(empty, **WINDOW)
    folder = write_folder(sample_parquet, tmp_path / "bars")
    (folder / "symbol=NQ" / "notes.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match=r"symbol=NQ/notes.csv cannot be read as Parquet"):
        load_windows(folder, **WINDOW)
    clash = write_folder(sample_parquet, tmp_path / "clash")
    day = next((clash / "symbol=ES").iterdir())
    rows = pq.read_table(day)
    pq.write_table(rows.append_column("symbol", pa.array(["ES"] * rows.num_rows)), day)
    with pytest.raises(
        DataError,
        match=r"the folders' key 'symbol' \(symbol=\.\.\. in their names\) is also a column in",
    ):
        load_windows(clash, **WINDOW)


def test_plan_and_train_take_a_folder_as_the_file(
    sample_parquet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_folder(sample_parquet, tmp_path / "bars")
    records = []
    for data in (sample_parquet, folder):
        # The plain step: a plan chosen by timing could differ between the runs, and with
        # dropout on, micro-batches draw other masks.
        args = ["train", str(data), "--preset", "tiny", "--no-gradient-checkpointing"]
        out = tmp_path / f"run-{data.name}"
        steps = ["--epochs", "1", "--max-steps-per-epoch", "3"]
        assert main([*args, *steps, "--out", str(out), "--quiet"]) == 0
        records.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    # The same windows, batches and losses.
    assert records[0][0]["split"] == records[1][0]["split"]
    losses = [[r.get("train_loss") for r in run if "train_loss" in r] for run in records]
    assert losses[0] == losses[1] and losses[0]
    # Past --max-host-memory the folder is streamed through a row cache (NOTE [Streaming a
    # folder in time order]): the same losses, to the float32 bits of the streamed scales.
    out = tmp_path / "runs" / "streamed"
    streamed = ["train", str(folder), *args[2:], *steps, "--out", str(out), "--quiet"]
    assert main([*streamed, "--max-host-memory", "1MB"]) == 0
    run = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    caches = [cache.name for cache in (tmp_path / "runs" / "data-cache").iterdir()]
    assert len(caches) == 1 and caches[0].startswith("bars-")
    assert [r["train_loss"] for r in run if "train_loss" in r] == pytest.approx(
        losses[0], rel=1e-5, abs=1e-7
    )
