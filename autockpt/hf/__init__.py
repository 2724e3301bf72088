"""autockpt for Hugging Face: one ``transformers.Trainer`` callback that plans the model's
training step under a byte budget (NOTE [Planning under transformers.Trainer] in
:mod:`autockpt.hf.callback`).

>>> trainer = transformers.Trainer(model, args, train_dataset=data,
...                                callbacks=[autockpt.hf.MemoryPlan("8GB")])

Needs ``transformers`` and ``accelerate`` (``pip install "autockpt[hf]"``).
"""

try:
    import accelerate  # noqa: F401
    import transformers  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "autockpt.hf needs the transformers and accelerate packages; install them with "
        "pip install 'autockpt[hf]'"
    ) from error

from autockpt.hf.callback import MemoryPlan  # noqa: E402

__all__ = ["MemoryPlan"]
