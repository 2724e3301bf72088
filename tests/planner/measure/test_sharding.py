"""Per-rank accounting: exact bytes on a hand-computable model, and the shards of a real run."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

import autockpt
from autockpt.errors import InfeasibleBudgetError
from autockpt.planner.measure.sharding import (
    ROOT_UNIT,
    fsdp_unit_paths,
    parameter_layouts,
    rank_share,
)
from autockpt.planner.plan_types import Plan


class Block(nn.Module):
    """A Linear and a raw scale parameter (read by the graph directly: the root unit's)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 7)  # weight (7, 10) 280 B, bias (7,) 28 B
        self.scale = nn.Parameter(torch.ones(7))  # 28 B

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * self.scale  # (B, 7)


class Net(nn.Module):
    """432 parameter bytes in three FSDP units: block.fc, head, and the root (block.scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(7, 3)  # weight (3, 7) 84 B, bias (3,) 12 B

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))  # (B, 3)


def net_share(world_size: int, parallelism: str = "fsdp"):  # type: ignore[no-untyped-def]
    model = Net()
    layouts = parameter_layouts(model, optimizer="adamw", unit_paths=fsdp_unit_paths(model))
    return rank_share(layouts, world_size=world_size, parallelism=parallelism)  # type: ignore[arg-type]


def test_units_are_the_called_leaves_and_the_rest_is_the_root() -> None:
    model = Net()
    assert fsdp_unit_paths(model) == ["block.fc", "head"]
    layouts = parameter_layouts(model, unit_paths=fsdp_unit_paths(model))
    units = {layout.name: layout.unit for layout in layouts}
    assert units == {
        "block.fc.weight": "block.fc",
        "block.fc.bias": "block.fc",
        "block.scale": ROOT_UNIT,
        "head.weight": "head",
        "head.bias": "head",
    }
    # AdamW: exp_avg and exp_avg_sq shaped like the parameter, one 4-byte step scalar.
    assert {(x.state_bytes_per_byte, x.scalar_state_bytes) for x in layouts} == {(2.0, 4)}


def test_one_process_and_ddp_hold_everything() -> None:
    single = net_share(1, "single")
    assert (single.parameters_bytes, single.gradients_bytes) == (432, 432)
    assert single.optimizer_state_bytes == 2 * 432 + 5 * 4
    assert single.offset_bytes == 0
    ddp = net_share(2, "ddp")
    assert (ddp.parameters_bytes, ddp.gradients_bytes, ddp.optimizer_state_bytes) == (
        432,
        432,
        884,
    )
    assert ddp.offset_bytes == 432  # the gradient buckets, live from the start of the step


def test_fsdp_on_two_ranks_rounds_each_parameter_up_to_its_shard() -> None:
    share = net_share(2)
    # Rows per rank: fc.weight 4 of 7 (160 B), fc.bias 4 (16), scale 4 (16), head.weight
    # 2 of 3 (56), head.bias 2 (8).
    assert share.parameters_bytes == 160 + 16 + 16 + 56 + 8 == 256
    assert share.gradients_bytes == 256
    assert share.optimizer_state_bytes == 2 * 256 + 5 * 4
    # Root (scale, 2 shards of 16 B) + block.fc twice over (parameters and gradients, each
    # as tensors and as a collective's buffer): 2 * (320 + 320) + 2 * (32 + 32).
    assert share.gathered_bytes == 32 + 1408
    assert share.offset_bytes == 1440 - (432 - 256) - (884 - 532)


def test_fsdp_on_four_ranks() -> None:
    share = net_share(4)
    # fc.weight 2 of 7 rows (80 B), fc.bias 2 (8), scale 2 (8), head.weight 1 of 3 (28), bias 1 (4).
    assert share.parameters_bytes == 80 + 8 + 8 + 28 + 4 == 128
    assert share.optimizer_state_bytes == 2 * 128 + 5 * 4
    assert share.gathered_bytes == 4 * 8 + 2 * (320 + 320) + 2 * (32 + 32)
    assert share.offset_bytes == 1440 - (432 - 128) - (884 - 276)


def test_single_with_several_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match="one process"):
        net_share(2, "single")


class Wide(nn.Module):
    """States much larger than activations: 4 x Linear(256, 256), 1 MiB of parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(256, 256) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))  # (B, 256)
        return x


