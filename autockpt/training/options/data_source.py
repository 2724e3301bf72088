"""Where a run's windows come from: memory for a file that fits the host's share, a row cache
on disk for one that does not (NOTE [Row cache] in :mod:`tft.data.streamed.row_cache`)."""

from __future__ import annotations

from pathlib import Path

from autockpt import format_bytes, parse_budget
from autockpt.errors import BudgetError, ConfigError
from autockpt.progress import report_progress
from tft.data.columns import ColumnRoles
from tft.data.normalize import Normalizer
from tft.data.sources.data_source import DataPaths, DataSource
from tft.data.streamed.row_cache import cache_folder, remove_stale_builds
from tft.data.streamed.streamed_windows import in_memory_bytes, stream_windows
from tft.data.windows import WindowedData, load_windows

__all__ = ["CACHE_FOLDER", "read_windows"]

CACHE_FOLDER = "data-cache"
"""The folder beside the run folders that holds the row caches of streamed files."""


def read_windows(
    path: DataPaths,
    *,
    roles: ColumnRoles | None,
    encoder_length: int,
    horizon: int,
    split: tuple[float, float, float] | tuple[str, str] | None = (0.7, 0.15, 0.15),
    normalizer: Normalizer | None = None,
    max_host_memory: str,
    cache: Path | None,
    runs_root: Path,
    grow_from: Path | None = None,
) -> tuple[WindowedData, str | None]:
    """The windows of ``path``, and a note when they are streamed from a row cache.

    Args:
        split: three shares of the timestamps or the two dates where validation and test
            begin (``--split``); None keeps the file whole.
        max_host_memory: the host memory the data may hold (``--max-host-memory``); a file
            whose rows need more in memory is streamed.
        cache: the row cache folder the user named (``--data-cache``): the file is streamed
            through it whatever its size, and a folder holding another file's cache is refused.
        runs_root: the folder of the run folders; the default cache is under it.
        grow_from: a cache folder the data's cache may grow from where it has none (the run's
            named one, for ``predict`` on its data and more: NOTE [A cache grown from
            another] in :mod:`tft.data.streamed.row_cache`).

    Raises:
        DataError, ConfigError: as :func:`tft.data.windows.load_windows`.
    """
    try:
        limit = parse_budget(max_host_memory).bytes
    except BudgetError:
        raise ConfigError(
            f"--max-host-memory {max_host_memory!r} is not a size; write it like 1GB, 800MB or 2GiB"
        ) from None
    path = DataSource.of(path)
    split_fractions = split if split is None or len(split) == 3 else None
    split_times = split if split is not None and len(split) == 2 else None
    needed = in_memory_bytes(path)
    if cache is None and needed <= limit:
        data = load_windows(
            path,
            roles=roles,
            encoder_length=encoder_length,
            horizon=horizon,
            split_fractions=split_fractions,
            split_times=split_times,
            normalizer=normalizer,
        )
        return data, None
    why = (
        "--data-cache was given"
        if cache is not None
        else f"its rows need about {format_bytes(needed)} in memory, more than "
        f"--max-host-memory {max_host_memory}"
    )
    folder = cache if cache is not None else cache_folder(runs_root / CACHE_FOLDER, path)
    # NOTE [Row cache]: a build killed outright leaves its partial folder; the default cache
    # folder holds only builds, so any stale one there goes, beside a named one only its own.
    removed = remove_stale_builds(folder, any_name=cache is None)
    data = stream_windows(
        path,
        folder,
        max_host_bytes=limit,
        roles=roles,
        encoder_length=encoder_length,
        horizon=horizon,
        split_fractions=split_fractions,
        split_times=split_times,
        normalizer=normalizer,
        check_source=cache is not None,
        progress=report_progress,  # NOTE [Progress on long waits]
        grow_from=[grow_from] if grow_from is not None else [],
    )
    note = f"{path}: streamed from the row cache {folder} ({why})"
    if data.cache_use not in (None, "built", "reused"):  # NOTE [A cache grown by new files]
        note += f"; {data.cache_use}"
    if removed:
        names = ", ".join(partial.name for partial, _ in removed)
        held = format_bytes(sum(size for _, size in removed))
        note += f"; removed the partial builds of stopped runs ({names}: {held})"
    return data, note
