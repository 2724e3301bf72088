"""A row cache written again from itself: grown by new files, or re-encoded where files
changed (NOTE [A cache grown by new files], NOTE [A cache re-encoded where its files
changed]), beside its folder and put in its place."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tft.data.streamed.build_folder import building_beside, put_in_place
from tft.data.streamed.cache_meta import META_FILE, RowCacheMeta, SourceFile
from tft.errors import DataError

__all__ = ["NO_FLOOR", "rewrite_cache"]

NO_FLOOR = -(2**63)
"""The floor of new bars' times where any new bar keeps the scales (a given normaliser)."""


def rewrite_cache(
    folder: Path,
    source: SourceFile,
    floor_ns: int,
    write: Callable[[Path], RowCacheMeta | None],
) -> RowCacheMeta | None:
    """The cache ``write`` writes into a fresh folder beside ``folder`` and describes, put in
    ``folder``'s place as the cache of ``source``; None, and ``folder`` left as it was, where
    ``write`` gives None or finds the data wrong (what is wrong is for a build to say, in
    the words it says it in).

    ``floor_ns`` is the earliest time a bar read may have with the cache's scales kept
    (:data:`NO_FLOOR` with the run's own normaliser; the first date of a split by dates the
    scales were fitted on).
    """
    try:
        with building_beside(folder) as partial:
            written = write(partial)
            if written is None:
                return None
            fitted_here = floor_ns != NO_FLOOR  # a run's own fit by dates still describes it
            written = written.model_copy(
                update={
                    "source": source,
                    "given_roles": written.given_roles if fitted_here else None,
                    "fitted_on": written.fitted_on if fitted_here else None,
                }
            )
            (partial / META_FILE).write_text(written.model_dump_json(indent=1), encoding="utf-8")
            put_in_place(partial, folder)
    except DataError:
        return None
    return written
