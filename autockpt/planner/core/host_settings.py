"""How planning uses the host process: one CPU thread, Python's cyclic collector paused, and
the host's random streams left where they were.

Planning runs tens of thousands of small operations (fake-tensor dispatch in Python, and a few
real kernels at tiny sizes: scalars, the LSTM's workspace probe, the separability probe). None
of them is large enough to gain from several threads, and both settings below made it much
slower when left as they were.
"""

from __future__ import annotations

import contextlib
import gc
import random
from collections.abc import Iterator

import numpy as np
import torch


@contextlib.contextmanager
def one_cpu_thread() -> Iterator[int]:
    """Run torch's CPU ops on one thread inside, as many as before afterwards.

    With two OpenMP threads every small real op pays the pool's wake-up and spin-waiting: a
    ``tft-225`` plan took 2.6-3.1 s on two threads of a two-core machine and 1.8-2.1 s on
    one, and a probe was ten times slower whenever another process shared the cores.

    Yields:
        The thread count outside, which training will run with (the planner times the real
        model with it: NOTE [Measured step time]).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector inside.

    A fake step creates tens of thousands of short-lived objects, which triggers collections
    that walk every fx graph and module alive: they took over half of a profile's time on
    ``tft-225``. Tensors are freed by reference counting, not by the collector, so the
    counts do not change; the cyclic garbage of a planning call (a few MB of graphs) is
    collected once the collector runs again.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def host_random_kept() -> Iterator[None]:
    """Put Python's and NumPy's global random streams back as they were, afterwards.

    Planning runs the model's forward for real (its probes, its timings, a model measured on
    real copies), and a forward may draw from them: ``Wav2Vec2``'s feature mask draws its
    spans from NumPy. Without this, a planned run's masks after planning were not those of the
    plain run with the same seeds (torch's own streams are forked beside it).
    """
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def forked_devices(device: torch.device) -> list[int]:
    """The CUDA devices a fork of the random streams for work on ``device`` must cover: its
    index, or the current device where it names none (``"cuda"`` alone is the current device,
    not device 0); none for the CPU, whose stream is forked always."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


@contextlib.contextmanager
def random_streams_kept(device: torch.device) -> Iterator[None]:
    """torch's random streams (the CPU's, and ``device``'s on CUDA) forked, and Python's and
    NumPy's put back afterwards: every random stream the caller draws from is where it was."""
    with torch.random.fork_rng(devices=forked_devices(device)), host_random_kept():
        yield
