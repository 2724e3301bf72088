"""A Hugging Face model's own loss, run with its head in chunks of positions under
``transformers.Trainer``.

NOTE [The model's own loss in chunks]
Under the Trainer the loss is the model's: ``model(**batch)`` with ``labels`` computes the
logits of every position and ``self.loss_function(logits, labels, vocab_size=..., **kwargs)``
on them, inside ``forward``. At long sequences those logits, their float copy and their
gradients are the step's peak, and a plan of the model's submodules cannot touch them.

So the step is split where the model splits it: the model called without ``labels`` (its
body and its head, nothing of the loss) and the model's own ``loss_function`` on the logits
and the labels (:class:`OwnLoss`), with whatever the Trainer passed for the loss
(``num_items_in_batch``). That split is checked before it is planned, on a real run of a few
positions of the batch: the model's own loss with ``labels`` and the split's must agree, or
the class computes its loss some other way (logits changed after the head, a loss of its
own) and the step is planned whole, saying why. Split, the step is what
:func:`autockpt.plan` plans for any model and loss (:class:`LogitsStep`): the probe finds how
the loss adds up over positions (the labels shifted by one inside it, NOTE [Losses that shift
their labels]), and the plan runs the head and the loss in chunks where that pays.

While the Trainer trains (:class:`OwnLossInChunks`), each training call's ``labels`` (and
``num_items_in_batch``) are taken out of the call, the head stands aside for the call (its
input comes out where the logits did), and after the forward the head and the loss run in
chunks of positions; the call returns the model's output with that ``loss`` and no logits
(the Trainer reads the loss alone while it trains; the whole logits never exist). Evaluation
calls run the model as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from autockpt.planner.core.output_structure import OutputSlot, flatten_output
from autockpt.planner.plan_types import LossChunks
from autockpt.planner.runtime.chunked_loss import ChunkedLoss, LossOverPositions
from autockpt.planner.runtime.head_cut import FeaturesOut

__all__ = ["LogitsStep", "OwnLoss", "OwnLossInChunks", "own_loss_split"]

#: The batch's entries that go to the loss, not to the model's body.
LOSS_KEYS = ("labels", "num_items_in_batch")
#: Positions of one sample the split is checked on.
CHECK_POSITIONS = 32


class LogitsStep(torch.nn.Module):
    """``forward(batch) = module(**batch)`` without the loss's entries: the model's output
    with its logits and no loss (NOTE [The model's own loss in chunks])."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Mapping[str, Any]) -> Any:
        return self.module(**model_inputs(batch))


class OwnLoss:
    """``loss(output, labels, num_items_in_batch)``: the model's own ``loss_function`` on
    the output's logits, as its ``forward`` calls it."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __call__(self, output: Any, labels: torch.Tensor, num_items: Any = None) -> torch.Tensor:
        extra = {} if num_items is None else {"num_items_in_batch": num_items}
        module: Any = self.module  # a PreTrainedModel: its loss_function and config
        loss: torch.Tensor = module.loss_function(
            _logits(output),
            labels,
            vocab_size=module.config.vocab_size,
            **extra,
        )
        return loss


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The batch without the loss's entries."""
    return {key: value for key, value in batch.items() if key not in LOSS_KEYS}


def loss_targets(batch: Mapping[str, Any]) -> tuple[Any, ...]:
    """What :class:`OwnLoss` takes after the output: the labels, and the Trainer's count of
    labelled tokens where it gave one."""
    count = batch.get("num_items_in_batch")
    return (batch["labels"],) if count is None else (batch["labels"], count)


def own_loss_split(module: torch.nn.Module, batch: Mapping[str, Any]) -> OwnLoss | str:
    """The model's own loss as :class:`OwnLoss`, checked against the model's forward with
    ``labels`` on a few positions of the batch; or why the model's loss cannot be split so.
    """
    labels = batch.get("labels")
    config = getattr(module, "config", None)
    if not isinstance(labels, torch.Tensor) or labels.dim() != 2:
        return "the batch has no labels of one sequence a sample"
    if not hasattr(module, "loss_function") or not hasattr(config, "vocab_size"):
        return f"{type(module).__name__} has no loss_function and vocab_size of its own"
    loss = OwnLoss(module)
    small = _few_positions(batch, labels.shape[1])
    was_training = module.training
    module.eval()  # no dropout: the two runs compare their losses, not their masks
    try:
        with torch.enable_grad():
            whole = _loss_and_gradient(module(**small), _output_loss)
            split = _loss_and_gradient(
                module(**model_inputs(small)), lambda output: loss(output, *loss_targets(small))
            )
    except Exception as error:  # noqa: BLE001 - the model's own, whatever it raises
        return f"{type(module).__name__} does not run without its labels ({type(error).__name__})"
    finally:
        module.train(was_training)
    if (
        whole is None
        or split is None
        or not all(
            torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(whole, split, strict=True)
        )
    ):
        return (
            f"{type(module).__name__}'s loss is not its loss_function on the logits its head "
            "makes (it changes the logits after the head, or computes a loss of its own)"
        )
    return loss


def _logits(output: Any) -> Any:
    """A model output's logits: ``output["logits"]``, or the first of a tuple."""
    return output["logits"] if isinstance(output, Mapping) else output[0]


def _output_loss(output: Any) -> Any:
    return output.get("loss") if isinstance(output, Mapping) else output[0]


def _loss_and_gradient(output: Any, loss_of: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The loss ``loss_of(output)`` and its gradient for the output's logits (not for the
    parameters: nothing is accumulated); ``None`` where the loss does not read them.

    The gradients tell apart losses whose values agree by chance: at random weights the
    logits are near uniform, and a cross-entropy with label smoothing equals one without.
    """
    logits = _logits(output)
    loss = loss_of(output)
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return None
    (gradient,) = torch.autograd.grad(loss, logits, allow_unused=True)
    return (loss.detach(), gradient) if gradient is not None else None


def _few_positions(batch: Mapping[str, Any], positions: int) -> dict[str, Any]:
    """The batch's first sample at its first ``CHECK_POSITIONS`` positions, some labelled."""
    kept = min(positions, CHECK_POSITIONS)
    small: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            value = value[:1]
            if value.dim() >= 2 and value.shape[1] == positions:
                value = value[:, :kept]
        small[key] = value
    labels = small["labels"].clone()
    labels[:, kept // 2 :] = labels[:, kept // 2 :].clamp(min=0)  # ignored ones count here
    small["labels"] = labels
    if "num_items_in_batch" in small:
        small["num_items_in_batch"] = int((labels[:, 1:] != -100).sum())
    return small


class OwnLossInChunks:
    """The model's head and its own loss in chunks of positions on each training call the
    Trainer makes (NOTE [The model's own loss in chunks]): :meth:`before` takes the call's
    labels out and stands the head aside, :meth:`after` runs the head and the loss in chunks
    and returns the output with the loss."""

    def __init__(self, module: torch.nn.Module, chunks: LossChunks) -> None:
        self.module = module
        self.chunks = chunks
        # The plan's path is the head's in the LogitsStep it was made for.
        self.head_path = chunks.head.removeprefix("module.")
        self.loss = OwnLoss(module)
        self._pending: tuple[tuple[Any, ...], torch.nn.Module, torch.nn.Linear] | None = None

    def before(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments without the loss's entries; the head stood aside."""
        parent_path, _, name = self.head_path.rpartition(".")
        parent = self.module.get_submodule(parent_path)
        head = parent._modules[name]
        assert isinstance(head, torch.nn.Linear), f"{self.head_path} is not an nn.Linear"
        parent._modules[name] = FeaturesOut(head)
        self._pending = (loss_targets(kwargs), parent, head)
        return model_inputs(kwargs)

    def after(self, output: Any) -> Any:
        """The head put back; the output with the loss of the head and the loss in chunks,
        and no logits. ``output`` is ``None`` where the forward raised."""
        if self._pending is None:
            return output
        targets, parent, head = self._pending
        self._pending = None
        name = self.head_path.rpartition(".")[2]
        parent._modules[name] = head
        if output is None:
            return None
        leaves, structure = flatten_output(output)
        leaf = self.chunks.leaf if self.chunks.leaf is not None else 0
        chunked = ChunkedLoss(
            self.loss,
            self.chunks.num_chunks,
            LossOverPositions(self.chunks.dim, self.chunks.reduction, self.chunks.shift),
            OutputSlot(structure, leaf),
        )
        loss = chunked((leaves[leaf], head.weight, head.bias), *targets)
        if dataclasses.is_dataclass(output):
            return dataclasses.replace(output, loss=loss, logits=None)  # type: ignore[type-var]
        return (loss, *(None if index == leaf else value for index, value in enumerate(output)))
