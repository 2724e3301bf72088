"""The shapes of a batch: which batches a plan holds for, batches grown to a bucket by their own
values, and the dimensions a declared maximum bounds (NOTE [Shapes a plan holds for])."""

from __future__ import annotations

import pytest
import torch

from autockpt.errors import ConfigError
from autockpt.planner.core.batch_split import (
    batch_shapes,
    declared_sizes,
    padded_to,
    read_max_shape,
    suggested_maximum,
)
from autockpt.plans_by_shape import next_power_of_two


def _batch(length: int, batch: int = 8) -> dict[str, torch.Tensor]:
    ids = torch.arange(batch * length).view(batch, length) % 50
    return {"input_ids": ids, "attention_mask": torch.ones(batch, length), "labels": ids}


def test_a_plan_holds_for_batches_no_larger_along_any_dimension() -> None:
    planned = batch_shapes((_batch(32),))
    assert planned.covers(batch_shapes((_batch(32),)))
    assert planned.covers(batch_shapes((_batch(7, batch=3),)))  # shorter and fewer
    assert not planned.covers(batch_shapes((_batch(33),)))  # one position longer
    assert not planned.covers(batch_shapes((_batch(8, batch=9),)))  # one sample more
    assert planned.text() == "input_ids 8x32, attention_mask 8x32, labels 8x32"
    # Another structure is compared by its batch size alone.
    assert planned.covers(batch_shapes((torch.zeros(8, 999),)))
    assert not planned.covers(batch_shapes((torch.zeros(9, 1),)))


def test_a_batch_grows_by_repeating_its_own_values() -> None:
    (small,), _ = ({k: v[:2, :3] for k, v in _batch(32).items()},), ()
    target = batch_shapes(({k: torch.zeros(4, 5) for k in small},))
    (grown,), targets = padded_to((small,), (), target)
    assert targets == []
    assert grown["input_ids"].shape == (4, 5)
    torch.testing.assert_close(grown["input_ids"][:, :3], small["input_ids"].repeat(2, 1))
    torch.testing.assert_close(grown["input_ids"][:2, 3:], small["input_ids"][:, :2])
    assert grown["input_ids"].dtype == torch.long  # ids stay ids


def test_a_declared_maximum_bounds_every_dimension_of_the_same_size() -> None:
    ids, causal = torch.zeros(8, 32, dtype=torch.long), torch.ones(32, 32)
    features = torch.zeros(8, 64)  # another size: not a position
    shapes = batch_shapes((ids, causal, features))
    sizes = declared_sizes(shapes, (16, 2048))
    assert sizes == {(0, 0): 16, (0, 1): 2048, (1, 0): 2048, (1, 1): 2048, (2, 0): 16}
    assert suggested_maximum(shapes, batch_shapes((torch.zeros(4, 90),))) == (8, 90)


@pytest.mark.parametrize("value", [(), (4, 0), "4x16", (2.5,)])
def test_a_maximum_that_is_not_a_tuple_of_sizes_is_refused(value) -> None:
    with pytest.raises(ConfigError, match="is not a tuple of positive sizes"):
        read_max_shape(value)


def test_buckets_are_the_next_power_of_two() -> None:
    assert [next_power_of_two(n) for n in (1, 2, 3, 32, 33, 384, 1000)] == [
        1, 2, 4, 32, 64, 512, 1024,
    ]  # fmt: skip
