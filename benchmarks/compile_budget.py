"""torch.compile's own activation memory budget against the planner, compiled, side by side.

For the bundled TFT and two zoo models (``nanogpt``, ``resnet_batchnorm`` by default), each in
its own copy of the model (same weights) with AdamW, in one process:

* ``eager``: the plain model, not compiled (the planner's prediction is checked against it);
* ``compile 1``: ``torch.compile`` (inductor), the default partition;
* ``compile 0.5`` / ``compile 0.25``: the same with
  ``torch._functorch.config.activation_memory_budget`` at 0.5 and 0.25;
* ``planned ~ compile B``: ``autockpt.plan`` at the peak ``compile B`` measured, applied, then
  compiled as ``compile 1`` is. Compiled, a plan's step does not peak where the planner's
  eager prediction says (inductor fuses and frees on its own schedule), so when the compiled
  planned step peaks above its target it is planned again at a budget lowered by the overshoot
  (up to ``--attempts`` plans); the row is the last plan tried;
* ``compile-aware ~ compile B``: ``autockpt.plan(..., compile=True)`` at the peak ``compile B``
  measured (NOTE [Compiled plans]), applied (``apply`` compiles it), measured like the others;
  ``compile-aware at 60% of compile 1`` the same at 60% of the plain compiled peak.

Memory is the peak of one step (gradients set to None, forward, loss, backward, AdamW step)
from the profiler's memory events: they come from the allocator, so they see inductor's
buffers, which the dispatcher never hands out. The bytes resident when the step starts
(parameters, buffers, AdamW state, the batch) are added, so the peaks are in the planner's
terms (the budget counts everything the step holds). Time is the median over ``--runs`` runs
of each run's median over ``--steps`` steps; the strategies take turns, the order rotating
every round, so all see the same machine load.

On CUDA (``--device cuda``) the peak is the allocator's own count instead (the most bytes its
tensors held plus what it reserved beyond them, as the compiled search counts it) and every
timed step ends with a synchronise.

    python benchmarks/compile_budget.py [--only tft,nanogpt] [--runs 3] [--steps 5]
    python benchmarks/compile_budget.py --device cuda --only tft,nanogpt
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch.utils._pytree import tree_map

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the zoo lives in the tests package

from zoo import what_it_does  # noqa: E402

import autockpt  # noqa: E402
from autockpt.planner.measure.allocator_peak import (  # noqa: E402
    allocator_peak_bytes,
    resident_bytes,
)
from autockpt.planner.measure.fake_step import default_loss  # noqa: E402
from autockpt.planner.runtime.compiled_backend import inductor_at  # noqa: E402
from tests.zoo import ZOO  # noqa: E402
from tests.zoo.tft_like import tft_batch, tft_loss  # noqa: E402
from tft.model.config import get_preset  # noqa: E402
from tft.model.transformer import TemporalFusionTransformer  # noqa: E402

MIB = 2**20
#: torch.compile's activation memory budgets compared.
COMPILE_BUDGETS = (0.5, 0.25)


@dataclass
class Workload:
    """One model with its batch and loss, as the zoo describes them."""

    name: str
    model: torch.nn.Module
    inputs: tuple[Any, ...]
    targets: tuple[Any, ...]
    loss_fn: Callable[..., torch.Tensor]
    loss_reduction: Literal["mean", "sum"]
    device: torch.device

    def sync(self) -> None:
        """Wait for the device's queued kernels (a CUDA step returns before they have run)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _on(device: torch.device, value: Any) -> Any:
    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def tft_workload(preset: str, batch_size: int, device: torch.device) -> Workload:
    config = get_preset(preset, batch_size=batch_size, dropout=0.1)
    torch.manual_seed(0)
    inputs, targets = _on(device, tft_batch(config, batch_size))
    model = TemporalFusionTransformer(config).to(device)
    return Workload(f"tft {preset}", model, inputs, targets, tft_loss, "sum", device)


def zoo_workload(name: str, device: torch.device) -> Workload:
    case = ZOO[name]
    inputs, targets = _on(device, case.batch(case.bench_batch_size))
    loss_fn = case.loss_fn or default_loss
    model = case.build().to(device)
    return Workload(name, model, inputs, targets, loss_fn, case.loss_reduction, device)


