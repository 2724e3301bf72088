"""Where a row cache is built: a fresh folder beside its own, renamed into place when done
(NOTE [Row cache] in :mod:`tft.data.streamed.row_cache`: a failed or interrupted build leaves
nothing behind)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tft.data.streamed.file_scan import hand_back_freed_memory

__all__ = ["building_beside", "put_in_place"]


@contextmanager
def building_beside(folder: Path) -> Iterator[Path]:
    """A fresh, empty ``<folder>.partial-<pid>`` for the block to build in; removed when the
    block ends, however it ends, unless :func:`put_in_place` has moved it into ``folder``'s
    place. The memory the build freed is handed back to the system either way."""
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        hand_back_freed_memory()


def put_in_place(partial: Path, folder: Path) -> None:
    """Replace ``folder`` by the finished build ``partial``."""
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
