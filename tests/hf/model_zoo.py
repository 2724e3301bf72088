"""Small Hugging Face ``transformers`` models for the tests: twenty-one classes, each built from a
config written here with random weights, and a batch for it as ``transformers.Trainer`` passes
one (keyword tensors, labels included, so ``model(**batch).loss`` is a scalar).

Nothing is downloaded: no ``from_pretrained``, no tokenizer, no hub access. Every model has 2
layers (2 per stack for encoder-decoders), widths of 32 to 64, 2 to 4 heads, a vocabulary of
128 where it has one, 32 tokens, 32x32 images, and dropout at 0.1 wherever its config has a
dropout probability. LayerDrop, which skips whole layers, stays off (a forward graph that
changes from call to call is another matter than dropout). ``use_cache`` keeps its class
default (see ``ZooModel.has_cache``).

The forecasting models are PatchTST and the vanilla ``TimeSeriesTransformerForPrediction``,
picked over Informer (its ProbSparse attention samples keys at random, beyond dropout) and
Autoformer (auto-correlation with a top-k over lags) as the simplest to build and train: a
Bart-like encoder-decoder with a Student-t negative log-likelihood loss.

Every example of a batch comes from its own seeded generator, so ``batch(n)`` is the first
``n`` rows of ``batch(m)`` for any ``m >= n``; every masked-LM row masks as many tokens as
every other, so the loss of a batch is the mean of its rows' losses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers
from torch import nn

Batch = dict[str, torch.Tensor]

VOCAB, TOKENS, TARGET_TOKENS = 128, 32, 16
FIRST_TOKEN = 4  # ids below this are the special tokens (pad, bos, eos, mask) of every config
MASK_TOKEN, MASKED_PER_ROW = 3, 5
WIDTH, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
DROPOUT = 0.1
IMAGE, CLASSES = 32, 10
MEL_BINS = 16
CHANNELS, CONTEXT, HORIZON = 3, 32, 8
LAGS = (1, 2, 3)
SEED = 0


@dataclass(frozen=True)
class ZooModel:
    """One Hugging Face model: its name, kind, how to build it and a batch for it.

    ``has_cache`` says whether the class keeps a KV cache. Bart and the Time Series Transformer
    turn theirs off in a call given labels, so their outputs of ``model(**batch)`` carry none;
    the other classes with a cache return it in training too.
    """

    name: str
    kind: str
    make: Callable[[], nn.Module]
    batch: Callable[[int], Batch]
    has_cache: bool


def loss_of(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The loss the model computes itself from a batch with labels."""
    return model(**batch).loss


def _rows(size: int, example: Callable[[torch.Generator], Batch]) -> Batch:
    """``size`` examples stacked, the i-th drawn from a generator seeded with ``SEED + i``."""
    examples = [example(torch.Generator().manual_seed(SEED + i)) for i in range(size)]
    return {key: torch.stack([e[key] for e in examples]) for key in examples[0]}


def _tokens(generator: torch.Generator, length: int = TOKENS) -> torch.Tensor:
    return torch.randint(FIRST_TOKEN, VOCAB, (length,), generator=generator)


# Batches.


