"""Time one TFT training step (forward + backward) on the CPU, ours against pytorch-forecasting's.

Shape: 225 observed + 4 known real inputs, hidden 64, 4 heads, variable hidden 8, encoder 60,
horizon 10, batch 32, dropout on, 2 CPU threads. When ``pytorch_forecasting`` is importable its
TemporalFusionTransformer is built at the same shape and the two are timed alternately in the same
run, so both see the same machine load; the ratio is the number to read. It is not a dependency of
autockpt: ``pip install pytorch-forecasting`` (check with ``--dry-run`` that it keeps your torch).

    python benchmarks/tft_speed.py [--steps 9] [--threads 2] [--compile]

The process keeps freed memory for reuse, as ``autockpt train`` does on the CPU (NOTE [Tuning the
host process] in ``autockpt/training/host/host_tuning.py``); ``--fresh-pages`` leaves glibc's malloc as
it is, so that every tensor above its mmap threshold (32 MiB at most) is mapped and zeroed afresh
on every step. Both models run in this process, so both get the same setting.

``--compile`` also times each model through ``torch.compile`` (the first call compiles, which
takes minutes on a 2-core machine and is not timed), and prints the ratio of each model's best
mode beside the eager-against-eager one. pytorch-forecasting's model is compiled only with
``--compile-theirs``: its forward loops over every input variable in Python, so its graph is
hundreds of GRNs long.

Load averages are printed because another busy process on the same cores inflates every number.
The user and system CPU time per step are printed too: system time is mostly the kernel zeroing
freshly mapped pages.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from autockpt.training.host.host_tuning import keep_freed_memory
from tft.model.config import TFTConfig, get_preset
from tft.model.loss import quantile_loss
from tft.model.transformer import TemporalFusionTransformer

Step = Callable[[], None]


def bench_config() -> TFTConfig:
    """The benchmark shape: the tft-225 preset with a 60-step encoder."""
    return get_preset("tft-225", encoder_length=60, batch_size=32)


def our_step(config: TFTConfig, *, compiled: bool = False) -> Step:
    torch.manual_seed(0)
    model = TemporalFusionTransformer(config).train()
    run = torch.compile(model) if compiled else model
    generator = torch.Generator().manual_seed(0)
    inputs = model.example_inputs(config.batch_size, generator=generator)
    target = torch.randn(config.batch_size, config.horizon, generator=generator)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        quantile_loss(run(*inputs), target, config.quantiles).backward()

    return step


def their_model(
    config: TFTConfig,
) -> tuple[torch.nn.Module, dict[str, torch.Tensor], torch.Tensor] | None:
    """pytorch-forecasting's TFT at ``config``'s shape in training mode, a batch dict for it
    and a target; None when it is not installed."""
    try:
        from pytorch_forecasting import TemporalFusionTransformer as TheirTFT
        from pytorch_forecasting.data.encoders import TorchNormalizer
        from pytorch_forecasting.metrics import QuantileLoss
    except ImportError:
        return None
    observed = [f"observed_{i}" for i in range(config.num_observed)]
    known = [f"known_{i}" for i in range(config.num_known)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TheirTFT(
            hidden_size=config.hidden_size,
            attention_head_size=config.num_heads,
            hidden_continuous_size=config.variable_hidden_size,
            lstm_layers=config.num_lstm_layers,
            dropout=config.dropout,
            output_size=config.num_quantiles,
            loss=QuantileLoss(list(config.quantiles)),
            max_encoder_length=config.encoder_length,
            static_categoricals=[],
            static_reals=[],
            time_varying_categoricals_encoder=[],
            time_varying_categoricals_decoder=[],
            time_varying_reals_encoder=observed + known,
            time_varying_reals_decoder=known,
            x_reals=observed + known,
            x_categoricals=[],
            embedding_sizes={},
            embedding_labels={},
            embedding_paddings=[],
            categorical_groups={},
            output_transformer=TorchNormalizer(method="identity", center=False),
        ).train()
    batch, num_reals = config.batch_size, config.num_observed + config.num_known
    generator = torch.Generator().manual_seed(0)
    batch_dict = {
        "encoder_cat": torch.zeros(batch, config.encoder_length, 0, dtype=torch.long),
        "decoder_cat": torch.zeros(batch, config.horizon, 0, dtype=torch.long),
        "encoder_cont": torch.randn(batch, config.encoder_length, num_reals, generator=generator),
        "decoder_cont": torch.randn(batch, config.horizon, num_reals, generator=generator),
        "encoder_lengths": torch.full((batch,), config.encoder_length),
        "decoder_lengths": torch.full((batch,), config.horizon),
        "target_scale": torch.ones(batch, 2),
    }
    target = torch.randn(batch, config.horizon, generator=generator)
    return model, batch_dict, target


def their_step(config: TFTConfig, *, compiled: bool = False) -> Step | None:
    """A training step of pytorch-forecasting's TFT, or None when it is not installed."""
    built = their_model(config)
    if built is None:
        return None
    model, batch_dict, target = built
    run = torch.compile(model) if compiled else model

    def step() -> None:
        model.zero_grad(set_to_none=True)
        prediction = run(batch_dict)["prediction"]
        quantile_loss(prediction, target, config.quantiles).backward()

    return step


def _measure(step: Step) -> tuple[float, float, float]:
    """Wall, user CPU and system CPU seconds of one step."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    step()
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return wall_s, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def _load() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Time one TFT training step on the CPU, ours against pytorch-forecasting's."
    )
    parser.add_argument("--steps", type=int, default=9, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--fresh-pages",
        action="store_true",
        help="leave glibc's malloc as it is instead of keeping freed memory as the trainer does",
    )
    parser.add_argument("--compile", action="store_true", help="also time ours compiled")
    parser.add_argument(
        "--compile-theirs", action="store_true", help="also time pytorch-forecasting's compiled"
    )
    args = parser.parse_args(argv)
    kept = not args.fresh_pages and keep_freed_memory()

    torch.set_num_threads(args.threads)
    config = bench_config()
    steps: dict[str, Step] = {"ours": our_step(config)}
    if args.compile:
        steps["ours, compiled"] = our_step(config, compiled=True)
    theirs = their_step(config)
    if theirs is not None:
        steps["pytorch-forecasting"] = theirs
        compiled_theirs = their_step(config, compiled=True) if args.compile_theirs else None
        if compiled_theirs is not None:
            steps["pytorch-forecasting, compiled"] = compiled_theirs
    print(
        f"TFT forward+backward: {config.num_observed} observed + {config.num_known} known inputs, "
        f"hidden {config.hidden_size}, {config.num_heads} heads, variable hidden "
        f"{config.variable_hidden_size}, encoder {config.encoder_length}, horizon "
        f"{config.horizon}, batch {config.batch_size}, {args.threads} CPU threads, "
        f"torch {torch.__version__}, freed memory {'kept' if kept else 'returned (fresh pages)'}"
    )
    print(f"load average before: {_load()}")
    for name, step in steps.items():
        started = time.perf_counter()
        for _ in range(args.warmup):
            step()
        print(f"{name:>30}: {args.warmup} warm-up steps took {time.perf_counter() - started:.1f} s")
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in steps}
    for _ in range(args.steps):
        for name, step in steps.items():
            times[name].append(_measure(step))
    print(f"load average after:  {_load()}")
    medians = {name: statistics.median(t[0] for t in values) for name, values in times.items()}
    for name, values in times.items():
        walls = [t[0] for t in values]
        user_ms = statistics.median(t[1] for t in values) * 1e3
        system_ms = statistics.median(t[2] for t in values) * 1e3
        print(
            f"{name:>30}: median {medians[name] * 1e3:7.1f} ms  (min {min(walls) * 1e3:.1f}, "
            f"max {max(walls) * 1e3:.1f}, {len(walls)} steps; CPU per step: user "
            f"{user_ms:.0f} ms, system {system_ms:.0f} ms)"
        )
    if theirs is None:
        print(
            "pytorch-forecasting comparison skipped: the package is not installed "
            "(pip install pytorch-forecasting; check with --dry-run that it keeps your torch)"
        )
        return
    ratio = medians["pytorch-forecasting"] / medians["ours"]
    print(f"{'ratio, eager':>30}: pytorch-forecasting / ours = {ratio:.2f}")
    if len(steps) > 2:
        ours_best = min(value for name, value in medians.items() if name.startswith("ours"))
        theirs_best = min(
            value for name, value in medians.items() if name.startswith("pytorch-forecasting")
        )
        print(
            f"{'ratio, best modes':>30}: pytorch-forecasting / ours = {theirs_best / ours_best:.2f}"
        )


if __name__ == "__main__":
    main()
