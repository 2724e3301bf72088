"""The budget as planning spends it: the user's reading, and what comes off it before a step's
tensors.

NOTE [One budget]
A budget is read once (:func:`~autockpt.planner.core.units.parse_budget`, at the edge: the CLI's
config, or :func:`autockpt.plan`'s argument) into a :class:`~autockpt.planner.core.units.Budget`,
and planning carries it as one :class:`StepBudget` that knows everything taken off it:

- on CUDA, the context (bytes the device shows before any tensor) and the caching allocator's
  slack (a share of the tensor bytes): a budget is what ``nvidia-smi`` shows;
- for one of several ranks, the rank's states beyond one process's (NOTE [Per-rank accounting]
  in :mod:`autockpt.planner.measure.sharding`), with the allocator's share of them;
- after a real step went over, the lowered target planning aims at (NOTE [Planning again] in
  :mod:`autockpt.planner.verify`), while the plan still reports the budget the user gave.

Planning reads :attr:`StepBudget.usable_bytes` (the tensor bytes one process's step may take)
and turns measured tensor bytes into what the device shows for one rank with
:meth:`StepBudget.shown_bytes`; the plan reports :attr:`StepBudget.read`. Nothing else shifts a
budget up or down.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from autockpt.errors import ConfigError
from autockpt.planner.core.units import Budget, parse_budget

#: What the CUDA context takes before any tensor: the stand-in where it cannot be measured
#: (NOTE [What the first card must measure]).
DEFAULT_CUDA_CONTEXT_BYTES = 512 * 2**20
#: What the caching allocator reserves beyond the tensors it holds (rounding, fragmentation),
#: as a share of the tensor bytes: a stand-in, which the plan's check step measures.
CUDA_HEADROOM_FRACTION = 0.10

# NOTE [What the first card must measure]
# No code of this project has run on a GPU yet. What only a card can say:
# - the context and the libraries' workspaces: measured when a CUDA budget is read
#   (:func:`measured_context_bytes`): after a warm-up that makes cuBLAS's handles on this
#   thread and on autograd's (a small matmul, forward and backward), the device's total less
#   its free memory (``torch.cuda.mem_get_info``) less what the allocator reserved. Another
#   process's memory on the same card counts as context too (free memory is the device's):
#   safe, never low. cuDNN's workspaces come only with the model's first convolution or RNN
#   and are not in it; the trainer measures the context again after its first step and writes
#   it in the run's summary (``measured_context_bytes``). The plan says which it used
#   (``PeakBreakdown.context_measured``); 512 MiB stays only where measuring failed;
# - the allocator's slack: planned at 10%; the plan's check step on the card measures its
#   ``max_memory_reserved`` over its ``max_memory_allocated`` (``PeakBreakdown.measured_slack``,
#   and the verified note), and a check that comes out over the budget plans again lower; the
#   trainer writes the slack of its steps in the summary. The one reading on record (an H200,
#   before any code of this project, the TFT without checkpointing) was 27% over, not 10%;
# - where the check step's saved copy of the model lives (host, not card: ``verify.py``) shows
#   only there, in ``max_memory_allocated`` before and during the check.
# ``benchmarks/gpu_check.py`` writes the card, driver, CUDA, cuDNN and torch versions to
# ``environment.json``, and each planned run's predicted peak, allocated and reserved peaks,
# measured context and slack to its rows.


@dataclass(frozen=True)
class DeviceReserve:
    """What a device holds besides one step's tensors (NOTE [What the first card must
    measure]): the context, the allocator's slack as a share of tensor bytes, and whether the
    context was measured on this device (False: the stand-in, or none on the CPU)."""

    context_bytes: int
    headroom_fraction: float
    context_measured: bool


_MEASURED_CONTEXT: dict[int, int] = {}


def device_reserve(device: torch.device) -> DeviceReserve:
    """The context and the allocator's slack on ``device``: the context measured once per
    CUDA device and process, the stand-in where there is no card to measure (planning for
    one from a machine without it) or measuring fails."""
    if device.type != "cuda":
        return DeviceReserve(0, 0.0, False)
    stand_in = DeviceReserve(DEFAULT_CUDA_CONTEXT_BYTES, CUDA_HEADROOM_FRACTION, False)
    if not torch.cuda.is_available():
        return stand_in
    try:
        context_bytes = measured_context_bytes(device)
    except RuntimeError:  # the card would not run the warm-up: the plan says so
        return stand_in
    return DeviceReserve(context_bytes, CUDA_HEADROOM_FRACTION, True)


def measured_context_bytes(device: torch.device) -> int:
    """The CUDA context and cuBLAS's workspaces on ``device``, measured once per process
    (NOTE [What the first card must measure])."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _MEASURED_CONTEXT:
        _warm_up_libraries(torch.device("cuda", index))
        torch.cuda.synchronize(index)
        _MEASURED_CONTEXT[index] = context_beside_allocator(index)
    return _MEASURED_CONTEXT[index]


def context_beside_allocator(device: torch.device | int) -> int:
    """What the card shows beyond the caching allocator's blocks now: its total less its free
    memory less what the allocator reserved (the context and the libraries' workspaces)."""
    free, total = torch.cuda.mem_get_info(device)
    return max(total - free - torch.cuda.memory_reserved(device), 0)


