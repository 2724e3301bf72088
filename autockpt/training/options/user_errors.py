"""What the application reports as the user's mistake, in one line and exit code 2: the errors
of the planner and of the application (:class:`autockpt.errors.AutockptError`) and those of
tft, which reads the user's files and builds the model (:class:`tft.errors.TFTError`)."""

from __future__ import annotations

from autockpt.errors import AutockptError
from tft.errors import TFTError

#: Every error class caused by user input rather than by a bug.
USER_ERRORS: tuple[type[Exception], ...] = (AutockptError, TFTError)
