"""Zoo: attention models, nanoGPT-style (SDPA, tied weights, its own loss) and
``nn.MultiheadAttention`` with a padding mask.

Shape legend: B batch, T tokens, C width, K heads, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.zoo.case import Batch, ZooCase, seeded

VOCAB, TOKENS, WIDTH, HEADS = 64, 32, 32, 2


class CausalSelfAttention(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.resid_dropout = nn.Dropout(dropout)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(WIDTH, dim=2)
        q = q.view(B, T, HEADS, C // HEADS).transpose(1, 2)  # (B, K, T, C/K)
        k = k.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        v = v.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.proj(y))


class GPTBlock(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = CausalSelfAttention(dropout)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's shape: SDPA with ``dropout_p`` keyed on ``self.training``, the embedding
    tied to the output layer, and ``forward(idx, targets)`` returning ``(logits, loss)`` with
    the mean cross-entropy computed inside."""

    def __init__(self, depth: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(TOKENS, WIDTH)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(dropout) for _ in range(depth))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def _token_ids(batch_size: int) -> Batch:
    generator = seeded(3)
    idx = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    targets = torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator)
    return (idx, targets), ()


def _gpt_loss(output: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return output[1]


class MHAEncoderLayer(nn.Module):
    """Post-norm encoder layer around ``nn.MultiheadAttention`` with a key padding mask."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(WIDTH, HEADS, dropout=dropout, batch_first=True)
        self.norm1 = nn.LayerNorm(WIDTH)
        self.feed_forward = nn.Sequential(
            nn.Linear(WIDTH, 2 * WIDTH), nn.ReLU(), nn.Dropout(dropout), nn.Linear(2 * WIDTH, WIDTH)
        )
        self.norm2 = nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(x, x, x, key_padding_mask=padding, need_weights=False)
        x = self.norm1(x + attended)  # (B, T, C)
        return self.norm2(x + self.feed_forward(x))


class MHAClassifier(nn.Module):
    """``nn.MultiheadAttention`` layers over padded sequences, a masked mean over time."""

    def __init__(self, depth: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        self.layers = nn.ModuleList(MHAEncoderLayer(dropout) for _ in range(depth))
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)  # (B, T, C)
        for layer in self.layers:
            h = layer(h, padding)
        keep = (~padding).unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)  # (B, C)
        return self.head(pooled)  # (B, 3)


def _padded(batch_size: int) -> Batch:
    generator = seeded(4)
    x = torch.randn(batch_size, TOKENS, 8, generator=generator)
    lengths = torch.randint(TOKENS // 2, TOKENS + 1, (batch_size, 1), generator=generator)
    padding = torch.arange(TOKENS).unsqueeze(0) >= lengths  # (B, T): True where padded
    labels = torch.randint(0, 3, (batch_size,), generator=generator)
    return (x, padding), (labels,)


def _classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, reduction="sum")


def _built(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls()


ATTENTION = [
    ZooCase(
        "nanogpt",
        "nanoGPT: SDPA dropout_p, tied embedding, mean loss computed inside",
        lambda: _built(NanoGPT),
        _token_ids,
        loss_fn=_gpt_loss,
        loss_reduction="mean",
        slow=True,
    ),
    ZooCase(
        "multihead_attention",
        "nn.MultiheadAttention with a key padding mask, summed cross-entropy",
        lambda: _built(MHAClassifier),
        _padded,
        loss_fn=_classification_loss,
        slow=True,
    ),
]
