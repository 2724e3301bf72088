"""The Temporal Fusion Transformer (Lim et al. 2021, "Temporal Fusion Transformers for
interpretable multi-horizon time series forecasting"), for quantile forecasts.

Shape legend:
    B   batch                       S   static categorical inputs (the symbol first)
    Te  encoder_length (past)       Td  horizon (future)         T  Te + Td
    No  observed real inputs        Nk  known real inputs
    Co  observed categorical inputs Ck  known categorical inputs
    V   No + Nk + Co + Ck (encoder inputs)                       Vd  Nk + Ck (decoder inputs)
    E   variable_hidden_size        H   hidden_size              Q   quantiles

Data flow (section 4 of the paper):
    static ids -> embeddings -> static VSN -> four GRNs: contexts c_s (variable selection),
        c_e (static enrichment), c_h and c_c (the LSTM's initial state)
    past observed + known inputs -> encoder VSN (c_s) -> LSTM encoder (seeded with c_h, c_c)
    future known inputs          -> decoder VSN (c_s) -> LSTM decoder (seeded with the encoder's
                                                         final state)
    (each real input is embedded by its own Linear(1, E), each categorical one by its own
    embedding table; both kinds go through the same variable selection)
    gated skip + add & norm around the LSTM -> static enrichment GRN (c_e) -> interpretable
    multi-head attention (decoder queries, causal) -> gated skip + add & norm -> position-wise GRN
    -> gated skip + add & norm to the LSTM layer's output -> linear head to Q quantiles

The whole forward traces with ``torch.fx.symbolic_trace``: it has no Python branches on tensor
values or shapes (sizes are read with ``x.size(i)`` and passed into ops), ``nn.LSTM`` stays a
leaf, and the per-variable GRNs are plain batched ops a planner can cut between. Every op is
independent per sample except the LSTM and the attention, which mix time within a sample.
The largest tensors are the encoder VSN's per-variable GRN activations, ``(V, B * Te, H)`` and
``(V, B * Te, 2H)`` (see NOTE [Variable-major layout] in :mod:`tft.model.layers`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from tft.model.config import TFTConfig
from tft.model.layers import (
    CategoricalInputEmbedding,
    GateAddNorm,
    GatedResidualNetwork,
    InterpretableMultiHeadAttention,
    RealInputEmbedding,
    VariableSelectionNetwork,
)


class Interpretation(NamedTuple):
    """What the model looked at, from :meth:`TemporalFusionTransformer.interpret`.

    Attributes:
        static_weights: selection weights of the static inputs, ``(B, S)``; rows sum to 1.
        encoder_weights: selection weights of the past inputs: observed reals, known reals,
            observed categoricals, known categoricals, ``(B, Te, V)``; each step sums to 1.
        decoder_weights: selection weights of the future known inputs, reals then
            categoricals, ``(B, Td, Nk + Ck)``.
        attention: head-averaged attention of each forecast step over all positions,
            ``(B, Td, Te + Td)``; rows sum to 1 and are 0 beyond the step's own position.
    """

    static_weights: Tensor
    encoder_weights: Tensor
    decoder_weights: Tensor
    attention: Tensor


class StaticCovariateEncoder(nn.Module):
    """Static ids -> selected static embedding -> the four context vectors of section 4.3.

    ``forward(static_ids (B, S)) -> (c_s, c_e, c_h, c_c each (B, H), weights (B, S))``.
    """

    offsets: Tensor

    def __init__(self, config: TFTConfig) -> None:
        super().__init__()
        hidden, dropout = config.hidden_size, config.dropout
        cardinalities = config.static_cardinalities
        # One table for all static inputs; input i's ids start at offsets[i].
        offsets = [sum(cardinalities[:i]) for i in range(len(cardinalities))]
        self.register_buffer("offsets", torch.tensor(offsets), persistent=False)
        self.embedding = nn.Embedding(sum(cardinalities), config.variable_hidden_size)
        self.selection = VariableSelectionNetwork(
            config.num_static, config.variable_hidden_size, hidden, dropout
        )
        self.selection_context = GatedResidualNetwork(hidden, hidden, hidden, dropout)
        self.enrichment_context = GatedResidualNetwork(hidden, hidden, hidden, dropout)
        self.state_h_context = GatedResidualNetwork(hidden, hidden, hidden, dropout)
        self.state_c_context = GatedResidualNetwork(hidden, hidden, hidden, dropout)

    def forward(self, static_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        embedded = self.embedding(static_ids + self.offsets).transpose(0, 1)  # (S, B, E)
        static, weights = self.selection(embedded)  # (B, H), (B, S)
        return (
            self.selection_context(static),
            self.enrichment_context(static),
            self.state_h_context(static),
            self.state_c_context(static),
            weights,
        )


class TemporalFusionTransformer(nn.Module):
    """Multi-horizon quantile forecaster; see the module docstring for the data flow.

    Args:
        config: sizes; ``tft.model.config.get_preset("tiny")`` for a model that trains in seconds.

    Example:
        >>> from tft.model.config import get_preset
        >>> model = TemporalFusionTransformer(get_preset("tiny"))
        >>> model(*model.example_inputs(2)).shape
        torch.Size([2, 4, 3])
    """

    def __init__(self, config: TFTConfig) -> None:
        super().__init__()
        self.config = config
        hidden, dropout = config.hidden_size, config.dropout
        embedding = config.variable_hidden_size
        num_encoder_reals = config.num_observed + config.num_known
        num_encoder_vars = num_encoder_reals + config.num_encoder_categorical
        num_decoder_vars = config.num_known + config.num_decoder_categorical
        self.static_encoder = StaticCovariateEncoder(config)
        self.encoder_embedding = RealInputEmbedding(num_encoder_reals, embedding)
        # Built only for data with time-varying categorical inputs, so that a model without
        # them has the same parameters (and checkpoints) as before they existed.
        self.encoder_categorical_embedding = (
            CategoricalInputEmbedding(
                config.observed_categorical_cardinalities + config.known_categorical_cardinalities,
                embedding,
            )
            if config.num_encoder_categorical
            else None
        )
        self.encoder_selection = VariableSelectionNetwork(
            num_encoder_vars, embedding, hidden, dropout, context_size=hidden
        )
        self.decoder_embedding = RealInputEmbedding(config.num_known, embedding)
        self.decoder_categorical_embedding = (
            CategoricalInputEmbedding(config.known_categorical_cardinalities, embedding)
            if config.num_decoder_categorical
            else None
        )
        self.decoder_selection = VariableSelectionNetwork(
            num_decoder_vars, embedding, hidden, dropout, context_size=hidden
        )
        lstm_dropout = dropout if config.num_lstm_layers > 1 else 0.0
        self.lstm_encoder = nn.LSTM(
            hidden, hidden, config.num_lstm_layers, batch_first=True, dropout=lstm_dropout
        )
        self.lstm_decoder = nn.LSTM(
            hidden, hidden, config.num_lstm_layers, batch_first=True, dropout=lstm_dropout
        )
        self.post_lstm = GateAddNorm(hidden, hidden, dropout)
        self.enrichment = GatedResidualNetwork(hidden, hidden, hidden, dropout, context_size=hidden)
        self.attention = InterpretableMultiHeadAttention(hidden, config.num_heads, dropout)
        self.post_attention = GateAddNorm(hidden, hidden, dropout)
        self.positionwise = GatedResidualNetwork(hidden, hidden, hidden, dropout)
        self.pre_output = GateAddNorm(hidden, hidden, dropout)
        self.output = nn.Linear(hidden, config.num_quantiles)

    def forward(
        self,
        static_ids: Tensor,
        encoder_observed: Tensor,
        encoder_known: Tensor,
        decoder_known: Tensor,
        encoder_categorical: Tensor | None = None,
        decoder_categorical: Tensor | None = None,
    ) -> Tensor:
        """Quantile forecasts ``(B, Td, Q)``.

        Args:
            static_ids: int64 ``(B, S)``, each column within its cardinality.
            encoder_observed: ``(B, Te, No)``.
            encoder_known: ``(B, Te, Nk)``.
            decoder_known: ``(B, Td, Nk)``.
            encoder_categorical: int64 ``(B, Te, Co + Ck)``, observed then known codes; needed
                when the config has time-varying categorical inputs, else unused.
            decoder_categorical: int64 ``(B, Td, Ck)``, the known codes.
        """
        return self._run(
            static_ids,
            encoder_observed,
            encoder_known,
            decoder_known,
            encoder_categorical,
            decoder_categorical,
        )[0]

    def interpret(
        self,
        static_ids: Tensor,
        encoder_observed: Tensor,
        encoder_known: Tensor,
        decoder_known: Tensor,
        encoder_categorical: Tensor | None = None,
        decoder_categorical: Tensor | None = None,
    ) -> tuple[Tensor, Interpretation]:
        """The forecast and the weights behind it (same inputs as :meth:`forward`).

        Call it under ``torch.no_grad()`` unless gradients are wanted: the returned tensors
        otherwise keep the autograd graph alive.
        """
        prediction, static_w, encoder_w, decoder_w, attention = self._run(
            static_ids,
            encoder_observed,
            encoder_known,
            decoder_known,
            encoder_categorical,
            decoder_categorical,
        )
        batch = encoder_observed.size(0)
        return prediction, Interpretation(
            static_weights=static_w,
            encoder_weights=encoder_w.view(batch, encoder_observed.size(1), -1),
            decoder_weights=decoder_w.view(batch, decoder_known.size(1), -1),
            attention=attention,
        )

    def _run(
        self,
        static_ids: Tensor,
        encoder_observed: Tensor,
        encoder_known: Tensor,
        decoder_known: Tensor,
        encoder_categorical: Tensor | None,
        decoder_categorical: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Prediction and the raw weights, ``(B, S)``, ``(B * Te, V)``, ``(B * Td, Vd)``,
        ``(B, Td, T)``, all of which the forward pass computes anyway."""
        batch = encoder_observed.size(0)
        encoder_steps = encoder_observed.size(1)
        decoder_steps = decoder_known.size(1)

        c_selection, c_enrichment, c_h, c_c, static_w = self.static_encoder(static_ids)

        encoder_inputs = torch.cat([encoder_observed, encoder_known], dim=-1)  # (B, Te, No + Nk)
        encoder_embedded = self.encoder_embedding(encoder_inputs)  # (No + Nk, B * Te, E)
        decoder_embedded = self.decoder_embedding(decoder_known)  # (Nk, B * Td, E)
        # Attribute tests, not tensor tests: fx records one branch, fixed by the config.
        if self.encoder_categorical_embedding is not None:
            codes = _required(encoder_categorical, "encoder_categorical")
            embedded = self.encoder_categorical_embedding(codes)  # (Co + Ck, B * Te, E)
            encoder_embedded = torch.cat([encoder_embedded, embedded], dim=0)  # (V, B * Te, E)
        if self.decoder_categorical_embedding is not None:
            codes = _required(decoder_categorical, "decoder_categorical")
            embedded = self.decoder_categorical_embedding(codes)  # (Ck, B * Td, E)
            decoder_embedded = torch.cat([decoder_embedded, embedded], dim=0)  # (Vd, B * Td, E)
        encoder_selected, encoder_w = self.encoder_selection(
            encoder_embedded,  # (V, B * Te, E)
            _repeat_over_time(c_selection, encoder_steps),  # (B * Te, H)
        )
        encoder_selected = encoder_selected.view(batch, encoder_steps, -1)  # (B, Te, H)
        decoder_selected, decoder_w = self.decoder_selection(
            decoder_embedded,  # (Vd, B * Td, E)
            _repeat_over_time(c_selection, decoder_steps),  # (B * Td, H)
        )
        decoder_selected = decoder_selected.view(batch, decoder_steps, -1)  # (B, Td, H)

        num_layers = self.config.num_lstm_layers
        initial_state = (
            c_h.unsqueeze(0).expand(num_layers, -1, -1).contiguous(),  # (layers, B, H)
            c_c.unsqueeze(0).expand(num_layers, -1, -1).contiguous(),  # (layers, B, H)
        )
        encoded = self.lstm_encoder(encoder_selected, initial_state)
        decoded = self.lstm_decoder(decoder_selected, encoded[1])
        lstm_output = torch.cat([encoded[0], decoded[0]], dim=1)  # (B, T, H)
        selected = torch.cat([encoder_selected, decoder_selected], dim=1)  # (B, T, H)
        temporal = self.post_lstm(lstm_output, selected)  # (B, T, H)

        enriched = self.enrichment(temporal, c_enrichment.unsqueeze(1))  # (B, T, H)
        future = enriched[:, encoder_steps:]  # (B, Td, H)
        attended, attention = self.attention(future, enriched)  # (B, Td, H), (B, Td, T)
        attended = self.post_attention(attended, future)  # (B, Td, H)
        processed = self.positionwise(attended)  # (B, Td, H)
        fused = self.pre_output(processed, temporal[:, encoder_steps:])  # (B, Td, H)
        prediction = self.output(fused)  # (B, Td, Q)
        return prediction, static_w, encoder_w, decoder_w, attention

    def example_inputs(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, ...]:
        """Random inputs of the right shapes and dtypes: ``(static_ids, encoder_observed,
        encoder_known, decoder_known)``, ids within each static input's cardinality, then
        ``(encoder_categorical, decoder_categorical)`` when the config has time-varying
        categorical inputs.

        Args:
            batch_size: B.
            device: where the tensors go (default: the CPU).
            generator: for reproducible draws; they are made on its device, then moved.
        """
        config = self.config
        source = generator.device if generator is not None else torch.device("cpu")
        dtype = self.output.weight.dtype
        static_ids = torch.stack(
            [
                torch.randint(c, (batch_size,), generator=generator, device=source)
                for c in config.static_cardinalities
            ],
            dim=1,
        )  # (B, S)
        shapes = [
            (batch_size, config.encoder_length, config.num_observed),
            (batch_size, config.encoder_length, config.num_known),
            (batch_size, config.horizon, config.num_known),
        ]
        reals = [
            torch.randn(shape, generator=generator, device=source, dtype=dtype) for shape in shapes
        ]
        target = torch.device(device) if device is not None else torch.device("cpu")
        inputs = [static_ids, *reals]
        if config.num_encoder_categorical:

            def codes(steps: int, cardinalities: list[int]) -> Tensor:
                shape = (batch_size, steps, len(cardinalities))
                uniform = torch.rand(shape, generator=generator, device=source)
                return (uniform * torch.tensor(cardinalities, device=source)).long()

            known = config.known_categorical_cardinalities
            inputs.append(
                codes(config.encoder_length, config.observed_categorical_cardinalities + known)
            )
            inputs.append(codes(config.horizon, known))  # (B, Td, Ck)
        return tuple(tensor.to(target) for tensor in inputs)


def _required(codes: Tensor | None, name: str) -> Tensor:
    if codes is None:
        raise ValueError(
            f"{name} is None but the model has categorical inputs; pass the batch's codes "
            "(Batch.inputs() gives all six inputs)"
        )
    return codes


def _repeat_over_time(context: Tensor, steps: int) -> Tensor:
    """``(B, C)`` -> ``(B * steps, C)``, row ``b * steps + t`` holding ``context[b]``."""
    return context.unsqueeze(1).expand(-1, steps, -1).reshape(-1, context.size(-1))
