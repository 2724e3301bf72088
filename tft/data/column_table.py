"""What the model sees of a file: one row per column, with its role, kind, scaling or reason.

:func:`tft.data.windows.load_windows` returns this table with the windows
(:attr:`tft.data.windows.WindowedData.columns`); ``autockpt plan`` and ``train`` print it before
anything else, a run keeps it in its folder, and ``--quiet`` prints it as one JSON line. Every
column of the file is in it: a column the model does not read says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from tft.data.columns import ColumnRoles, _usable, unusable_reason

if TYPE_CHECKING:
    from tft.data.normalize import Normalizer

__all__ = ["CALENDAR_INPUTS", "ColumnUse", "Role", "column_table"]

CALENDAR_INPUTS = ("minute_of_day_sin", "minute_of_day_cos", "day_of_week_sin", "day_of_week_cos")
"""Known inputs derived from the timestamp (UTC), always the last known real inputs."""

Role = Literal["timestamp", "symbol", "target", "known", "observed", "static", "unused"]


class ColumnUse(BaseModel):
    """How one column of the file is used."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """The column's name in the file."""
    type: str
    """Its Parquet (Arrow) type, e.g. ``double``, ``string``, ``bool``."""
    role: Role
    """What it is to the model; ``unused`` when the model does not read it."""
    kind: Literal["time", "symbol", "real", "categorical"] | None
    """``real`` inputs are scaled numbers, ``categorical`` ones embedded categories; None
    when unused."""
    categories: int | None = None
    """Categories fitted on the training rows (symbols for the symbol column), without the
    "unknown" one (NOTE [Categories] in tft.data.categories)."""
    unknown_rows: int | None = None
    """Rows of a categorical column coded "unknown": a null, or a value the training rows
    never had."""
    scaling: str | None = None
    """How a real input is scaled: ``per symbol`` or ``global`` (the target also says its
    transform)."""
    note: str | None = None
    """Why an unused column is left out, or what a timestamp or target becomes."""


def column_table(
    schema: pa.Schema,
    roles: ColumnRoles,
    normalizer: Normalizer,
    unknown_rows: dict[str, int],
    warmup_rows: dict[str, int] | None = None,
) -> list[ColumnUse]:
    """One :class:`ColumnUse` per column of the file, in file order (``roles`` resolved);
    ``warmup_rows``: each real input's warm-up rows dropped (NOTE [Warm-up rows])."""
    scaling = "per symbol" if roles.scaling == "per_symbol" else "global"
    role_of: dict[str, Role] = {roles.timestamp: "timestamp", roles.target: "target"}
    if roles.symbol is not None:
        role_of[roles.symbol] = "symbol"
    role_of.update(dict.fromkeys(roles.known, "known"))
    role_of.update(dict.fromkeys(roles.observed or [], "observed"))
    role_of.update(dict.fromkeys(roles.static or [], "static"))
    table = []
    for field in schema:
        name = field.name
        role = role_of.get(name, "unused")
        use: dict[str, Any]
        if role == "timestamp":
            calendar = f"gives {len(CALENDAR_INPUTS)} known calendar inputs"
            read = _times_read_as(field.type, roles)
            use = {
                "kind": "time",
                "note": f"{read}; {calendar} (UTC minute of the day, day of the week)",
            }
        elif role == "symbol":
            use = {
                "kind": "symbol",
                "categories": len(normalizer.symbols),
                "note": "a static input",
            }
        elif role == "target":
            transform = roles.target_transform
            use = {
                "kind": "real",
                "scaling": f"{transform}, {scaling}",
                "note": f"forecast; its past {transform} is the first observed input",
            }
        elif role == "unused":
            use = {"kind": None, "note": _unused_reason(field, roles)}
        elif name in roles.categorical:
            use = {
                "kind": "categorical",
                "categories": len(normalizer.categories[name]),
                "unknown_rows": unknown_rows.get(name, 0),
            }
        else:
            use = {"kind": "real", "scaling": scaling}
            if (warmup := (warmup_rows or {}).get(name)) is not None:
                use["note"] = (
                    f"{warmup:,} warm-up rows (null/NaN at the start of a symbol's rows) "
                    "dropped, with the windows that touch them"
                )
        table.append(ColumnUse(name=name, type=str(field.type), role=role, **use))
    return table


def _unused_reason(field: pa.Field, roles: ColumnRoles) -> str:
    if field.name in roles.ignore:
        return "ignored as asked"
    if not _usable(field.type):
        return unusable_reason(field.type)
    return "not listed as known, observed or static"


def _times_read_as(kind: pa.DataType, roles: ColumnRoles) -> str:
    """How the timestamp column's values were read (NOTE [Timestamps as exports store them])."""
    zone = f"on {roles.timezone}'s clock" if roles.timezone else "in UTC"
    if pa.types.is_integer(kind):
        units = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
        return f"epoch {units[roles.timestamp_unit or 'ns']}"
    if pa.types.is_timestamp(kind):
        return "times with their zone" if kind.tz else f"times without a zone, {zone}"
    return f"ISO 8601 text, {zone} where a time has no offset"
