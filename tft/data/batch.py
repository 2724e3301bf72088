"""One batch of TFT windows as tensors: what :mod:`tft.data.windows` gathers and the model reads."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Batch"]


class Batch(NamedTuple):
    """One batch of windows; B windows, Te encoder steps, Td = horizon decoder steps."""

    static_ids: torch.Tensor  # (B, 1 + num_static) int64: the symbol index, then static codes
    encoder_observed: torch.Tensor  # (B, Te, num_observed) float32
    encoder_known: torch.Tensor  # (B, Te, num_known) float32
    decoder_known: torch.Tensor  # (B, Td, num_known) float32
    encoder_categorical: torch.Tensor  # (B, Te, Co + Ck) int64: observed, then known codes
    decoder_categorical: torch.Tensor  # (B, Td, Ck) int64: known codes
    target: torch.Tensor  # (B, Td) float32, normalised
    decoder_time_ns: torch.Tensor  # (B, Td) int64, UTC nanoseconds of the forecast rows
    symbol_index: torch.Tensor  # (B,) int64

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """The model's inputs: static ids, encoder observed, encoder known, decoder known, and,
        when the data has time-varying categorical columns, their encoder and decoder codes."""
        reals = (self.static_ids, self.encoder_observed, self.encoder_known, self.decoder_known)
        if self.encoder_categorical.size(-1) == 0:
            return reals
        return (*reals, self.encoder_categorical, self.decoder_categorical)

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """The same batch with every tensor moved to ``device``."""
        return Batch(*(tensor.to(device, non_blocking=non_blocking) for tensor in self))
