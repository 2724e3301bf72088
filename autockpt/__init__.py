"""autockpt: fit a PyTorch training step under a memory budget.

>>> import autockpt
>>> plan = autockpt.plan(model, (x,), budget="4GB")
>>> print(autockpt.report(plan))  # the table ``autockpt plan`` prints
>>> planned = autockpt.apply(model, plan)
"""

from autockpt.errors import (
    AutockptError,
    BudgetError,
    ConfigError,
    DataError,
    DeviceError,
    InfeasibleBudgetError,
    PlanMismatchError,
    PlanningError,
    RunError,
    ShapeError,
    TraceError,
)
from autockpt.plan_report import report
from autockpt.planner.apply import apply
from autockpt.planner.core.decisions import Parallelism
from autockpt.planner.core.memory_tracker import MemoryTracker, tensors_of
from autockpt.planner.core.units import Budget, format_bytes, parse_budget
from autockpt.planner.entry import plan
from autockpt.planner.plan_types import PeakBreakdown, Plan, SegmentPlan
from autockpt.planner.simulate.step_profile import OptimizerFactory
from autockpt.planner.training_step import training_step
from autockpt.shape_planner import ShapePlanner

__all__ = [
    "AutockptError",
    "Budget",
    "BudgetError",
    "ConfigError",
    "DataError",
    "DeviceError",
    "InfeasibleBudgetError",
    "MemoryTracker",
    "OptimizerFactory",
    "Parallelism",
    "PeakBreakdown",
    "Plan",
    "PlanMismatchError",
    "PlanningError",
    "RunError",
    "SegmentPlan",
    "ShapeError",
    "ShapePlanner",
    "TraceError",
    "apply",
    "format_bytes",
    "parse_budget",
    "plan",
    "report",
    "tensors_of",
    "training_step",
]
