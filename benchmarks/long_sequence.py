"""Language models at one long sequence, where the logits are the floor: a Llama-style decoder
and GPT-2 (4 layers, width 256, vocabulary 32000; 1 x 2048 tokens; Hugging Face classes with
random weights, ``use_cache`` as their configs have it), with the loss in each form people
write it: the benchmark's own wrapper (the logits tensor out, the labels shifted beforehand),
the model's ``CausalLMOutput`` straight out with ``out.logits`` shifted in the loss, the same
with ``.float()``, and the model's own loss from ``labels`` under ``transformers.Trainer``
(``autockpt.hf.MemoryPlan``). Each is planned with the loss run whole
(``allow_loss_chunks=False``) and with the head and the loss in chunks of positions. Prints a
Markdown table: the plain peak (AdamW's state included), each minimum, and at half the plain
peak the plan, its step's peak by the tests' own counter and its step time against the plain
step's, timed side by side.

    python benchmarks/long_sequence.py [--only llama,gpt2] [--forms ...] [--repeats N] [--tokens N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the oracle lives in the tests package

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402

import autockpt  # noqa: E402
from autockpt import format_bytes  # noqa: E402
from autockpt.errors import InfeasibleBudgetError  # noqa: E402
from tests.oracle import measured_step  # noqa: E402

VOCAB, WIDTH, LAYERS, HEADS = 32000, 256, 4, 4


class LogitsOut(nn.Module):
    """A causal language model taking ``input_ids``, its logits out, as a plain loop uses it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the vocabulary, labels already shifted by the batch; -100 ignored."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def shifted_loss(output: Any, labels: torch.Tensor) -> torch.Tensor:
    """The loss as people write it for a Hugging Face model: its output's logits, shifted."""
    return F.cross_entropy(output.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def shifted_float_loss(output: Any, labels: torch.Tensor) -> torch.Tensor:
    """The same, in float32 as mixed-precision loops write it."""
    logits = output.logits[:, :-1].float()
    return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())


#: Form -> (whether the model is wrapped to return its logits, the loss, labels pre-shifted).
LOOP_FORMS: dict[str, tuple[bool, Any, bool]] = {
    "wrapper": (True, next_token_loss, True),
    "out.logits shifted": (False, shifted_loss, False),
    ".float()": (False, shifted_float_loss, False),
}
TRAINER_FORM = "Trainer labels"


def _models(tokens: int) -> dict[str, Any]:
    def llama() -> nn.Module:
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=688,
            num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
            max_position_embeddings=tokens,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config)

    def gpt2() -> nn.Module:
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=tokens,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)

    return {"llama": llama, "gpt2": gpt2}


def _minimum(model: nn.Module, inputs: Any, options: dict[str, Any]) -> int:
    try:
        autockpt.plan(model, inputs, 1, **options)
    except InfeasibleBudgetError as error:
        return error.minimum_bytes
    raise AssertionError("a one-byte budget was met")


