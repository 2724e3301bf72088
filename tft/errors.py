"""Errors of tft's own: what a user's data file or model configuration gets wrong.

Every one names the offending value (the file, column, row or field) and the way out, in one
line; the application that reads files through tft reports them as it reports its own (the
``autockpt`` command prints the line and exits with code 2). ``assert`` is kept for internal
invariants only. tft imports nothing of ``autockpt``: these are its own classes.
"""


class TFTError(Exception):
    """Base class of every tft error caused by user input rather than by a bug."""


class DataError(TFTError, ValueError):
    """A data file that cannot be used: missing, not Parquet, bad columns or rows."""


class ConfigError(TFTError, ValueError):
    """A model or data configuration value that cannot be used."""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name where it has none: what a
    one-line message quotes of a library's error (pyarrow's run to many lines)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
