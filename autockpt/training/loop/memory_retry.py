"""A training step tried again after CUDA ran out of memory.

NOTE [Recovering outside the except block]
An exception's traceback holds the frames it went through, and with them every tensor the
failed step had made. Recovering inside ``except torch.OutOfMemoryError:`` (collecting,
emptying the cache, planning again with its own real check step) ran with the failed step's
activations still alive: the re-plan and the retry started with the memory that had just run
out (PyTorch's FAQ, "My out of memory exception handler can't allocate memory"). So the
``except`` block only decides whether to try again; the recovery runs after it, once the
exception and its frames are gone. The random state is put back to where it was before the
first attempt, so the retried step draws the dropout masks the failed one drew (and a plain
run would have).

NOTE [Retrying an optimizer step]
An optimizer step that ran out of memory may have updated some of its tensors already (the
foreach AdamW bumps its step counts and moments before the square root that allocates), and
running it again would update them twice: a silent change of the run. An in-place update bumps
the tensor's version counter, so the step is retried only where no parameter and no state
tensor it had before the attempt changed version: the attempt ran out while making new tensors
(AdamW's moments on the first step, the foreach kernels' temporaries before anything was
written). State the failed attempt created (a parameter's first moments, half made) is dropped,
so the retry makes it whole. Where something was written, the error stands and the run stops
(resumable from its last checkpoint). Gradient clipping runs before the step and is not part of
the attempt: clipping twice would scale the gradients twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from autockpt.errors import DeviceError

Result = TypeVar("Result")


def retried_on_out_of_memory(
    attempt: Callable[[], Result],
    recover: Callable[[], None],
    *,
    retries: Callable[[], bool],
    cuda_devices: Sequence[int] = (),
) -> Result:
    """``attempt()``, and on ``torch.OutOfMemoryError`` ``recover()`` then ``attempt()`` again,
    until it returns (NOTE [Recovering outside the except block]).

    Args:
        attempt: the step; it changes nothing that a retry would see twice.
        recover: runs after the failed attempt's tensors are freed; raises to give up.
        retries: asked inside the ``except`` block; ``False`` re-raises the error.
        cuda_devices: the CUDA devices whose random state the retry puts back (the CPU's is
            put back always).
    """
    cpu_state = torch.get_rng_state()
    cuda_states = [torch.cuda.get_rng_state(device) for device in cuda_devices]
    while True:
        try:
            return attempt()
        except torch.OutOfMemoryError:
            if not retries():
                raise
        # Out of the except block: the error, its traceback and the step's tensors are gone.
        recover()
        torch.set_rng_state(cpu_state)
        for device, state in zip(cuda_devices, cuda_states, strict=True):
            torch.cuda.set_rng_state(state, device)


def optimizer_step_retried_on_out_of_memory(
    step: Callable[[], object],
    optimizer: torch.optim.Optimizer,
    recover: Callable[[], None],
    *,
    retries: Callable[[], bool],
    written_fix: str,
) -> None:
    """``step()`` (the optimizer's; what it returns is dropped), and on ``torch.OutOfMemoryError`` ``recover()`` then again,
    where the failed attempt wrote nothing (NOTE [Retrying an optimizer step]).

    Raises:
        DeviceError: the failed attempt had updated a parameter or its state (``written_fix``
            says what the user can do).
    """
    while True:
        versions = _versions(optimizer)
        try:
            step()
            return
        except torch.OutOfMemoryError:
            if not retries():
                raise
            written = _written_since(optimizer, versions)
            if written:
                raise DeviceError(
                    f"CUDA ran out of memory in the optimizer step after it had updated "
                    f"{written}: it cannot be run again without updating it twice; {written_fix}"
                ) from None
        _drop_state_made_since(optimizer, versions)
        recover()


def _versions(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """The version counter of every parameter and every state tensor, by id."""
    versions: dict[int, int] = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            versions[id(parameter)] = parameter._version
            for value in optimizer.state.get(parameter, {}).values():
                if isinstance(value, torch.Tensor):
                    versions[id(value)] = value._version
    return versions


def _written_since(optimizer: torch.optim.Optimizer, versions: dict[int, int]) -> str:
    """What changed version since ``versions`` was taken ("" for nothing): a count of
    parameters and state tensors."""
    parameters = state = 0
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            parameters += parameter._version != versions[id(parameter)]
            for value in optimizer.state.get(parameter, {}).values():
                if isinstance(value, torch.Tensor) and id(value) in versions:
                    state += value._version != versions[id(value)]
    parts = [f"{parameters} parameters"] * bool(parameters) + [f"{state} state tensors"] * bool(
        state
    )
    return " and ".join(parts)


def _drop_state_made_since(optimizer: torch.optim.Optimizer, versions: dict[int, int]) -> None:
    """Forget the state of every parameter whose state tensors are all new since ``versions``
    (made by the failed attempt, perhaps half)."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            state = optimizer.state.get(parameter)
            tensors = [v for v in (state or {}).values() if isinstance(v, torch.Tensor)]
            if state is not None and not any(id(t) in versions for t in tensors):
                del optimizer.state[parameter]
