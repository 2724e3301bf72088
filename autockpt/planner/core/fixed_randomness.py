"""Random draws made fixed, so that a batch and its samples run alone can be compared.

NOTE [Fixed randomness]
The separability probe (:mod:`autockpt.planner.measure.separability`) compares a few samples run
together with each sample run alone. Any random draw in the forward breaks that comparison
although it mixes nothing: a dropout mask for three samples is not the masks for each
alone. Evaluation mode does not remove them all: torch.fx records ``self.training`` as a
constant, so functional dropout (``F.dropout(x, p, self.training)``), SDPA's ``dropout_p``
and ``if self.training:`` branches stay on in a graph traced in training mode, and a forward
may draw noise itself (``torch.randn_like``, ``torch.rand``, ``bernoulli``).

So the probe runs under :class:`FixedRandomness`, a dispatch mode that sees every aten op
tagged ``nondeterministic_seeded`` (PyTorch's own list of ops that draw from a generator):

- an op with a dropout switch (``native_dropout``'s ``train``, SDPA kernels' ``dropout_p``,
  the fused RNNs' ``dropout`` and ``train``, RReLU's ``training``) runs with it off;
- an op that only draws gives a fixed value of its distribution instead: 1 for Bernoulli
  (the mask of a dropout written by hand keeps everything), the middle of the range for
  uniform draws, the mean for normal ones (a tensor mean as it is: the draw stays per sample),
  the lowest value for integer draws, the identity for ``randperm``, index 0 for
  ``multinomial``;
- any other seeded op runs as it is: a draw the probe cannot fix can only make it refuse,
  never accept a model that mixes samples.

A value that is the same whatever the batch keeps per-sample draws per sample, and leaves
every real mixing (BatchNorm's batch statistics, a mean over the batch) as it was. The model
trains with its real draws; the probe only establishes that nothing but them differs.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from autockpt.planner.core.dispatch_mode import OpMode

#: Arguments that switch an op's randomness off, and the value that does.
_SWITCHES_OFF: dict[str, Any] = {
    "train": False,
    "training": False,
    "dropout": 0.0,
    "dropout_p": 0.0,
}


class FixedRandomness(OpMode):
    """Runs every seeded aten op without its randomness (NOTE [Fixed randomness])."""

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        kwargs = dict(kwargs)
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return func(*args, **kwargs)
        names = [argument.name for argument in func._schema.arguments]
        switched = [name for name in names if name in _SWITCHES_OFF]
        if switched:
            positional = list(args)
            for name in switched:
                position = names.index(name)
                if position < len(positional):
                    positional[position] = _SWITCHES_OFF[name]
                else:
                    kwargs[name] = _SWITCHES_OFF[name]
            return func(*positional, **kwargs)
        result = func(*args, **kwargs)
        if isinstance(result, torch.Tensor):
            given = dict(zip(names, args, strict=False)) | kwargs
            _fix(func._schema.name.split("::")[-1].rstrip("_"), result, given)
        return result


def _fix(name: str, result: torch.Tensor, given: dict[str, Any]) -> None:
    """Overwrite ``result``, the draw of op ``name`` called with ``given``, with its fixed value."""
    with torch.no_grad():
        if name == "bernoulli":
            result.fill_(1)
        elif name in ("rand", "rand_like", "uniform"):
            result.fill_((given.get("from", 0.0) + given.get("to", 1.0)) / 2)
        elif name in ("randn", "randn_like"):
            result.zero_()
        elif name == "normal":
            mean = given.get("mean", 0.0)
            if isinstance(mean, torch.Tensor):
                result.copy_(mean.expand_as(result))
            else:
                result.fill_(mean)
        elif name in ("randint", "randint_like", "random"):
            result.fill_(given.get("low", given.get("from", 0)) or 0)
        elif name == "randperm":
            result.copy_(torch.arange(result.numel(), dtype=result.dtype, device=result.device))
        elif name == "multinomial":
            result.zero_()
        elif name == "exponential":
            result.fill_(1.0 / given.get("lambd", 1.0))
        elif name == "geometric":
            result.fill_(1)
        elif name == "cauchy":
            result.fill_(given.get("median", 0.0))
        elif name == "log_normal":
            result.fill_(math.exp(given.get("mean", 1.0)))
        elif name in ("poisson", "_standard_gamma"):
            result.copy_(given["self"])
