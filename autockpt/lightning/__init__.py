"""autockpt for Lightning: one callback that plans a LightningModule's training step under a
byte budget (NOTE [Planning a LightningModule] in :mod:`autockpt.lightning.callback`).

>>> trainer = lightning.Trainer(callbacks=[autockpt.lightning.MemoryPlan(budget="4GB")])

Needs the ``lightning`` package (``pip install "autockpt[lightning]"``).
"""

try:
    import lightning  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "autockpt.lightning needs the lightning package; install it with "
        "pip install 'autockpt[lightning]'"
    ) from error

from autockpt.lightning.callback import MemoryPlan  # noqa: E402

__all__ = ["MemoryPlan"]
