"""One batch of TFT windows as tensors, what :mod:`tft.data.windows` gathers and the model reads,
and the order windows are drawn into batches (:class:`WindowOrder`).

NOTE [A shuffle with no per-window array]
An epoch draws a part's windows in a permutation fixed by the run's seed and the epoch. Made as
an array, that permutation is 8 bytes a window, twice while it is made (about 670 MB for the
42M training windows of 60M bars), which a file streamed past the host's memory cannot hold.
So the permutation is a function, worked out a batch of positions at a time: a Feistel
network (six rounds of a 64-bit mixing function keyed from the seed) is a bijection on the
integers below the smallest power of four at or above the window count, and a position whose
image falls past the count is mapped again until it does not (cycle walking: a bijection of
the domain restricted to the count's range stays a bijection, and the domain is under four
times the count, so a position takes few steps). Every window comes once an epoch, the order
depends only on the seed and the count, and holding it costs six integers.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = ["Batch", "WindowOrder"]

_ROUNDS = 6


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


class WindowOrder:
    """The order ``count`` windows are drawn in: as they are (``seed`` None) or a permutation
    fixed by ``seed`` (NOTE [A shuffle with no per-window array]); ``order[a:b]`` gives the
    windows drawn at positions ``a`` to ``b``."""

    def __init__(self, count: int, seed: int | None) -> None:
        self.count = count
        # Each half of the network's input holds this many bits: 4 ** half_bits >= count.
        self._half_bits = max(1, ((max(count, 2) - 1).bit_length() + 1) // 2)
        self._keys = (
            None
            if seed is None
            else np.random.default_rng(seed).integers(0, 2**63, size=_ROUNDS, dtype=np.uint64)
        )

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, positions: slice) -> np.ndarray:
        start, stop, step = positions.indices(self.count)
        drawn = np.arange(start, stop, step, dtype=np.int64)
        if self._keys is None:
            return drawn
        values = self._permute(drawn.astype(np.uint64))
        outside = values >= self.count
        while outside.any():  # cycle walking: map again until inside the count's range
            values[outside] = self._permute(values[outside])
            outside = values >= self.count
        return values.astype(np.int64)

    def _permute(self, values: np.ndarray) -> np.ndarray:
        bits = np.uint64(self._half_bits)
        mask = np.uint64((1 << self._half_bits) - 1)
        left, right = values >> bits, values & mask
        for key in self._keys if self._keys is not None else ():
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << bits) | right


def _mix(values: np.ndarray) -> np.ndarray:
    """A 64-bit mixing function (the finaliser of SplitMix64): each output bit depends on
    every input bit. Products wrap modulo 2**64, as unsigned arrays do."""
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))
