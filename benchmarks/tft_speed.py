"""Time one TFT training step (forward + backward) on the CPU, ours against pytorch-forecasting's.

Shape: 225 observed + 4 known real inputs, hidden 64, 4 heads, variable hidden 8, encoder 60,
horizon 10, batch 32, dropout on, 2 CPU threads. When ``pytorch_forecasting`` is importable its
TemporalFusionTransformer is built at the same shape and the two are timed alternately in the same
run, so both see the same machine load; the ratio is the number to read. It is not a dependency of
autockpt: ``pip install pytorch-forecasting`` (check with ``--dry-run`` that it keeps your torch).

    python benchmarks/tft_speed.py [--steps 9] [--threads 2]

Load averages are printed because another busy process on the same cores inflates every number.
The user and system CPU time per step are printed too: system time is mostly the kernel zeroing
freshly mapped pages, which every tensor above glibc's 32 MB mmap threshold costs on each step.
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

from tft.config import TFTConfig, get_preset
from tft.loss import quantile_loss
from tft.model import TemporalFusionTransformer

Step = Callable[[], None]


def bench_config() -> TFTConfig:
    """The benchmark shape: the tft-225 preset with a 60-step encoder."""
    return get_preset("tft-225", encoder_length=60, batch_size=32)


def our_step(config: TFTConfig) -> Step:
    model = TemporalFusionTransformer(config).train()
    generator = torch.Generator().manual_seed(0)
    inputs = model.example_inputs(config.batch_size, generator=generator)
    target = torch.randn(config.batch_size, config.horizon, generator=generator)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        quantile_loss(model(*inputs), target, config.quantiles).backward()

    return step


def their_step(config: TFTConfig) -> Step | None:
    """pytorch-forecasting's TFT at ``config``'s shape, or None when it is not installed."""
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

    def step() -> None:
        model.zero_grad(set_to_none=True)
        prediction = model(batch_dict)["prediction"]
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


def _keep_freed_memory() -> None:
    """Stop glibc from serving large blocks with fresh mmap pages.

    Tensors over glibc's mmap threshold (32 MiB at most) are mapped afresh and zeroed by the
    kernel on every allocation: on a 2-core machine that was about half of our TFT's step
    (system time), because its variable selection tensors are about 100 MB each.
    """
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # from malloc.h
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, (1 << 31) - 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Time one TFT training step on the CPU, ours against pytorch-forecasting's."
    )
    parser.add_argument("--steps", type=int, default=9, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="tell glibc's malloc to reuse freed blocks instead of returning them to the "
        "kernel (both models run in this process, so both get it)",
    )
    args = parser.parse_args(argv)
    if args.keep_freed_memory:
        _keep_freed_memory()

    torch.set_num_threads(args.threads)
    config = bench_config()
    steps: dict[str, Step] = {"ours": our_step(config)}
    theirs = their_step(config)
    if theirs is not None:
        steps["pytorch-forecasting"] = theirs
    print(
        f"TFT forward+backward: {config.num_observed} observed + {config.num_known} known inputs, "
        f"hidden {config.hidden_size}, {config.num_heads} heads, variable hidden "
        f"{config.variable_hidden_size}, encoder {config.encoder_length}, horizon "
        f"{config.horizon}, batch {config.batch_size}, {args.threads} CPU threads, "
        f"torch {torch.__version__}"
    )
    print(f"load average before: {_load()}")
    for step in steps.values():
        for _ in range(args.warmup):
            step()
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
            f"{name:>20}: median {medians[name] * 1e3:7.1f} ms  (min {min(walls) * 1e3:.1f}, "
            f"max {max(walls) * 1e3:.1f}, {len(walls)} steps; CPU per step: user "
            f"{user_ms:.0f} ms, system {system_ms:.0f} ms)"
        )
    if theirs is None:
        print(
            "pytorch-forecasting comparison skipped: the package is not installed "
            "(pip install pytorch-forecasting; check with --dry-run that it keeps your torch)"
        )
    else:
        ratio = medians["pytorch-forecasting"] / medians["ours"]
        print(f"{'ratio':>20}: pytorch-forecasting / ours = {ratio:.2f}")


if __name__ == "__main__":
    main()
