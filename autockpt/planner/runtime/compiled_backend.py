"""Inductor with its partitioner at a chosen activation memory budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["compile_in_place", "inductor_at"]


def inductor_at(fraction: float) -> Callable[..., Any]:
    """A dynamo backend: inductor with ``torch._functorch.config.activation_memory_budget`` at
    ``fraction`` (1.0 is inductor's default partition) while it compiles.

    The setting is read when the joint graph is partitioned, which happens inside the backend
    call, so patching it there applies it to this module's graphs only, whatever the rest of
    the process compiles.
    """
    from torch._inductor.compile_fx import compile_fx

    def backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        with torch._functorch.config.patch(activation_memory_budget=fraction):
            return compile_fx(graph, example_inputs)

    return backend


def compile_in_place(module: torch.nn.Module, fraction: float) -> torch.nn.Module:
    """Compile ``module``'s calls with :func:`inductor_at` ``fraction`` and return it.

    ``nn.Module.compile`` compiles the call in place, unlike ``torch.compile(module)``, whose
    wrapper prefixes every ``state_dict`` key with ``_orig_mod.``: the planned module keeps the
    user's keys.
    """
    module.compile(backend=inductor_at(fraction))
    return module
