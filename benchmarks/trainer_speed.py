"""Time the trainer's step against a plain forward/backward/AdamW loop on the same model and batch.

For each preset the trainer is built as ``autockpt train`` builds it (``prepare``, then a
``Trainer`` writing to a temporary run folder, its records going nowhere) and its per-step path,
``Trainer.train_step`` (the planned step, gradient clipping, AdamW, the schedule, the step's
record and the budget check), runs on one fixed batch. The plain loop is a deep copy of the same
model with its own AdamW, made as the trainer makes its own (fused on the CPU):
``model(*inputs)``, the quantile loss, ``backward``, the same gradient clipping, ``step``,
``zero_grad``. The two take turns step by step in one process, so both see
the same machine load; the ratio of the medians is the number to read, and each row is printed
as it is done.

Each preset runs twice: without a budget (nothing is measured, NOTE [Enforcing the budget] in
``autockpt/training/loop/step_memory.py``) and with a budget twice the unplanned peak, which plans
the same steps (nothing recomputed) but measures the first steps and then every
``--memory-check-every``-th; ``--steps`` should cover at least one sampled step, whose cost the
mean includes and the median does not.

    python benchmarks/trainer_speed.py [--presets tiny,small] [--steps 100] [--repeats 3]

Both loops run with the thread count and allocator setting the trainer chooses for the run
(``autockpt/training/host/host_tuning.py``), printed first.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from autockpt.training.host.host_tuning import tune_host
from autockpt.training.host.progress import JsonLinesReporter
from autockpt.training.loop.train import Trainer
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.settings import run_optimizer
from autockpt.training.setup.prepare import Setup, prepare
from autockpt.training.setup.runs import RunFolder


def plain_step(setup: Setup) -> Callable[[], None]:
    """A forward/backward/AdamW step of a copy of ``setup``'s model on its first batch."""
    config = setup.config
    model = copy.deepcopy(setup.model).train()
    # the trainer's AdamW, fused on the CPU
    optimizer = run_optimizer(config, setup.device, setup.parallelism)(list(model.parameters()))
    batch = setup.data.train.batch(np.arange(setup.batch_size))
    inputs, target = batch.inputs(), batch.target

    def step() -> None:
        loss = setup.loss_fn(model(*inputs), target)
        loss.backward()
        if config.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the trainer reads the loss every step too

    return step


def trainer_step(setup: Setup, folder: Path) -> Callable[[], bool]:
    """The trainer's per-step path on ``setup``'s first batch, records going nowhere; each
    call returns whether the step's memory was measured."""
    trainer = Trainer(setup, RunFolder.create(folder), JsonLinesReporter(io.StringIO()))
    trainer.model.train()
    batch = setup.data.train.batch(np.arange(setup.global_batch_size))

    def step() -> bool:
        record = trainer.train_step(batch, epoch=1, step_in_epoch=trainer.state.global_step + 1)
        trainer.pending.clear()  # the epoch's records would be written and cleared at its end
        return bool(record["peak_measured"])

    return step


def compare(setup: Setup, *, steps: int, warmup: int) -> dict[str, float]:
    """Alternate the two steps; their medians and means, and how many steps were measured."""
    with tempfile.TemporaryDirectory() as folder:
        ours = trainer_step(setup, Path(folder) / "run")
        plain = plain_step(setup)
        for _ in range(warmup):
            ours()
            plain()
        trainer_s: list[float] = []
        plain_s: list[float] = []
        measured = 0
        for index in range(steps):
            # Alternate which goes first, so neither always runs right after the other.
            for first in (True, False) if index % 2 == 0 else (False, True):
                started = time.perf_counter()
                if first:
                    measured += ours()
                    trainer_s.append(time.perf_counter() - started)
                else:
                    plain()
                    plain_s.append(time.perf_counter() - started)
    return {
        "trainer_ms": statistics.median(trainer_s) * 1e3,
        "plain_ms": statistics.median(plain_s) * 1e3,
        "trainer_mean_ms": statistics.fmean(trainer_s) * 1e3,
        "plain_mean_ms": statistics.fmean(plain_s) * 1e3,
        "measured": measured,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small", help="comma-separated presets")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per loop and run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per loop first")
    parser.add_argument("--repeats", type=int, default=3, help="runs per preset and budget")
    parser.add_argument("--memory-check-every", type=int, default=50, help="the trainer's N")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, load average before {os.getloadavg()}")
    header = (
        "| preset | budget | trainer (median) | plain (median) | ratio | trainer (mean) | "
        "plain (mean) | ratio of means | steps measured |"
    )
    print(header)
    print("|---" * 9 + "|")
    for preset in args.presets.split(","):
        unlimited = TrainConfig(
            preset=preset, memory_check_every=args.memory_check_every, quiet=True
        )
        free_setup = prepare(unlimited)
        budget = 2 * free_setup.plan.unplanned_peak_bytes
        budgeted_setup = prepare(unlimited.with_updates(vram_budget=str(budget)))
        tuning = tune_host(
            free_setup.config, free_setup.device, free_setup.plan.unplanned_peak_bytes
        )
        print(f"{preset}: {tuning.describe() if tuning else 'not on the CPU'}")
        for label, setup in (("none", free_setup), (f"{budget / 2**20:.1f} MiB", budgeted_setup)):
            for _ in range(args.repeats):
                row = compare(setup, steps=args.steps, warmup=args.warmup)
                print(
                    f"| {preset} | {label} | {row['trainer_ms']:.1f} ms | {row['plain_ms']:.1f} ms "
                    f"| {row['trainer_ms'] / row['plain_ms']:.2f} | {row['trainer_mean_ms']:.1f} ms "
                    f"| {row['plain_mean_ms']:.1f} ms | "
                    f"{row['trainer_mean_ms'] / row['plain_mean_ms']:.2f} | "
                    f"{int(row['measured'])} of {args.steps} |",
                    flush=True,
                )
        if tuning is not None:
            tuning.restore()
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