def test_a_model_whose_states_outgrow_the_budget_plans_under_fsdp() -> None:
    model, x = Wide(), torch.randn(4, 256)
    budget = 7 * 2**19  # 3.5 MiB: parameters, gradients and AdamW state take 4 MiB in one process
    with pytest.raises(InfeasibleBudgetError):
        autockpt.plan(model, (x,), budget)
    plan = autockpt.plan(model, (x,), budget, world_size=4, parallelism="fsdp")
    assert plan.fits and plan.predicted_peak_bytes <= budget
    assert (plan.world_size, plan.parallelism) == (4, "fsdp")
    share = rank_share(
        parameter_layouts(model, unit_paths=fsdp_unit_paths(model)),
        world_size=4,
        parallelism="fsdp",
    )
    assert plan.breakdown.parameters_bytes == share.parameters_bytes == 4 * (64 * 256 + 64) * 4
    assert plan.breakdown.gathered_bytes == share.gathered_bytes
    single = autockpt.plan(model, (x,), 2**40)
    assert plan.predicted_peak_bytes == single.predicted_peak_bytes + share.offset_bytes
    # Plans saved before there were ranks still load, as one process's.
    old = json.loads(single.model_dump_json())
    del old["world_size"], old["parallelism"], old["breakdown"]["gathered_bytes"]
    reloaded = Plan.model_validate(old)
    assert (reloaded.world_size, reloaded.parallelism) == (1, "single")


def test_ddp_counts_the_gradient_buckets() -> None:
    model, x = Wide(), torch.randn(4, 256)
    single = autockpt.plan(model, (x,), 2**40)
    ddp = autockpt.plan(model, (x,), 2**40, world_size=2)
    assert ddp.parallelism == "ddp"
    assert ddp.predicted_peak_bytes == single.predicted_peak_bytes + 4 * (256 * 256 + 256) * 4


# ---------------------------------------------------------------------------- a real two-rank run


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    from torch.distributed.tensor import DTensor

    storages = {}
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _fsdp_worker(rank: int, world_size: int, port: int, out: str) -> None:
    """One rank: shard the planned Net (every segment recomputed), one AdamW step, report."""
    import torch.distributed as dist

    from autockpt.training.host.distributed import shard

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        torch.manual_seed(0)
        model, x, y = Net(), torch.randn(8, 10), torch.randn(8, 3)
        reference = copy.deepcopy(model)
        nn.functional.mse_loss(reference(x), y).backward()
        plan = autockpt.plan(
            model,
            (x[:4],),
            2**40,
            use_gradient_checkpointing=True,
            world_size=2,
            parallelism="fsdp",
        )
        planned = shard(autockpt.apply(model, plan), model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mine = slice(4 * rank, 4 * rank + 4)
        autockpt.training_step(planned, plan, (x[mine],), (y[mine],), nn.functional.mse_loss)
        grad_error = max(
            float((p.grad.full_tensor() - r.grad).abs().max())  # type: ignore[union-attr]
            for p, r in zip(model.parameters(), reference.parameters(), strict=True)
        )
        optimizer.step()
        parameters = list(model.parameters())
        state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        report = {
            "rank": rank,
            "parameters_bytes": _storage_bytes(parameters),
            "gradients_bytes": _storage_bytes([p.grad for p in parameters if p.grad is not None]),
            "optimizer_state_bytes": _storage_bytes(state),
            "grad_error": grad_error,
        }
        reports: list[object] = [None] * world_size
        dist.all_gather_object(reports, report)
        if rank == 0:
            Path(out).write_text(json.dumps(reports))
        dist.barrier()  # leave together (see autockpt.training.host.distributed.process_group)
    finally:
        dist.destroy_process_group()
    # Out without the interpreter's teardown: now and then a rank aborted at the end of a run
    # under pytest ("terminate called without an active exception"; why is not known yet):
    # 4 of 32 runs of this test alone, none of 14 leaving this way.
    os._exit(0)


@pytest.mark.slow
def test_two_fsdp_ranks_hold_the_shards_the_accounting_predicts(tmp_path: Path) -> None:
    out = tmp_path / "reports.json"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_fsdp_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    reports = json.loads(out.read_text())
    share = net_share(2)
    for report in reports:
        # Recomputed segments read the gathered parameters: gradients are the whole batch's.
        assert report["grad_error"] < 1e-6
        # Every rank stores padded shards of parameters and gradients.
        assert report["parameters_bytes"] == share.parameters_bytes
        assert report["gradients_bytes"] == share.gradients_bytes
    # Optimizer state follows the unpadded rows: rank 0 holds the most, as predicted.
    assert reports[0]["optimizer_state_bytes"] == share.optimizer_state_bytes
    assert reports[1]["optimizer_state_bytes"] <= share.optimizer_state_bytes
