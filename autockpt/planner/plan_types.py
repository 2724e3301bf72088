"""The Plan: what the planner decided and predicted, as a saved, reloadable artifact.

A :class:`Plan` is a pydantic model (``extra="forbid"``): ``plan.model_dump_json()`` saves it and
``Plan.model_validate_json(text)`` reloads it; :func:`autockpt.apply` accepts either.

NOTE [One minimum]
A user reads the minimum in three places: the plan's line (``minimum about ...``),
:attr:`Plan.minimum_feasible_bytes`, and a refusal. The search stops widening once a cheap plan
fits (plain recompute first, then regions and chunks, then micro-batches), so at a large budget
the minimum is that of the options it examined: at 4 GB the sample's plan said ``minimum about
22.73 MiB`` while 10 MB planned, the minimum of recompute alone. The plan says which options its
minimum covers (:attr:`Plan.minimum_searched`), and the line names them where they are not all.
A refusal has examined every option and measured its lowest plan: it names that one number as
the minimum and as the budget to raise to (it named the minimum and 5% more), and a budget of
that number plans. Choices the chain model puts at one lowest peak can measure far apart, so
each micro-batch count's are measured, not only the cheapest of them
(:func:`~autockpt.planner.solve.chain_solver.lowest_peak_choices`): otherwise which one was
measured followed the segments' times, and a refusal named 550 KiB on one run and 488 KiB on
another, both at budgets 488 KiB would meet. The plan measures its minimum the same way
(:meth:`~autockpt.planner.solve.budget_search.BudgetSearch.measured_minimum_bytes`), over the
options it examined, only the micro-batch counts whose estimate is within reach of the lowest
measured, so the plan's line and a refusal name one number (the sample: 3.46 MiB in both; the
line gave the chain model's 3.50 MiB before). A search that stopped early measures its minimum
too: it named the chain model's estimate, which can be under the measured peak (a 4-block MLP
in bf16: 25.10 MiB named, 27.84 MiB measured, and planning at 25.10 MiB was refused).

NOTE [The plan as text]
``print(plan)`` and a notebook's display of a plan give the table ``autockpt plan`` prints, not
the model's fields (``repr(plan)`` still gives those). The table is drawn by
:func:`autockpt.report`, with rich, which the planner does not import: the package hands the
function to :func:`read_plans_with`, when ``autockpt`` is imported. Imported on its own, this
module prints a plan as pydantic would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from autockpt.planner.core.batch_split import BatchShapes
from autockpt.planner.core.decisions import Parallelism
from autockpt.planner.core.units import Budget

Strategy = Literal["auto", "checkpoint-all", "checkpoint-none"]
Tracing = Literal["fx", "forward-hooks"]


class StepTimeline(BaseModel):
    """Bytes alive across one measured step, op by op, as the planner counted them on fake
    tensors (tensor bytes, without the device's context and slack); at most
    ``TIMELINE_POINTS`` points, each the highest of the ops it stands for, so no peak is lost.
    With micro-batches, the step of one piece."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bytes: list[int]
    phases: list[tuple[str, int, int]]
    """Each phase (``forward``, ``loss``, ``backward``, ``optimizer``) and its first and last
    point."""
    recomputed: list[tuple[int, int]]
    """First and last point of each run of backward points inside a recomputed segment (its
    recompute and its backward)."""


class StepTimelines(BaseModel):
    """The plain step's and the planned step's :class:`StepTimeline`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plain: StepTimeline
    planned: StepTimeline


class SegmentPlan(BaseModel):
    """One segment of the chain and what the plan does with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Readable name, from the modules the segment runs in."""
    nodes: list[str]
    """The fx nodes it covers, in order."""
    modules: list[str]
    """The module paths its nodes run in."""
    inputs: list[str]
    """The nodes whose values it reads from earlier segments."""
    outputs: list[str]
    """Its nodes whose values later segments read."""
    saved_bytes: int
    """Bytes it keeps alive for backward when kept (at the planned micro-batch size)."""
    boundary_bytes: int
    """Bytes it keeps alive when recomputed: its inputs and outputs."""
    recompute_s: float
    """Seconds recomputing it adds to a step (in its chunks, if any), timed on the real model
    where the planner could (NOTE [Timed options]); negative when that was measured faster
    than keeping it. For a kept segment, what a plain recompute would add."""
    recomputed: bool
    """Whether its interior is dropped after forward and rebuilt in backward."""
    num_chunks: int = 1
    """Pieces along the batch it runs in (only when recomputed)."""
    input_batch_dims: list[int | None] = []
    """Per input, the dimension split into chunks (None: passed whole to every chunk)."""
    output_batch_dims: list[int] = []
    """Per output, the dimension the chunks are joined along."""
    selective: bool = False
    """Whether only its cheap ops are recomputed, the outputs of its matrix products,
    convolutions and attention kept from forward (NOTE [Selective recompute])."""
    reason: str = ""
    """Why the planner chose this option."""
    compile_fraction: float | None = None
    """In a compiled plan, the activation memory budget of the segment's own compiled graph
    (``torch.autograd.graph.region_activation_memory_budget``, graph breaks around it: compile's
    partitioner picks what to recompute in it, NOTE [Per-region budgets]); None: it runs in the
    step's graph, at the plan's ``compile_fraction``."""


class LossChunks(BaseModel):
    """The model's head and the loss run together in chunks of positions, each chunk's
    gradients taken in forward (NOTE [Loss over positions in chunks]); run by
    :func:`autockpt.training_step`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    head: str
    """The module path of the ``nn.Linear`` whose output is the model's output."""
    num_chunks: int
    """Chunks of positions."""
    dim: int
    """The positions' dimension of the head's input (and of the targets cut with it)."""
    reduction: Literal["sum", "mean", "mean over labelled"]
    """How the chunks' losses add up to the whole loss, as the probe found it."""
    shift: int = 0
    """How many positions on the loss reads a term's label (NOTE [Losses that shift their
    labels]): each chunk runs on that many positions more."""
    leaf: int | None = None
    """The head's output's place in the structure the model returns; ``None``: the model
    returns it alone."""


class PeakBreakdown(BaseModel):
    """What the predicted peak is made of, in bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    inputs_bytes: int
    """The batch: inputs and, when given, the targets."""
    activations_bytes: int
    """Live at the end of forward, beyond the above: what backward will need."""
    transient_bytes: int
    """The rest of the peak: workspaces, recomputed interiors, gradients in flight."""
    context_bytes: int
    """CUDA context (0 on the CPU)."""
    headroom_bytes: int
    """Budget kept back for the allocator's slack (0 on the CPU)."""
    gathered_bytes: int = 0
    """FSDP: parameters (and gradients) gathered whole while their unit runs; see
    NOTE [Per-rank accounting]. The other parts are one rank's (its shards under FSDP)."""
    context_measured: bool = False
    """Whether ``context_bytes`` was measured on the card (NOTE [What the first card must
    measure]); False: the stand-in, or the CPU's nothing."""
    measured_slack: float | None = None
    """The allocator's reserved over allocated bytes, less one, in the plan's check step on
    the card; None where no check step ran on CUDA."""


class BatchLeaves(BaseModel):
    """Which tensors of the batch the plan was made at carry the batch: the inputs' and the
    targets' tree structure (as ``torch.utils._pytree`` writes it) and one flag per leaf, in
    ``tree_flatten``'s order (NOTE [The batch's leaves, as planned] in
    :mod:`autockpt.planner.core.batch_split`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs_structure: str
    inputs: list[bool]
    targets_structure: str
    targets: list[bool]


class Plan(BaseModel):
    """What to recompute, how to split the batch, and the predicted peak: the planner's answer.

    Save with ``plan.model_dump_json()``, reload with ``Plan.model_validate_json(text)``;
    ``print(plan)`` shows the table ``autockpt plan`` prints (NOTE [The plan as text]).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __str__(self) -> str:
        return _as_text(self) if _as_text is not None else super().__str__()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """What IPython and Jupyter show for a plan: the table, as ``print`` does."""
        printer.text(str(self))

    budget_bytes: int
    budget_text: str
    budget_reading: str
    device: str
    strategy: Strategy
    batch_size: int
    num_micro_batches: int = 1
    """Pieces the batch is split into, with gradients accumulated (see ``training_step``)."""
    loss_chunks: LossChunks | None = None
    """The head and the loss in chunks of positions (see ``training_step``); None: whole."""
    segments: list[SegmentPlan]
    predicted_peak_bytes: int
    """Measured peak of the planned step on fake tensors, plus context and headroom."""
    breakdown: PeakBreakdown
    unplanned_peak_bytes: int
    """The same for the step with nothing recomputed, in one piece."""
    minimum_feasible_bytes: int
    """The smallest budget the options examined meet, by the planner's model (an estimate).
    Chunks and micro-batches are only examined when plain recompute cannot fit, so above that
    this is the minimum of plain recompute; an infeasible budget examines everything (NOTE
    [One minimum])."""
    minimum_searched: str = "every option"
    """What :attr:`minimum_feasible_bytes` is the lowest of: ``every option``, or, where a cheap
    plan stopped the search early, ``recompute alone`` or ``recompute and chunks``."""
    predicted_extra_s: float
    """Seconds the plan adds to a step (negative: it saves time); see ``notes`` for whether
    they were timed on the real model or estimated (NOTE [Time model]), and whether the plan
    was timed whole against the plain step (NOTE [Whole-plan timing])."""
    unplanned_step_s: float
    """Seconds of a plain step: forward, backward and, where timed, the optimizer step."""
    fits: bool
    planning_s: float
    timeline: StepTimelines | None = None
    """Bytes alive across the plain and the planned step (``autockpt plan --plot``); None for
    a plan read off a line at smaller batches (NOTE [Scaled real measurement])."""
    planning_peak_bytes: int = 0
    """The most memory planning itself held on the device, the model and batch included: on
    CUDA the caching allocator's peak of tensor bytes; on the CPU the largest of what its real
    runs held (NOTE [Planning's own peak] in :mod:`autockpt.planner.pipeline`). 0: unknown (a
    plan saved before this was reported)."""
    notes: list[str] = []
    tracing: Tracing = "fx"
    """How the segments were found: ``"fx"``, runs of traced graph nodes; ``"forward-hooks"``,
    whole submodules (``SegmentPlan.modules`` holds each one's path; NOTE [Module chain])."""
    world_size: int = 1
    """Ranks training together; the budget, the peak and the breakdown are one rank's."""
    parallelism: Parallelism = "single"
    """How the ranks share the work: ``single``, ``ddp`` or ``fsdp`` (NOTE [Per-rank accounting])."""
    forward_pieces: int | None = None
    """The fewest pieces a forward without autograd of a batch was measured to fit the budget
    in (NOTE [Validation in as few pieces as fit] in
    :mod:`autockpt.planner.measure.inference_forward`); None: not measured, the bound
    :attr:`inference_pieces` gives stands."""
    batch_leaves: BatchLeaves | None = None
    """Which leaves of the inputs and targets carry the batch, as planned: what
    :func:`autockpt.training_step` cuts into micro-batches at any later batch of the same
    structure. None: a plan saved before they were recorded (dim-0 sizes decide)."""
    batch_shapes: BatchShapes | None = None
    """The shape of every tensor of the inputs and targets the plan was made for: it holds for
    any batch no larger along any dimension (NOTE [Shapes a plan holds for]), and
    :func:`autockpt.training_step` refuses a larger one. None: a plan saved before shapes were
    recorded (not checked)."""
    compile_fraction: float | None = None
    """None: the step runs eager. A number: :func:`autockpt.apply` compiles the planned module
    with inductor at this ``activation_memory_budget``, and the peak, the step time and the
    unplanned figures are those of compiled steps measured for real (NOTE [Compiled plans])."""

    @property
    def budget(self) -> Budget:
        """The budget planned for, as read (a budget decided from the plain step included)."""
        return Budget(bytes=self.budget_bytes, text=self.budget_text, reading=self.budget_reading)

    @property
    def num_recomputed(self) -> int:
        """How many segments are recomputed."""
        return sum(segment.recomputed for segment in self.segments)

    @property
    def inference_pieces(self) -> int:
        """Pieces to cut a batch into for a forward without autograd (validation, prediction)
        to stay within this plan's peak: the step's micro-batches times its most chunked
        segment or loss.

        Under ``torch.no_grad()`` the planned module runs the model's own forward, whole: no
        activation is kept, but a region the plan runs in chunks makes its whole batch's
        intermediates at once, which can take more than the training step did. A batch of
        ``batch_size / inference_pieces`` makes no intermediate larger than one of the step's
        chunks and keeps nothing for backward, so its forward peaks no higher than the step.
        Where planning measured fewer pieces to fit (:attr:`forward_pieces`), those.
        """
        if self.forward_pieces is not None:
            return self.forward_pieces
        chunks = [segment.num_chunks for segment in self.segments]
        if self.loss_chunks is not None:
            chunks.append(self.loss_chunks.num_chunks)
        return self.num_micro_batches * max(chunks, default=1)


_as_text: Callable[[Plan], str] | None = None


def read_plans_with(as_text: Callable[[Plan], str]) -> None:
    """Make ``str(plan)`` (and a notebook's display) ``as_text(plan)`` (NOTE [The plan as
    text]); the package sets :func:`autockpt.report` when it is imported."""
    global _as_text
    _as_text = as_text
