"""The base of the planner's dispatch modes: each aten call seen as ``on_op(func, args, kwargs)``."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OpMode(TorchDispatchMode):
    """A dispatch mode whose subclasses see each aten call once, in :meth:`on_op`.

    ``on_op`` runs the op itself (``func(*args, **kwargs)``), or something in its place, and
    returns the result; ``kwargs`` is always a dict (the caller's, not to be changed in place).
    """

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return self.on_op(func, args, kwargs or {})

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``func`` on ``args`` and ``kwargs`` (or what replaces it) and return the result."""
        raise NotImplementedError
