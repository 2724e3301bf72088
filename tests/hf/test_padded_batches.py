"""``transformers.Trainer`` with a padding collator: GPT-2 fine-tuned on batches padded to
lengths that rise, fall and end longer than any seen, under ``autockpt.hf.MemoryPlan`` at 60% of
the plain run's largest step. Every step (planning included) is counted by the tests' own
counter, and the losses are the plain run's (NOTE [Plans that follow the shapes of a run])."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("accelerate", reason="the hf extra is not installed")

import autockpt  # noqa: E402
from autockpt.hf import MemoryPlan  # noqa: E402
from tests.hf.test_trainer_callback import EveryStepPeak  # noqa: E402

VOCAB, BATCH = 128, 4
#: Each batch's longest sequence, in the order the data gives them.
LENGTHS = [32, 96, 384, 64, 256, 600]


class Texts(torch.utils.data.IterableDataset):
    """Token sequences in order, each batch's first the longest (a Trainer does not shuffle an
    iterable dataset): the lengths of the padded batches are :data:`LENGTHS`."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __iter__(self) -> Iterator[dict[str, list[int]]]:
        generator = torch.Generator().manual_seed(0)
        for longest in self.lengths:
            for index in range(BATCH):
                length = longest if index == 0 else max(1, longest // (index + 1))
                yield {
                    "input_ids": torch.randint(1, VOCAB, (length,), generator=generator).tolist()
                }


def pad(examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """A collator as users write one: pad to the batch's longest; labels -100 on the padding."""
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
        mask[row, : len(example["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=1024,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _train(out: Path, callbacks: list[Any], lengths: list[int] = LENGTHS) -> EveryStepPeak:
    torch.manual_seed(0)
    model = _gpt2()
    counter = EveryStepPeak()
    counter.watch(model)
    args = transformers.TrainingArguments(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=BATCH,
        max_steps=len(lengths), learning_rate=1e-3, seed=0, report_to=[], save_strategy="no",
        logging_steps=1, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Texts(lengths), data_collator=pad,
        callbacks=[*callbacks, counter],
    )  # fmt: skip
    try:
        trainer.train()
    finally:
        counter.close()
    return counter


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> EveryStepPeak:
    return _train(tmp_path_factory.mktemp("plain"), [])


def test_every_padded_batch_runs_under_the_budget_with_the_plain_losses(plain, tmp_path) -> None:
    budget = int(0.6 * max(plain.peaks[1:]))
    memory_plan = MemoryPlan(budget, allow_chunks=False, show=False)
    planned = _train(tmp_path, [memory_plan])
    assert len(planned.peaks) == len(LENGTHS)
    assert max(planned.peaks) <= budget, (planned.peaks, budget)
    torch.testing.assert_close(planned.losses, plain.losses, rtol=1e-5, atol=1e-6)
    # 32, the buckets of 96 and 384; 64 and 256 with the plans above them; 600 its own: its
    # bucket, 1024 tokens, cannot fit this budget by recompute alone, so 600 itself is planned.
    lengths = [plan.batch_shapes.shapes[0][1] for plan in memory_plan.shape_plans.plans]
    assert lengths == [32, 128, 512, 600], lengths


def test_a_declared_maximum_plans_once(plain, tmp_path) -> None:
    budget = int(0.6 * max(plain.peaks[1:]))
    memory_plan = MemoryPlan(budget, allow_chunks=False, show=False, max_shape=(BATCH, 600))
    planned = _train(tmp_path, [memory_plan])
    assert memory_plan.shape_plans.num_plans == 1
    assert max(planned.peaks) <= budget, (planned.peaks, budget)
    torch.testing.assert_close(planned.losses, plain.losses, rtol=1e-5, atol=1e-6)


def test_with_replanning_off_a_longer_batch_is_refused_in_one_line(tmp_path) -> None:
    memory_plan = MemoryPlan("1GB", show=False, replan=False)
    with pytest.raises(autockpt.ShapeError) as refused:
        _train(tmp_path, [memory_plan], lengths=[32, 96])
    message = str(refused.value)
    assert "\n" not in message and "input_ids 4x96" in message and "input_ids 4x32" in message
    assert "max_shape=(4, 96)" in message and "replan=True" in message
