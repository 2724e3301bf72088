"""Training steps written the way people write them, for ``tests/planner/test_user_steps.py``.

Each :class:`UserStep` is a model, a batch and a loss as a user would hand them to
``autockpt.plan``: custom autograd Functions (gradient reversal, straight-through estimators, a
hand-written fused activation, a Function that saves its inputs and marks an output
non-differentiable), grad-mode and autocast regions inside ``forward``, losses that close over
the batch's targets, read ``.item()``, take dict or tuple outputs or keep state, functional
dropout with SDPA, tied weights, in-place ops, dict batches, and models fx cannot trace.

Shape legend: B batch, W width, C classes, T tokens, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, CLASSES, BATCH = 64, 10, 2048
HORIZON = 12
TOKENS, VOCAB = 32, 96


@dataclass(frozen=True)
class UserStep:
    """One user's training step.

    Attributes:
        name: the test id.
        style: what it stands for, one line.
        build: makes the model (seeded).
        batch: makes ``(inputs, targets)`` (seeded); targets may be ``()`` when the loss closes
            over them.
        loss_fn: ``loss_fn(output, *targets)``.
        tracing: the path the plan must take: ``"fx"`` or ``"forward-hooks"``.
        loss_reduction: whether the loss is a mean or a sum over samples.
        gradient_tolerance: ``rtol`` for the gradients (bfloat16 regions round per piece).
        budget_share: the budget, as a share of the unplanned peak.
        needs: a package the step needs beyond the base (its test skips without it).
    """

    name: str
    style: str
    build: Callable[[], nn.Module]
    batch: Callable[[], tuple[tuple[Any, ...], tuple[Any, ...]]]
    loss_fn: Callable[..., torch.Tensor]
    tracing: Literal["fx", "forward-hooks"] = "fx"
    loss_reduction: Literal["mean", "sum"] = "mean"
    gradient_tolerance: float = 1e-4
    budget_share: float = 0.5
    needs: str | None = None


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _classes(seed: int = 0) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    generator = _generator(seed)
    x = torch.randn(BATCH, WIDTH, generator=generator)  # (B, W)
    return (x,), (torch.randint(0, CLASSES, (BATCH,), generator=generator),)


def _mlp(depth: int, width: int = WIDTH) -> nn.Sequential:
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)))


def _seeded(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return make()

    return build


# ------------------------------------------------------------------- custom autograd Functions


class GradientReversal(torch.autograd.Function):
    """DANN's layer: the identity forward, the gradient negated and scaled back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, strength: float) -> torch.Tensor:
        ctx.strength = strength
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.strength * grad, None


class DomainAdversarial(nn.Module):
    """Features, a label head, and a domain head behind a gradient reversal layer."""

    def __init__(self) -> None:
        super().__init__()
        self.features = _mlp(4)
        self.label_head = nn.Linear(WIDTH, CLASSES)
        self.domain_head = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.features(x)  # (B, W)
        reversed_ = GradientReversal.apply(features, 0.3)
        return self.label_head(features), self.domain_head(reversed_)  # (B, C), (B, 2)


def _domain_batch() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    (x,), (labels,) = _classes(1)
    return (x,), (labels, torch.randint(0, 2, (BATCH,), generator=_generator(2)))


def _domain_loss(output: tuple[torch.Tensor, torch.Tensor], labels, domains) -> torch.Tensor:
    label_logits, domain_logits = output
    return F.cross_entropy(label_logits, labels) + F.cross_entropy(domain_logits, domains)


class RoundStraightThrough(torch.autograd.Function):
    """Quantization-aware training: round forward, the gradient passed straight through."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def fake_quantize(x: torch.Tensor, levels: float) -> torch.Tensor:
    return RoundStraightThrough.apply(x.clamp(-1, 1) * levels) / levels


class QuantizedLinear(nn.Linear):
    """A linear layer that trains through 4-bit weights and 8-bit activations."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight.abs().max().detach()
        weight = fake_quantize(self.weight / scale, 7.0) * scale
        return F.linear(fake_quantize(x, 127.0), weight, self.bias)


class QuantizedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(QuantizedLinear(WIDTH, WIDTH) for _ in range(4))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


