"""The head and the loss in chunks of positions whatever form the loss takes (NOTE [Losses that
shift their labels], NOTE [The loss sees the scores alone]): a Hugging Face decoder called as
people call it (its ``CausalLMOutput`` straight out, the loss reading ``.logits``,
``["logits"]`` or ``[0]``, shifting by a position, casting with ``.float()``, the model's own
``loss_function``, label smoothing and a z-loss over a boolean mask) is planned at half its
plain peak, every step counted by the tests' own counter under the budget with the plain
step's loss and gradients; a loss that cannot be so run says why in one line."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from autockpt.errors import InfeasibleBudgetError, PlanMismatchError
from autockpt.planner.core.fake_mode import PlanningFakeMode
from autockpt.planner.measure.loss_positions import loss_over_positions
from autockpt.planner.runtime.chunked_loss import IGNORE_INDEX, LossOverPositions
from tests.oracle import assert_same_gradients, measured_step

transformers = pytest.importorskip("transformers")

VOCAB, TOKENS, PROMPT = 6000, 1024, 128


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=TOKENS,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).train()


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=TOKENS,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).train()


def _batch() -> tuple[tuple[torch.Tensor], tuple[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=generator)
    labels = ids.clone()
    labels[:, :PROMPT] = IGNORE_INDEX  # a prompt the loss ignores
    return (ids,), (labels,)


def shifted(output: Any, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def shifted_float(output: Any, labels: torch.Tensor) -> torch.Tensor:
    logits = output.logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def by_key(output: Any, labels: torch.Tensor) -> torch.Tensor:
    logits = output["logits"][..., :-1, :].contiguous()
    return F.cross_entropy(logits.view(-1, VOCAB), labels[..., 1:].contiguous().view(-1))


def by_index(output: Any, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output[0][:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def smoothed_z_loss(output: Any, labels: torch.Tensor) -> torch.Tensor:
    """Label smoothing, and a z-loss over the labelled positions (a boolean mask)."""
    logits, kept = output.logits[:, :-1].float(), labels[:, 1:]
    loss = F.cross_entropy(logits.flatten(0, 1), kept.flatten(), label_smoothing=0.1)
    return loss + 1e-4 * torch.logsumexp(logits, -1)[kept != IGNORE_INDEX].pow(2).mean()


def _no_value(tensor: torch.Tensor) -> torch.Tensor:
    """Zero, with ``tensor``'s gradient."""
    return tensor - tensor.detach()


def own_loss_function(model: nn.Module) -> Callable[..., torch.Tensor]:
    """The model's own ``loss_function`` (labels shifted and padded inside it)."""
    return lambda output, labels: model.loss_function(output.logits, labels, vocab_size=VOCAB)


