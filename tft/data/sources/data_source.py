"""What a run reads: one Parquet file, a folder of them, a quoted pattern, or several of these
given together (NOTE [A folder of files as one dataset] in :mod:`tft.data.sources.parquet_folder`).

NOTE [Several data paths]
``autockpt train a.parquet b/ 'c/*.parquet'`` is one dataset: the union of the files each path
names (a file itself, a folder's files, a pattern's matches), a file named twice read once.
What the shell makes of an unquoted pattern (``data/*.parquet``: one path per file) is the same
dataset as the pattern in quotes. Several paths are read as a folder is, whatever they name:
rows in time order within each symbol, the same bar in two files refused naming both. The
folder their files are named from, and whose hive keys (``symbol=ES/...``) become columns, is the
deepest folder the paths have in common (the shell's ``bars/symbol=*/*.parquet`` keeps its
``symbol`` key); the files are then named by their absolute paths under it, so that paths given
relative and absolute meet.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tft.errors import DataError

__all__ = ["DataPaths", "DataSource", "is_pattern", "pattern_base"]

_WILDCARD = re.compile(r"[*?[]")


def is_pattern(path: Path) -> bool:
    """Whether ``path`` is a glob pattern: it holds ``*``, ``?`` or ``[`` and no file or
    folder has that name (NOTE [A folder of files as one dataset])."""
    return _WILDCARD.search(str(path)) is not None and not path.exists()


def pattern_base(path: Path) -> Path:
    """The folder a data path's files are named from and its hive keys start below: a
    pattern's leading parts without wildcards (``.`` where the first part has one); else
    ``path``."""
    if not is_pattern(path):
        return path
    parts = path.parts
    fixed = next(i for i, part in enumerate(parts) if _WILDCARD.search(part))
    return Path(*parts[:fixed]) if fixed else Path(".")


def _error(path: object, text: str) -> DataError:
    return DataError(f"{path}: {' '.join(text.split())}")


def _files_of(path: Path) -> list[Path]:
    """The data files one folder or pattern names, sorted by path: every file under it whose
    parts below it do not start with ``.`` or ``_`` (what Spark and pandas write beside data).

    Raises:
        DataError: the folder holds no file at all, or the pattern matches none.
    """
    base = pattern_base(path)
    if is_pattern(path):
        relative = Path(*path.parts[len(base.parts) :])
        candidates = list(base.glob(str(relative))) if base.is_dir() else []
    else:
        candidates = list(path.rglob("*"))
    files = sorted(
        file
        for file in candidates
        if file.is_file()
        and not any(part.startswith((".", "_")) for part in file.relative_to(base).parts)
    )
    if not files and is_pattern(path):
        raise _error(
            path,
            "matches no data file; check the pattern (quote it, so the shell passes it as "
            "written), or pass the folder of Parquet files",
        )
    if not files:
        raise _error(
            path, "is a folder with no data files in it; pass a folder of Parquet files of bars"
        )
    return files


@dataclass(frozen=True)
class DataSource:
    """The data paths of one dataset, as given (NOTE [Several data paths]).

    Attributes:
        paths: one path (a Parquet file, a folder of them or a glob pattern) or several.
    """

    paths: tuple[Path, ...]

    def __post_init__(self) -> None:
        if not self.paths:
            raise ValueError("a DataSource needs at least one path")

    @classmethod
    def of(cls, data: DataPaths) -> DataSource:
        """``data`` as a source: itself, one path, or several (repeats dropped, order kept)."""
        if isinstance(data, DataSource):
            return data
        if isinstance(data, (str, os.PathLike)):
            return cls((Path(data),))
        return cls(tuple(dict.fromkeys(Path(path) for path in data)))

    def __str__(self) -> str:
        shown = ", ".join(str(path) for path in self.paths[:3])
        more = len(self.paths) - 3
        return shown + (f" and {more} more" if more > 0 else "")

    @property
    def several(self) -> bool:
        """Whether more than one path was given."""
        return len(self.paths) > 1

    @property
    def many(self) -> bool:
        """Whether the source names several files: several paths, a folder or a pattern
        (read as a folder is; NOTE [A folder of files as one dataset])."""
        path = self.paths[0]
        return self.several or is_pattern(path) or path.is_dir()

    @property
    def file(self) -> Path:
        """The one Parquet file of a source that is not :attr:`many`."""
        if self.many:
            raise ValueError(f"{self} names several files, not one")
        return self.paths[0]

    @property
    def base(self) -> Path:
        """The folder the files are named from and their hive keys start below: a folder
        itself, a pattern's leading folder, a file's folder; for several paths, the deepest
        folder their own have in common (absolute)."""
        if not self.several:
            path = self.paths[0]
            return path.parent if not self.many else pattern_base(path)
        folders = [str(_folder_of(path).absolute()) for path in self.paths]
        return Path(os.path.commonpath(folders))

    def files(self) -> list[Path]:
        """The source's data files sorted by path, each once (absolute for several paths).

        Raises:
            DataError: a path that does not exist, a folder with no files, a pattern that
                matches none.
        """
        if not self.several:
            return _files_of(self.paths[0]) if self.many else [self.paths[0]]
        found: dict[Path, Path] = {}
        for path in self.paths:
            if not is_pattern(path) and not path.exists():
                raise _error(path, "no such file or folder; check the path")
            named = _files_of(path) if is_pattern(path) or path.is_dir() else [path]
            for file in named:
                found.setdefault(file.resolve(), file.absolute())
        return sorted(found.values())

    def files_by_resolved(self) -> dict[str, Path]:
        """:meth:`files`, each by its resolved path (how a row cache names them)."""
        return {str(file.resolve()): file for file in self.files()}

    def name_of(self, file: Path) -> Path:
        """``file`` as the messages name it: relative to :attr:`base`."""
        return file.relative_to(self.base)

    def resolved(self) -> DataSource:
        """The same source with each path absolute, links resolved, in path order (the order
        they were given in makes no other dataset): what a run folder keeps and a row cache is
        named by."""
        return DataSource(tuple(sorted({path.resolve() for path in self.paths})))

    @property
    def identity(self) -> str:
        """One string for the resolved source: the path itself for one path (as row caches
        recorded it before several were read), a JSON list for several."""
        paths = [str(path) for path in self.resolved().paths]
        return paths[0] if len(paths) == 1 else json.dumps(paths)

    def config_value(self) -> Path | list[Path]:
        """The resolved source as a run's config keeps it: one path or a list."""
        paths = self.resolved().paths
        return paths[0] if len(paths) == 1 else list(paths)


DataPaths = DataSource | str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""What the public readers take for a dataset: a source, one path, or several."""


def _folder_of(path: Path) -> Path:
    """The folder one path's files are under: a pattern's leading folder, a folder, a
    file's folder."""
    if is_pattern(path):
        return pattern_base(path)
    return path if path.is_dir() else path.parent