class FusedSwiGLU(torch.autograd.Function):
    """A fused kernel's Python twin: ``silu(gate) * up`` with a hand-written backward that
    saves only its inputs (as fused kernels do)."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        sigmoid = torch.sigmoid(gate)
        silu = gate * sigmoid
        return grad * up * sigmoid * (1 + gate * (1 - sigmoid)), grad * silu


class SwiGLUBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gates = nn.ModuleList(nn.Linear(WIDTH, 2 * WIDTH) for _ in range(4))
        self.ups = nn.ModuleList(nn.Linear(WIDTH, 2 * WIDTH) for _ in range(4))
        self.downs = nn.ModuleList(nn.Linear(2 * WIDTH, WIDTH) for _ in range(4))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for gate, up, down in zip(self.gates, self.ups, self.downs, strict=True):
            x = x + down(FusedSwiGLU.apply(gate(x), up(x)))  # (B, W)
        return self.head(x)


class TopKSparse(torch.autograd.Function):
    """Keeps each row's ``k`` largest activations: saves its mask for backward and returns it
    too, marked non-differentiable."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        threshold = x.topk(k, dim=-1).values[..., -1:]
        mask = x >= threshold
        ctx.save_for_backward(mask)
        ctx.mark_non_differentiable(mask)
        return x * mask, mask

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _mask_grad: Any) -> tuple[torch.Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


class SparseAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(_mlp(2), nn.Linear(WIDTH, 4 * WIDTH))
        self.decoder = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, mask = TopKSparse.apply(self.encoder(x), 16)  # (B, 4W), (B, 4W) bool
        return {"reconstruction": self.decoder(codes), "active": mask.float().mean(-1)}


def _reconstruction_batch() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    x = torch.randn(BATCH, WIDTH, generator=_generator(3))
    return (x,), (x.clone(),)


def _reconstruction_loss(output: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output["reconstruction"], target)


# ------------------------------------------------------------------- grad-mode and autocast


class DistilledStudent(nn.Module):
    """A student trained beside a frozen teacher that runs under ``no_grad`` in ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.teacher = nn.Sequential(_mlp(3), nn.Linear(WIDTH, CLASSES))
        self.student = nn.Sequential(_mlp(3), nn.Linear(WIDTH, CLASSES))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            teacher = self.teacher(x)  # (B, C)
        return {"student": self.student(x), "teacher": teacher}


def _distillation_loss(output: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    temperature = 2.0
    soft = F.kl_div(
        F.log_softmax(output["student"] / temperature, -1),
        F.softmax(output["teacher"] / temperature, -1),
        reduction="batchmean",
    )
    return soft * temperature**2 + F.cross_entropy(output["student"], labels)


class MixedPrecisionBody(nn.Module):
    """The body under ``torch.autocast(bfloat16)``, the head back in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp(4)
        self.head = nn.Linear(WIDTH, CLASSES)

    @torch.autocast("cpu", dtype=torch.bfloat16)
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).float())


# --------------------------------------------------------------------------- losses


class PlainMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp(5)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


_CLOSED_LABELS = _classes(4)[1][0]


def _closed_over_loss(output: torch.Tensor) -> torch.Tensor:
    # What a quick script writes: the labels come from the enclosing scope, not the planner.
    return F.cross_entropy(output, _CLOSED_LABELS)


def _finite_checked_loss(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    loss = F.cross_entropy(output, labels)
    if not torch.isfinite(loss).item():
        raise FloatingPointError(f"loss is {loss.item()}")
    return loss


class LoggedLoss:
    """A loss that keeps a history of ``loss.item()`` and the accuracy, for a progress line."""

    def __init__(self) -> None:
        self.history: list[float] = []
        self.accuracy: list[float] = []

    def __call__(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(output, labels)
        self.history.append(loss.item())
        self.accuracy.append(float((output.argmax(-1) == labels).float().mean()))
        return loss


class WeightedSmoothedLoss(nn.Module):
    """A loss module with state: class weights in a buffer, label smoothing, a call count."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weights", torch.linspace(0.5, 1.5, CLASSES))
        self.calls = 0

    def forward(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return F.cross_entropy(output, labels, weight=self.weights, label_smoothing=0.1)


class AuxiliaryOutput(nn.Module):
    """Returns the prediction and a penalty (a tuple), as mixture-of-experts layers do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp(4)
        self.router = nn.Linear(WIDTH, 4)
        with torch.no_grad():
            self.router.weight.mul_(20.0)  # a router that has learned to prefer: loads differ
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        load = F.softmax(self.router(h), -1).mean(0)  # (4,): mixes samples, as a batch mean
        return self.head(h), (load * load).sum() * 4


def _auxiliary_loss(
    output: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor
) -> torch.Tensor:
    logits, penalty = output
    return F.cross_entropy(logits, labels) + 0.1 * penalty


# ------------------------------------------------------------- ways of writing a model


class TiedLanguageModel(nn.Module):
    """Embedding and output head tied, SDPA with functional dropout keyed on
    ``self.training``, a residual added in place."""

    def __init__(self, heads: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(1, TOKENS, WIDTH) / math.sqrt(WIDTH))
        self.qkv = nn.ModuleList(nn.Linear(WIDTH, 3 * WIDTH) for _ in range(2))
        self.mlp = nn.ModuleList(_mlp(1) for _ in range(2))
        self.norm = nn.LayerNorm(WIDTH)
        self.heads, self.p = heads, p

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        x = self.embed(ids) + self.position[:, :t]  # (B, T, W)
        for qkv, mlp in zip(self.qkv, self.mlp, strict=True):
            q, k, v = qkv(x).chunk(3, dim=-1)  # fx unpacks a chunk, not a loop over it
            q, k, v = (
                z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v)
            )  # (B, H, T, W/H)
            attended = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True
            )
            x = x + attended.transpose(1, 2).reshape(b, t, -1)
            update = F.dropout(mlp(x), self.p, training=self.training)
            update += x  # in place on a value nothing saved
            x = update
        return F.linear(self.norm(x), self.embed.weight)  # (B, T, V): the head is the embedding