FORMS: dict[str, Any] = {
    "logits-shifted": (_llama, shifted),
    "float": (_llama, shifted_float),
    "key": (_llama, by_key),
    "index": (_llama, by_index),
    "smoothing-and-z-loss": (_llama, smoothed_z_loss),
    "own-loss-function": (_llama, own_loss_function),
    "gpt2-float": (_gpt2, shifted_float),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_of_the_loss_runs_in_chunks_under_half_the_peak_with_the_plain_gradients(form):
    make, loss_fn = FORMS[form]
    model = make()
    if loss_fn is own_loss_function:
        loss_fn = own_loss_function(model)
    inputs, targets = _batch()
    counted = dict(loss_fn=loss_fn, targets=targets, loss_reduction="mean")
    plain_peak, want_loss, want = measured_step(model, inputs, **counted)
    budget = plain_peak // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autockpt.plan(model, inputs, budget, loss_fn=loss_fn, example_targets=targets)
    chunks = plan.loss_chunks
    assert chunks is not None, plan.notes
    assert (chunks.head, chunks.shift, chunks.reduction) == ("lm_head", 1, "mean over labelled")
    assert chunks.leaf is not None  # the logits of a CausalLMOutput
    peak, loss, got = measured_step(model, inputs, plan, **counted)
    assert peak <= budget
    torch.testing.assert_close(loss, want_loss)
    assert_same_gradients(got, want)


def test_the_planned_model_called_directly_returns_the_models_output():
    model = _llama()
    inputs, targets = _batch()
    plan = autockpt.plan(model, inputs, 10**12, loss_fn=shifted, example_targets=targets)
    budget = plan.unplanned_peak_bytes // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autockpt.plan(model, inputs, budget, loss_fn=shifted, example_targets=targets)
    assert plan.loss_chunks is not None
    planned = autockpt.apply(copy.deepcopy(model), plan)
    output = planned(*inputs)
    assert type(output) is type(model(*inputs))
    torch.testing.assert_close(output.logits, model(*inputs).logits)


class DictOutLM(nn.Module):
    """A decoder written by hand that torch.fx traces, returning a dict: its logits and the
    features they were made from."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.mix = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
        self.aux_head = nn.Linear(32, 2)
        self.lm_head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.embed(ids)
        hidden = hidden + self.mix(hidden)
        return {"hidden": hidden, "logits": self.lm_head(hidden), "aux": self.aux_head(hidden)}


def test_a_dict_output_traced_by_fx_runs_its_loss_in_chunks_with_the_plain_gradients():
    torch.manual_seed(0)
    model = DictOutLM().train()
    inputs, targets = _batch()
    counted = dict(loss_fn=by_key, targets=targets, loss_reduction="mean")
    plain_peak, want_loss, want = measured_step(model, inputs, **counted)
    budget = plain_peak // 2
    plan = autockpt.plan(model, inputs, budget, loss_fn=by_key, example_targets=targets)
    assert plan.tracing == "fx"
    assert plan.loss_chunks is not None and plan.loss_chunks.head == "lm_head"  # the widest
    peak, loss, got = measured_step(model, inputs, plan, **counted)
    assert peak <= budget
    torch.testing.assert_close(loss, want_loss)
    # The aux head and the hidden output need no gradient: the loss reads the logits alone.
    assert_same_gradients(got, want)
    planned = autockpt.apply(copy.deepcopy(model), plan)
    output, original = planned(*inputs), model(*inputs)
    assert list(output) == list(original)
    for key in original:
        torch.testing.assert_close(output[key], original[key])


def _refusal(model: nn.Module, loss_fn: Callable[..., torch.Tensor], targets: Any) -> str:
    inputs, _ = _batch()
    with pytest.raises(InfeasibleBudgetError) as refused:
        autockpt.plan(model, inputs, 1, loss_fn=loss_fn, example_targets=targets)
    return str(refused.value)


def test_a_loss_that_reads_more_of_the_output_says_why_it_is_not_chunked():
    torch.manual_seed(0)
    model = DictOutLM().train()
    _, targets = _batch()

    def with_aux(output: Any, labels: torch.Tensor) -> torch.Tensor:
        return by_key(output, labels) + output["aux"].pow(2).mean()

    message = _refusal(model, with_aux, targets)
    assert "not in chunks of positions" in message
    assert "reads more of the output than the head's scores" in message


def test_a_penalty_on_the_parameters_is_not_chunked_and_training_step_refuses_it():
    model = _llama()
    inputs, targets = _batch()

    def penalised(output: Any, labels: torch.Tensor) -> torch.Tensor:
        return shifted(output, labels) + 1e-4 * model.lm_head.weight.pow(2).sum()

    message = _refusal(model, penalised, targets)
    assert "needs gradients for 1 tensors besides the head's scores" in message
    # A plan made for the plain loss, stepped with the penalty: refused, not run without it.
    plan = autockpt.plan(model, inputs, 10**12, loss_fn=shifted, example_targets=targets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autockpt.plan(
            model, inputs, plan.unplanned_peak_bytes // 2, loss_fn=shifted, example_targets=targets
        )
    assert plan.loss_chunks is not None
    planned = autockpt.apply(model, plan)
    with pytest.raises(PlanMismatchError, match="besides the head's scores"):
        autockpt.training_step(planned, plan, inputs, targets, penalised)


@pytest.mark.parametrize(
    ("loss_fn", "reason"),
    [
        # A z-loss over every position beside a cross-entropy over the labelled ones, small
        # enough that only the gradients tell (NOTE [Probing in float64]).
        (
            lambda o, y: shifted(o, y) + 1e-5 * torch.logsumexp(o.logits, -1).pow(2).mean(),
            "not a sum or a mean over positions",
        ),
        # A term with no value and a gradient (a straight-through estimator's form) over every
        # position: only the gradients tell (NOTE [Probing in float64]).
        (
            lambda o, y: shifted(o, y) + _no_value(torch.logsumexp(o.logits, -1)).mean(),
            "not a sum or a mean over positions",
        ),
        # The labels closed over: no target carries the positions.
        (lambda o: shifted(o, _batch()[1][0]), "no target has the positions"),
    ],
    ids=["z-loss-over-every-position", "gradient-without-value", "closed-over-labels"],
)
def test_a_loss_that_does_not_add_up_over_positions_says_why(loss_fn, reason):
    model = _llama()
    targets = _batch()[1] if loss_fn.__code__.co_argcount == 2 else ()
    message = _refusal(model, loss_fn, targets)
    assert "not in chunks of positions" in message and reason in message, message


def test_the_probe_finds_a_loss_that_shifts_its_labels():
    head = nn.Linear(16, 50)
    labels = torch.randint(1, 50, (3, 40))
    found = loss_over_positions(
        head,
        (3, 40, 16),
        [labels],
        lambda o, y: F.cross_entropy(o[:, :-1].flatten(0, 1), y[:, 1:].flatten()),
    )
    assert found == LossOverPositions(1, "mean over labelled", 1)
    summed = loss_over_positions(
        head,
        (3, 40, 16),
        [labels],
        lambda o, y: F.cross_entropy(o[:, :-1].flatten(0, 1), y[:, 1:].flatten(), reduction="sum"),
    )
    assert summed == LossOverPositions(1, "sum", 1)


def test_data_dependent_ops_on_fake_tensors_are_made_at_their_largest():
    # NOTE [Data-dependent sizes on fake tensors]: every element kept.
    with PlanningFakeMode():
        x = torch.randn(4, 5)
        assert x.nonzero().shape == (20, 2)
        assert x[x > 0].shape == (20,)
        assert x.masked_select(x > 0).shape == (20,)
        values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
        assert (values.shape, inverse.shape, counts.shape) == ((20,), (4, 5), (20,))
        assert torch.unique_consecutive(x).shape == (20,)