def _causal_lm_batch(size: int) -> Batch:
    """Tokens, an all-ones attention mask and the tokens again as labels (the model shifts)."""

    def example(generator: torch.Generator) -> Batch:
        ids = _tokens(generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    return _rows(size, example)


def _masked_lm_batch(size: int) -> Batch:
    """``MASKED_PER_ROW`` tokens of each row replaced by the mask token and kept as labels, the
    rest of the labels ignored (-100)."""

    def example(generator: torch.Generator) -> Batch:
        ids = _tokens(generator)
        masked = torch.rand(TOKENS, generator=generator).argsort()[:MASKED_PER_ROW]
        labels = torch.full_like(ids, -100)
        labels[masked] = ids[masked]
        inputs = ids.clone()
        inputs[masked] = MASK_TOKEN
        return {"input_ids": inputs, "attention_mask": torch.ones_like(ids), "labels": labels}

    return _rows(size, example)


def _classification_batch(size: int) -> Batch:
    """Tokens, an all-ones attention mask and one class of three per row."""

    def example(generator: torch.Generator) -> Batch:
        ids = _tokens(generator)
        label = torch.randint(0, 3, (), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": label}

    return _rows(size, example)


def _seq2seq_batch(size: int) -> Batch:
    """Source tokens with an all-ones attention mask, and target tokens as labels (the model
    shifts them right into its decoder inputs)."""

    def example(generator: torch.Generator) -> Batch:
        ids = _tokens(generator)
        labels = _tokens(generator, TARGET_TOKENS)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    return _rows(size, example)


def _speech_batch(size: int) -> Batch:
    """Log-mel features of ``2 * TOKENS`` frames (Whisper's convolutions halve them) and target
    tokens as labels."""

    def example(generator: torch.Generator) -> Batch:
        features = torch.randn(MEL_BINS, 2 * TOKENS, generator=generator)
        return {"input_features": features, "labels": _tokens(generator, TARGET_TOKENS)}

    return _rows(size, example)


def _image_batch(size: int) -> Batch:
    """Normalized 32x32 RGB images and one class of ``CLASSES`` per image."""

    def example(generator: torch.Generator) -> Batch:
        pixels = torch.randn(3, IMAGE, IMAGE, generator=generator)
        label = torch.randint(0, CLASSES, (), generator=generator)
        return {"pixel_values": pixels, "labels": label}

    return _rows(size, example)


def _patchtst_batch(size: int) -> Batch:
    """Random walks of ``CHANNELS`` channels: ``CONTEXT`` steps past, ``HORIZON`` to come."""

    def example(generator: torch.Generator) -> Batch:
        series = torch.randn(CONTEXT + HORIZON, CHANNELS, generator=generator).cumsum(0)
        return {"past_values": series[:CONTEXT], "future_values": series[CONTEXT:]}

    return _rows(size, example)


def _time_series_batch(size: int) -> Batch:
    """A positive noisy sine over ``CONTEXT`` steps and the lags before them, then ``HORIZON``
    steps to come, each step with its position in the period as the one time feature, and
    every past value observed."""
    past = CONTEXT + max(LAGS)

    def example(generator: torch.Generator) -> Batch:
        start = torch.randint(0, 12, (), generator=generator)
        steps = torch.arange(past + HORIZON) + start
        phase = (steps % 12).float() / 12
        noise = 0.1 * torch.randn(past + HORIZON, generator=generator)
        values = 2 + torch.sin(2 * torch.pi * phase) + noise
        features = phase.unsqueeze(-1)
        return {
            "past_values": values[:past],
            "past_time_features": features[:past],
            "past_observed_mask": torch.ones(past),
            "future_values": values[past:],
            "future_time_features": features[past:],
        }

    return _rows(size, example)


# Decoders.


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=TOKENS, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
        n_inner=FFN, resid_pdrop=DROPOUT, embd_pdrop=DROPOUT, attn_pdrop=DROPOUT,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _gpt_neox() -> nn.Module:
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=FFN, max_position_embeddings=TOKENS, attention_dropout=DROPOUT,
        hidden_dropout=DROPOUT, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.GPTNeoXForCausalLM(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=TOKENS,
        attention_dropout=DROPOUT, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _mistral() -> nn.Module:
    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=TOKENS,
        attention_dropout=DROPOUT, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.MistralForCausalLM(config)


def _qwen2() -> nn.Module:
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=TOKENS,
        attention_dropout=DROPOUT, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config)


def _gemma() -> nn.Module:
    config = transformers.GemmaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=WIDTH // HEADS,
        max_position_embeddings=TOKENS, attention_dropout=DROPOUT,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.GemmaForCausalLM(config)


def _phi() -> nn.Module:
    config = transformers.PhiConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, max_position_embeddings=TOKENS, resid_pdrop=DROPOUT,
        embd_pdrop=DROPOUT, attention_dropout=DROPOUT, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.PhiForCausalLM(config)


def _opt() -> nn.Module:
    config = transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, ffn_dim=FFN,
        num_attention_heads=HEADS, max_position_embeddings=TOKENS, dropout=DROPOUT,
        attention_dropout=DROPOUT, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.OPTForCausalLM(config)


def _falcon() -> nn.Module:
    config = transformers.FalconConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        ffn_hidden_size=FFN, max_position_embeddings=TOKENS, hidden_dropout=DROPOUT,
        attention_dropout=DROPOUT, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.FalconForCausalLM(config)


def _mixtral() -> nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=TOKENS,
        num_local_experts=4, num_experts_per_tok=2, attention_dropout=DROPOUT,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.MixtralForCausalLM(config)


# Encoders.


def _encoder_settings() -> dict[str, float | int]:
    return {
        "vocab_size": VOCAB, "hidden_size": WIDTH, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "intermediate_size": FFN, "hidden_dropout_prob": DROPOUT,
        "attention_probs_dropout_prob": DROPOUT, "pad_token_id": 0,
    }  # fmt: skip


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        **_encoder_settings(), max_position_embeddings=TOKENS, num_labels=3,
        classifier_dropout=DROPOUT,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


def _roberta() -> nn.Module:
    # RoBERTa's positions start after the padding id.
    settings = {**_encoder_settings(), "pad_token_id": 1}
    config = transformers.RobertaConfig(
        **settings, max_position_embeddings=TOKENS + 2, bos_token_id=0, eos_token_id=2
    )
    return transformers.RobertaForMaskedLM(config)


def _deberta_v2() -> nn.Module:
    config = transformers.DebertaV2Config(
        **_encoder_settings(), max_position_embeddings=TOKENS, relative_attention=True,
        position_buckets=16, norm_rel_ebd="layer_norm", share_att_key=True,
        pos_att_type=["p2c", "c2p"], position_biased_input=False, pooler_dropout=DROPOUT,
    )  # fmt: skip
    return transformers.DebertaV2ForMaskedLM(config)


def _electra() -> nn.Module:
    config = transformers.ElectraConfig(
        **_encoder_settings(), embedding_size=WIDTH // 2, max_position_embeddings=TOKENS,
        summary_last_dropout=DROPOUT,
    )  # fmt: skip
    return transformers.ElectraForMaskedLM(config)


# Encoder-decoders.


def _t5() -> nn.Module:
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=FFN, num_layers=LAYERS,
        num_heads=HEADS, dropout_rate=DROPOUT, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config)


def _bart() -> nn.Module:
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=WIDTH, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN, max_position_embeddings=TOKENS, dropout=DROPOUT,
        attention_dropout=DROPOUT, activation_dropout=DROPOUT, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
    )  # fmt: skip
    return transformers.BartForConditionalGeneration(config)


