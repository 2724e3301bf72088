"""The head and the loss in chunks of positions (NOTE [Loss over positions in chunks]): a
language model whose loss is its floor at one or two sequences is planned below that floor,
every step counted by the tests' own counter, with the plain step's loss and gradients (ignored
labels and label smoothing included) and the original's outputs."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from torch import nn

import autockpt
from autockpt.errors import InfeasibleBudgetError, PlanMismatchError
from autockpt.plan_report import print_plan
from autockpt.planner.measure.loss_positions import loss_over_positions
from autockpt.planner.runtime.chunked_loss import (
    IGNORE_INDEX,
    ChunkedLoss,
    LossOverPositions,
    chunk_spans,
)
from tests.oracle import assert_same_gradients, measured_step

VOCAB, WIDTH, TOKENS, BATCH = 6000, 32, 512, 2


class TinyLM(nn.Module):
    """An embedding, two residual MLP blocks with dropout, and a linear head to the vocabulary:
    its logits are most of its step."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(WIDTH),
                nn.Linear(WIDTH, 4 * WIDTH),
                nn.GELU(),
                nn.Dropout(0.1),
                nn.Linear(4 * WIDTH, WIDTH),
            )
            for _ in range(2)
        )
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = hidden + block(hidden)
        return self.lm_head(hidden)


class DictLM(TinyLM):
    """The same model taking a dict batch, which torch.fx does not plan: module-level
    segments, the model cut before its head as a module."""

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return super().forward(batch["ids"])


def smoothed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the vocabulary with label smoothing; labels -100 are ignored."""
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.view(-1), label_smoothing=0.1)


def sequence_normalised_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy plus a term normalised over the whole sequence: it mixes positions."""
    spread = logits[..., 0].logsumexp(dim=1).mean()
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) + spread


def _batch() -> tuple[tuple[torch.Tensor], tuple[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=generator)
    labels = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=generator)
    labels[0, :300] = IGNORE_INDEX  # a prompt: the first sample's loss counts 212 positions
    labels[1, 500:] = IGNORE_INDEX  # padding at the end of the second
    return (ids,), (labels,)


def _minimum(model: nn.Module, inputs, targets, loss_fn, **options) -> InfeasibleBudgetError:
    with pytest.raises(InfeasibleBudgetError) as refused:
        autockpt.plan(model, inputs, 1, loss_fn=loss_fn, example_targets=targets, **options)
    return refused.value


@pytest.mark.parametrize("make", [TinyLM, DictLM], ids=["fx", "forward-hooks"])
def test_a_loss_over_positions_in_chunks_plans_below_its_floor_with_the_plain_gradients(make):
    torch.manual_seed(0)
    model = make().train()
    inputs, targets = _batch()
    if make is DictLM:
        inputs = ({"ids": inputs[0]},)
    whole = _minimum(model, inputs, targets, smoothed_loss, allow_loss_chunks=False)
    chunked = _minimum(model, inputs, targets, smoothed_loss)
    # Without chunks the loss is the floor; with them the floor is well below it.
    assert "the peak is the loss" in str(whole)
    assert chunked.minimum_bytes < 0.75 * whole.minimum_bytes
    budget = (chunked.minimum_bytes + whole.minimum_bytes) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autockpt.plan(model, inputs, budget, loss_fn=smoothed_loss, example_targets=targets)
    assert plan.loss_chunks is not None and plan.loss_chunks.head == "lm_head"
    assert plan.tracing == ("fx" if make is TinyLM else "forward-hooks")
    assert plan.loss_chunks.reduction == "mean over labelled" and plan.loss_chunks.num_chunks > 1
    assert plan.unplanned_peak_bytes == whole.unplanned_bytes > budget
    assert any("chunks of positions" in note for note in plan.notes)
    console = Console(record=True, width=200)
    print_plan(console, plan, budget_given=True)
    assert "loss chunks:   lm_head and the loss in" in console.export_text()
    plan = autockpt.Plan.model_validate_json(plan.model_dump_json())  # as saved and reloaded
    counted = dict(loss_fn=smoothed_loss, targets=targets, loss_reduction="mean")
    peak, loss, got = measured_step(model, inputs, plan, **counted)
    assert peak <= budget
    _, want_loss, want = measured_step(model, inputs, **counted)
    torch.testing.assert_close(loss, want_loss)
    assert_same_gradients(got, want)
    planned = autockpt.apply(copy.deepcopy(model), plan)
    torch.manual_seed(1)
    trained_call = planned(*inputs)  # called directly while it trains: the whole logits
    torch.manual_seed(1)
    torch.testing.assert_close(trained_call, model(*inputs))
    with torch.no_grad():
        torch.testing.assert_close(planned.eval()(*inputs), model.eval()(*inputs))


def test_a_loss_that_mixes_positions_is_not_chunked():
    torch.manual_seed(0)
    model = TinyLM().train()
    inputs, targets = _batch()
    whole = _minimum(model, inputs, targets, sequence_normalised_loss, allow_loss_chunks=False)
    refused = _minimum(model, inputs, targets, sequence_normalised_loss)
    assert refused.minimum_bytes == whole.minimum_bytes
    assert "not a sum or a mean over positions" in str(refused)


