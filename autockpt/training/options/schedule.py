"""The learning-rate schedule: linear warm-up, then cosine decay to 0 (or a constant rate).

:class:`~autockpt.training.loop.train.Trainer` hands :func:`learning_rate_factor` to
``torch.optim.lr_scheduler.LambdaLR``, which multiplies the configured peak rate by it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from autockpt.training.options.config import TrainConfig


def learning_rate_factor(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at each step: linear warm-up, then cosine to 0."""
    warmup = int(config.warmup_fraction * total_steps)

    def factor(step: int) -> float:
        if config.lr_schedule == "constant":
            return 1.0
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(total_steps - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor
