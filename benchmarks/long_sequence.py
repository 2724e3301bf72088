"""Language models at one long sequence, where the logits are the floor: a Llama-style decoder
and GPT-2 (4 layers, width 256, vocabulary 32000; 1 x 2048 tokens; Hugging Face classes with
random weights, ``use_cache`` as their configs have it), planned with the loss run whole
(``allow_loss_chunks=False``) and with the head and the loss in chunks of positions. Prints a
Markdown table: the plain peak, each minimum, and at half the plain peak the plan, its step's
peak by the tests' own counter and its step time against the plain step's, timed side by side.

    python benchmarks/long_sequence.py [--only llama,gpt2] [--repeats N] [--tokens N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the oracle lives in the tests package

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
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


def _models(tokens: int) -> dict[str, Any]:
    import transformers

    def llama() -> nn.Module:
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=688,
            num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
            max_position_embeddings=tokens,
        )  # fmt: skip
        return LogitsOut(transformers.LlamaForCausalLM(config))

    def gpt2() -> nn.Module:
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=tokens,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        return LogitsOut(transformers.GPT2LMHeadModel(config))

    return {"llama": llama, "gpt2": gpt2}


def _minimum(model: nn.Module, inputs: Any, options: dict[str, Any]) -> int:
    try:
        autockpt.plan(model, inputs, 1, **options)
    except InfeasibleBudgetError as error:
        return error.minimum_bytes
    raise AssertionError("a one-byte budget was met")


def _step_s(model: nn.Module, plan: autockpt.Plan | None, batch: Any, repeats: int) -> float:
    """The median seconds of a forward and backward of ``model`` run by ``training_step``."""
    inputs, targets = batch
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        autockpt.training_step(model, plan, inputs, targets, next_token_loss)
        times.append(time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="llama,gpt2", help="comma-separated model names")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps of each, per round")
    parser.add_argument("--tokens", type=int, default=2048, help="sequence length")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(
        "| model | plain peak | minimum, loss whole | minimum, loss in chunks | budget (50%) "
        "| plan | step peak | step time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, make in _models(args.tokens).items():
        if name not in args.only.split(","):
            continue
        torch.manual_seed(0)
        model = make().train()
        generator = torch.Generator().manual_seed(0)
        inputs = (torch.randint(0, VOCAB, (1, args.tokens), generator=generator),)
        targets = (torch.randint(0, VOCAB, (1, args.tokens), generator=generator),)
        targets[0][0, : args.tokens // 8] = -100  # a prompt the loss ignores
        options: dict[str, Any] = dict(loss_fn=next_token_loss, example_targets=targets)
        plain = autockpt.plan(model, inputs, 10**12, **options)
        peak = plain.unplanned_peak_bytes
        whole = _minimum(model, inputs, {**options, "allow_loss_chunks": False})
        chunked = _minimum(model, inputs, options)
        budget = peak // 2
        plan = autockpt.plan(model, inputs, budget, **options)
        counted, _, _ = measured_step(
            model, inputs, plan, loss_fn=next_token_loss, targets=targets, loss_reduction="mean"
        )
        planned = autockpt.apply(model, plan)
        batch = (inputs, targets)
        # Side by side, alternating, so that the machine's load weighs on both alike.
        plain_s, planned_s = [], []
        for _ in range(3):
            plain_s.append(_step_s(model, None, batch, args.repeats))
            planned_s.append(_step_s(planned, plan, batch, args.repeats))
        ratio = statistics.median(planned_s) / statistics.median(plain_s)
        chunks = plan.loss_chunks
        what = f"{plan.num_recomputed} of {len(plan.segments)} recomputed, {plan.tracing}"
        if chunks is not None:
            what += f"; loss in {chunks.num_chunks} chunks"
        print(
            f"| {name} | {format_bytes(peak)} | {format_bytes(whole)} ({whole / peak:.0%}) "
            f"| {format_bytes(chunked)} ({chunked / peak:.0%}) | {format_bytes(budget)} "
            f"| {what} | {format_bytes(counted)} ({counted / budget:.0%}) | {ratio:.2f}x "
            f"(predicted {1 + plan.predicted_extra_s / plan.unplanned_step_s:.2f}x) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