@dataclass
class Strategy:
    """One way to run the step: its copy of the model, what it calls, what was measured."""

    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    runner: torch.nn.Module
    plan: autockpt.Plan | None = None
    peak_bytes: int | None = None
    compile_s: float | None = None
    step_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def step(self, work: Workload) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        autockpt.training_step(
            self.runner,
            self.plan,
            work.inputs,
            work.targets,
            work.loss_fn,
            loss_reduction=work.loss_reduction,
        )
        self.optimizer.step()


def _fresh_copy(work: Workload) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A copy of the model and its AdamW with its state made (as it is once training runs)."""
    model = copy.deepcopy(work.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # a zero learning rate: the state exists, the weights stay
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def measured(strategy: Strategy, work: Workload) -> Strategy:
    """The strategy after a first step (where compiling happens) and its profiled peak."""
    started = time.perf_counter()
    strategy.step(work)
    work.sync()
    strategy.compile_s = time.perf_counter() - started
    # Counted from a step's start with no gradients held, as the trainer's steps start: the
    # profiler does not report freeing a block allocated before it started, so gradients
    # counted as resident and then freed by the step's zero_grad would count twice.
    strategy.optimizer.zero_grad(set_to_none=True)
    batch = (*work.inputs, *work.targets)
    strategy.peak_bytes = resident_bytes(
        strategy.model, strategy.optimizer, batch
    ) + allocator_peak_bytes(lambda: strategy.step(work), work.device)
    return strategy


def compiled(work: Workload, name: str, budget: float, plan: autockpt.Plan | None) -> Strategy:
    model, optimizer = _fresh_copy(work)
    runner = autockpt.apply(model, plan) if plan is not None else model
    compiled_runner = cast(torch.nn.Module, torch.compile(runner, backend=inductor_at(budget)))
    return measured(Strategy(name, model, optimizer, compiled_runner, plan), work)


def plan_at(work: Workload, budget_bytes: int) -> autockpt.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return autockpt.plan(
            work.model,
            work.inputs,
            budget_bytes,
            loss_fn=work.loss_fn,
            example_targets=work.targets,
        )


def planned_to_match(work: Workload, target: Strategy, attempts: int) -> Strategy | None:
    """The planned model, compiled, at a budget whose compiled peak is at most ``target``'s."""
    assert target.peak_bytes is not None
    budget = target.peak_bytes
    tried: list[str] = []
    strategy = None
    for _ in range(attempts):
        try:
            plan = plan_at(work, budget)
        except autockpt.InfeasibleBudgetError as error:
            tried.append(
                f"{budget / MIB:.2f} MiB refused (minimum {error.minimum_bytes / MIB:.2f})"
            )
            break
        strategy = compiled(work, f"planned ~ {target.name}", 1.0, plan)
        assert strategy.peak_bytes is not None
        tried.append(
            f"{budget / MIB:.2f} MiB -> predicted {plan.predicted_peak_bytes / MIB:.2f}, "
            f"compiled {strategy.peak_bytes / MIB:.2f}"
        )
        if strategy.peak_bytes <= target.peak_bytes:
            break
        budget = int(budget * target.peak_bytes / strategy.peak_bytes) - 1
    if strategy is not None:
        strategy.notes.append("; ".join(tried))
    else:
        print(f"  {work.name}: no plan for {target.name}: {'; '.join(tried)}", flush=True)
    return strategy


def compile_aware(work: Workload, target: Strategy | float, name: str) -> Strategy | None:
    """``autockpt.plan(..., compile=True)`` at ``target``'s peak (or at a byte count), applied
    to a fresh copy (which ``apply`` compiles) and measured like the others."""
    budget = target if isinstance(target, float) else target.peak_bytes
    assert budget is not None
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = autockpt.plan(
                work.model,
                work.inputs,
                int(budget),
                loss_fn=work.loss_fn,
                example_targets=work.targets,
                compile=True,
            )
    except autockpt.InfeasibleBudgetError as error:
        print(f"  {work.name}: {name}: refused: {error}", flush=True)
        return None
    search_s = time.perf_counter() - started
    model, optimizer = _fresh_copy(work)
    strategy = measured(Strategy(name, model, optimizer, autockpt.apply(model, plan), plan), work)
    chosen = next(note for note in plan.notes if note.startswith("chosen:"))
    search = next(note for note in plan.notes if note.startswith("compiled search:"))
    strategy.notes.append(
        f"{chosen}, measured {plan.predicted_peak_bytes / MIB:.2f} MiB in the search, "
        f"{search.split(':')[1].split('(')[0].strip()}, planning {search_s:.0f} s in all"
    )
    return strategy


