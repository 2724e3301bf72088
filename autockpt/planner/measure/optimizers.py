"""The one optimizer factory: the optimizer a spec names (:data:`OptimizerSpec`), over the
parameters a measurement or a real step runs with, with its state as training holds it."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from autockpt.errors import ConfigError
from autockpt.planner.simulate.step_profile import OptimizerSpec


def make_optimizer(
    spec: OptimizerSpec, parameters: Sequence[torch.nn.Parameter]
) -> torch.optim.Optimizer | None:
    """The one optimizer factory: the optimizer ``spec`` names over the trainable
    ``parameters`` (``None`` when it keeps no state).

    ``"adamw"`` and ``"sgd"`` are the planner's defaults, an instance is copied (its class and
    settings), and a factory (:data:`OptimizerFactory`) is called: a run that plans with its
    own factory and trains with what the same factory makes is planned for the optimizer it
    trains with, fused kernels and all.
    """
    trainable = [p for p in parameters if p.requires_grad]
    if spec is None or not trainable:
        return None
    if isinstance(spec, torch.optim.Optimizer):
        return same_kind(spec, trainable)
    if spec == "adamw":
        return torch.optim.AdamW(trainable, lr=1e-3)
    if spec == "sgd":
        return torch.optim.SGD(trainable, lr=1e-2, momentum=0.9)
    if callable(spec):
        # Its class and settings, learnt from what it makes over one real scalar: the planner's
        # parameters are stand-ins (meta, fake or copies) a factory may not take as they are.
        made = spec([torch.nn.Parameter(torch.zeros(()))])
        if not isinstance(made, torch.optim.Optimizer):
            raise ConfigError(
                f"the optimizer factory {spec!r} returned {type(made).__name__}, not a "
                "torch.optim.Optimizer; pass a callable that makes one from a list of "
                "parameters, e.g. functools.partial(torch.optim.AdamW, lr=3e-4)"
            )
        return same_kind(made, trainable)
    raise ConfigError(
        f"optimizer {spec!r} is not one of 'adamw', 'sgd', None, an optimizer or a callable "
        "that makes one from a list of parameters"
    )


def give_state(optimizer: torch.optim.Optimizer, parameters: Sequence[torch.nn.Parameter]) -> None:
    """Make ``optimizer``'s state as an earlier step leaves it (what training holds), from
    zero gradients; the gradients are then set to None."""
    for parameter in parameters:
        if parameter.requires_grad:
            parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def same_kind(
    optimizer: torch.optim.Optimizer, parameters: Sequence[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """An optimizer of ``optimizer``'s class and settings over other parameters."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    if settings.get("fused") and any(p.device.type == "meta" for p in parameters):
        # Fused kernels refuse meta tensors. Over meta stand-ins only the state's sizes are
        # read, and the fused kernels keep the same state (a step count and moments shaped
        # like each parameter), so the stand-ins take the default kernels.
        settings["fused"] = None
    return type(optimizer)(parameters, **settings)
