"""CUDA settings read on the CPU against stand-ins of ``torch.cuda``: auto precision on a card
that only emulates bf16, and a run's random state resumed on fewer GPUs than it was saved on."""

from __future__ import annotations

import torch


def test_auto_precision_takes_fp16_on_a_card_that_only_emulates_bf16(monkeypatch):
    from autockpt.training.options.settings import resolve_precision

    native: dict[str, bool] = {}

    def supported(including_emulation: bool = True) -> bool:
        return including_emulation or native["bf16"]

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    for has_bf16, expected in ((True, torch.bfloat16), (False, torch.float16)):
        native["bf16"] = has_bf16
        assert resolve_precision("auto", torch.device("cuda")) == expected


def test_a_run_saved_on_more_gpus_resumes_on_fewer(monkeypatch):
    from autockpt.training.setup.runs import capture_rng_state, restore_rng_state

    state = capture_rng_state()
    state["cuda"] = [torch.ByteTensor(16), torch.ByteTensor(16)]  # saved on two GPUs
    restored: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: restored.append(device))
    restore_rng_state(state)
    assert restored == [0]
