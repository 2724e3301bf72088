"""Training on two gloo ranks on the CPU: the same losses as one process, one plan, one writer.

The two-rank runs are launched once per module with ``torch.distributed.run`` on loopback and
several tests read them: one epoch, then a resume for the second epoch on two ranks again.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from autockpt.cli import main
from autockpt.errors import ConfigError
from autockpt.planner.plan_types import Plan
from autockpt.planner.training_step import training_step
from autockpt.training.host.distributed import (
    World,
    plan_digest,
    rank_slice,
    world_from_environment,
)
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.runs import PLAN_FILE, RunFolder
from tests.tft.test_parquet_folder import write_folder
from tests.training.test_train import run_files
from tft.data.windows import Batch

REPO = Path(__file__).resolve().parents[2]
# Dropout off, so a step's result does not depend on which rank drew which mask.
# Validation on 48 windows (3 steps' worth at the global batch): the ranks' losses are the
# point, and the default sample (4,096 windows, NOTE [Scores in proportion]) is 256 FSDP
# forwards at a global batch of 16, past the launch's timeout on a loaded 2-core machine.
RUN = ["--preset", "tiny", "--quiet", "--max-steps-per-epoch", "3", "--seed", "5", "--dropout", "0"]
RUN += ["--val-windows", "48"]
PER_RANK_BATCH = 8
LAUNCH_TIMEOUT_S = 120


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch_two_ranks(*arguments: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2 -m autockpt train ...`` on loopback, bounded in time.

    A launch in which a rank was killed by SIGSEGV or SIGABRT inside gloo runs once more from
    the same start (its run folder as it was), with a warning: on a loaded 2-core machine a
    rank of the FSDP runs died so about once in 40 launches while the ranks gathered the
    sharded states at an epoch's end (a native crash: no Python traceback on that rank; the
    same launch passes when run again). Any other failure fails at once.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    # A rank that dies of a signal prints its threads' Python stacks, and torch's C++ stack
    # where it raises: what the warning below carries when a launch is run again.
    env["PYTHONFAULTHANDLER"] = "1"
    env["TORCH_SHOW_CPP_STACKTRACES"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "autockpt",
        "train",
        *arguments,
    ]
    run = _run_folder(arguments)
    saved = run.with_name(run.name + ".before-launch")
    if run.exists():
        shutil.copytree(run, saved)
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    if result.returncode != 0 and _RANK_KILLED_BY_A_SIGNAL.search(result.stderr):
        tail = result.stderr[-6000:]
        warnings.warn(f"a rank died of a signal; launching again: {tail}", stacklevel=2)
        shutil.rmtree(run, ignore_errors=True)
        if saved.exists():
            shutil.copytree(saved, run)
        command[command.index("--master-port") + 1] = str(free_port())
        result = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
        )
    shutil.rmtree(saved, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# torchrun's summary of the first rank to fail: "exitcode  : -11 (pid: ...)  (SIGSEGV)".
_RANK_KILLED_BY_A_SIGNAL = re.compile(r"Root Cause[\s\S]*exitcode\s*:\s*-(?:6|11)\b")


def _run_folder(arguments: tuple[str, ...]) -> Path:
    """The run folder a launch writes: its ``--out`` or its ``--resume``."""
    for flag in ("--out", "--resume"):
        if flag in arguments:
            return Path(arguments[arguments.index(flag) + 1])
    raise AssertionError(f"a launch without --out or --resume: {arguments}")


def records(run: Path, kind: str) -> list[dict]:
    return [r for r in RunFolder(run).read_metrics() if r["kind"] == kind]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Epoch 1 on two ranks, then epoch 2 resumed on two ranks; returns the folder and stdouts."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    batch = ["--batch-size", str(PER_RANK_BATCH)]
    first = launch_two_ranks(str(SAMPLE_DATA), *RUN, *batch, "--epochs", "1", "--out", str(out))
    second = launch_two_ranks("--resume", str(out), "--epochs", "2", "--quiet")
    return out, [first.stdout, second.stdout]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same runs in one process with the global batch (twice the per-rank batch)."""
    out = tmp_path_factory.mktemp("single") / "run"
    batch = ["--batch-size", str(2 * PER_RANK_BATCH)]
    assert main(["train", str(SAMPLE_DATA), *RUN, *batch, "--epochs", "1", "--out", str(out)]) == 0
    assert main(["train", "--resume", str(out), "--epochs", "2", "--quiet"]) == 0
    return out