def _step_s(
    model: nn.Module, plan: autockpt.Plan | None, batch: Any, loss_fn: Any, repeats: int
) -> float:
    """The median seconds of a forward and backward of ``model`` run by ``training_step``."""
    inputs, targets = batch
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        autockpt.training_step(model, plan, inputs, targets, loss_fn)
        times.append(time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def _loop_row(model: nn.Module, form: str, ids: torch.Tensor, repeats: int) -> str:
    """One form of a loop's loss: minima, and the plan at half the plain peak."""
    wrapped, loss_fn, pre_shifted = LOOP_FORMS[form]
    labels = ids.clone()
    labels[0, : ids.shape[1] // 8] = -100  # a prompt the loss ignores
    if pre_shifted:
        labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
    model = LogitsOut(model) if wrapped else model
    inputs, targets = (ids,), (labels,)
    options: dict[str, Any] = dict(loss_fn=loss_fn, example_targets=targets)
    counted = dict(loss_fn=loss_fn, targets=targets, loss_reduction="mean")
    peak, _, _ = measured_step(model, inputs, **counted)
    whole = _minimum(model, inputs, {**options, "allow_loss_chunks": False})
    chunked = _minimum(model, inputs, options)
    budget = peak // 2
    plan = autockpt.plan(model, inputs, budget, **options)
    step_peak, _, _ = measured_step(model, inputs, plan, **counted)
    planned = autockpt.apply(model, plan)
    batch = (inputs, targets)
    # Side by side, alternating, so that the machine's load weighs on both alike.
    plain_s, planned_s = [], []
    for _ in range(3):
        plain_s.append(_step_s(model, None, batch, loss_fn, repeats))
        planned_s.append(_step_s(planned, plan, batch, loss_fn, repeats))
    ratio = statistics.median(planned_s) / statistics.median(plain_s)
    predicted = 1 + plan.predicted_extra_s / plan.unplanned_step_s
    return _row(form, peak, whole, chunked, budget, plan, step_peak, f"{ratio:.2f}x "
                f"(predicted {predicted:.2f}x)")  # fmt: skip


def _trainer_row(make: Any, ids: torch.Tensor, steps: int) -> str:
    """The model's own loss under ``transformers.Trainer``: minima as the callback plans the
    step, and a run at half the plain run's peak, each step counted, times side by side."""
    from autockpt.hf import MemoryPlan
    from autockpt.hf.own_loss import LogitsStep, loss_targets, model_inputs, own_loss_split
    from autockpt.hf.step import HuggingFaceStep, output_loss
    from tests.hf.test_trainer_callback import EveryStepPeak

    labels = ids.clone()
    labels[0, : ids.shape[1] // 8] = -100
    data = [{"input_ids": ids[0], "labels": labels[0]}] * steps

    def run(callbacks: list[Any]) -> tuple[EveryStepPeak, list[float]]:
        torch.manual_seed(0)
        model = make()
        counter, times = EveryStepPeak(), StepTimes()
        counter.watch(model)
        with tempfile.TemporaryDirectory() as out:
            args = transformers.TrainingArguments(
                output_dir=out, use_cpu=True, per_device_train_batch_size=1, max_steps=steps,
                learning_rate=1e-4, seed=0, report_to=[], save_strategy="no",
                dataloader_num_workers=0, disable_tqdm=True, logging_strategy="no",
            )  # fmt: skip
            trainer = transformers.Trainer(
                model=model, args=args, train_dataset=data, callbacks=[*callbacks, counter, times]
            )
            trainer.train()
        return counter, times.seconds

    plain, plain_s = run([])
    peak = max(plain.peaks[1:])  # AdamW's state made by the first step
    batch = {"input_ids": ids, "labels": labels}
    model = make().train()
    whole = _minimum(
        HuggingFaceStep(model), (batch,),
        dict(loss_fn=output_loss, tracing="forward-hooks", allow_micro_batches=False,
             allow_loss_chunks=False),
    )  # fmt: skip
    split = own_loss_split(model, batch)
    assert not isinstance(split, str), split
    chunked = _minimum(
        LogitsStep(model), (model_inputs(batch),),
        dict(loss_fn=split, example_targets=loss_targets(batch), tracing="forward-hooks",
             allow_micro_batches=False),
    )  # fmt: skip
    budget = peak // 2
    memory_plan = MemoryPlan(budget, show=False)
    planned, planned_s = run([memory_plan])
    assert memory_plan.plan is not None
    # The first step plans; the steps after it are timed (the plain run's alike).
    ratio = statistics.median(planned_s[1:]) / statistics.median(plain_s[1:])
    plan = memory_plan.plan
    predicted = 1 + plan.predicted_extra_s / plan.unplanned_step_s
    return _row(TRAINER_FORM, peak, whole, chunked, budget, plan, max(planned.peaks),
                f"{ratio:.2f}x (predicted {predicted:.2f}x; Trainer steps 2-{steps})")  # fmt: skip


class StepTimes(transformers.TrainerCallback):  # type: ignore[misc]
    """Seconds of every Trainer step, from ``on_step_begin`` to ``on_step_end``."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._started = 0.0

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self._started = time.perf_counter()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.seconds.append(time.perf_counter() - self._started)


def _row(
    form: str, peak: int, whole: int, chunked: int, budget: int, plan: autockpt.Plan,
    step_peak: int, time_text: str,
) -> str:  # fmt: skip
    what = f"{plan.num_recomputed} of {len(plan.segments)} recomputed, {plan.tracing}"
    if plan.loss_chunks is not None:
        what += f"; loss in {plan.loss_chunks.num_chunks} chunks"
    return (
        f"| {form} | {format_bytes(peak)} | {format_bytes(whole)} ({whole / peak:.0%}) "
        f"| {format_bytes(chunked)} ({chunked / peak:.0%}) | {format_bytes(budget)} "
        f"| {what} | {format_bytes(step_peak)} ({step_peak / budget:.0%}) | {time_text} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="llama,gpt2", help="comma-separated model names")
    forms = ",".join([*LOOP_FORMS, TRAINER_FORM])
    parser.add_argument("--forms", default=forms, help="comma-separated forms of the loss")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps of each, per round")
    parser.add_argument("--tokens", type=int, default=2048, help="sequence length")
    parser.add_argument("--trainer-steps", type=int, default=5, help="Trainer steps of each run")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(
        "| model, form of the loss | plain peak | minimum, loss whole | minimum, loss in chunks "
        "| budget (50%) | plan | step peak | step time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, make in _models(args.tokens).items():
        if name not in args.only.split(","):
            continue
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, VOCAB, (1, args.tokens), generator=generator)
        for form in args.forms.split(","):
            torch.manual_seed(0)
            if form == TRAINER_FORM:
                row = _trainer_row(make, ids, args.trainer_steps)
            else:
                row = _loop_row(make().train(), form, ids, args.repeats)
            print(row.replace("| ", f"| {name}, ", 1), flush=True)


if __name__ == "__main__":
    main()
