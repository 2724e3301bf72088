"""A fine-tune whose batches change shape: plans that follow the lengths against one plan made
for the longest (NOTE [Plans that follow the shapes of a run]).

GPT-2 (a small configuration, 2048 positions) under ``transformers.Trainer`` and
``autockpt.hf.MemoryPlan``, fed by a padding collator: each batch is as long as its longest
sequence, the lengths drawn from a long-tailed distribution (16 to 2048 tokens, most short,
log-normal). Two runs on the same batches, one after the other in this process:

- *following*: ``MemoryPlan(budget)``: plans the first batch, then each new length bucket;
- *planned once*: ``MemoryPlan(budget, max_shape=(batch, 2048))``: one plan for the longest.

It prints the plans each run made, planning's seconds against the run's, and the mean step
time of each run (planning left out) and their ratio. The budget is a share of the plain
step's peak at the longest batch, as the planner measures it. Needs the hf extra.

    python3 benchmarks/varying_shapes.py                     # 40 steps, batch 4, budget 50%
    python3 benchmarks/varying_shapes.py --steps 80 --share 0.4
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import torch
import transformers

import autockpt
from autockpt.hf import MemoryPlan
from autockpt.hf.step import HuggingFaceStep, output_loss

VOCAB, LONGEST, SHORTEST = 512, 2048, 16


def lengths(steps: int, seed: int) -> list[int]:
    """Each batch's longest sequence: log-normal around 90 tokens, clipped to 16..2048."""
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.exp(torch.randn(steps, generator=generator) * 1.1 + 4.5)
    return [int(min(max(n, SHORTEST), LONGEST)) for n in drawn.tolist()]


class Texts(torch.utils.data.IterableDataset):
    """Batches of ``batch`` token sequences in order, the first of each the batch's longest."""

    def __init__(self, longest: list[int], batch: int) -> None:
        self.longest, self.batch = longest, batch

    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(0)
        for length in self.longest:
            for index in range(self.batch):
                size = length if index == 0 else max(SHORTEST // 2, length // (index + 1))
                yield {"input_ids": torch.randint(1, VOCAB, (size,), generator=generator).tolist()}


def pad(examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Dynamic padding, as a collator does: to the batch's longest; labels -100 on padding."""
    ids = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(e["input_ids"]) for e in examples], batch_first=True
    )
    mask = (ids != 0).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=128, n_layer=4, n_head=4, n_positions=LONGEST,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


class StepClock(transformers.TrainerCallback):
    """Each step's seconds, from ``on_step_begin`` to ``on_step_end``."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.seconds.append(time.perf_counter() - self._started)


def run(longest: list[int], batch: int, memory_plan: MemoryPlan) -> tuple[float, StepClock]:
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, use_cpu=True, per_device_train_batch_size=batch,
            max_steps=len(longest), learning_rate=1e-4, seed=0, report_to=[],
            save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
            disable_tqdm=True,
        )  # fmt: skip
        trainer = transformers.Trainer(
            model=gpt2(), args=args, train_dataset=Texts(longest, batch), data_collator=pad,
            callbacks=[memory_plan, clock],
        )  # fmt: skip
        started = time.perf_counter()
        trainer.train()
        return time.perf_counter() - started, clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--share", type=float, default=0.5, help="budget / plain peak at 2048")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    longest = lengths(options.steps, options.seed)
    widest = pad([{"input_ids": [1] * LONGEST}] * options.batch)
    plain = autockpt.plan(
        HuggingFaceStep(gpt2()), (widest,), 2**40, loss_fn=output_loss,
        tracing="forward-hooks", allow_micro_batches=False, progress=False,
    )  # fmt: skip
    budget = int(options.share * plain.unplanned_peak_bytes)
    print(
        f"lengths: {options.steps} batches of {options.batch}, median "
        f"{sorted(longest)[len(longest) // 2]}, longest {max(longest)} tokens; budget "
        f"{autockpt.format_bytes(budget)} ({options.share:.0%} of the plain step at {LONGEST})"
    )
    rows = []
    for name, memory_plan in (
        ("following", MemoryPlan(budget, show=False)),
        ("planned once", MemoryPlan(budget, show=False, max_shape=(options.batch, LONGEST))),
    ):
        total_s, clock = run(longest, options.batch, memory_plan)
        steps_s = sum(clock.seconds) - memory_plan.shape_plans.planning_s
        rows.append((name, memory_plan, total_s, steps_s / len(clock.seconds)))
        made = ", ".join(p.batch_shapes.text(max_leaves=1) for p in memory_plan.shape_plans.plans)
        print(
            f"{name:>13}: {memory_plan.shape_plans.num_plans} plans ({made}); planning "
            f"{memory_plan.shape_plans.planning_s:.1f} s of the run's {total_s:.1f} s "
            f"({memory_plan.shape_plans.planning_s / total_s:.0%}); mean step "
            f"{1000 * steps_s / len(clock.seconds):.0f} ms, planning left out"
        )
    following, once = rows[0][3], rows[1][3]
    print(f"step time, following / planned once: {following / once:.2f}")


if __name__ == "__main__":
    main()