def allocator_slack(reserved_bytes: int, allocated_bytes: int) -> float:
    """The share the caching allocator reserved beyond what it allocated: a step's
    ``max_memory_reserved`` over its ``max_memory_allocated``, less one."""
    return reserved_bytes / max(allocated_bytes, 1) - 1.0


def _warm_up_libraries(device: torch.device) -> None:
    """A small matmul forward and backward: cuBLAS makes its handles and workspaces on this
    thread and on autograd's backward thread."""
    weight = torch.randn(64, 64, device=device, requires_grad=True)
    (torch.randn(64, 64, device=device) @ weight).sum().backward()


@dataclass(frozen=True)
class StepBudget:
    """One budget from the user's reading to the tensor bytes a step may take (NOTE [One budget]).

    Attributes:
        read: the budget as the user gave it; the plan reports this one.
        target_bytes: what planning aims at as the device shows it: ``read.bytes``, or lower
            after a real step went over.
        context_bytes: what the device shows before any tensor (the CUDA context).
        headroom_fraction: the allocator's slack, a share of the tensor bytes.
        rank_offset_bytes: one rank's tensors beyond one process's (0 for one process).
        context_measured: whether ``context_bytes`` was measured on the device (NOTE [What
            the first card must measure]).
    """

    read: Budget
    target_bytes: int
    context_bytes: int = 0
    headroom_fraction: float = 0.0
    rank_offset_bytes: int = 0
    context_measured: bool = False

    @classmethod
    def on(cls, read: Budget, device: torch.device, *, rank_offset_bytes: int = 0) -> StepBudget:
        """``read`` spent on ``device`` by one rank whose states exceed one process's by
        ``rank_offset_bytes``."""
        reserve = device_reserve(device)
        return cls(
            read,
            read.bytes,
            reserve.context_bytes,
            reserve.headroom_fraction,
            rank_offset_bytes,
            reserve.context_measured,
        )

    def decided(self, read: Budget) -> StepBudget:
        """This budget on the same device and rank, read as ``read`` (a budget decided once the
        plain step is measured, NOTE [A budget decided from the plain step])."""
        return dataclasses.replace(self, read=read, target_bytes=read.bytes)

    def lowered(self, target_bytes: int) -> StepBudget:
        """The same budget, planned for at ``target_bytes`` (still reported as :attr:`read`)."""
        return dataclasses.replace(self, target_bytes=target_bytes)

    @property
    def rank_offset_shown_bytes(self) -> int:
        """The rank's extra tensors as the device shows them: plus the allocator's share."""
        return self.rank_offset_bytes + int(self.rank_offset_bytes * self.headroom_fraction)

    @property
    def usable_bytes(self) -> int:
        """The tensor bytes one process's step may take under :attr:`target_bytes`."""
        # What is left after the rank's extra states and the context, less the allocator's
        # share of it.
        left = self.target_bytes - self.rank_offset_shown_bytes - self.context_bytes
        return int(left / (1.0 + self.headroom_fraction))

    def shown_bytes(self, tensor_bytes: int) -> int:
        """What the device shows for one rank whose process holds ``tensor_bytes`` of tensors:
        plus the rank's extra states, the context and the allocator's slack."""
        return (
            tensor_bytes
            + int(tensor_bytes * self.headroom_fraction)
            + self.context_bytes
            + self.rank_offset_shown_bytes
        )


#: A budget as :func:`autockpt.plan` takes it: bytes, a text, one already read, or a function
#: of the plain step's bytes returning one of those.
BudgetGiven = str | int | Budget | Callable[[int], str | int | Budget]

#: What planning starts from where the budget is decided from the plain step: no limit yet.
UNDECIDED = Budget(
    bytes=2**62,
    text="decided from the plain step",
    reading="decided once the plain step is measured",
)


def read_budget(
    budget: BudgetGiven, device: torch.device, *, compile: bool
) -> tuple[Budget, Callable[[int], Budget] | None]:
    """``budget`` read for ``device``; where it is a function of the plain step's bytes,
    :data:`UNDECIDED` and that function returning a read budget, called once per plain
    step's bytes (the loss whole and in chunks share one; NOTE [A budget decided from the
    plain step] in :mod:`autockpt.planner.pipeline`).

    Raises:
        BudgetError: the budget cannot be read.
        ConfigError: a function with ``compile=True``.
    """
    if isinstance(budget, Budget):
        return budget, None
    if isinstance(budget, (str, int)):
        return parse_budget(budget, device=device), None
    if compile:
        raise ConfigError(
            "compile=True needs the budget in bytes (its candidates are compiled for it); "
            "pass a number or a text such as '4GB', not a function"
        )
    decide = budget
    decided: dict[int, Budget] = {}

    def read(plain_bytes: int) -> Budget:
        if plain_bytes not in decided:
            value = decide(plain_bytes)
            decided[plain_bytes] = (
                value if isinstance(value, Budget) else parse_budget(value, device=device)
            )
        return decided[plain_bytes]

    return UNDECIDED, read
