"""User-facing errors.

Every mistake a user can make (a bad budget string, a file that is not Parquet, a budget no plan
can meet) raises a subclass of :class:`AutockptError`. Its message is one line that names the
offending value and the way out; the CLI prints it to stderr and exits with code 2. ``assert`` is
kept for internal invariants only.
"""


class AutockptError(Exception):
    """Base class of every error caused by user input rather than by a bug."""


class BudgetError(AutockptError, ValueError):
    """A memory budget that cannot be read (``"4XB"``, ``"-1GB"``, ``""``)."""


class InfeasibleBudgetError(AutockptError):
    """No plan fits the budget.

    Attributes:
        budget_bytes: the budget that was asked for.
        minimum_bytes: the smallest budget a plan can meet for this model and batch.
        bound: what keeps the minimum where it is, as the message says it ("" when not known).
        unplanned_bytes: the peak of the plain step (0 when not measured).
    """

    def __init__(
        self,
        message: str,
        *,
        budget_bytes: int,
        minimum_bytes: int,
        bound: str = "",
        unplanned_bytes: int = 0,
    ) -> None:
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.minimum_bytes = minimum_bytes
        self.bound = bound
        self.unplanned_bytes = unplanned_bytes


class TraceError(AutockptError):
    """The model cannot be traced or split into segments, and no fallback applies."""


class DataError(AutockptError, ValueError):
    """A data file that cannot be used: missing, not Parquet, bad columns or rows."""


class ConfigError(AutockptError, ValueError):
    """A configuration value or file that cannot be used."""


class RunError(AutockptError):
    """A run folder that cannot be resumed or read (missing, incompatible, corrupt)."""


class DeviceError(AutockptError):
    """A device that was asked for but is not available (``--device cuda`` without a GPU)."""


class PlanMismatchError(AutockptError):
    """A plan applied to a model it was not made for."""


class ShapeError(AutockptError):
    """A batch larger than the shapes its plan was made for, where no plan may be made for it
    (``training_step`` with a plan, a callback with ``replan=False``); the message names both
    shapes and the ways out."""


class PlanningError(AutockptError):
    """Planning met an error of the model's own (or of a library it runs) that no option of the
    plan could route around; the message names it, and the error is its ``__cause__``."""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name where it has none."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def describe_error(error: BaseException) -> str:
    """``"TypeName: first line of the message"``, for a one-line note or error."""
    line = first_line(error)
    name = type(error).__name__
    return name if line == name else f"{name}: {line}"


def warn_at_the_callers_line(message: str) -> None:
    """Warn with ``message`` as raised at the first line outside this package: the user's call
    (``autockpt.plan(...)``, a Lightning or Trainer hook), not a line inside the planner, which
    a fixed ``stacklevel`` names whenever the path to the warning changes."""
    import os
    import sys
    import warnings
    from types import FrameType

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level = 2  # stacklevel 2 is the caller of this function
    frame_: FrameType | None = sys._getframe(1)
    while frame_ is not None and os.path.abspath(frame_.f_code.co_filename).startswith(package):
        level, frame_ = level + 1, frame_.f_back
    warnings.warn(message, stacklevel=level)
