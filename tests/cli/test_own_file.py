"""The command line on a user's own file: the column table, categoricals, per-symbol scaling."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from autockpt.cli import main
from tests.tft.futures import write_futures

COLUMNS = ["--target", "px_last", "--symbol-column", "ticker", "--timestamp-column", "ts"]
SHORT = ["--preset", "tiny", "--epochs", "1", "--max-steps-per-epoch", "2", "--batch-size", "8"]


def test_train_shows_every_column_and_predict_reads_a_new_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_futures(tmp_path / "mine.parquet")
    out = tmp_path / "run"
    args = ["train", str(data), *COLUMNS, *SHORT, "--known-columns", "session"]
    assert main([*args, "--quiet", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["kind"] == "columns"
    shown = {column["name"]: column for column in lines[0]["columns"]}
    assert shown["session"]["role"] == "known" and shown["session"]["kind"] == "categorical"
    assert shown["raw"]["role"] == "unused" and "binary" in shown["raw"]["note"]
    saved = json.loads((out / "columns.json").read_text())
    assert [column["name"] for column in saved] == pq.read_schema(data).names
    assert saved == lines[0]["columns"]

    newer = write_futures(tmp_path / "newer.parquet", session_override={900: "HOLIDAY"})
    forecasts = tmp_path / "forecasts.parquet"
    assert main(["predict", str(out), str(newer), "-o", str(forecasts)]) == 0
    printed = capsys.readouterr().out
    assert "session: 2 rows had a value the training rows never had" in printed
    written = pq.read_table(forecasts)
    assert written.num_rows > 0
    assert json.loads(written.schema.metadata[b"unknown_rows"]) == {
        "session": 2,
        "is_roll": 0,
        "exchange": 0,
    }


def test_plan_prints_the_column_table_with_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_futures(tmp_path / "mine.parquet")
    assert main(["plan", str(data), *COLUMNS, "--preset", "tiny", "--ignore-columns", "imb"]) == 0
    out = capsys.readouterr().out
    table = out[: out.index("memory plan")]
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if line.startswith("│")}
    assert "categorical, 2 categories" in rows["session"]
    assert "static" in rows["exchange"]
    assert "ignored as asked" in rows["imb"]
    assert "neither a number nor a category" in rows["raw"]


def test_a_static_column_that_varies_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_futures(tmp_path / "mine.parquet")
    out = tmp_path / "run"
    code = main(
        ["train", str(data), *COLUMNS, *SHORT, "--static-columns", "session", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "static column 'session' takes more than one value within a symbol" in err
    assert not out.exists()
