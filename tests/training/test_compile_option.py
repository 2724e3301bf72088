"""``autockpt train --compile``: the option reaches the config, and the trainer's steps compile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autockpt.cli import main
from autockpt.cli.parser import build_parser, overrides
from autockpt.training.config import TrainConfig
from autockpt.training.runs import RunFolder
from autockpt.training.settings import SAMPLE_DATA

RUN = [
    *("--preset", "tiny", "--quiet", "--epochs", "1", "--max-steps-per-epoch", "2"),
    *("--seed", "5", "--dropout", "0", "--use-gradient-checkpointing"),
]


def test_compile_flag_reaches_the_config() -> None:
    args = build_parser().parse_args(["train", "--compile"])
    assert TrainConfig(**overrides(args)).compile is True
    args = build_parser().parse_args(["train"])
    assert TrainConfig(**overrides(args)).compile is False


def _losses(out: Path) -> list[float]:
    return [r["loss"] for r in RunFolder(out).read_metrics() if r["kind"] == "step"]


@pytest.mark.slow
def test_a_compiled_run_compiles_its_steps_and_keeps_the_losses(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    assert main(["train", str(SAMPLE_DATA), *RUN, "--out", str(tmp_path / "eager")]) == 0
    torch._dynamo.reset()
    counters.clear()
    compiled_out = tmp_path / "compiled"
    assert main(["train", str(SAMPLE_DATA), *RUN, "--compile", "--out", str(compiled_out)]) == 0
    assert counters["stats"]["unique_graphs"] > 0, "the planned steps went through torch.compile"
    eager, compiled = _losses(tmp_path / "eager"), _losses(compiled_out)
    assert len(eager) == 2
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-6)
