"""Hugging Face models as their users train them (T5, GPT-2, BERT, a Llama-style decoder): built
small with random weights (nothing downloaded), planned at half their peak, the budget held by
the tests' own counter, and the plain step's gradients and the original's eval outputs kept.
T5's decoder writes a ``Cache`` object in train mode (``use_cache=True``), as GPT-2's and
Llama's do when asked to, which a recompute would write again (NOTE [Python state written in
forward])."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autockpt
from tests.oracle import assert_same_gradients, measured_step

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

VOCAB = 128


class T5Seq2Seq(nn.Module):
    """``T5ForConditionalGeneration`` taking ``(input_ids, decoder_input_ids)``, its logits out."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.T5Config(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            dropout_rate=0.0,
        )
        assert config.use_cache  # the decoder writes its Cache in train mode too
        self.t5 = transformers.T5ForConditionalGeneration(config)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.t5(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _holds_at_half_its_peak(
    model: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    labels: tuple[torch.Tensor, ...],
    tracing: str,
) -> autockpt.Plan:
    """Plan ``model`` at half its unplanned peak and check the plan: every option measured,
    the budget held by LiveBytes, the plain step's loss and gradients, the original's eval
    outputs. Returns the plan of the unplanned step (its minimum, its peak)."""
    options = dict(loss_fn=_loss, example_targets=labels, tracing=tracing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fx keeps parts of these models whole, or hooks plan
        plain = autockpt.plan(model, inputs, 10**12, **options)
        budget = plain.unplanned_peak_bytes // 2
        plan = autockpt.plan(model, inputs, budget, **options)
    # Every option measured: none left out for an error of the planner's own making.
    assert not any("measuring it failed" in note for note in plan.notes), plan.notes
    counted = dict(loss_fn=_loss, targets=labels, loss_reduction="mean")
    peak, loss, got = measured_step(model, inputs, plan, **counted)
    assert peak <= budget
    _, want_loss, want = measured_step(model, inputs, **counted)
    torch.testing.assert_close(loss, want_loss)
    assert_same_gradients(got, want)
    planned = autockpt.apply(copy.deepcopy(model), plan).eval()
    with torch.no_grad():
        torch.testing.assert_close(planned(*inputs), model.eval()(*inputs))
    return plain


@pytest.mark.parametrize("tracing", ["auto", "forward-hooks"])
def test_t5_plans_at_half_its_peak_and_keeps_its_gradients_and_eval_outputs(tracing):
    torch.manual_seed(0)
    model = T5Seq2Seq().train()
    inputs = (torch.randint(0, VOCAB, (16, 64)), torch.randint(0, VOCAB, (16, 32)))
    labels = (torch.randint(0, VOCAB, (16, 32)),)
    plain = _holds_at_half_its_peak(model, inputs, labels, tracing)
    if tracing == "auto":
        # The minimum over every option, measured (a plan at an unlimited budget measures the
        # minimum of recompute alone: NOTE [One minimum]).
        with warnings.catch_warnings(), pytest.raises(autockpt.InfeasibleBudgetError) as refused:
            warnings.simplefilter("ignore")
            autockpt.plan(model, inputs, 1, loss_fn=_loss, example_targets=labels)
        assert refused.value.minimum_bytes <= 0.4 * plain.unplanned_peak_bytes


class CausalOrMaskedLM(nn.Module):
    """A language model taking ``input_ids``, its logits out; ``use_cache`` passed as given
    (``True`` makes the decoder layers write a ``Cache`` in train mode too)."""

    def __init__(self, model: nn.Module, use_cache: bool | None = None) -> None:
        super().__init__()
        self.model = model
        self.use_cache = use_cache

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        options = {} if self.use_cache is None else {"use_cache": self.use_cache}
        return self.model(input_ids=input_ids, **options).logits


def gpt2_config(length: int = 64) -> Any:
    """A small GPT-2 (2 layers of width 64, dropout off) for sequences up to ``length``."""
    return transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=length,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def _gpt2() -> nn.Module:
    return CausalOrMaskedLM(transformers.GPT2LMHeadModel(gpt2_config()), use_cache=True)


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return CausalOrMaskedLM(transformers.BertForMaskedLM(config))


def llama_config() -> Any:
    """A small Llama-style decoder (2 layers of width 64, grouped-query attention)."""
    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )


def _llama() -> nn.Module:
    return CausalOrMaskedLM(transformers.LlamaForCausalLM(llama_config()), use_cache=True)


@pytest.mark.parametrize(
    ("make", "tracing"),
    [(_gpt2, "auto"), (_gpt2, "forward-hooks"), (_bert, "auto"), (_llama, "auto")],
    ids=["gpt2-cache", "gpt2-cache-hooks", "bert", "llama-cache"],
)
def test_language_models_plan_at_half_their_peak_and_keep_their_gradients(make, tracing):
    torch.manual_seed(0)
    model = make().train()
    inputs = (torch.randint(0, VOCAB, (16, 64)),)
    labels = (torch.randint(0, VOCAB, (16, 64)),)
    _holds_at_half_its_peak(model, inputs, labels, tracing)


def test_a_llama_decoder_at_one_sequence_plans_below_its_loss_with_its_cache_kept():
    """One sequence, a vocabulary-sized head, ``use_cache=True``: the loss in chunks of
    positions and the layers that write the cache recomputed (NOTE [Loss over positions in
    chunks], NOTE [Python state written in forward])."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=4000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
    )  # fmt: skip
    model = CausalOrMaskedLM(transformers.LlamaForCausalLM(config), use_cache=True).train()
    inputs = (torch.randint(0, 4000, (1, 512)),)
    labels = torch.randint(0, 4000, (1, 512))
    labels[0, :100] = -100
    options = dict(loss_fn=_loss, example_targets=(labels,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(autockpt.InfeasibleBudgetError) as whole:
            autockpt.plan(model, inputs, 1, allow_loss_chunks=False, **options)
        with pytest.raises(autockpt.InfeasibleBudgetError) as chunked:
            autockpt.plan(model, inputs, 1, **options)
        budget = (whole.value.minimum_bytes + chunked.value.minimum_bytes) // 2
        plan = autockpt.plan(model, inputs, budget, **options)
    assert plan.loss_chunks is not None
    assert chunked.value.minimum_bytes < 0.6 * whole.value.minimum_bytes
    counted = dict(loss_fn=_loss, targets=(labels,), loss_reduction="mean")
    peak, loss, got = measured_step(model, inputs, plan, **counted)
    assert peak <= budget
    _, want_loss, want = measured_step(model, inputs, **counted)
    torch.testing.assert_close(loss, want_loss)
    assert_same_gradients(got, want)
