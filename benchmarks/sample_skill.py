"""What can be learned from the bundled sample: the model's, the naive forecasts' and an
oracle's validation loss per horizon step, and the skills over the better naive forecast.

The oracle (NOTE [Planted order flow] in ``tft/synthetic/planted.py``) knows what the generator planted:
each bar's true volatility and the latent order flow. It is scored on exactly the validation
windows the trainer scores, in the same normalised units, with the same pinball loss, beside the
same naive forecasts (``autockpt.training.forecasts.evaluate.ForecastScores``). The model is trained the
way ``autockpt demo`` trains it (the same defaults, ``--quiet``), its numbers read from the run's
metrics.

    python benchmarks/sample_skill.py [--days 15 --symbols ES,NQ --seed 7] [--no-train]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autockpt.cli import main  # noqa: E402
from autockpt.training.forecasts.evaluate import Evaluation, ForecastScores  # noqa: E402
from autockpt.training.forecasts.interpret import interpret  # noqa: E402
from autockpt.training.options.config import TrainConfig  # noqa: E402
from autockpt.training.options.settings import SAMPLE_DATA  # noqa: E402
from autockpt.training.setup.prepare import Setup, prepare  # noqa: E402
from autockpt.training.setup.runs import RunFolder  # noqa: E402
from tft.synthetic.bars import planted_truth  # noqa: E402
from tft.synthetic.planted import oracle_quantiles  # noqa: E402


def file_rows(setup: Setup, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """For every kept row of the windows' row arrays, its row in the file; and every file
    row's log return (NaN at each symbol's first row)."""
    table = pq.read_table(path, columns=["timestamp", "symbol", "close"])
    times = table["timestamp"].cast("int64").to_numpy()
    symbols = table["symbol"].to_numpy(zero_copy_only=False)
    close = table["close"].to_numpy()
    log_returns = np.full(len(close), np.nan)
    rows = setup.data.whole.rows
    kept = np.empty(len(rows.time_ns), dtype=np.int64)
    for index, name in enumerate(setup.data.symbols):
        where = np.flatnonzero(symbols == name)
        log_returns[where[1:]] = np.diff(np.log(close[where]))
        mine = np.flatnonzero(rows.symbol_index == index)
        kept[mine] = where[np.searchsorted(times[where], rows.time_ns[mine])]
    return kept, log_returns


def oracle_evaluation(setup: Setup, path: Path, days: int, symbols: list[str], seed: int):
    """The oracle's scores on the validation windows, beside the naive forecasts'."""
    truth = planted_truth(days=days, symbols=symbols, seed=seed)
    kept, log_returns = file_rows(setup, path)
    data = setup.data
    last_encoder = data.encoder_length - 1
    levels = np.asarray(setup.model_config.quantiles)
    fit_origins = kept[data.train.starts + last_encoder]
    target = data.normalizer.target
    mean, std = np.asarray(target.mean), np.asarray(target.std)
    scores = ForecastScores(
        setup.naive_forecasts,
        setup.loss_fn,
        setup.model_config.quantiles,
        target.std,
        data.horizon,
        torch.device("cpu"),
    )
    validation = data.validation
    for first in range(0, len(validation), 4096):
        indices = np.arange(first, min(first + 4096, len(validation)))
        batch = validation.batch(indices)
        origins = kept[validation.starts[indices] + last_encoder]
        raw = oracle_quantiles(truth, log_returns, fit_origins, origins, data.horizon, levels)
        symbol = batch.symbol_index.numpy()
        normalised = (raw - mean[symbol][:, None, None]) / std[symbol][:, None, None]
        scores.add(torch.tensor(normalised, dtype=torch.float32), batch)
    return scores.evaluation()


def _skills(evaluation: Evaluation) -> list[float | None]:
    return evaluation.skill_by_step


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=SAMPLE_DATA)
    parser.add_argument("--days", type=int, default=15)
    parser.add_argument("--symbols", default="ES,NQ")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-train", action="store_true", help="the oracle and naive only")
    parser.add_argument("--demo-args", default="", help="extra arguments for autockpt demo")
    args = parser.parse_args()
    torch.manual_seed(0)
    setup = prepare(TrainConfig(data=args.data, preset="tiny", device="cpu"))
    oracle = oracle_evaluation(setup, args.data, args.days, args.symbols.split(","), args.seed)
    model_steps: list[float] = []
    model_skill: list[float | None] = []
    if not args.no_train:
        out = Path(tempfile.mkdtemp(prefix="sample-skill-")) / "run"
        demo = ["demo", "--quiet", "--out", str(out), *args.demo_args.split()]
        if main(demo) != 0:
            raise SystemExit("autockpt demo failed")
        epochs = [r for r in RunFolder(out).read_metrics() if r["kind"] == "epoch"]
        best = min(epochs, key=lambda r: r["val_loss"])
        model_steps, model_skill = best["val_loss_by_step"], best["val_skill_by_step"]
        ranked = list(interpret(out, args.data, device="cpu").encoder.items())[:4]
        print("interpret, past inputs first:", ", ".join(f"{n} {w:.3f}" for n, w in ranked))
    naive = oracle.naive
    print(f"validation windows: {oracle.num_windows}")
    header = "step  model   no change  quantiles  oracle  | skill: model  oracle"
    print(header)
    for h in range(setup.data.horizon):
        model = f"{model_steps[h]:.4f}" if model_steps else "  -   "
        skill = model_skill[h] if model_skill else None
        print(
            f"{h + 1:>4}  {model}  {naive['no_change'].loss_by_step[h]:.4f}     "
            f"{naive['quantiles'].loss_by_step[h]:.4f}     {oracle.model.loss_by_step[h]:.4f}"
            f"  |  {'-' if skill is None else f'{skill:+.1%}':>7}  "
            f"{_skills(oracle)[h]:+.1%}"
        )
    print(
        json.dumps(
            {
                "oracle_loss_by_step": oracle.model.loss_by_step,
                "oracle_skill_by_step": _skills(oracle),
                "naive_loss_by_step": {k: v.loss_by_step for k, v in naive.items()},
                "model_loss_by_step": model_steps,
                "model_skill_by_step": model_skill,
            }
        )
    )


if __name__ == "__main__":
    main_()
