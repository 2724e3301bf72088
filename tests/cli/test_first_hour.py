"""A trader's first hour with their own export: the columns named as exports name them (``ts``,
``ticker``, ``o h l c v``), three contracts interleaved by time. What the file settles is
settled (the one timestamp column, the text column that tells a timestamp's rows apart), and
what it cannot is asked for all at once, each with its flag first (NOTE [Roles the file
settles])."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autockpt.cli import main
from tests.cli.test_cli import assert_one_line
from tft.data import role_inference
from tft.data.columns import ColumnRoles
from tft.data.sources.data_source import DataSource
from tft.data.windows import load_windows
from tft.errors import DataError

PLAN = ["--preset", "tiny", "--vram-budget", "8MB"]
CONTRACTS = ("ESZ6", "NQZ6", "CLZ6")
DATE_HOURS = ("19:00", "21:30")


def write_export(
    path: Path,
    *,
    minutes: int = 600,
    interleaved: bool = True,
    names: bool = False,
    times_as: str = "timestamp",
) -> Path:
    """Three contracts' one-minute bars as an export writes them: by time, contract by
    contract within a minute (``interleaved``), or contract after contract. ``names`` adds a
    ``name`` column, one to one with the ticker but in another order. ``times_as``: the times
    as a Parquet ``timestamp``, ``text`` on the exchange's clock (no zone), or epoch ``ms``."""
    rng = np.random.default_rng(0)
    times = np.datetime64("2026-03-02T14:30", "ns") + np.arange(minutes) * np.timedelta64(1, "m")
    tables = []
    for number, ticker in enumerate(CONTRACTS):
        close = (100.0 + 50 * number) * np.exp(np.cumsum(rng.normal(0, 5e-4, minutes)))
        columns = {
            "ts": _stored(times, times_as),
            "ticker": pa.array([ticker] * minutes),
            "o": close * (1 + rng.normal(0, 1e-4, minutes)),
            "h": close * 1.001,
            "l": close * 0.999,
            "c": close,
            "v": rng.integers(1, 900, minutes),
            "book_imb": rng.normal(0, 1, minutes),
            # A 14-bar RSI per contract: no value for its first 13 bars (NOTE [Warm-up rows]).
            "rsi_14": np.concatenate([np.full(13, np.nan), rng.uniform(20, 80, minutes - 13)]),
            "session": pa.array(["RTH" if m % 390 < 300 else "ETH" for m in range(minutes)]),
        }
        if names:
            columns["name"] = pa.array([f"contract {len(CONTRACTS) - number}"] * minutes)
        tables.append(pa.table(columns))
    table = pa.concat_tables(tables)
    if interleaved:
        order = np.lexsort((np.arange(table.num_rows) // minutes, np.tile(np.arange(minutes), 3)))
        table = table.take(pa.array(order))
    pq.write_table(table, path)
    return path


def _stored(times: np.ndarray, kind: str) -> pa.Array:
    if kind == "text":  # Chicago's clock in March 2026 (CST, UTC-6, until the 8th)
        local = times - np.timedelta64(6, "h")
        return pa.array([str(t.astype("datetime64[s]")).replace("T", " ") for t in local])
    if kind == "ms":
        return pa.array(times.astype(np.int64) // 10**6)
    return pa.array(times)


def test_the_export_runs_on_the_second_try_with_the_one_flag_it_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_export(tmp_path / "mybars.parquet")
    code = main(["plan", str(data), *PLAN])
    err = capsys.readouterr().err
    assert code == 2
    assert_one_line(err)
    # The target cannot be read off the file: asked for, flag first. The timestamp and the
    # symbol can: not asked for.
    assert "no target column 'close': name it with --target COLUMN (ColumnRoles(target=" in err
    assert "timestamp" not in err.split("the file has")[0] and "symbol" not in err
    assert main(["plan", str(data), *PLAN, "--target", "c", "--quiet"]) == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[0])
    roles = {column["name"]: column["role"] for column in shown["columns"]}
    assert roles["ts"] == "timestamp" and roles["ticker"] == "symbol" and roles["c"] == "target"
    rsi = next(column for column in shown["columns"] if column["name"] == "rsi_14")
    assert rsi["role"] == "observed" and rsi["note"].startswith("36 warm-up rows")


def test_every_role_the_file_lacks_is_named_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_export(tmp_path / "mybars.parquet")
    code = main(["plan", str(data), *PLAN, "--known-columns", "sesion", "--symbol-column", "sym"])
    err = capsys.readouterr().err
    assert code == 2
    assert_one_line(err)
    assert "3 problems with the column roles" in err
    for asked in ("--symbol-column COLUMN", "--target COLUMN", "--known-columns A,B"):
        assert asked in err
    assert err.index("--target") < err.index("ColumnRoles(target=")  # the flag first
    assert "the file has ts, ticker, o, h, l, c, v, book_imb, ... (10 in all)" in err


def test_a_named_role_is_never_replaced_by_what_the_file_settles(tmp_path: Path) -> None:
    data = write_export(tmp_path / "mybars.parquet")
    with pytest.raises(DataError, match="no timestamp column 'time'"):
        load_windows(
            data, roles=ColumnRoles(timestamp="time", target="c"), encoder_length=8, horizon=2
        )
    # symbol=None said in so many words: the contracts' repeated timestamps are refused.
    with pytest.raises(DataError, match="repeats the timestamp"):
        load_windows(data, roles=ColumnRoles(symbol=None, target="c"), encoder_length=8, horizon=2)


def test_one_to_one_columns_settle_the_symbol_and_other_groupings_are_asked_for(
    tmp_path: Path,
) -> None:
    data = write_export(tmp_path / "named.parquet", names=True)
    windows = load_windows(data, roles=ColumnRoles(target="c"), encoder_length=8, horizon=2)
    assert windows.normalizer.roles.symbol == "ticker"  # first in the file; name is static
    assert "name" in (windows.normalizer.roles.static or [])

    table = pq.read_table(data)
    # A column that tells a minute's rows apart but groups them otherwise than the ticker
    # (the rows are interleaved: a minute's three contracts, then the next minute's).
    row = np.arange(table.num_rows)
    venue = pa.array([f"venue {v}" for v in (row % 3 + row // 3) % 3])
    pq.write_table(table.drop_columns(["name"]).append_column("venue", venue), data)
    with pytest.raises(DataError) as refused:
        load_windows(data, roles=ColumnRoles(target="c"), encoder_length=8, horizon=2)
    message = str(refused.value)
    assert "each of ticker, venue tells the rows apart" in message
    assert "--symbol-column COLUMN" in message


def test_contracts_one_after_another_past_the_sample_say_to_name_the_symbol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Contract after contract, the first rows' timestamps never repeat: the file settles
    # nothing, and the order check's error names the text columns and the flag.
    data = write_export(tmp_path / "sorted.parquet", interleaved=False)
    monkeypatch.setattr(role_inference, "SAMPLE_ROWS", 100)
    with pytest.raises(DataError) as refused:
        load_windows(data, roles=ColumnRoles(target="c"), encoder_length=8, horizon=2)
    message = str(refused.value)
    assert "is earlier than row" in message
    assert "the file's text columns: ticker, session" in message
    assert message.index("--symbol-column") < message.index("sort the file")


@pytest.mark.parametrize("times_as", ["text", "ms"])
def test_times_as_text_or_epochs_plan_and_text_asks_for_its_zone(
    tmp_path: Path, times_as: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_export(tmp_path / "mybars.parquet", times_as=times_as)
    # Text that reads as times is found (NOTE [Roles the file settles]); epochs are named.
    roles = (
        ["--target", "c"] if times_as == "text" else ["--timestamp-column", "ts", "--target", "c"]
    )
    if times_as == "text":
        assert main(["plan", str(data), *PLAN, *roles]) == 2
        err = capsys.readouterr().err
        assert_one_line(err)
        assert "timestamp column 'ts' is text with no time zone" in err
        assert "--timezone ZONE" in err
        roles += ["--timezone", "America/Chicago"]
    assert main(["plan", str(data), *PLAN, *roles, "--quiet"]) == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[0])
    note = next(c["note"] for c in shown["columns"] if c["name"] == "ts")
    read = "epoch milliseconds" if times_as == "ms" else "ISO 8601 text, on America/Chicago's"
    assert note.startswith(read), note


def test_the_split_is_the_users_and_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_export(tmp_path / "mybars.parquet")
    args = ["plan", str(data), *PLAN, "--target", "c"]
    assert main([*args, "--split", "0.8,0.1,0.1", "--quiet"]) == 0
    split = json.loads(capsys.readouterr().out.splitlines()[0])["split"]
    assert split["shares"] == [0.8, 0.1, 0.1]
    default = main([*args, "--quiet"])
    assert default == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["split"]["shares"] == [
        0.7,
        0.15,
        0.15,
    ]
    windows = split["windows"]
    assert windows["train"] > 0.75 * sum(windows.values())
    assert main(args) == 0
    assert "split:         train 70% (" in capsys.readouterr().out

    assert main([*args, "--split", "0.5,0.1,0.1"]) == 2
    err = capsys.readouterr().err
    assert_one_line(err)
    assert "--split" in err and "add up to 1" in err
    # Too short a test part for one window: the message names the flag that fixes it.
    assert main([*args, "--split", "0.99,0.009,0.001"]) == 2
    err = capsys.readouterr().err
    assert_one_line(err)
    assert "give the validation split a larger share (--split TRAIN,VAL,TEST" in err


def test_the_split_can_be_two_dates_on_the_files_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_export(tmp_path / "mybars.parquet")  # 14:30 UTC to 00:29 the next day
    args = ["plan", str(data), *PLAN, "--target", "c", "--split", "2026-03-02T19:00,21:30"]
    assert main(args) == 2  # the second is not a date: one line naming it
    err = capsys.readouterr().err
    assert_one_line(err)
    assert "'21:30' is not an ISO 8601 date" in err
    args[-1] = "2026-03-02T19:00,2026-03-02T21:30"
    assert main([*args, "--quiet"]) == 0
    split = json.loads(capsys.readouterr().out.splitlines()[0])["split"]
    assert split["dates"] == ["2026-03-02T19:00", "2026-03-02T21:30"]
    cuts = [int(np.datetime64(f"2026-03-02T{hour}", "ns").astype(np.int64)) for hour in DATE_HOURS]
    assert split["cuts_ns"] == cuts
    # Per contract, train has the minutes from 14:43 (the RSI's warm-up rows dropped) to
    # 18:59, validation 150 and test 180; a window (tiny: 24 + 4 bars) begins at all but 27.
    assert split["windows"] == {"train": 3 * (257 - 27), "validation": 3 * 123, "test": 3 * 153}
    assert main([*args, "--timezone", "America/Chicago", "--quiet"]) == 0  # UTC-6 in March
    chicago = json.loads(capsys.readouterr().out.splitlines()[0])["split"]
    assert chicago["cuts_ns"][0] == cuts[0] + 6 * 3600 * 10**9
    assert main(args) == 0
    assert "split:         train before 2026-03-02T19:00 UTC (" in capsys.readouterr().out
    args[-1] = "2026-03-02T19:00,2026-03-05"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert_one_line(err)
    assert "test start 2026-03-05T00:00 UTC is outside the file's bars" in err


def test_a_text_time_column_is_found_and_a_date_or_a_label_is_not(tmp_path: Path) -> None:
    data = write_export(tmp_path / "mybars.parquet", times_as="text")
    table = pq.read_table(data)
    dates = pa.array([value[:10] for value in table["ts"].to_pylist()])
    schema = table.append_column("day", dates).schema
    pq.write_table(table.append_column("day", dates), data)
    settled = role_inference.infer_roles(
        DataSource.of(data), schema, ColumnRoles(target="c", timezone="UTC")
    )
    assert settled.timestamp == "ts"  # not "day" (a date alone), "ticker" or "session"
    both = table.append_column("when", table["ts"])
    pq.write_table(both, data)
    with pytest.raises(DataError, match="--timestamp-column COLUMN"):  # two: asked for
        role_inference.infer_roles(DataSource.of(data), both.schema, ColumnRoles(target="c"))
