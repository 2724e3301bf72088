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
run would have). Only forward and backward are retried: an optimizer step that ran out of
memory may have updated some of its state already (AdamW's moments before its square root),
and running it again would update them twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

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
