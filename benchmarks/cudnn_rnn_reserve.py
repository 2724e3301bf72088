"""cuDNN's RNN reserve space, read off the kernel on a GPU beside the planner's estimate.

    python benchmarks/cudnn_rnn_reserve.py --out reserve.json     # needs a CUDA device

For each recurrent layer shape below, a training forward of ``nn.LSTM``, ``nn.GRU`` or
``nn.RNN`` runs on the GPU under a dispatch mode that reads the size of the reserve space
``aten._cudnn_rnn`` returns, and prints it beside :func:`cudnn_rnn_reserve_bytes` (NOTE [cuDNN's
RNN on fake tensors] in ``autockpt/planner/core/fake_mode.py``). It also prints how far the
allocator's peak rose above what was allocated before and after the forward and the backward:
the kernels' scratch space, which the planner does not count.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autockpt.planner.core.fake_mode import bound_arguments, cudnn_rnn_reserve_bytes

#: (kind, steps, batch, input size, hidden size, layers, bidirectional, dtype)
SHAPES = [
    ("LSTM", 10, 32, 64, 64, 1, False, torch.float32),
    ("LSTM", 20, 32, 64, 64, 1, False, torch.float32),
    ("LSTM", 10, 64, 64, 64, 1, False, torch.float32),
    ("LSTM", 10, 32, 64, 128, 1, False, torch.float32),
    ("LSTM", 10, 32, 128, 64, 1, False, torch.float32),
    ("LSTM", 10, 32, 64, 64, 2, False, torch.float32),
    ("LSTM", 10, 32, 64, 64, 1, True, torch.float32),
    ("LSTM", 50, 17, 33, 96, 3, True, torch.float32),
    ("LSTM", 10, 32, 64, 64, 1, False, torch.float16),
    ("LSTM", 10, 32, 64, 64, 1, False, torch.bfloat16),
    ("LSTM", 100, 256, 160, 160, 1, False, torch.float32),
    ("GRU", 10, 32, 64, 64, 1, False, torch.float32),
    ("GRU", 20, 64, 64, 128, 2, True, torch.float32),
    ("RNN", 10, 32, 64, 64, 1, False, torch.float32),
    ("RNN", 20, 64, 64, 128, 2, True, torch.float32),
]


class _Reserves(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._cudnn_rnn.default:
            bound = bound_arguments(func, args, kwargs)
            self.found.append(
                (out[3].numel() * out[3].element_size(), cudnn_rnn_reserve_bytes(bound))
            )
        return out


def measure(shape: tuple[Any, ...]) -> dict[str, Any]:
    kind, steps, batch, inputs, hidden, layers, bidirectional, dtype = shape
    layer = getattr(nn, kind)(inputs, hidden, layers, bidirectional=bidirectional)
    layer = layer.to("cuda", dtype)
    x = torch.randn(steps, batch, inputs, device="cuda", dtype=dtype, requires_grad=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    reserves = _Reserves()
    with reserves:
        out, _ = layer(x)
    torch.cuda.synchronize()
    after_forward = torch.cuda.memory_allocated()
    forward_scratch = torch.cuda.max_memory_allocated() - after_forward
    torch.cuda.reset_peak_memory_stats()
    out.sum().backward()
    torch.cuda.synchronize()
    backward_scratch = torch.cuda.max_memory_allocated() - max(
        after_forward, torch.cuda.memory_allocated()
    )
    (measured, estimated), *_ = reserves.found or [(-1, -1)]
    return {
        "shape": f"{kind} T{steps} B{batch} I{inputs} H{hidden} L{layers}"
        f"{' bi' if bidirectional else ''} {str(dtype).removeprefix('torch.')}",
        "reserve_bytes": measured,
        "estimate_bytes": estimated,
        "forward_allocated_bytes": after_forward - before,
        "forward_scratch_bytes": forward_scratch,
        "backward_scratch_bytes": backward_scratch,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    rows = [measure(shape) for shape in SHAPES]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