@pytest.mark.slow
def test_two_ranks_give_the_losses_of_one_process_with_the_global_batch(
    two_rank_run: tuple[Path, list[str]], one_process_run: Path
) -> None:
    ddp, _ = two_rank_run
    ddp_steps, single_steps = records(ddp, "step"), records(one_process_run, "step")
    assert len(ddp_steps) == len(single_steps) == 6
    # Epoch 2 ran after a resume, on two ranks and in one process alike.
    for mine, theirs in zip(ddp_steps, single_steps, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5, abs=1e-6)
    for mine, theirs in zip(records(ddp, "epoch"), records(one_process_run, "epoch"), strict=True):
        assert mine["val_windows"] == theirs["val_windows"]
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_both_ranks_run_rank_zeros_plan(two_rank_run: tuple[Path, list[str]]) -> None:
    ddp, _ = two_rank_run
    agreements = [r for r in records(ddp, "event") if "plan_digest_by_rank" in r]
    assert len(agreements) == 2  # the first run and the resume
    for record in agreements:
        digests = record["plan_digest_by_rank"]
        assert len(digests) == 2 and digests[0] == digests[1]
    saved = Plan.model_validate_json((ddp / PLAN_FILE).read_text())
    assert plan_digest(saved) == agreements[-1]["plan_digest_by_rank"][0]


@pytest.mark.slow
def test_only_rank_zero_prints_and_writes(two_rank_run: tuple[Path, list[str]]) -> None:
    ddp, stdouts = two_rank_run
    for stdout in stdouts:
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        assert sum('"kind": "start"' in line for line in lines) == 1
        assert sum('"kind": "summary"' in line for line in lines) == 1
        assert sum('"kind": "columns"' in line for line in lines) == 1
    assert sorted(p.name for p in ddp.iterdir()) == run_files()
    # One writer: every step appears once, and the log holds one summary per launch.
    assert [r["step"] for r in records(ddp, "step")] == [1, 2, 3, 4, 5, 6]
    assert [r["world_size"] for r in records(ddp, "summary")] == [2, 2]


