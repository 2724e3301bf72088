"""A training step retried after running out of memory (NOTE [Recovering outside the except
block]): the failed step's tensors are freed before recovering, the retried step draws the
random numbers the failed one drew, and a device that cannot retry re-raises."""

from __future__ import annotations

import io
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from autockpt.errors import DeviceError
from autockpt.training.host.progress import JsonLinesReporter
from autockpt.training.loop.memory_retry import (
    optimizer_step_retried_on_out_of_memory,
    retried_on_out_of_memory,
)
from autockpt.training.loop.replanning import Replanner
from autockpt.training.loop.train import Trainer
from autockpt.training.options.config import TrainConfig
from autockpt.training.options.settings import SAMPLE_DATA
from autockpt.training.setup.prepare import prepare
from autockpt.training.setup.runs import RunFolder


def test_the_failed_steps_tensors_are_freed_and_its_random_state_back_before_the_retry():
    held: list[weakref.ref[torch.Tensor]] = []
    draws: list[torch.Tensor] = []
    alive_when_recovering: list[bool] = []

    def step() -> str:
        draws.append(torch.rand(4))  # a dropout mask's draw
        activations = torch.empty(2**20)  # what the failed step had made when memory ran out
        held.append(weakref.ref(activations))
        if len(draws) == 1:
            raise torch.OutOfMemoryError("planted")
        return "done"

    def recover() -> None:
        alive_when_recovering.append(held[0]() is not None)
        torch.rand(100)  # re-planning draws from the same stream

    assert retried_on_out_of_memory(step, recover, retries=lambda: True) == "done"
    assert alive_when_recovering == [False]
    torch.testing.assert_close(draws[1], draws[0])


def test_a_device_that_cannot_retry_raises_the_error_itself():
    def step() -> None:
        raise torch.OutOfMemoryError("planted")

    def recover() -> None:
        raise AssertionError("never recovers")

    with pytest.raises(torch.OutOfMemoryError, match="planted"):
        retried_on_out_of_memory(step, recover, retries=lambda: False)


# ---------------------------------------------------------------- the optimizer step retried


def _adamw_and_gradients(seed: int = 0) -> tuple[list[torch.nn.Parameter], torch.optim.AdamW]:
    torch.manual_seed(seed)
    parameters = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))]
    for p in parameters:
        p.grad = torch.randn_like(p)
    return parameters, torch.optim.AdamW(parameters, lr=0.1, foreach=False)


def test_an_optimizer_step_that_ran_out_while_making_its_state_is_retried_once_whole(
    monkeypatch: pytest.MonkeyPatch,
):
    plain, plain_optimizer = _adamw_and_gradients()
    plain_optimizer.step()
    parameters, optimizer = _adamw_and_gradients()
    made = 0
    zeros_like = torch.zeros_like

    def running_out(*args, **kwargs):  # the first parameter's second moments do not fit
        nonlocal made
        made += 1
        if made == 2:
            raise torch.OutOfMemoryError("planted")
        return zeros_like(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros_like", running_out)
    recovered: list[bool] = []
    optimizer_step_retried_on_out_of_memory(
        optimizer.step,
        optimizer,
        lambda: recovered.append(True),
        retries=lambda: True,
        written_fix="planted",
    )
    assert recovered == [True]
    for p, q in zip(parameters, plain, strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
        state, plain_state = optimizer.state[p], plain_optimizer.state[q]
        assert state.keys() == plain_state.keys()
        for key in state:
            torch.testing.assert_close(state[key], plain_state[key], rtol=0, atol=0)


def test_an_optimizer_step_that_ran_out_after_writing_is_not_run_again():
    parameters, optimizer = _adamw_and_gradients()
    once, reference = _adamw_and_gradients()
    optimizer.step()  # the state is there: the second step writes into it
    reference.step()
    reference.step()

    def writes_then_runs_out() -> None:
        optimizer.step()  # AdamW updated every parameter, then memory ran out
        raise torch.OutOfMemoryError("planted")

    def recover() -> None:
        raise AssertionError("never recovers")

    with pytest.raises(DeviceError, match="2 parameters and 6 state tensors.*resume"):
        optimizer_step_retried_on_out_of_memory(
            writes_then_runs_out,
            optimizer,
            recover,
            retries=lambda: True,
            written_fix="resume it",
        )
    for p, q in zip(parameters, once, strict=True):  # the second step ran once, not twice
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_an_optimizer_step_on_a_device_that_cannot_retry_raises_the_error_itself():
    _, optimizer = _adamw_and_gradients()

    def runs_out() -> None:
        raise torch.OutOfMemoryError("planted")

    with pytest.raises(torch.OutOfMemoryError, match="planted"):
        optimizer_step_retried_on_out_of_memory(
            runs_out, optimizer, lambda: None, retries=lambda: False, written_fix=""
        )


def _running_out_once(step: Any, attempts: list[int], *, runs_out: bool) -> Any:
    """``step`` that runs out of memory, before doing anything, on its first call if
    ``runs_out``; each call is counted in ``attempts``."""

    def step_running_out_once(*args: Any, **kwargs: Any) -> Any:
        attempts.append(1)
        if runs_out and len(attempts) == 1:
            raise torch.OutOfMemoryError("planted")
        return step(*args, **kwargs)

    return step_running_out_once


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_the_trainer_retries_its_optimizer_step_with_the_steps_gradients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A stand-in for CUDA: the trainer retries, its cache calls do nothing, re-planning keeps
    # the plan. The retried step must leave the parameters where a step that never ran out
    # leaves them: the recovery keeps the gradients the step is retried with.
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    replans: list[str] = []

    def replan(self: Replanner, budget_bytes: int, state: Any, *, reason: str) -> None:
        replans.append(reason)
        self.new_plan(self.plan)

    monkeypatch.setattr(Replanner, "replan", replan)
    config = TrainConfig(data=SAMPLE_DATA, preset="tiny", batch_size=8, max_steps_per_epoch=1)
    batch = prepare(config).data.train.batch(range(8))
    trained: list[dict[str, torch.Tensor]] = []
    for runs_out in (False, True):
        trainer = Trainer(
            prepare(config),
            RunFolder.create(tmp_path / f"run{runs_out}"),
            JsonLinesReporter(io.StringIO()),
        )
        attempts: list[int] = []
        monkeypatch.setattr(
            trainer.optimizer,
            "step",
            _running_out_once(trainer.optimizer.step, attempts, runs_out=runs_out),
        )
        monkeypatch.setattr(trainer, "_retries_out_of_memory", lambda: True)
        torch.manual_seed(0)
        trainer.train_step(batch, epoch=1, step_in_epoch=1)
        assert len(attempts) == 1 + runs_out
        trained.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    assert replans == ["CUDA ran out of memory at step 1"]
    assert trained[0].keys() == trained[1].keys()
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, rtol=0, atol=0, msg=name)
