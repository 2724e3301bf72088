"""NOTE [Tuning the host process]: once the trainer tells malloc to keep freed memory, a step
that frees more than 2 GiB at once gets its pages back without faulting them in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autockpt.training.host.host_tuning import keep_freed_memory

#: A step's worth of tensors freed at once, then made again: thirty of 90 MB, 2.7 GB in all,
#: each under the 1 GiB mmap threshold (so on malloc's heap) and together past the 2 GiB
#: the largest int makes a trim threshold.
STEP = """
import resource, sys, torch
from autockpt.training.host.host_tuning import keep_freed_memory
assert keep_freed_memory()
def step():
    return [torch.ones(22_500_000) for _ in range(30)]  # 90 MB each, every page touched
held = step()
del held
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
held = step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES = 30 * 90_000_000 // 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_step_past_2_gib_reuses_its_freed_pages() -> None:
    if not keep_freed_memory():
        pytest.skip("libc is not glibc")
    result = subprocess.run(
        [sys.executable, "-c", STEP], capture_output=True, text=True, check=True
    )
    faults = int(result.stdout.strip().splitlines()[-1])
    # With the trim threshold at the largest int (2 GiB) malloc gave the 2.7 GB back, and
    # 549 thousand pages faulted in again; with trimming off, 0 to 22 thousand.
    assert faults < PAGES // 2, f"{faults} page faults making {PAGES} pages again"