def test_training_step_needs_the_planned_model_for_a_loss_in_chunks():
    torch.manual_seed(0)
    model = TinyLM().train()
    inputs, targets = _batch()
    budget = _minimum(model, inputs, targets, smoothed_loss).minimum_bytes * 11 // 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = autockpt.plan(model, inputs, budget, loss_fn=smoothed_loss, example_targets=targets)
    assert plan.loss_chunks is not None
    with pytest.raises(PlanMismatchError, match="autockpt.apply"):
        autockpt.training_step(model, plan, inputs, targets, smoothed_loss)
    other = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, 4))
    with pytest.raises(PlanMismatchError):
        autockpt.apply(other, plan)


@pytest.mark.parametrize(
    ("loss_fn", "reduction"),
    [
        (lambda o, y: F.cross_entropy(o.flatten(0, 1), y.flatten()), "mean over labelled"),
        (smoothed_loss, "mean over labelled"),
        (lambda o, y: F.cross_entropy(o.flatten(0, 1), y.flatten(), reduction="sum"), "sum"),
        (lambda o, y: (o.softmax(-1)[..., 0] - y / VOCAB).pow(2).mean(), "mean"),
    ],
    ids=["cross-entropy", "label-smoothing", "sum", "mean-squared"],
)
def test_the_probe_finds_how_a_loss_adds_up_over_positions(loss_fn, reduction):
    head = nn.Linear(WIDTH, VOCAB)
    labels = torch.randint(1, VOCAB, (3, 40))
    found = loss_over_positions(head, (3, 40, WIDTH), [labels], loss_fn)
    assert found == LossOverPositions(1, reduction)


@pytest.mark.parametrize(
    ("loss_fn", "reason"),
    [
        (sequence_normalised_loss, "not a sum or a mean"),
        # Another ignored label: -100 is refused, so which positions count is not known.
        (lambda o, y: F.cross_entropy(o.flatten(0, 1), y.flatten(), ignore_index=7), "refuses"),
        # Padding (label 0) masked by the loss itself, and present in the targets.
        (
            lambda o, y: F.cross_entropy(o.flatten(0, 1), y.masked_fill(y == 0, -100).flatten()),
            "not a sum or a mean",
        ),
        (lambda o, y: o.sum(-1), "not one number"),
    ],
    ids=["sequence-normalised", "other-ignore-index", "masked-padding", "not-scalar"],
)
def test_the_probe_refuses_a_loss_whose_chunks_do_not_add_up(loss_fn, reason):
    head = nn.Linear(WIDTH, 50)
    labels = torch.randint(1, 50, (3, 40))
    labels[1, 30] = 0
    found = loss_over_positions(head, (3, 40, WIDTH), [labels], loss_fn)
    assert isinstance(found, str) and reason in found, found


def test_chunk_spans_cover_every_position_once():
    assert chunk_spans(10, 3) == [(0, 4), (4, 3), (7, 3)]
    assert chunk_spans(2, 4) == [(0, 1), (1, 1)]


def test_the_probe_reads_a_classifier_head_over_its_samples():
    # Features (samples, width): the rows are the "positions", the windows overlap.
    head = nn.Linear(WIDTH, 10)
    found = loss_over_positions(head, (8, WIDTH), [torch.randint(0, 10, (8,))], F.cross_entropy)
    assert found == LossOverPositions(0, "mean over labelled")


@pytest.mark.parametrize("scale", [1.0, 0.25], ids=["loss", "loss-scaled"])
def test_chunked_loss_gives_the_whole_loss_and_its_gradients(scale):
    # A head with a bias, three samples, ignored labels: every gradient as the whole loss's,
    # whatever the caller multiplies the loss by (a micro-batch's weight).
    torch.manual_seed(0)
    head = nn.Linear(WIDTH, 50)
    features = torch.randn(3, 40, WIDTH, requires_grad=True)
    labels = torch.randint(0, 50, (3, 40))
    labels[0, :25] = IGNORE_INDEX
    loss_fn = lambda o, y: F.cross_entropy(o.flatten(0, 1), y.flatten(), label_smoothing=0.1)  # noqa: E731
    want_loss = loss_fn(head(features), labels)
    want = torch.autograd.grad(want_loss * scale, [features, head.weight, head.bias])
    chunked = ChunkedLoss(loss_fn, 6, LossOverPositions(1, "mean over labelled"))
    loss = chunked((features, head.weight, head.bias), labels)
    got = torch.autograd.grad(loss * scale, [features, head.weight, head.bias])
    torch.testing.assert_close(loss, want_loss)
    for name, a, b in zip(("features", "weight", "bias"), got, want, strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_forced_checkpointing_keeps_the_loss_whole():
    # use_gradient_checkpointing=True asks for every segment recomputed, and that alone.
    torch.manual_seed(0)
    model = TinyLM().train()
    inputs, targets = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # over the budget: it says so and plans anyway
        plan = autockpt.plan(
            model,
            inputs,
            1,
            loss_fn=smoothed_loss,
            example_targets=targets,
            use_gradient_checkpointing=True,
        )
    assert plan.strategy == "checkpoint-all" and plan.loss_chunks is None
