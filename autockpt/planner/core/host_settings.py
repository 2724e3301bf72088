"""How planning uses the host process: one CPU thread, and Python's cyclic collector paused.

Planning runs tens of thousands of small operations (fake-tensor dispatch in Python, and a few
real kernels at tiny sizes: scalars, the LSTM's workspace probe, the separability probe). None
of them is large enough to gain from several threads, and both settings below made it much
slower when left as they were.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

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