def time_round_robin(strategies: Sequence[Strategy], work: Workload, runs: int, steps: int) -> None:
    """Each run: every strategy ``steps`` steps in turn (the order rotating), its median kept."""
    for run in range(runs):
        order = list(strategies[run % len(strategies) :]) + list(
            strategies[: run % len(strategies)]
        )
        per_step: dict[str, list[float]] = {s.name: [] for s in strategies}
        for _ in range(steps):
            for strategy in order:
                work.sync()
                started = time.perf_counter()
                strategy.step(work)
                work.sync()
                per_step[strategy.name].append(time.perf_counter() - started)
        for strategy in strategies:
            strategy.step_s.append(statistics.median(per_step[strategy.name]))


def one_model(work: Workload, runs: int, steps: int, attempts: int) -> list[str]:
    torch._dynamo.reset()
    started = time.perf_counter()
    model, optimizer = _fresh_copy(work)
    eager = measured(Strategy("eager", model, optimizer, model), work)
    predicted = plan_at(work, 10**15).predicted_peak_bytes
    eager.notes.append(f"planner predicted {predicted / MIB:.2f} MiB unplanned")
    strategies = [eager, compiled(work, "compile 1", 1.0, None)]
    for budget in COMPILE_BUDGETS:
        own = compiled(work, f"compile {budget:g}", budget, None)
        strategies.append(own)
        matched = planned_to_match(work, own, attempts)
        if matched is not None:
            strategies.append(matched)
        aware = compile_aware(work, own, f"compile-aware ~ {own.name}")
        if aware is not None:
            strategies.append(aware)
    plain_compiled = strategies[1].peak_bytes
    assert plain_compiled is not None
    aware = compile_aware(work, 0.6 * plain_compiled, "compile-aware at 60% of compile 1")
    if aware is not None:
        strategies.append(aware)
    print(
        f"  {work.name}: compiled and planned in {time.perf_counter() - started:.0f} s", flush=True
    )
    # The compiled search resets dynamo, so the strategies compiled before it compile again:
    # here, not inside the timed rounds.
    for strategy in strategies:
        strategy.step(work)
    time_round_robin(strategies, work, runs, steps)
    base = strategies[1]
    assert base.peak_bytes is not None
    rows = []
    for strategy in strategies:
        assert strategy.peak_bytes is not None
        step_ms = statistics.median(strategy.step_s) * 1e3
        ratio = statistics.median(strategy.step_s) / statistics.median(base.step_s)
        rows.append(
            f"| {work.name} | {strategy.name} | {strategy.peak_bytes / MIB:.2f} "
            f"| {strategy.peak_bytes / base.peak_bytes:.0%} | {step_ms:.1f} | {ratio:.2f}x "
            f"| {strategy.compile_s:.0f} | {what_it_does(strategy.plan) if strategy.plan else ''} "
            f"| {'; '.join(strategy.notes)} |"
        )
    return rows


def workloads(
    names: Sequence[str], tft_preset: str, tft_batch_size: int, device: torch.device
) -> list[Workload]:
    return [
        tft_workload(tft_preset, tft_batch_size, device)
        if name == "tft"
        else zoo_workload(name, device)
        for name in names
    ]


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="tft,nanogpt,resnet_batchnorm")
    parser.add_argument("--tft-preset", default="tiny")
    parser.add_argument("--tft-batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available; run without it (the CPU)")
    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = 64  # several copies of one model class, compiled
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name != "tft" and name not in ZOO]
    if unknown:
        parser.error(f"--only {','.join(unknown)}: not a zoo model (or 'tft')")
    print(
        f"torch {torch.__version__} on {_device_name(device)}, {args.threads} thread(s), medians of {args.runs} runs "
        f"of {args.steps} steps",
        flush=True,
    )
    rows = [
        "| model | strategy | peak MiB | of compile 1 | step ms | vs compile 1 | first step s "
        "| plan | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for work in workloads(names, args.tft_preset, args.tft_batch_size, device):
        rows += one_model(work, args.runs, args.steps, args.attempts)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
