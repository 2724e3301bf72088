"""What the loop's steps run besides the plan: the planned model through ``torch.compile`` with
``--compile``."""

from __future__ import annotations

from typing import cast

import torch

from autockpt import Plan
from autockpt.training.options.config import TrainConfig


def compiled_step(planned: torch.nn.Module, plan: Plan, *, config: TrainConfig) -> torch.nn.Module:
    """``planned``, through ``torch.compile`` with ``--compile``: what runs the steps. A plan
    searched among compiled steps comes compiled from ``apply`` already."""
    if not config.compile or plan.compile_fraction is not None:
        return planned
    # torch.compile of a module returns a module (OptimizedModule); its stub says Callable.
    return cast(torch.nn.Module, torch.compile(planned))