def _tokens() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    generator = _generator(5)
    ids = torch.randint(0, VOCAB, (256, TOKENS), generator=generator)
    return (ids,), (torch.randint(0, VOCAB, (256, TOKENS), generator=generator),)


def _token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class InPlaceConvNet(nn.Module):
    """A small convolutional net the way older code writes it: ``ReLU(inplace=True)``,
    ``x.mul_``, ``out += identity``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True))
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(16, 16, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(16, 16, 3, padding=1),
            )
            for _ in range(3)
        )
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)  # (B, 16, H, W)
        for block in self.blocks:
            out = block(x)
            out.mul_(0.5)
            out += x
            x = F.relu(out)
        return self.head(x.mean((2, 3)))


def _images() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    generator = _generator(6)
    x = torch.randn(64, 3, 24, 24, generator=generator)
    return (x,), (torch.randint(0, CLASSES, (64,), generator=generator),)


class DictBatchGate(nn.Module):
    """A dict batch with a mask, and a branch on a tensor's value fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(4)
        )
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = batch["features"]  # (B, W)
        for block in self.blocks:
            x = block(x)  # (B, 4W) inside
        if batch["weight"].min() < 1:  # down-weight marked rows only when there are any
            x = x * batch["weight"][:, None]
        return self.head(x)


def _dict_batch() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    generator = _generator(7)
    weight = torch.ones(BATCH)
    weight[::7] = 0.5
    batch = {"features": torch.randn(BATCH, WIDTH, generator=generator), "weight": weight}
    return (batch,), (torch.randint(0, CLASSES, (BATCH,), generator=generator),)


_DICT_LABELS = _dict_batch()[1][0]


def _closed_over_dict_loss(output: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, _DICT_LABELS)


