"""A zoo of small models written the way people write PyTorch, for tests and benchmarks.

Each :class:`~tests.zoo.case.ZooCase` says how to build a model and its batch, its loss and
whether its step is batch-separable. ``tests/planner/test_zoo.py`` plans each at half its
unplanned peak and at its reported minimum; ``benchmarks/zoo.py`` tabulates them.
"""

from __future__ import annotations

from tests.zoo.attention import ATTENTION
from tests.zoo.case import ZooCase
from tests.zoo.convnet import CONVNET
from tests.zoo.feedforward import FEEDFORWARD
from tests.zoo.outputs import OUTPUTS
from tests.zoo.recurrent import RECURRENT
from tests.zoo.tft_like import TFT_LIKE
from tests.zoo.untraceable import UNTRACEABLE

ZOO: dict[str, ZooCase] = {
    case.name: case
    for case in (
        *FEEDFORWARD,
        *ATTENTION,
        *RECURRENT,
        *OUTPUTS,
        *CONVNET,
        *UNTRACEABLE,
        *TFT_LIKE,
    )
}
