"""``transformers.Trainer`` on two ranks (``torchrun``, gloo on the CPU) under
``autockpt.hf.MemoryPlan``: rank 0 plans and every rank takes its plan, every rank's steps
counted under the budget by the tests' own counter, with the plain two-rank run's losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("accelerate", reason="the hf extra is not installed")

RANKS_RUN = """
import hashlib, json, sys, tempfile
import torch, transformers
from tests.hf.test_trainer_callback import BATCH, EveryStepPeak, _gpt2, _gpt2_data
from autockpt.hf import MemoryPlan

def run(callbacks):
    torch.manual_seed(0)
    model = _gpt2()
    counter = EveryStepPeak()
    counter.watch(model)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, use_cpu=True, per_device_train_batch_size=BATCH, max_steps=4,
            learning_rate=1e-3, seed=0, report_to=[], save_strategy="no",
            logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
            ddp_backend="gloo",
        )
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=_gpt2_data(), callbacks=[*callbacks, counter]
        )
        trainer.train()
    return counter

if __name__ == "__main__":
    plain = run([])
    # One budget on every rank: half the smaller of the ranks' plain peaks.
    budget = torch.tensor(max(plain.peaks[1:]) // 2)
    torch.distributed.all_reduce(budget, op=torch.distributed.ReduceOp.MIN)
    memory_plan = MemoryPlan(int(budget), allow_chunks=False, show=False)
    planned = run([memory_plan])
    plan = memory_plan.plan
    print("RESULT " + json.dumps({
        "rank": torch.distributed.get_rank(),
        "budget": int(budget),
        "peaks": planned.peaks,
        "losses": planned.losses,
        "plain_losses": plain.losses,
        "recomputed": plan.num_recomputed,
        "plan": hashlib.sha256(plan.model_dump_json().encode()).hexdigest(),
    }), flush=True)
"""


@pytest.mark.slow
def test_two_ranks_take_rank_zeros_plan_and_step_under_the_budget(tmp_path: Path) -> None:
    script = tmp_path / "ranks_run.py"
    script.write_text(RANKS_RUN)
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # The two ranks print at once: one rank's line can run into the other's.
    decoder = json.JSONDecoder()
    results = [decoder.raw_decode(part)[0] for part in done.stdout.split("RESULT ")[1:]]
    assert sorted(result["rank"] for result in results) == [0, 1]
    assert len({result["plan"] for result in results}) == 1  # one plan, rank 0's
    for result in results:
        assert result["recomputed"] > 0
        assert len(result["peaks"]) == 4
        assert max(result["peaks"]) <= result["budget"], result
        assert len(result["losses"]) == 4
        for got, want in zip(result["losses"], result["plain_losses"], strict=True):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