class _LanguageModelBatch:
    """Token ids and next-token labels, the labels closed over by the loss (as a quick
    fine-tuning script writes it: ``loss_fn=lambda out: F.cross_entropy(out.logits..., labels)``)."""

    def __init__(self, seed: int) -> None:
        generator = _generator(seed)
        self.ids = torch.randint(0, VOCAB, (16, 64), generator=generator)
        self.labels = torch.randint(0, VOCAB, (16, 64), generator=generator)

    def batch(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return (self.ids,), ()

    def loss(self, output: Any) -> torch.Tensor:
        return F.cross_entropy(output.logits.flatten(0, 1), self.labels.flatten())


def _gpt2() -> nn.Module:
    import transformers

    from tests.planner.test_hugging_face import gpt2_config

    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(gpt2_config()).train()


def _llama() -> nn.Module:
    import transformers

    from tests.planner.test_hugging_face import llama_config

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(llama_config()).train()


class GaussianForecaster(nn.Module):
    """A DeepAR-style probabilistic head: ``forward`` builds a ``torch.distributions.Normal``
    (which checks its arguments, reading a value off them) and returns each sample's negative
    log-likelihood of the horizon it is given, as forecasting libraries do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp(5)
        self.loc = nn.Linear(WIDTH, HORIZON)
        self.scale = nn.Linear(WIDTH, HORIZON)

    def forward(self, x: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
        h = self.body(x)  # (B, W)
        forecast = torch.distributions.Normal(self.loc(h), F.softplus(self.scale(h)) + 1e-3)
        return -forecast.log_prob(future).mean(-1)  # (B,)


def _gaussian_forecaster() -> nn.Module:
    # Argument checks on, as a fresh process has them: the first torch.compile in a process
    # turns them off for good (dynamo does), and with them off torch.fx traces the distribution
    # and the step would not take the path this entry stands for.
    torch.distributions.Distribution.set_default_validate_args(True)
    return _seeded(GaussianForecaster)()


def _horizons() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    generator = _generator(18)
    x = torch.randn(BATCH, WIDTH, generator=generator)  # (B, W)
    return (x, torch.randn(BATCH, HORIZON, generator=generator)), ()


_GPT2_BATCH, _LLAMA_BATCH = _LanguageModelBatch(16), _LanguageModelBatch(17)

STEPS: dict[str, UserStep] = {
    step.name: step
    for step in (
        UserStep(
            "gradient-reversal",
            "domain-adversarial training: a reversal Function, a tuple output, two targets",
            _seeded(DomainAdversarial),
            _domain_batch,
            _domain_loss,
        ),
        UserStep(
            "straight-through-quantization",
            "quantization-aware training: round with a straight-through Function in every layer",
            _seeded(QuantizedMLP),
            lambda: _classes(8),
            lambda output, labels: F.cross_entropy(output, labels),
        ),
        UserStep(
            "fused-swiglu-function",
            "a fused activation's Function that saves only its inputs",
            _seeded(SwiGLUBlocks),
            lambda: _classes(9),
            lambda output, labels: F.cross_entropy(output, labels),
        ),
        UserStep(
            "top-k-sparse-function",
            "a Function that saves a mask and returns it marked non-differentiable; dict output",
            _seeded(SparseAutoencoder),
            _reconstruction_batch,
            _reconstruction_loss,
        ),
        UserStep(
            "no-grad-teacher",
            "distillation: a frozen teacher under no_grad inside forward; a dict output",
            _seeded(DistilledStudent),
            lambda: _classes(10),
            _distillation_loss,
        ),
        UserStep(
            "autocast-method",
            "a method decorated with torch.autocast(bfloat16) inside forward",
            _seeded(MixedPrecisionBody),
            lambda: _classes(11),
            lambda output, labels: F.cross_entropy(output, labels),
            gradient_tolerance=2e-2,
        ),
        UserStep(
            "closed-over-targets",
            "a loss that ignores its target arguments and closes over the batch's labels",
            _seeded(PlainMLP),
            lambda: (_classes(4)[0], ()),
            _closed_over_loss,
        ),
        UserStep(
            "finite-check-item",
            "a loss that checks torch.isfinite(loss).item() and raises",
            _seeded(PlainMLP),
            lambda: _classes(12),
            _finite_checked_loss,
        ),
        UserStep(
            "logged-item-and-accuracy",
            "a loss object keeping loss.item() and float(accuracy) for a progress line",
            _seeded(PlainMLP),
            lambda: _classes(13),
            LoggedLoss(),
        ),
        UserStep(
            "stateful-loss-module",
            "an nn.Module loss with a weight buffer, label smoothing and a call counter",
            _seeded(PlainMLP),
            lambda: _classes(14),
            WeightedSmoothedLoss(),
        ),
        UserStep(
            "auxiliary-tuple-output",
            "a tuple output with a load-balancing penalty that mixes samples (no micro-batches)",
            _seeded(AuxiliaryOutput),
            lambda: _classes(15),
            _auxiliary_loss,
            budget_share=0.7,
        ),
        UserStep(
            "tied-sdpa-language-model",
            "tied embedding and head, SDPA and functional dropout on self.training, x += ...",
            _seeded(TiedLanguageModel),
            _tokens,
            _token_loss,
        ),
        UserStep(
            "in-place-convolutions",
            "ReLU(inplace=True), out.mul_(0.5), out += identity",
            _seeded(InPlaceConvNet),
            _images,
            lambda output, labels: F.cross_entropy(output, labels),
        ),
        UserStep(
            "dict-batch-closed-over-loss",
            "a dict batch, a branch on a tensor's value (hooks), a loss closed over the labels",
            _seeded(DictBatchGate),
            lambda: (_dict_batch()[0], ()),
            _closed_over_dict_loss,
            tracing="forward-hooks",
        ),
        UserStep(
            "gpt2-called-directly-closed-over-labels",
            "Hugging Face GPT-2 called as it is, its ModelOutput's logits in a closed-over loss",
            _gpt2,
            _GPT2_BATCH.batch,
            _GPT2_BATCH.loss,
            tracing="forward-hooks",
            needs="transformers",
        ),
        UserStep(
            "llama-called-directly-closed-over-labels",
            "a Llama-style decoder called as it is, its logits in a closed-over loss, at 60%",
            _llama,
            _LLAMA_BATCH.batch,
            _LLAMA_BATCH.loss,
            tracing="forward-hooks",
            budget_share=0.6,
            needs="transformers",
        ),
        UserStep(
            "distribution-built-in-forward",
            "a Normal built in forward (it checks its arguments) and its NLL returned, fx refused",
            _gaussian_forecaster,
            _horizons,
            lambda nll: nll.mean(),
            tracing="forward-hooks",
        ),
    )
}
