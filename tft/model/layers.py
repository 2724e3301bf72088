"""Building blocks of the Temporal Fusion Transformer (Lim et al. 2021, section 4).

Shape legend:
    B  batch                      T  time steps (Te encoder, Td decoder = horizon)
    N  rows of independent work (B * T, or B for static inputs)
    V  input variables            E  variable_hidden_size (one variable's embedding width)
    H  hidden_size (d_model)      C  context width
    K  attention heads            D  head width (H / K)

NOTE [Variable-major layout]
A variable selection network runs one small GRN per input variable. With 225 inputs, a Python
loop over variables costs thousands of tiny kernel launches, so the per-variable weights are
stacked, ``(V, in, out)``, and applied to all variables at once with one ``baddbmm`` whose batch
dimension is the variable. That is why the per-variable tensors are variable-major, ``(V, N, .)``:
the matmuls read and write them without transposes, and the ``(V, N, H)`` tensors (the largest of
the whole model) are never copied into another layout. Everything inside a GRN is independent per
row, so any range of ``N`` (of batch or of time) can be computed on its own.

Every module here is made of plain tensor operations that ``torch.fx.symbolic_trace`` records
one by one: a memory planner may cut the graph between any two of them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GatedLinearUnit(nn.Module):
    """``GLU(x) = (W4 x + b4) * sigmoid(W5 x + b5)``, with dropout on ``x`` before it."""

    def __init__(self, input_size: int, output_size: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(input_size, 2 * output_size)

    def forward(self, x: Tensor) -> Tensor:
        return F.glu(self.linear(self.dropout(x)), dim=-1)  # (..., out)


class GateAddNorm(nn.Module):
    """Gated skip connection: ``LayerNorm(residual + GLU(x))``."""

    def __init__(self, input_size: int, output_size: int, dropout: float) -> None:
        super().__init__()
        self.gate = GatedLinearUnit(input_size, output_size, dropout)
        self.norm = nn.LayerNorm(output_size)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.norm(residual + self.gate(x))  # (..., out)


class GatedResidualNetwork(nn.Module):
    """GRN of equations (2)-(4): ``LayerNorm(a + GLU(W1 ELU(W2 a + W3 c + b2) + b1))``.

    The residual ``a`` goes through a linear projection when the input and output widths differ.
    With ``context_size``, a context ``c`` (broadcastable to the input's leading dimensions) enters
    the first layer and must be passed to every call.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int,
        dropout: float,
        *,
        context_size: int | None = None,
    ) -> None:
        super().__init__()
        self.skip = nn.Linear(input_size, output_size) if input_size != output_size else None
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.context = (
            nn.Linear(context_size, hidden_size, bias=False) if context_size is not None else None
        )
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.gate_norm = GateAddNorm(hidden_size, output_size, dropout)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        residual = x if self.skip is None else self.skip(x)  # (..., out)
        hidden = self.fc1(x)  # (..., hidden)
        if self.context is not None:
            hidden = hidden + self.context(context)
        hidden = self.fc2(F.elu(hidden))  # (..., hidden)
        return self.gate_norm(hidden, residual)  # (..., out)


