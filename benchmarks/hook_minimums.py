"""How low the forward-hook path goes: models planned with module-level segments.

For each model: the unplanned peak, the peak of ``use_gradient_checkpointing=True``, and the
planner's measured minimum (the refusal of a 1-byte budget) with recompute alone, with chunks
too, and with micro-batches too, each as a share of the unplanned peak (all on fake tensors,
or on a real copy where the forward reads tensor values). The rows:

- ``linear_chain``: six ``Linear`` + ``ReLU`` blocks, batch 4096, planned through hooks (the
  case where recomputing each block alone saves nothing; NOTE [Module spans]);
- the zoo's models that torch.fx cannot trace (``dict_batch``, ``own_loss_lm``);
- pytorch-forecasting's TFT at the TFT speed benchmark's shape (225 + 4 real inputs, encoder
  60), batches 16 and 64, when ``pytorch_forecasting`` is installed;
- a T5 from a small ``transformers`` config, when ``transformers`` is installed.

    python benchmarks/hook_minimums.py [--only linear_chain,pf_tft_16]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the zoo lives in the tests package

import autockpt  # noqa: E402
from autockpt.planner.measure.fake_step import default_loss  # noqa: E402
from benchmarks.tft_speed import bench_config, their_model  # noqa: E402
from tests.zoo import ZOO  # noqa: E402
from tft.model.loss import quantile_loss  # noqa: E402

MIB = 2**20

#: name -> (model, inputs, targets, loss_fn), or None when a package is missing.
Case = tuple[torch.nn.Module, tuple[Any, ...], tuple[Any, ...], Callable[..., torch.Tensor]]


def linear_chain() -> Case:
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(6)]
    model = torch.nn.Sequential(*blocks)
    return model, (torch.randn(4096, 64),), (), lambda out: out.pow(2).mean()


def zoo_case(name: str) -> Case:
    case = ZOO[name]
    torch.manual_seed(0)
    inputs, targets = case.batch(case.bench_batch_size)
    return case.build(), tuple(inputs), tuple(targets), case.loss_fn or default_loss


def pf_tft(batch_size: int) -> Case | None:
    config = bench_config().model_copy(update={"batch_size": batch_size})
    built = their_model(config)
    if built is None:
        return None
    model, batch, target = built

    def loss_fn(output: Any, target: torch.Tensor) -> torch.Tensor:
        return quantile_loss(output["prediction"], target, config.quantiles)

    return model, (batch,), (target,), loss_fn


def t5_small() -> Case | None:
    try:
        from transformers import T5Config, T5ForConditionalGeneration
    except ImportError:
        return None
    config = T5Config(
        vocab_size=512, d_model=128, d_kv=32, d_ff=512, num_layers=4, num_heads=4,
        decoder_start_token_id=0, dropout_rate=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config).train()
    ids = torch.randint(1, 512, (32, 128))
    labels = torch.randint(1, 512, (32, 32))

    def loss_fn(output: Any) -> torch.Tensor:
        return output.loss

    class WithLabels(torch.nn.Module):
        """The T5 called with keyword arguments, as its users call it."""

        def __init__(self) -> None:
            super().__init__()
            self.t5 = model

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
            return self.t5(input_ids=input_ids, labels=labels)

    return WithLabels(), (ids, labels), (), loss_fn


CASES: dict[str, Callable[[], Case | None]] = {
    "linear_chain": linear_chain,
    "dict_batch": lambda: zoo_case("dict_batch"),
    "own_loss_lm": lambda: zoo_case("own_loss_lm"),
    "pf_tft_16": lambda: pf_tft(16),
    "pf_tft_64": lambda: pf_tft(64),
    "t5_small": t5_small,
}


def _plan(case: Case, budget: int, **options: Any) -> autockpt.Plan:
    model, inputs, targets, loss_fn = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autockpt.plan(
            model,
            inputs,
            budget,
            loss_fn=loss_fn,
            example_targets=targets,
            tracing="forward-hooks",
            **options,
        )


def _minimum(case: Case, **options: Any) -> tuple[int, str]:
    try:
        _plan(case, 1, **options)
    except autockpt.InfeasibleBudgetError as error:
        return error.minimum_bytes, error.bound
    raise AssertionError("a 1-byte budget was met")


def row(name: str, case: Case) -> str:
    started = time.perf_counter()
    plain = _plan(case, 10**15)
    unplanned = plain.unplanned_peak_bytes
    forced = _plan(case, 10**15, use_gradient_checkpointing=True)
    alone, _ = _minimum(case, allow_chunks=False, allow_micro_batches=False)
    chunks, _ = _minimum(case, allow_micro_batches=False)
    everything, bound = _minimum(case)
    spans = sum(len(s.modules) > 1 for s in forced.segments)
    return (
        f"| {name} | {unplanned / MIB:.1f} | {len(plain.segments)} | "
        f"{forced.predicted_peak_bytes / unplanned:.0%} ({spans} spans) | "
        f"{alone / unplanned:.1%} | {chunks / unplanned:.1%} | {everything / unplanned:.1%} | "
        f"{bound} | {time.perf_counter() - started:.0f} s |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated rows (default: all)")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = [n for n in options.only.split(",") if n] or list(CASES)
    print(
        "| model | unplanned MiB | links | checkpoint all | minimum, recompute | + chunks "
        "| + micro-batches | what bounds it | time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        case = CASES[name]()
        if case is None:
            print(f"| {name} | skipped: its package is not installed |  |  |  |  |  |  |  |")
            continue
        print(row(name, case), flush=True)


if __name__ == "__main__":
    main()
