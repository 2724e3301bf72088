"""The columns report: what the model reads from the file, printed before the plan
(:mod:`autockpt.plan_report`, which the Lightning callback prints too).

On a terminal rich fits the table to the window (folding long segment names); in a file or a
pipe the console from :func:`autockpt.cli.console.make_console` is wide enough that every column
is printed in full and every row on one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from tft.data.splits import time_text

if TYPE_CHECKING:
    from tft.data.column_table import ColumnUse
    from tft.data.windows import WindowedData


def split_line(split: tuple[float, float, float] | tuple[str, str], data: WindowedData) -> str:
    """The split the run trains, validates and tests on: each part's share of the timestamps
    or the times it begins at, and its windows (``--split``)."""
    windows = (len(data.train), len(data.validation), len(data.test))
    if len(split) == 2 and data.split_cuts_ns is not None:
        validation, test = (time_text(cut) for cut in data.split_cuts_ns)
        return (
            f"split:         train before {validation} ({windows[0]:,} windows), validation "
            f"from then ({windows[1]:,}), test from {test} ({windows[2]:,}), in time order "
            "(--split)"
        )
    shown = ", ".join(
        f"{name} {share:.0%} ({count:,} windows)"
        for name, share, count in zip(("train", "validation", "test"), split, windows, strict=True)
    )
    return f"split:         {shown} of the timestamps, in time order (--split)"


def print_columns(console: Console, columns: list[ColumnUse]) -> None:
    """What the model sees: every column of the file with its role, kind and scaling, or why
    it is left out.

    Runs of consecutive columns used alike (225 real observed features) share one row, so the
    table stays short; ``columns.json`` and ``--quiet`` list every column.
    """
    table = Table(title="data columns")
    table.add_column("column", overflow="fold")
    table.add_column("type", no_wrap=True)
    table.add_column("role")
    table.add_column("kind")
    table.add_column("scaling")
    table.add_column("note", overflow="fold")
    for group in _runs_used_alike(columns):
        column = group[0]
        kind: str = column.kind or "-"
        if column.categories is not None:
            kind = f"{kind}, {column.categories:,} categories"
        note = column.note or ""
        if column.unknown_rows:
            note = f"{column.unknown_rows:,} rows not in the training categories: coded unknown"
        role = column.role if column.role != "unused" else "[dim]unused[/dim]"
        table.add_row(_names(group), column.type, role, kind, column.scaling or "-", note)
    console.print(table)


def _runs_used_alike(columns: list[ColumnUse]) -> list[list[ColumnUse]]:
    def key(column: ColumnUse) -> tuple[object, ...] | None:
        if column.categories is not None or column.note is not None:
            return None  # a column with something of its own to say has its own row
        return (column.type, column.role, column.kind, column.scaling)

    runs: list[list[ColumnUse]] = []
    for column in columns:
        if runs and key(column) is not None and key(runs[-1][0]) == key(column):
            runs[-1].append(column)
        else:
            runs.append([column])
    return runs


def _names(group: list[ColumnUse]) -> str:
    if len(group) <= 3:
        return ", ".join(column.name for column in group)
    return f"{group[0].name}, {group[1].name}, ... {group[-1].name} ({len(group)} columns)"


def columns_record(
    columns: list[ColumnUse],
    split: tuple[float, float, float] | tuple[str, str],
    data: WindowedData,
) -> dict[str, object]:
    """The column table and the split as one JSON-able record (``--quiet`` prints it as a
    line)."""
    windows = {"train": len(data.train), "validation": len(data.validation), "test": len(data.test)}
    return {
        "kind": "columns",
        "columns": [column.model_dump(mode="json") for column in columns],
        "split": {
            ("dates" if len(split) == 2 else "shares"): list(split),
            "cuts_ns": list(data.split_cuts_ns or ()),
            "windows": windows,
        },
    }
