"""The model's own loss in chunks of positions under ``transformers.Trainer`` (NOTE [The model's
own loss in chunks]): a decoder fine-tuned at one sequence of 1024 tokens under a budget its
loss alone exceeds when run whole, every step counted by the tests' own counter, with the
plain Trainer's losses and the plain run's trained weights; a class whose loss is not its
``loss_function`` on its head's logits is planned whole and says why."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("accelerate", reason="the hf extra is not installed")

import autockpt  # noqa: E402
from autockpt.errors import InfeasibleBudgetError  # noqa: E402
from autockpt.hf import MemoryPlan  # noqa: E402
from autockpt.hf.step import HuggingFaceStep, output_loss  # noqa: E402
from tests.hf.test_trainer_callback import EveryStepPeak  # noqa: E402

VOCAB, LENGTH, STEPS = 6000, 1024, 3


def _llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=LENGTH,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


class SmoothedLoss(transformers.GPT2LMHeadModel):
    """GPT-2 computing a loss of its own (label smoothing), not its ``loss_function``."""

    def forward(self, input_ids=None, labels=None, **kwargs):  # type: ignore[no-untyped-def]
        output = super().forward(input_ids=input_ids, **kwargs)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(
                output.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), label_smoothing=0.1
            )
        return transformers.modeling_outputs.CausalLMOutput(loss=loss, logits=output.logits)


class ScaledLogits(transformers.GPT2LMHeadModel):
    """GPT-2 scaling its logits after its head: its output is not the head's."""

    def forward(self, input_ids=None, labels=None, **kwargs):  # type: ignore[no-untyped-def]
        output = super().forward(input_ids=input_ids, **kwargs)
        logits = output.logits * 0.5
        loss = None if labels is None else self.loss_function(logits, labels, VOCAB)
        return transformers.modeling_outputs.CausalLMOutput(loss=loss, logits=logits)


def _gpt2_config() -> Any:
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=LENGTH,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


def _data() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (STEPS, LENGTH), generator=generator)
    labels = ids.clone()
    labels[:, :100] = -100  # a prompt the loss ignores
    return [{"input_ids": i, "labels": y} for i, y in zip(ids, labels, strict=True)]


def _train(make: Any, out: Path, callbacks: list[Any]) -> tuple[torch.nn.Module, EveryStepPeak]:
    torch.manual_seed(0)
    model = make()
    counter = EveryStepPeak()
    counter.watch(model)
    args = transformers.TrainingArguments(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=1, max_steps=STEPS,
        learning_rate=1e-3, seed=0, report_to=[], save_strategy="no", logging_steps=1,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_data(), callbacks=[*callbacks, counter]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return model, counter


def test_the_models_own_loss_runs_in_chunks_under_a_budget_its_whole_loss_exceeds(tmp_path):
    plain_model, plain = _train(_llama, tmp_path / "plain", [])
    budget = max(plain.peaks[1:]) // 2
    # Run whole, the model's loss alone is above that budget (what the callback did before).
    batch = {key: value.unsqueeze(0) for key, value in _data()[0].items()}
    with pytest.raises(InfeasibleBudgetError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        autockpt.plan(
            HuggingFaceStep(_llama().train()), (batch,), budget, loss_fn=output_loss,
            tracing="forward-hooks", allow_micro_batches=False, allow_loss_chunks=False,
        )  # fmt: skip
    memory_plan = MemoryPlan(budget, show=False)
    model, planned = _train(_llama, tmp_path / "planned", [memory_plan])
    plan = memory_plan.plan
    assert plan is not None and plan.loss_chunks is not None, plan
    assert (plan.loss_chunks.head, plan.loss_chunks.shift) == ("module.lm_head", 1)
    assert len(planned.peaks) == STEPS
    assert max(planned.peaks) <= budget, (planned.peaks, budget)  # planning in the first one
    torch.testing.assert_close(planned.losses, plain.losses, rtol=1e-5, atol=1e-6)
    # Every parameter trained as the plain run trained it (its gradients, step by step).
    want = dict(plain_model.named_parameters())
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter, want[name], rtol=1e-5, atol=1e-6, msg=name)
    # Training over, the head is the model's own and the model returns its logits again.
    assert type(model.lm_head) is torch.nn.Linear
    with torch.no_grad():
        output = model.eval()(**batch)
    assert output.logits.shape == (1, LENGTH, VOCAB) and output.loss is not None


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: SmoothedLoss(_gpt2_config()), "is not its loss_function on the logits"),
        (lambda: ScaledLogits(_gpt2_config()), "no tensor of its output is the output of"),
    ],
    ids=["loss-of-its-own", "logits-scaled-after-the-head"],
)
def test_a_class_that_cannot_be_so_planned_is_planned_whole_and_says_why(make, reason, tmp_path):
    _, plain = _train(make, tmp_path / "plain", [])
    memory_plan = MemoryPlan(max(plain.peaks[1:]) * 95 // 100, show=False)
    _, planned = _train(make, tmp_path / "planned", [memory_plan])
    plan = memory_plan.plan
    assert plan is not None and plan.loss_chunks is None and plan.num_recomputed > 0
    assert any(reason in note for note in plan.notes), plan.notes
    assert max(planned.peaks) <= memory_plan.budget.bytes
    torch.testing.assert_close(planned.losses, plain.losses, rtol=1e-5, atol=1e-6)