class PerVariableLinear(nn.Module):
    """One linear layer per variable, applied to all variables in one batched matmul.

    Weight ``(V, in, out)``, bias ``(V, 1, out)``; input ``(V, N, in)``, output ``(V, N, out)``.
    Initialised like ``nn.Linear`` (uniform in +-1/sqrt(in)) for each variable.

    ``baddbmm`` first copies the broadcast bias into the whole output and then accumulates the
    product onto it: one extra pass over ``(V, N, out)``. When the output is wider than the input,
    appending a column of ones to the input and the bias as a last weight row is cheaper, and the
    ``(V, N, 2H)`` gate of a per-variable GRN is the widest tensor of the model.
    """

    def __init__(self, num_vars: int, input_size: int, output_size: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(input_size)
        self.weight = nn.Parameter(torch.empty(num_vars, input_size, output_size))
        self.bias = nn.Parameter(torch.empty(num_vars, 1, output_size))
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)
        self.fold_bias = output_size > input_size + 1

    def forward(self, x: Tensor) -> Tensor:
        if not self.fold_bias:
            return torch.baddbmm(self.bias, x, self.weight)  # (V, N, out)
        return torch.bmm(_with_ones(x), self._folded_weight())  # (V, N, out)

    def halves(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The output's two halves along its last dimension, each computed into a tensor of
        its own: ``forward(x).chunk(2, -1)``, without the strided views (see
        :class:`PerVariableGRN`)."""
        weight = self._folded_weight()  # (V, in + 1, out)
        half = weight.size(-1) // 2
        x_ones = _with_ones(x)  # (V, N, in + 1)
        return torch.bmm(x_ones, weight[:, :, :half]), torch.bmm(x_ones, weight[:, :, half:])

    def add_to(self, base: Tensor, x: Tensor) -> Tensor:
        """``base + forward(x)`` in one ``baddbmm`` that accumulates onto ``base``."""
        return torch.baddbmm(base, _with_ones(x), self._folded_weight())  # (V, N, out)

    def _folded_weight(self) -> Tensor:
        return torch.cat([self.weight, self.bias], dim=1)  # (V, in + 1, out)


def _with_ones(x: Tensor) -> Tensor:
    """``x`` with a last column of ones, which multiplies a bias folded into a weight."""
    return torch.cat([x, torch.ones_like(x[:, :, :1])], dim=-1)  # (V, N, in + 1)


class PerVariableGRN(nn.Module):
    """A separate GRN for each variable (no context), batched over variables.

    Input ``(V, N, in)``, output ``(V, N, out)``; see NOTE [Variable-major layout]. Each variable
    has its own layer norm scale and shift, so the norm is ``layer_norm`` without affine terms
    followed by one ``addcmul`` with the per-variable ``(V, 1, out)`` scale and shift.

    NOTE [Fused per-variable GRN]
    The ``(V, N, out)`` tensors here are the largest of the model, so the GRN's math is laid out
    to pass over them as few times as it can, with the parameters of the plain layout:
    - the gate's two halves are two matmuls into two tensors, and the GLU is ``value *
      sigmoid(gate)``: ``F.glu`` on one ``(V, N, 2 out)`` tensor computes its backward into
      strided halves, which ran 3x slower per element than on whole tensors;
    - the skip projection accumulates onto the gated value in one ``baddbmm`` instead of a
      matmul and an add.
    The outputs and gradients are those of a GRN per variable up to float rounding
    (``tests/tft/test_model.py`` checks it against a loop over variables).
    """

    def __init__(
        self, num_vars: int, input_size: int, hidden_size: int, output_size: int, dropout: float
    ) -> None:
        super().__init__()
        self.output_size = output_size
        self.skip = (
            PerVariableLinear(num_vars, input_size, output_size)
            if input_size != output_size
            else None
        )
        self.fc1 = PerVariableLinear(num_vars, input_size, hidden_size)
        self.fc2 = PerVariableLinear(num_vars, hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.gate = PerVariableLinear(num_vars, hidden_size, 2 * output_size)
        self.norm_weight = nn.Parameter(torch.ones(num_vars, 1, output_size))
        self.norm_bias = nn.Parameter(torch.zeros(num_vars, 1, output_size))

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.dropout(self.fc2(F.elu(self.fc1(x))))  # (V, N, hidden)
        value, gate = self.gate.halves(hidden)  # (V, N, out) each
        gated = value * torch.sigmoid(gate)  # (V, N, out)
        summed = gated + x if self.skip is None else self.skip.add_to(gated, x)  # (V, N, out)
        normed = F.layer_norm(summed, (self.output_size,))  # (V, N, out)
        return torch.addcmul(self.norm_bias, normed, self.norm_weight)  # (V, N, out)


class RealInputEmbedding(nn.Module):
    """Embeds each real input variable with its own ``Linear(1, E)``, into variable-major layout.

    Input ``(B, T, V)``, output ``(V, B * T, E)``.
    """

    def __init__(self, num_vars: int, embedding_size: int) -> None:
        super().__init__()
        self.num_vars = num_vars
        self.weight = nn.Parameter(torch.empty(num_vars, 1, embedding_size))
        self.bias = nn.Parameter(torch.empty(num_vars, 1, embedding_size))
        nn.init.uniform_(self.weight, -1.0, 1.0)  # nn.Linear's bound for one input
        nn.init.uniform_(self.bias, -1.0, 1.0)

    def forward(self, x: Tensor) -> Tensor:
        columns = x.reshape(-1, self.num_vars).t().unsqueeze(-1)  # (V, N, 1)
        return torch.addcmul(self.bias, columns, self.weight)  # (V, N, E)


class CategoricalInputEmbedding(nn.Module):
    """Embeds each categorical input with its own table, into variable-major layout.

    One ``nn.Embedding`` holds every input's rows (input ``i``'s codes start at
    ``offsets[i]``), as the static embedding does. Input ``(B, T, C)`` int64 codes, output
    ``(C, B * T, E)``, the layout of :class:`RealInputEmbedding`, so the two concatenate into
    one variable selection.
    """

    offsets: Tensor

    def __init__(self, cardinalities: list[int], embedding_size: int) -> None:
        super().__init__()
        self.num_vars = len(cardinalities)
        offsets = [sum(cardinalities[:i]) for i in range(len(cardinalities))]
        self.register_buffer("offsets", torch.tensor(offsets), persistent=False)
        self.embedding = nn.Embedding(sum(cardinalities), embedding_size)

    def forward(self, codes: Tensor) -> Tensor:
        embedded = self.embedding(codes.reshape(-1, self.num_vars) + self.offsets)  # (N, C, E)
        return embedded.transpose(0, 1)  # (C, N, E)


class VariableSelectionNetwork(nn.Module):
    """Variable selection (equations (6)-(8)): a weighted sum of per-variable GRN outputs.

    The selection weights are ``softmax(GRN(flattened embeddings, context))`` over variables;
    each variable's embedding goes through its own GRN to ``hidden_size``. With one variable the
    weight is 1 and no selection GRN is built.

    ``forward(embedded (V, N, E), context (N, C) | None) -> (selected (N, H), weights (N, V))``.
    """

    def __init__(
        self,
        num_vars: int,
        input_size: int,
        hidden_size: int,
        dropout: float,
        *,
        context_size: int | None = None,
    ) -> None:
        super().__init__()
        self.num_vars = num_vars
        self.input_size = input_size
        self.selection = (
            GatedResidualNetwork(
                num_vars * input_size, hidden_size, num_vars, dropout, context_size=context_size
            )
            if num_vars > 1
            else None
        )
        self.variable_grns = PerVariableGRN(num_vars, input_size, input_size, hidden_size, dropout)

    def forward(self, embedded: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        rows = embedded.transpose(0, 1)  # (N, V, E)
        if self.selection is None:
            weights = torch.ones_like(rows[:, :, 0])  # (N, 1)
        else:
            flat = rows.reshape(-1, self.num_vars * self.input_size)  # (N, V * E)
            weights = torch.softmax(self.selection(flat, context), dim=-1)  # (N, V)
        processed = self.variable_grns(embedded)  # (V, N, H)
        # One (1, V) x (V, H) product per row; the transposed view avoids a copy of processed.
        selected = torch.bmm(weights.unsqueeze(1), processed.transpose(0, 1))  # (N, 1, H)
        return selected.squeeze(1), weights  # (N, H), (N, V)


@torch.fx.wrap
def causal_mask(num_queries: int, num_keys: int, device: torch.device) -> Tensor:
    """``True`` where a query may not look: the last ``num_queries`` keys are the queries' own
    positions, and query ``i`` sees keys up to and including its own position.

    Wrapped for torch.fx: the sizes are plain ints when it runs, proxies when traced.
    """
    blocked = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device)
    return blocked.triu(diagonal=num_keys - num_queries + 1)  # (Tq, Tk)


class InterpretableMultiHeadAttention(nn.Module):
    """Interpretable multi-head attention (equations (13)-(16)).

    Each head has its own query and key projections; all heads share one value projection, so
    the head-averaged attention matrix ``A`` is exact: ``output = W_H (A V W_V)``. Queries are
    the last ``Tq`` positions of the key sequence; a causal mask stops them from looking ahead.

    ``forward(queries (B, Tq, H), keys (B, Tk, H)) -> (output (B, Tq, H), A (B, Tq, Tk))``.
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, self.head_size)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(self.head_size, hidden_size)

    def forward(self, queries: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        q = self.query(queries).unflatten(-1, (self.num_heads, self.head_size))  # (B, Tq, K, D)
        k = self.key(keys).unflatten(-1, (self.num_heads, self.head_size))  # (B, Tk, K, D)
        v = self.value(keys)  # (B, Tk, D)
        scores = torch.matmul(q.transpose(1, 2), k.permute(0, 2, 3, 1))  # (B, K, Tq, Tk)
        scores = scores * (1.0 / math.sqrt(self.head_size))
        blocked = causal_mask(queries.size(1), keys.size(1), queries.device)  # (Tq, Tk)
        scores = scores.masked_fill(blocked, float("-inf"))
        attention = torch.softmax(scores, dim=-1).mean(dim=1)  # (B, Tq, Tk)
        heads = torch.bmm(self.dropout(attention), v)  # (B, Tq, D)
        return self.output(heads), attention  # (B, Tq, H), (B, Tq, Tk)