@pytest.mark.slow
def test_a_run_of_two_ranks_is_not_resumed_on_one(
    two_rank_run: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    ddp, _ = two_rank_run
    assert main(["train", "--resume", str(ddp), "--epochs", "3", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "trained on 2 rank(s)" in error and "this run has 1" in error
    assert error.count("\n") == 1 and error.endswith("\n")


# ---------------------------------------------------------------------------- FSDP

#: Per rank: tight enough that the plan recomputes and splits the batch (checked below).
FSDP_BUDGET = "1000000"


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The two-rank runs again with --strategy fsdp and a per-rank budget, resumed likewise."""
    out = tmp_path_factory.mktemp("fsdp") / "run"
    options = ["--batch-size", str(PER_RANK_BATCH), "--strategy", "fsdp"]
    first = launch_two_ranks(
        str(SAMPLE_DATA),
        *RUN,
        *options,
        "--vram-budget",
        FSDP_BUDGET,
        "--epochs",
        "1",
        "--out",
        str(out),
    )
    second = launch_two_ranks("--resume", str(out), "--epochs", "2", "--quiet")
    return out, [first.stdout, second.stdout]


@pytest.mark.slow
def test_fsdp_ranks_give_the_losses_of_one_process_with_the_global_batch(
    fsdp_run: tuple[Path, list[str]], one_process_run: Path
) -> None:
    fsdp, stdouts = fsdp_run
    plan = Plan.model_validate_json((fsdp / PLAN_FILE).read_text())
    assert (plan.world_size, plan.parallelism) == (2, "fsdp")
    assert plan.num_recomputed > 0 and plan.num_micro_batches > 1  # planned segments in use
    steps, single_steps = records(fsdp, "step"), records(one_process_run, "step")
    assert len(steps) == len(single_steps) == 6  # epoch 2 ran after a resume on two ranks
    for mine, theirs in zip(steps, single_steps, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5, abs=1e-6)
    for mine, theirs in zip(records(fsdp, "epoch"), records(one_process_run, "epoch"), strict=True):
        assert mine["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-5, abs=1e-6)
    agreements = [r for r in records(fsdp, "event") if "plan_digest_by_rank" in r]
    assert len(agreements) == 2 and all(len(set(r["plan_digest_by_rank"])) == 1 for r in agreements)
    assert [r["parallelism"] for r in records(fsdp, "summary")] == ["fsdp", "fsdp"]
    # One writer: the same files as one process, every step once.
    assert sorted(p.name for p in fsdp.iterdir()) == run_files()
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for stdout in stdouts:
        assert sum('"kind": "summary"' in line for line in stdout.splitlines()) == 1


@pytest.mark.slow
def test_an_fsdp_checkpoint_loads_into_the_plain_model(fsdp_run: tuple[Path, list[str]]) -> None:
    fsdp, _ = fsdp_run
    checkpoint = RunFolder(fsdp).load_checkpoint("best.pt")
    assert checkpoint["parallelism"] == "fsdp"
    assert all(
        isinstance(v, torch.Tensor) and type(v) is torch.Tensor
        for v in checkpoint["model"].values()
    )


def test_a_strategy_needs_several_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--preset", "tiny", "--strategy", "fsdp", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "--strategy fsdp needs several ranks" in error
    assert error.count("\n") == 1 and error.endswith("\n")
    assert main(["plan", "--preset", "tiny", "--strategy", "fsdp", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "--world-size N" in error
    assert error.count("\n") == 1 and error.endswith("\n")


# ---------------------------------------------------------------------------- the parts


def test_the_world_comes_from_torchruns_variables() -> None:
    assert world_from_environment({}) == World()
    world = world_from_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert world == World(rank=3, world_size=4, local_rank=1)
    assert not world.is_main and world.is_distributed
    assert world.device(torch.device("cuda")) == torch.device("cuda", 1)
    assert world.device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ConfigError, match="RANK=4 is not within WORLD_SIZE=4"):
        world_from_environment({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ConfigError, match="whole numbers"):
        world_from_environment({"RANK": "x", "WORLD_SIZE": "2"})


@pytest.mark.parametrize("size", [8, 7, 1])
def test_rank_slices_are_disjoint_and_cover_the_batch(size: int) -> None:
    batch = Batch(*(torch.arange(size) for _ in Batch._fields))
    parts = [rank_slice(batch, World(rank=r, world_size=3)) for r in range(3)]
    assert torch.equal(torch.cat([part.target for part in parts]), batch.target)
    assert max(len(p.target) for p in parts) - min(len(p.target) for p in parts) <= 1


def test_gradients_are_synchronised_on_the_last_micro_batch_only() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1))
    plain = copy.deepcopy(model)
    plan = Plan.model_construct(num_micro_batches=4)  # training_step reads only this field
    # 13 samples in 4 pieces (4, 3, 3, 3): each piece's mean loss is weighted by its share.
    inputs, targets = (torch.randn(13, 5),), (torch.randn(13, 1),)
    # DDP all-reduces in the backward of a piece run outside no_sync: record, per piece, whether
    # its forward and its backward ran inside the stub.
    inside = [False]
    forwards: list[bool] = []
    backwards: list[bool] = []

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        inside[0] = True
        try:
            yield
        finally:
            inside[0] = False

    model.register_forward_hook(lambda *_: forwards.append(inside[0]))
    model[0].weight.register_hook(lambda grad: backwards.append(inside[0]))  # in backward
    loss = training_step(
        model, plan, inputs, targets, torch.nn.functional.mse_loss, no_sync=no_sync
    )
    deferred = [True] * (plan.num_micro_batches - 1) + [False]
    assert forwards == deferred and backwards == deferred
    # The accumulated gradients are those of one plain pass over the whole batch.
    want_loss = torch.nn.functional.mse_loss(plain(*inputs), *targets)
    want_loss.backward()
    torch.testing.assert_close(loss, want_loss.detach())
    for (name, parameter), reference in zip(
        model.named_parameters(), plain.parameters(), strict=True
    ):
        assert parameter.grad is not None and reference.grad is not None
        torch.testing.assert_close(parameter.grad, reference.grad, msg=name)


@pytest.mark.slow
def test_two_ranks_stream_a_folder_as_one_process_does(tmp_path: Path) -> None:
    # Past --max-host-memory the folder streams through one row cache, built by rank 0 while
    # rank 1 waits (main_first), then mapped by both; each rank gathers its share of a batch.
    folder = write_folder(SAMPLE_DATA, tmp_path / "bars")
    streamed = [str(folder), *RUN, "--epochs", "1", "--max-host-memory", "1MB"]
    launch_two_ranks(*streamed, "--batch-size", str(PER_RANK_BATCH), "--out", str(tmp_path / "ddp"))
    one = ["--batch-size", str(2 * PER_RANK_BATCH), "--out", str(tmp_path / "one")]
    assert main(["train", *streamed, *one]) == 0
    caches = [cache.name for cache in (tmp_path / "data-cache").iterdir()]
    assert len(caches) == 1 and caches[0].startswith("bars-")
    ddp_steps, single_steps = records(tmp_path / "ddp", "step"), records(tmp_path / "one", "step")
    assert len(ddp_steps) == len(single_steps) == 3
    for mine, theirs in zip(ddp_steps, single_steps, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5, abs=1e-6)
