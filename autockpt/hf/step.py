"""A Hugging Face model's training step as ``transformers.Trainer`` runs it, as a module the
planner can plan: ``model(**batch)``, the loss the model returns from the batch's labels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from autockpt.errors import ConfigError

__all__ = ["HuggingFaceStep", "output_loss"]


class HuggingFaceStep(torch.nn.Module):
    """``forward(batch) = module(**batch)``: the call ``Trainer.compute_loss`` makes.

    Planned with module-level segments (``plan(..., tracing="forward-hooks")``, NOTE [Module
    chain]): the segments are the model's own submodules, so the plan can be put into the
    model the Trainer holds (:class:`~autockpt.installed_plan.InstalledPlan`).
    """

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Mapping[str, Any]) -> Any:
        return self.module(**batch)


def output_loss(output: Any) -> torch.Tensor:
    """The loss a model's output carries, as the Trainer reads it: ``output["loss"]``, or the
    first element of a tuple (``return_dict=False``).

    Raises:
        ConfigError: the output carries no loss (the batch has no labels, so the Trainer would
            compute the loss outside the model, which the plan cannot see).
    """
    if isinstance(output, Mapping):
        loss = output.get("loss")
    elif isinstance(output, tuple) and output:
        loss = output[0]
    else:
        loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    raise ConfigError(
        f"the model returned {type(output).__name__} without a loss; MemoryPlan plans the step "
        "whose loss the model computes from the batch's labels: give the batches labels "
        "(a data collator for language modeling does), not a compute_loss_func"
    )