def _whisper() -> nn.Module:
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=MEL_BINS, d_model=WIDTH, encoder_layers=LAYERS,
        decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_source_positions=TOKENS,
        max_target_positions=TOKENS, dropout=DROPOUT, attention_dropout=DROPOUT,
        activation_dropout=DROPOUT, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, begin_suppress_tokens=None,
    )  # fmt: skip
    return transformers.WhisperForConditionalGeneration(config)


# Vision.


def _vit() -> nn.Module:
    config = transformers.ViTConfig(
        image_size=IMAGE, patch_size=8, hidden_size=WIDTH, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN, hidden_dropout_prob=DROPOUT,
        attention_probs_dropout_prob=DROPOUT, num_labels=CLASSES,
    )  # fmt: skip
    return transformers.ViTForImageClassification(config)


def _convnext() -> nn.Module:
    config = transformers.ConvNextConfig(
        image_size=IMAGE, patch_size=4, num_stages=2, hidden_sizes=[WIDTH // 2, WIDTH],
        depths=[1, 1], drop_path_rate=DROPOUT, num_labels=CLASSES,
    )  # fmt: skip
    return transformers.ConvNextForImageClassification(config)


# Forecasting.


def _patchtst() -> nn.Module:
    config = transformers.PatchTSTConfig(
        num_input_channels=CHANNELS, context_length=CONTEXT, prediction_length=HORIZON,
        patch_length=8, patch_stride=8, d_model=WIDTH // 2, num_attention_heads=HEADS,
        num_hidden_layers=LAYERS, ffn_dim=WIDTH, attention_dropout=DROPOUT,
        positional_dropout=DROPOUT, path_dropout=DROPOUT, ff_dropout=DROPOUT,
        head_dropout=DROPOUT,
    )  # fmt: skip
    return transformers.PatchTSTForPrediction(config)


def _time_series_transformer() -> nn.Module:
    config = transformers.TimeSeriesTransformerConfig(
        prediction_length=HORIZON, context_length=CONTEXT, lags_sequence=list(LAGS),
        num_time_features=1, d_model=WIDTH // 2, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS // 2, decoder_attention_heads=HEADS // 2,
        encoder_ffn_dim=WIDTH, decoder_ffn_dim=WIDTH, dropout=DROPOUT,
        attention_dropout=DROPOUT, activation_dropout=DROPOUT, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )  # fmt: skip
    return transformers.TimeSeriesTransformerForPrediction(config)


ZOO: tuple[ZooModel, ...] = (
    ZooModel("gpt2", "decoder", _gpt2, _causal_lm_batch, True),
    ZooModel("gpt-neox", "decoder", _gpt_neox, _causal_lm_batch, True),
    ZooModel("llama", "decoder", _llama, _causal_lm_batch, True),
    ZooModel("mistral", "decoder", _mistral, _causal_lm_batch, True),
    ZooModel("qwen2", "decoder", _qwen2, _causal_lm_batch, True),
    ZooModel("gemma", "decoder", _gemma, _causal_lm_batch, True),
    ZooModel("phi", "decoder", _phi, _causal_lm_batch, True),
    ZooModel("opt", "decoder", _opt, _causal_lm_batch, True),
    ZooModel("falcon", "decoder", _falcon, _causal_lm_batch, True),
    ZooModel("mixtral", "decoder", _mixtral, _causal_lm_batch, True),
    ZooModel("bert", "encoder", _bert, _classification_batch, False),
    ZooModel("roberta", "encoder", _roberta, _masked_lm_batch, False),
    ZooModel("deberta-v2", "encoder", _deberta_v2, _masked_lm_batch, False),
    ZooModel("electra", "encoder", _electra, _masked_lm_batch, False),
    ZooModel("t5", "encoder-decoder", _t5, _seq2seq_batch, True),
    ZooModel("bart", "encoder-decoder", _bart, _seq2seq_batch, True),
    ZooModel("whisper", "encoder-decoder", _whisper, _speech_batch, True),
    ZooModel("vit", "vision", _vit, _image_batch, False),
    ZooModel("convnext", "vision", _convnext, _image_batch, False),
    ZooModel("patchtst", "forecasting", _patchtst, _patchtst_batch, False),
    ZooModel(
        "time-series-transformer", "forecasting", _time_series_transformer, _time_series_batch, True
    ),
)
