"""The run folder: atomic writes, safe loads, RNG round trips, resume checks."""

import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from autockpt.errors import RunError
from autockpt.training.setup.runs import (
    CONFIG_FILE,
    LAST_FILE,
    RunFolder,
    capture_rng_state,
    check_compatible,
    restore_rng_state,
    write_atomic,
    write_json_atomic,
)


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    write_json_atomic(path, {"epochs": 1})

    def broken(temporary: Path) -> None:
        temporary.write_text("half a fi")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, broken)
    assert path.read_text() == '{\n  "epochs": 1\n}\n'
    assert sorted(os.listdir(tmp_path)) == ["config.json"]


def test_create_refuses_a_folder_that_holds_a_run(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path / "run")
    run.write_config({"preset": "tiny"})
    with pytest.raises(RunError, match="already holds a run; continue it with --resume"):
        RunFolder.create(tmp_path / "run")


def test_open_missing_folder_names_it_and_the_way_out(tmp_path: Path) -> None:
    with pytest.raises(RunError, match=r"nope does not exist; .* --out"):
        RunFolder.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match=f"has no {CONFIG_FILE}"):
        RunFolder.open(tmp_path / "empty")


def test_metrics_are_appended(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path / "run")
    run.append_metrics([{"kind": "step", "loss": 1.0}])
    run.append_metrics([{"kind": "epoch", "loss": 0.5}, {"kind": "summary"}])
    assert [r["kind"] for r in run.read_metrics()] == ["step", "epoch", "summary"]


def test_checkpoint_round_trip_with_rng_state(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path / "run")
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    run.save_checkpoint(LAST_FILE, {"rng": capture_rng_state(), "weights": torch.ones(2)})
    expected = (torch.rand(3), np.random.rand(3), random.random())

    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    loaded = run.load_checkpoint(LAST_FILE)
    restore_rng_state(loaded["rng"])
    torch.testing.assert_close(torch.rand(3), expected[0])
    np.testing.assert_array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def test_loading_never_runs_code_from_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = RunFolder.create(tmp_path / "run")
    with open(run.file(LAST_FILE), "wb") as stream:
        pickle.dump({"model": _Payload()}, stream, protocol=2)
    with pytest.raises(RunError, match="cannot be loaded safely"):
        run.load_checkpoint(LAST_FILE)
    assert "must never run" not in capsys.readouterr().out


def test_corrupt_checkpoint_is_a_run_error(tmp_path: Path) -> None:
    run = RunFolder.create(tmp_path / "run")
    run.file(LAST_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(RunError, match="the run is damaged"):
        run.load_checkpoint(LAST_FILE)


def test_check_compatible_names_the_first_difference(tmp_path: Path) -> None:
    check_compatible(tmp_path, {"a": (1, 2)}, {"a": [1, 2]}, what="model")  # JSON-equal
    with pytest.raises(
        RunError, match=r"its model has hidden_size=16 but this run has hidden_size=32"
    ):
        check_compatible(tmp_path, {"hidden_size": 16}, {"hidden_size": 32}, what="model")
