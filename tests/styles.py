"""Models written the way other people write PyTorch, for the planned-module tests.

Each reads ``self.training`` from Python in its own way (torch.fx freezes such reads), or
returns its output in a container other than a tensor: what ``autockpt.apply`` must keep
working as on the original model.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 32
BATCH = 24


class FunctionalDropoutNet(nn.Module):
    """Dropout as a function keyed on ``self.training`` (the issue's first reproduction)."""

    def __init__(self, width: int = WIDTH, depth: int = 4, p: float = 0.3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 1)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.dropout(torch.relu(layer(x)), self.p, training=self.training)  # (B, W)
        return self.head(x)  # (B, 1)


class NoisyBlock(nn.Module):
    """A block that adds noise and drops features only in training (an ``if`` on the mode)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.linear(x))  # (B, W)
        if self.training:
            h = h + 0.1 * torch.randn_like(h)
            h = h * (torch.rand_like(h) > 0.2) / 0.8
        return x + h


class TrainingBranchNet(nn.Module):
    """Blocks whose ``forward`` branches on ``self.training``."""

    def __init__(self, width: int = WIDTH, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(NoisyBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: SDPA with ``dropout_p`` chosen from ``self.training``; a buffer
    (a gain on the queries) read by traced-through code."""

    def __init__(self, width: int, heads: int, p: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.heads = heads
        self.p = p
        self.register_buffer("gain", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # (B, T, C)
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2) * self.gain  # (B, H, T, C/H)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # (B, T, C)
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self, width: int, heads: int, p: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, p)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(p)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A nanoGPT-style decoder over token ids: (B, T) -> logits (B, T, V)."""

    def __init__(
        self, vocab: int = 50, width: int = WIDTH, heads: int = 4, length: int = 16, p: float = 0.2
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(1, length, width) / math.sqrt(width))
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(GPTBlock(width, heads, p) for _ in range(3))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.embed(ids) + self.position[:, : ids.shape[1]])  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))  # (B, T, V)


class DictBatchNet(nn.Module):
    """Residual blocks over a dict batch: planned with module-level segments (forward hooks)."""

    def __init__(self, width: int = WIDTH, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = batch["x"]  # (B, W)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


# ---------------------------------------------------------------------------- output types


@dataclass
class RegressionOutput:
    """A plain dataclass output, with a field the constructor does not take."""

    prediction: torch.Tensor
    hidden: torch.Tensor
    aux: tuple[torch.Tensor, ...] = ()
    label: str = "regression"
    norm: torch.Tensor | None = field(default=None, init=False)


@dataclass
class ModelOutputLike(OrderedDict):  # type: ignore[type-arg]
    """What a Hugging Face ``ModelOutput`` is: a dataclass and an ``OrderedDict`` whose entries
    are the fields that are not None, also reachable by attribute."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                self[item.name] = value


class Pair(NamedTuple):
    prediction: torch.Tensor
    hidden: torch.Tensor


class OutputNet(nn.Module):
    """Residual blocks with dropout, whose output comes in the container ``kind`` names."""

    def __init__(self, kind: str, width: int = WIDTH, depth: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.kind = kind
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Dropout(p)) for _ in range(depth)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        for block in self.blocks:
            x = x + block(x)  # (B, W)
        prediction = self.head(x)  # (B, 1)
        if self.kind == "tensor":
            return prediction
        if self.kind == "tuple":
            return prediction, [x, None]
        if self.kind == "dict":
            return {"prediction": prediction, "hidden": x, "step": 3}
        if self.kind == "namedtuple":
            return Pair(prediction, x)
        if self.kind == "dataclass":
            out = RegressionOutput(prediction, x, aux=(x.mean(dim=1),))
            out.norm = x.norm()
            return out
        assert self.kind == "model_output", self.kind
        loss = F.mse_loss(prediction.squeeze(1), y) if y is not None else None
        return ModelOutputLike(loss=loss, logits=prediction, hidden_states=(x,))


OUTPUT_KINDS = ("tensor", "tuple", "dict", "namedtuple", "dataclass", "model_output")


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of an :class:`OutputNet` output, in a fixed order, for comparisons."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, RegressionOutput):
        assert output.norm is not None
        return [output.prediction, output.hidden, *output.aux, output.norm]
    if isinstance(output, dict):
        return [v for v in output.values() if isinstance(v, torch.Tensor)] + [
            t for v in output.values() if isinstance(v, tuple) for t in v
        ]
    return [
        t
        for item in output
        for t in ([item] if isinstance(item, torch.Tensor) else item)
        if t is not None
    ]
