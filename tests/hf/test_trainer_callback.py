"""``transformers.Trainer`` under ``autockpt.hf.MemoryPlan``: GPT-2 (dropout on) and PatchTST
fine-tuned at half their plain peak, every step (the first, which plans, included) counted
from its start to its end by the tests' own counter, the losses the plain Trainer's, and the
plan kept in the Trainer's checkpoints (NOTE [Planning under transformers.Trainer])."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("accelerate", reason="the hf extra is not installed")

import autockpt  # noqa: E402
from autockpt.errors import BudgetError  # noqa: E402
from autockpt.hf import MemoryPlan  # noqa: E402
from tests.oracle import LiveBytes, starting_tensors  # noqa: E402

VOCAB, LENGTH, BATCH, STEPS = 128, 64, 8, 4


class EveryStepPeak(transformers.TrainerCallback):
    """The peak of every training step, counted by LiveBytes from ``on_step_begin`` (the
    parameters, gradients, optimizer state) to ``on_step_end``; the batch counts from the
    model's call. The loss of every training call is kept too."""

    def __init__(self) -> None:
        self.counter: LiveBytes | None = None
        self.peaks: list[int] = []
        self.losses: list[float] = []

    def watch(self, model: torch.nn.Module) -> None:
        # Planning runs copies of the model, hooks and all: only the model's own calls count.
        def hold_batch(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            if self.counter is not None and module is model:
                for value in kwargs.values():
                    if isinstance(value, torch.Tensor):
                        self.counter.hold(value)

        def keep_loss(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            if module is model and module.training and torch.is_grad_enabled():
                self.losses.append(float(output["loss"].detach()))

        model.register_forward_pre_hook(hold_batch, with_kwargs=True, prepend=True)
        model.register_forward_hook(keep_loss, with_kwargs=True)

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.counter = LiveBytes()
        inner = getattr(optimizer, "optimizer", optimizer)
        for tensor in starting_tensors(model, inner, []):
            self.counter.hold(tensor)
        self.counter.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        assert self.counter is not None
        self.counter.__exit__(None, None, None)
        self.peaks.append(self.counter.peak_bytes)
        self.counter = None

    def close(self) -> None:
        """Leave the count of a step that never ended (training raised mid-step): its
        dispatch mode would otherwise stay on for every test after this one."""
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.counter = None


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=LENGTH,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _gpt2_data() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (STEPS * BATCH, LENGTH), generator=generator)
    labels = ids.clone()
    labels[:, :4] = -100  # ignored positions, as a collator for prompts writes them
    return [{"input_ids": i, "labels": y} for i, y in zip(ids, labels, strict=True)]


def _patchtst() -> torch.nn.Module:
    config = transformers.PatchTSTConfig(
        num_input_channels=7, context_length=512, prediction_length=24, patch_length=16,
        patch_stride=8, d_model=32, num_attention_heads=4, num_hidden_layers=3, ffn_dim=64,
    )  # fmt: skip
    return transformers.PatchTSTForPrediction(config)


def _patchtst_data() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    series = torch.randn(STEPS * BATCH, 536, 7, generator=generator).cumsum(1)
    return [{"past_values": s[:512], "future_values": s[512:]} for s in series]


def _train(
    make: Callable[[], torch.nn.Module],
    data: list[dict[str, torch.Tensor]],
    out: Path,
    callbacks: list[Any],
    **settings: Any,
) -> tuple[Any, EveryStepPeak]:
    torch.manual_seed(0)
    model = make()
    counter = EveryStepPeak()
    counter.watch(model)
    arguments: dict[str, Any] = dict(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=BATCH,
        max_steps=STEPS, learning_rate=1e-3, seed=0, report_to=[], save_strategy="no",
        logging_steps=1, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    args = transformers.TrainingArguments(**{**arguments, **settings})
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, callbacks=[*callbacks, counter]
    )
    children = list(model.children())
    try:
        trainer.train()
    finally:
        counter.close()
    # Training over, the model is the user's own again: its submodules, not planned copies.
    assert all(a is b for a, b in zip(model.children(), children, strict=True))
    return trainer, counter


@pytest.mark.parametrize(
    ("make", "data"), [(_gpt2, _gpt2_data), (_patchtst, _patchtst_data)], ids=["gpt2", "patchtst"]
)
def test_fine_tuned_at_half_its_peak_with_the_plain_losses(
    make: Callable[[], torch.nn.Module], data: Callable[[], list[Any]], tmp_path: Path
) -> None:
    _, plain = _train(make, data(), tmp_path / "plain", [])
    # The first step makes AdamW's state; the steps after it hold it throughout.
    budget = max(plain.peaks[1:]) // 2
    memory_plan = MemoryPlan(budget, allow_chunks=False, show=False)
    _, planned = _train(make, data(), tmp_path / "planned", [memory_plan])
    plan = memory_plan.plan
    assert plan is not None and plan.num_recomputed > 0 and plan.fits, plan
    assert len(planned.peaks) == STEPS
    assert max(planned.peaks) <= budget, (planned.peaks, budget)  # planning in the first one
    assert len(planned.losses) == STEPS
    torch.testing.assert_close(planned.losses, plain.losses, rtol=1e-5, atol=1e-6)


def test_the_plan_is_kept_in_checkpoints_and_taken_again_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    _, plain = _train(_gpt2, _gpt2_data(), tmp_path / "plain", [])
    budget = max(plain.peaks[1:]) // 2
    memory_plan = MemoryPlan(budget, allow_chunks=False, show=False)
    _train(_gpt2, _gpt2_data(), out, [memory_plan], save_strategy="steps", save_steps=2)
    assert memory_plan.plan is not None
    saved = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    state = saved["stateful_callbacks"]["MemoryPlan"]
    saved_plans = [autockpt.Plan.model_validate_json(t) for t in state["attributes"]["plans_json"]]
    assert saved_plans == memory_plan.shape_plans.plans == [memory_plan.plan]
    assert state["args"]["budget"] == str(budget)

    def no_planning(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a resumed run planned again")

    monkeypatch.setattr(autockpt, "plan", no_planning)
    torch.manual_seed(0)
    model = _gpt2()
    resumed = MemoryPlan(budget, allow_chunks=False, show=False)
    args = transformers.TrainingArguments(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=BATCH,
        max_steps=STEPS, learning_rate=1e-3, seed=0, report_to=[], save_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_gpt2_data(), callbacks=[resumed]
    )
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert resumed.plan == memory_plan.plan


def test_hugging_faces_checkpointing_gives_way_to_the_plan_in_one_line(tmp_path: Path) -> None:
    memory_plan = MemoryPlan(10**9, show=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, _ = _train(
            _gpt2, _gpt2_data()[: 2 * BATCH], tmp_path / "run", [memory_plan],
            gradient_checkpointing=True,
        )  # fmt: skip
    lines = [str(w.message) for w in caught if "MemoryPlan both recompute" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0] and "the plan wins" in lines[0]
    assert not trainer.model.is_gradient_checkpointing


def test_a_budget_that_is_not_a_size_fails_where_the_callback_is_made() -> None:
    with pytest.raises(BudgetError, match="'8XB' is not a size"):
        MemoryPlan("8XB")
