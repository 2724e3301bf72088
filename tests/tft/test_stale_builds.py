"""A row cache's build killed outright (``kill -9``) leaves its partial folder; the next run on
the same cache folder removes it, says so in one line, and builds and streams as it would
have (NOTE [Row cache])."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autockpt.training.options.data_source import CACHE_FOLDER, read_windows
from tft.data.streamed.row_cache import cache_folder, remove_stale_builds
from tft.data.windows import load_windows

WINDOW = {"encoder_length": 12, "horizon": 3}

# Builds the sample's cache in small chunks and stops for good in its third pass, after
# saying so, where the test kills it.
_BUILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tft.data.streamed.streamed_windows import stream_windows

    path, folder, marker = (Path(arg) for arg in sys.argv[1:4])

    def progress(text):
        if "pass 3 of 3" in text:
            marker.write_text("building")
            time.sleep(120)

    stream_windows(path, folder, max_host_bytes=1 << 30, chunk_rows=5000, progress=progress,
                   encoder_length=12, horizon=3)
    """
)


def test_a_build_killed_outright_is_removed_by_the_next_run(
    sample_parquet: Path, tmp_path: Path
) -> None:
    folder = cache_folder(tmp_path / CACHE_FOLDER, sample_parquet)
    marker = tmp_path / "marker"
    build = subprocess.Popen(
        [sys.executable, "-c", _BUILD, str(sample_parquet), str(folder), str(marker)],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert build.poll() is None, "the build ended before its third pass"
            assert time.monotonic() < deadline, "the build never reached its third pass"
            time.sleep(0.1)
    finally:
        os.kill(build.pid, signal.SIGKILL)
        build.wait()
    partial = folder.with_name(f"{folder.name}.partial-{build.pid}")
    assert partial.is_dir() and any(partial.iterdir())  # what kill -9 leaves
    assert not folder.exists()

    data, note = read_windows(
        sample_parquet,
        roles=None,
        max_host_memory="1KB",  # past memory: streamed through the cache
        cache=None,
        runs_root=tmp_path,
        **WINDOW,
    )
    assert not partial.exists() and folder.is_dir()
    assert note is not None and "\n" not in note
    assert f"removed the partial builds of stopped runs ({partial.name}: " in note
    assert len(data.whole) == len(load_windows(sample_parquet, **WINDOW).whole)


def test_a_build_still_running_or_another_folders_is_kept(tmp_path: Path) -> None:
    folder = tmp_path / "bars-0123"
    running = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    other = tmp_path / f"other-4567.partial-{_finished_pid()}"
    not_a_build = folder.with_name(f"{folder.name}.partial-notes")
    for made in (running, other, not_a_build):
        made.mkdir()
        (made / "target.bin").write_bytes(b"x" * 100)
    assert remove_stale_builds(folder) == []  # its own build runs; the other is not its own
    assert remove_stale_builds(folder, any_name=True) == [(other, 100)]
    assert running.is_dir() and not_a_build.is_dir() and not other.exists()


def _finished_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(done.stdout)
    with pytest.raises(ProcessLookupError):  # gone, and not yet reused
        os.kill(pid, 0)
    return pid
