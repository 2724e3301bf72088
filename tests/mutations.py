"""Planted bugs: each one, applied to a copy of the project, must make the tests that back it fail.

A test that cannot fail proves nothing, so this script plants small bugs of the kinds the
README's claims rule out (a memory tracker blind to an op, a BatchNorm model split into
micro-batches, DDP's gradient sync on the wrong piece, a units slip, dropout masks not replayed
by a recompute, ...), runs the README's test command on each (or, with ``--quick``, only the
tests named for the claim), and prints caught or MISSED.
Run it from the repository root after changing the planner, the trainer or those tests:

    python3 tests/mutations.py             # every planted bug, each under the README's test
                                           # command (up to 2 minutes a bug on 2 cores)
    python3 tests/mutations.py --quick     # each under the tests named for it (3 minutes in all)
    python3 tests/mutations.py units rng   # some of them, by name
    python3 tests/mutations.py --list

It exits 1 when a planted bug is missed, when its text is no longer in the source (update the
bug), or when the chosen tests fail without any bug (the control run). pytest does not collect
this file: its name does not start with ``test_``.

NOTE [Running the copy]
The package is installed in editable mode from the original checkout, so ``import autockpt``
could reach the original instead of the copy. The tests run as ``python -m pytest`` with the
copy as the working directory and on ``PYTHONPATH``, which put it at the front of ``sys.path``,
ahead of the editable install's finder; the script checks where ``autockpt``, ``tft`` and
``tests`` are imported from before it plants anything, and the first planted bug (``canary``)
is one no test can miss. Bytecode is not written (``PYTHONDONTWRITEBYTECODE``), so a file
restored within the same second is never read from a stale cache.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Not copied: version control, caches and build metadata.
IGNORED = (".git", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache", ".pytest_cache")
#: Seconds one run of the tests may take before it counts as an error.
TIMEOUT_S = 1800


@dataclass(frozen=True)
class Mutation:
    """A planted bug: ``old`` replaced by ``new`` in ``path``, caught by ``tests``."""

    name: str
    why: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation(
        "canary",
        "training_step() raises: proves the copy is the package under test",
        "autockpt/planner/training_step.py",
        "    pieces = max(plan.num_micro_batches, 1) if plan is not None else 1",
        '    raise RuntimeError("planted")',
        ("tests/planner/test_memory_oracle.py::test_mlp_nothing_recomputed",),
    ),
    Mutation(
        "tracker-blind-to-addmm",
        "the planner's tracker misses every aten.addmm output (Linear layers)",
        "autockpt/planner/core/memory_tracker.py",
        "if id(tensor.untyped_storage()) not in input_storages:",
        "if id(tensor.untyped_storage()) not in input_storages and func is not "
        "torch.ops.aten.addmm.default:",
        (
            "tests/planner/core/test_memory_tracker.py",
            "tests/planner/test_memory_oracle.py",
            "tests/planner/test_plan.py::test_measured_peak_stays_under_budget_and_equals_prediction",
        ),
    ),
    Mutation(
        "separability-forced",
        "the whole step is declared batch-separable: a BatchNorm model may be micro-batched",
        "autockpt/planner/measure/separability.py",
        '    """Whether the step separates: the loss reduction that makes it, or None and why not."""',
        '    """Whether the step separates: the loss reduction that makes it, or None and why not."""'
        '\n    return "mean", ""',
        ("tests/planner/test_plan.py::test_batchnorm_model_is_never_split_into_micro_batches",),
    ),
    Mutation(
        "ddp-sync-on-first-piece",
        "DDP's gradient all-reduce runs with the first micro-batch instead of the last",
        "autockpt/planner/training_step.py",
        "last = index == pieces - 1",
        "last = index == 0",
        (
            "tests/training/test_distributed.py::test_gradients_are_synchronised_on_the_last_micro_batch_only",
        ),
    ),
    Mutation(
        "micro-batch-weights-equal",
        "each micro-batch's mean loss weighted 1/pieces, not by its share of the batch",
        "autockpt/planner/training_step.py",
        'weight = sizes[index] / batch if loss_reduction == "mean" else 1.0',
        'weight = 1 / pieces if loss_reduction == "mean" else 1.0',
        (
            "tests/training/test_distributed.py::test_gradients_are_synchronised_on_the_last_micro_batch_only",
        ),
    ),
    Mutation(
        "units",
        "GB read as 2**30 bytes (GiB)",
        "autockpt/planner/core/units.py",
        '"gb": 10**9,',
        '"gb": 2**30,',
        ("tests/planner/core/test_units.py",),
    ),
    Mutation(
        "rng-not-preserved",
        "a recomputed segment draws new dropout masks instead of replaying the forward's",
        "autockpt/planner/runtime/segment_runners.py",
        "            preserve_rng_state=True,\n            context_fn=self._contexts,",
        "            preserve_rng_state=False,\n            context_fn=self._contexts,",
        (
            "tests/planner/test_plan.py::"
            "test_plain_recompute_keeps_loss_and_every_gradient_with_dropout_on[all-mlp]",
            "tests/planner/test_plan.py::"
            "test_plain_recompute_keeps_loss_and_every_gradient_with_dropout_on[all-tft-tiny]",
        ),
    ),
    Mutation(
        "optimizer-state-halved",
        "one of AdamW's two moments is left out of the tensors a step starts with",
        "autockpt/planner/core/memory_tracker.py",
        "tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))",
        "tensors.extend([v for v in state.values() if isinstance(v, torch.Tensor)][::2])",
        ("tests/planner/test_memory_oracle.py",),
    ),
    Mutation(
        "within-budget-without-budget",
        "a run without a budget reports within_budget: true",
        "autockpt/training/loop/run_summary.py",
        '"within_budget": None',
        '"within_budget": True',
        ("tests/cli/test_cli.py::test_three_step_train_on_the_sample",),
    ),
    Mutation(
        "usage-block",
        "argparse's own errors print the whole usage block again",
        "autockpt/cli/parser.py",
        "    def error(self, message: str) -> NoReturn:",
        "    def _error(self, message: str) -> NoReturn:",
        ("tests/cli/test_cli.py::test_usage_errors_are_one_line_naming_the_help",),
    ),
    Mutation(
        "views-counted-as-new",
        "the tracker keys storages by tensor, so every view of a live storage counts again",
        "autockpt/planner/core/memory_tracker.py",
        "        key = id(storage)\n        if key in self._live:",
        "        key = id(tensor)\n        if key in self._live:",
        ("tests/planner/core/test_memory_tracker.py",),
    ),
    Mutation(
        "chunk-off-by-one",
        "each chunk of a chunked segment takes the next chunk's samples, the last one twice",
        "autockpt/planner/runtime/segment_runners.py",
        "parts[chunk] if parts is not None else value",
        "parts[min(chunk + 1, num_chunks - 1)] if parts is not None else value",
        (
            "tests/planner/test_plan.py::"
            "test_chunks_and_micro_batches_keep_gradients_with_dropout_off[mlp]",
        ),
    ),
    Mutation(
        "batchnorm-updated-twice",
        "a recomputed segment's BatchNorm running statistics are not put back after recompute",
        "autockpt/planner/runtime/segment_runners.py",
        "                buffer.copy_(value)",
        "                pass",
        ("tests/planner/test_plan.py::test_batchnorm_statistics_update_once_under_recompute",),
    ),
    Mutation(
        "validation-mae-per-window",
        "validation MAE divided by windows instead of values",
        "autockpt/training/forecasts/evaluate.py",
        "mae=float(sums[1]) / num_values,",
        "mae=float(sums[1]) / num_windows,",
        ("tests/training/test_train.py::test_validation_metrics_are_those_of_best_pt",),
    ),
    Mutation(
        "resume-without-rng",
        "a resumed run does not restore the random streams (dropout masks drift)",
        "autockpt/training/loop/train.py",
        "        restore_random_states(checkpoint, self.world.rank)",
        "        pass",
        (
            "tests/training/test_train.py::test_resume_continues_exactly",
            "tests/training/test_train.py::"
            "test_resume_is_exact_with_recompute_chunks_micro_batches_and_a_replan",
        ),
    ),
    Mutation(
        "scaling-ignores-symbol",
        "per-symbol scaling fits one scale over all symbols",
        "tft/data/normalize.py",
        "    if not per_symbol:\n",
        "    if True:\n",
        (
            "tests/tft/test_categorical.py::"
            "test_two_symbols_with_the_same_moves_30x_apart_get_the_same_inputs",
        ),
    ),
    Mutation(
        "lightning-plan-not-installed",
        "the Lightning callback plans but Lightning trains the module without the plan",
        "autockpt/lightning/forward_plan.py",
        "        self._replaced.__enter__()\n",
        "",
        (
            "tests/lightning/test_callback.py::"
            "test_the_planned_run_takes_the_plain_runs_losses_under_half_its_peak",
        ),
    ),
    Mutation(
        "lightning-gradients-kept",
        "the last step's gradients stay alive through Lightning's forward",
        "autockpt/lightning/callback.py",
        "                optimizer.zero_grad(set_to_none=True)",
        "                pass",
        (
            "tests/lightning/test_callback.py::"
            "test_the_planned_run_takes_the_plain_runs_losses_under_half_its_peak",
        ),
    ),
    Mutation(
        "span-rerun-forgets-rng",
        "a span's rerun in backward draws new dropout masks",
        "autockpt/planner/runtime/chain_spans.py",
        "                torch.set_rng_state(call.cpu_rng)",
        "                pass",
        (
            "tests/planner/runtime/test_chain_spans.py::"
            "test_a_budget_plan_recomputes_spans_fits_and_keeps_every_gradient_with_dropout_on",
        ),
    ),
    Mutation(
        "spans-never-offered",
        "the module chain's links are recomputed one by one only, never as spans",
        "autockpt/planner/trace/module_chain.py",
        "    ordered = sorted(cuts)",
        "    ordered = list(range(count + 1))",
        (
            "tests/planner/runtime/test_chain_spans.py::"
            "test_forced_checkpointing_lowers_the_peak_of_a_chain_of_linears_through_hooks",
        ),
    ),
    Mutation(
        "whole-plan-timing-ignored",
        "the plans that fit are timed whole, but the solver's estimate still picks the plan",
        "autockpt/planner/solve/staged_search.py",
        "            found = (timed.decision, timed.profile)\n",
        "            pass\n",
        (
            "tests/planner/solve/test_whole_plan_timing.py::"
            "test_the_fastest_plan_timed_whole_is_chosen_and_predicted",
        ),
    ),
    Mutation(
        "whole-plan-slowest",
        "the slowest of the plans timed whole is taken",
        "autockpt/planner/solve/whole_plan_timing.py",
        "        best = min(range(len(entries)), key=lambda i: ratio(entries[i]))",
        "        best = max(range(len(entries)), key=lambda i: ratio(entries[i]))",
        (
            "tests/planner/solve/test_whole_plan_timing.py::"
            "test_the_fastest_plan_timed_whole_is_chosen_and_predicted",
        ),
    ),
    Mutation(
        "link-chunks-unchecked",
        "a submodule is chunked on the hook path without checking each sample alone",
        "autockpt/planner/measure/separability.py",
        "    if not _segment_agrees(output_leaves, tuple(leaves), outs, in_dims, dims):",
        "    if False:",
        (
            "tests/planner/measure/test_chain_chunks.py::"
            "test_the_probe_finds_which_submodules_compute_sample_by_sample",
        ),
    ),
    Mutation(
        "loss-backward-uncounted",
        "the chain model leaves out the loss's backward, made with every kept byte alive",
        "autockpt/planner/measure/fake_step.py",
        '                self.phase_peak["loss"] = max(self.phase_peak["loss"], now)  # on top of S_n',
        "                pass",
        (
            "tests/planner/runtime/test_chain_spans.py::"
            "test_a_budget_only_spans_meet_is_planned_with_the_loss_backward_counted",
        ),
    ),
    Mutation(
        "stage-stop-on-sums",
        "a stage's fit ends the search on the solver's sums, the plan timed whole overruled",
        "autockpt/planner/solve/staged_search.py",
        "                if stage_timed.extra_s <= WIDEN_PAST_SHARE * stage_timed.plain_s:",
        "                if True:",
        (
            "tests/planner/timing/test_time_model.py::"
            "test_a_fit_whose_sums_say_free_but_timed_whole_is_slow_does_not_end_the_search",
        ),
    ),
    Mutation(
        "plain-step-unsettled",
        "the plain step is timed twice at most, however much faster its second run was",
        "autockpt/planner/timing/timed_runs.py",
        "SETTLED_SHARE, MAX_SETTLING_RUNS = 0.9, 6",
        "SETTLED_SHARE, MAX_SETTLING_RUNS = 0.9, 2",
        (
            "tests/planner/timing/test_time_model.py::"
            "test_the_plain_step_is_timed_again_until_it_stops_getting_faster",
        ),
    ),
    Mutation(
        "whole-plan-median",
        "whole plans are ranked by their median round, runs slowed by the plan before included",
        "autockpt/planner/solve/whole_plan_timing.py",
        "    fastest = iter([min(t) for t in times])",
        "    fastest = iter([sorted(t)[len(t) // 2] for t in times])",
        (
            "tests/planner/solve/test_whole_plan_timing.py::"
            "test_a_plan_is_judged_by_its_fastest_round_not_by_runs_after_other_plans",
        ),
    ),
    Mutation(
        "selective-keeps-nothing",
        "a selective recompute keeps no op's output: it runs the matrix products again too",
        "autockpt/planner/runtime/selective_recompute.py",
        "    if op in KEPT_OPS:",
        "    if False:",
        (
            "tests/planner/runtime/test_selective_recompute.py::"
            "test_a_selective_recompute_runs_the_cheap_ops_again_but_not_the_matrix_products",
        ),
    ),
    Mutation(
        "selective-dropped-by-apply",
        "autockpt.apply reads a selective segment as a plain recompute",
        "autockpt/planner/apply.py",
        "            selective=segment.selective,",
        "            selective=False,",
        (
            "tests/planner/runtime/test_selective_recompute.py::"
            "test_a_selective_recompute_runs_the_cheap_ops_again_but_not_the_matrix_products",
        ),
    ),
    Mutation(
        "selective-over-in-place-writes",
        "a segment that writes in place may be recomputed selectively (a stored product changed)",
        "autockpt/planner/runtime/selective_recompute.py",
        "    if not isinstance(traced, TracedModel) or segment.keep_reason:",
        "    if not isinstance(traced, TracedModel):",
        (
            "tests/planner/runtime/test_selective_recompute.py::"
            "test_a_segment_that_writes_in_place_is_never_recomputed_selectively",
        ),
    ),
    Mutation(
        "selective-over-written-products",
        "a segment whose stored products are written through a view (nn.GRU) may be selective",
        "autockpt/planner/runtime/selective_safety.py",
        "            self.written.add(self._made_by[id(storage)])",
        "            pass",
        (
            "tests/planner/runtime/test_selective_recompute.py::"
            "test_a_segment_whose_products_are_written_through_views_is_never_selective",
        ),
    ),
    Mutation(
        "selective-mode-free",
        "a selective recompute's cost leaves out its dispatch modes' per-op overhead",
        "autockpt/planner/timing/time_model.py",
        "            + 2 * s.forward_num_ops * time_model.mode_overhead_s",
        "            + 0.0",
        (
            "tests/planner/runtime/test_selective_recompute.py::"
            "test_a_costly_dispatch_mode_makes_a_plain_recompute_the_cheaper_one",
        ),
    ),
    Mutation(
        "selective-never-offered",
        "the chain never offers a selective recompute",
        "autockpt/planner/solve/chain_builder.py",
        "        if s_terms is not None and index in self.selective:",
        "        if False:",
        (
            "tests/planner/runtime/test_selective_recompute.py::"
            "test_the_planner_recomputes_cheap_ops_where_that_fits_and_the_peak_holds",
        ),
    ),
    Mutation(
        "real-steps-at-the-whole-batch",
        "a model measured for real is measured at the whole batch, whatever the budget",
        "autockpt/planner/measure/step_measurer.py",
        "        if traced.fake_mode is None and room_bytes is not None:",
        "        if False:",
        ("tests/planner/measure/test_scaled_step.py",),
    ),
    Mutation(
        "optimizer-probe-writes-the-model",
        "the optimizer's step peak is probed on the real copy's parameters, the model's memory",
        "autockpt/planner/measure/fake_step.py",
        "        if self.mode is None:\n            # A real copy",
        "        if False:\n            # A real copy",
        ("tests/planner/measure/test_scaled_step.py",),
    ),
    Mutation(
        "recording-graph-kept",
        "the forward that finds the module chain stays alive through planning (a module keeps "
        "its outputs)",
        "autockpt/planner/trace/module_chain.py",
        "        gc.collect()\n        copied = parameter_sharing_copy(model)",
        "        copied = parameter_sharing_copy(model)",
        ("tests/lightning/test_forecasting.py",),
    ),
    Mutation(
        "lightning-hooks-only",
        "the Lightning callback plans module-level segments even where the forward traces",
        "autockpt/lightning/callback.py",
        "                inputs = forward_inputs(pl_module, batch, batch_idx, trainer)",
        "                inputs = None",
        ("tests/lightning/test_forward_plan.py",),
    ),
    Mutation(
        "naive-forecast-shifted",
        "the no-change forecast is the normalised 0, not the normalised value of a raw return of 0",
        "autockpt/training/setup/baselines.py",
        "            no_change=torch.tensor((0.0 - mean) / std, dtype=torch.float32),",
        "            no_change=torch.zeros(len(mean)),",
        ("tests/training/test_baselines.py",),
    ),
    Mutation(
        "timeline-mean-points",
        "a timeline point is the mean of the ops it stands for, so a short peak is lost",
        "autockpt/planner/report_rows.py",
        "        heights.append(top)",
        "        heights.append(sum(op[0] for op in ops[start : start + per_point]) // per_point)",
        ("tests/planner/test_report_rows.py",),
    ),
    Mutation(
        "interpret-names-shifted",
        "interpret names the encoder's weights with the known inputs before the observed ones",
        "autockpt/training/forecasts/interpret.py",
        "        *data.observed_columns,\n        *data.known_columns,",
        "        *data.known_columns,\n        *data.observed_columns,",
        ("tests/training/test_interpret.py",),
    ),
    Mutation(
        "flow-same-bar",
        "the planted order flow moves its own bar's return, so the sample has nothing to forecast",
        "tft/synthetic/planted.py",
        "    previous = np.concatenate([[0.0], flow[:-1]])",
        "    previous = flow",
        ("tests/tft/test_synthetic.py",),
    ),
    Mutation(
        "stream-no-carry",
        "a chunk of a streamed file forgets each symbol's last bar, so its first row is dropped",
        "tft/data/streamed/file_scan.py",
        "        carried = [code for code in np.unique(codes).tolist() if code in self.carry]",
        "        carried = []",
        ("tests/tft/test_streamed_windows.py",),
    ),
    Mutation(
        "cache-gathered-through-mapping",
        "batches from a row cache are gathered through its mapping, so an epoch maps the file",
        "tft/data/windows.py",
        "        if self._rows.files is not None:\n            return self._read_batch(",
        "        if False:\n            return self._read_batch(",
        ("tests/tft/test_streamed_windows.py",),
    ),
    Mutation(
        "compiled-fit-unchecked",
        "the compiled search takes the fastest compiled step whether or not it fits the budget",
        "autockpt/planner/compiled_search.py",
        "        return [c for c in tried if c.peak_bytes <= budget_bytes]",
        "        return list(tried)",
        ("tests/planner/test_compiled_plan.py",),
    ),
    Mutation(
        "chunks-in-one-compiled-graph",
        "compiled, a chunked segment's chunks share the step's graph, so inductor rebuilds "
        "every chunk before the gradients need them",
        "autockpt/planner/runtime/segment_runners.py",
        "            pieces.append(self._graph_of_its_own(self._checkpointed, *chunk_inputs))",
        "            pieces.append(self._checkpointed(*chunk_inputs))",
        ("tests/planner/test_compile.py",),
    ),
    Mutation(
        "compiled-context-dropped",
        "the compiled search leaves the CUDA context out of each candidate's peak, so a step "
        "that fits by its tensors is taken on a card it overflows",
        "autockpt/planner/compiled_search.py",
        "            self.context_bytes + resident + allocator_peak_bytes(step, self.device)",
        "            resident + allocator_peak_bytes(step, self.device)",
        ("tests/planner/test_compiled_plan.py",),
    ),
    Mutation(
        "region-budget-not-applied",
        "a segment given a region budget is compiled in the step's graph at the step's fraction",
        "autockpt/planner/runtime/compiled_backend.py",
        "    if fraction is None or not torch.compiler.is_compiling():",
        "    if True:",
        ("tests/planner/test_region_budgets.py",),
    ),
    Mutation(
        "region-budget-ignored-by-backend",
        "the backend compiles a region's graph at the step's fraction, not the region's",
        "autockpt/planner/runtime/compiled_backend.py",
        "        budget = own if own is not None else fraction",
        "        budget = fraction",
        ("tests/planner/test_region_budgets.py",),
    ),
    Mutation(
        "region-through-torch-annotation",
        "regions are annotated with torch's region_activation_memory_budget, which rejects "
        "a graph with dropout (inductor's seed op is not annotated)",
        "autockpt/planner/runtime/compiled_backend.py",
        "    with fx_traceback.annotate({REGION_KEY: float(fraction)}):",
        "    with torch.autograd.graph.region_activation_memory_budget(fraction):",
        ("tests/planner/test_region_budgets.py",),
    ),
    Mutation(
        "region-tries-past-no-gain",
        "the compiled search keeps handing segments to regions when regions peak no lower, "
        "spending the compiles the eager plans need",
        "autockpt/planner/compiled_search.py",
        "        if candidate.peak_bytes >= lowest_bytes:",
        "        if False:",
        ("tests/planner/test_region_budgets.py",),
    ),
    Mutation(
        "region-budget-not-passed",
        "apply drops the plan's per-segment compile budgets",
        "autockpt/planner/apply.py",
        "            region_fraction=segment.compile_fraction,",
        "            region_fraction=None,",
        ("tests/planner/test_region_budgets.py",),
    ),
    Mutation(
        "python-state-unseen",
        "a call that writes to a cache or list it is given may be recomputed",
        "autockpt/planner/trace/module_chain.py",
        "            if call.keep_reason or call.state_note or state_of(value) == before:",
        "            if True:",
        ("tests/planner/trace/test_python_state.py",),
    ),
    Mutation(
        "failed-option-kills-planning",
        "an option whose measurement raises ends planning instead of being left out",
        "autockpt/planner/solve/widening.py",
        "        except Exception as error:\n            self._failed.add(what)",
        "        except ZeroDivisionError as error:\n            self._failed.add(what)",
        ("tests/planner/test_foreign_errors.py",),
    ),
    Mutation(
        "chunked-model-output",
        "a segment whose output is a structure (a ModelOutput) may run in chunks",
        "autockpt/planner/measure/separability.py",
        "            and all(\n                isinstance(value, torch.Tensor)",
        "            and all(\n                True or isinstance(value, torch.Tensor)",
        ("tests/planner/test_hugging_face.py",),
    ),
    Mutation(
        "unseen-category-is-a-category",
        "a value the training rows never had gets a real category's code",
        "tft/data/categories.py",
        "index.fill_null(-1)",
        "index.fill_null(0)",
        (
            "tests/tft/test_categorical.py::"
            "test_a_value_the_training_rows_never_had_is_the_unknown_category",
        ),
    ),
    Mutation(
        "function-traced-through",
        "a custom autograd Function is traced through, its backward dropped (plain fx)",
        "autockpt/planner/trace/autograd_regions.py",
        "        if not _traces((args, kwargs)):",
        "        if True:",
        (
            "tests/planner/trace/test_autograd_regions.py",
            "tests/planner/test_user_steps.py",
        ),
    ),
    Mutation(
        "no-grad-region-dropped",
        "a torch.no_grad region inside forward is traced as any other code",
        "autockpt/planner/trace/autograd_regions.py",
        '        (grad_mode.no_grad, "__enter__", no_grad_in),\n'
        '        (grad_mode.no_grad, "__exit__", no_grad_out),\n',
        "",
        (
            "tests/planner/trace/test_autograd_regions.py",
            "tests/planner/test_user_steps.py",
        ),
    ),
    Mutation(
        "autocast-region-dropped",
        "a torch.autocast region inside forward runs at the precision around the model",
        "autockpt/planner/trace/autograd_regions.py",
        '        (torch.amp.autocast_mode.autocast, "__enter__", autocast_entered),\n'
        '        (torch.amp.autocast_mode.autocast, "__exit__", autocast_left),\n',
        "",
        (
            "tests/planner/trace/test_autograd_regions.py",
            "tests/planner/test_user_steps.py",
        ),
    ),
    Mutation(
        "item-in-loss-ends-planning",
        "a loss that reads .item() on fake tensors gets no value (planning ends)",
        "autockpt/planner/measure/fake_step.py",
        "with FakeScalars() if mode is not None else contextlib.nullcontext():",
        "with contextlib.nullcontext():",
        ("tests/planner/test_user_steps.py", "tests/planner/core/test_fake_scalars.py"),
    ),
    Mutation(
        "tft-imports-autockpt",
        "tft's splits raise the application's error again (tft loads the planner)",
        "tft/data/splits.py",
        "from tft.errors import ConfigError, DataError",
        "from tft.errors import ConfigError\nfrom autockpt.errors import DataError",
        ("tests/test_layout.py",),
    ),
    Mutation(
        "timed-at-the-whole-batch",
        "the real model is timed at the whole batch, whatever the budget (planning holds the "
        "plain step)",
        "autockpt/planner/timing/timing_room.py",
        "samples = max(min(int((allowed - fixed) // grows_per_sample), batch_size), 0)",
        "samples = batch_size",
        ("tests/planner/timing/test_timing_room.py",),
    ),
    Mutation(
        "whole-region-cut-without-its-batch-dims",
        "a region recomputed whole is timed on part of the batch though its inputs' batch "
        "dimensions are unknown (timing fails, every time is estimated)",
        "autockpt/planner/timing/time_model.py",
        "cut = samples < self.batch_size or samples > self.stopwatch.batch_size",
        "cut = samples < self.batch_size",
        ("tests/planner/timing/test_timing_room.py",),
    ),
    Mutation(
        "timed-part-scaled-in-proportion",
        "a step timed on part of the batch is scaled in proportion (its fixed cost grows with "
        "the batch, micro-batches come out free)",
        "autockpt/planner/timing/timing_room.py",
        "    if high <= low:\n        return high_s * samples / max(high, 1)",
        "    if True:\n        return high_s * samples / max(high, 1)",
        ("tests/planner/timing/test_timing_room.py",),
    ),
    Mutation(
        "rank-offset-not-shown",
        "one rank's peak is reported as one process's: its extra states (DDP's gradient "
        "buckets, FSDP's gathered units) do not show in the plan",
        "autockpt/planner/core/step_budget.py",
        "            + self.context_bytes\n            + self.rank_offset_shown_bytes\n",
        "            + self.context_bytes\n",
        ("tests/planner/measure/test_sharding.py", "tests/planner/core/test_step_budget.py"),
    ),
    Mutation(
        "rank-offset-not-taken-off",
        "one rank's step may take the whole budget: its extra states are not taken off what "
        "planning aims at",
        "autockpt/planner/core/step_budget.py",
        "left = self.target_bytes - self.rank_offset_shown_bytes - self.context_bytes",
        "left = self.target_bytes - self.context_bytes",
        ("tests/planner/measure/test_sharding.py",),
    ),
    Mutation(
        "budget-read-again-on-copy",
        "a copy of the run's settings reads its budget again from the text it was written as",
        "autockpt/training/options/config.py",
        "return _validate({**dict(self), **changes}, sources={})",
        "return _validate({**self.model_dump(), **changes}, sources={})",
        ("tests/training/test_config.py",),
    ),
    Mutation(
        "run-plans-for-another-optimizer",
        "the trainer plans for the planner's default AdamW, not the optimizer it trains with",
        "autockpt/training/setup/planning.py",
        "optimizer=run_optimizer(config, device, parallelism),",
        'optimizer="adamw",',
        ("tests/training/test_train.py::test_the_run_trains_with_the_optimizer_planning_counted",),
    ),
    Mutation(
        "fused-optimizer-over-meta",
        "a fused optimizer is copied onto the planner's meta stand-ins as it is (planning ends)",
        "autockpt/planner/measure/optimizers.py",
        '    if settings.get("fused") and any(p.device.type == "meta" for p in parameters):',
        "    if False:",
        ("tests/planner/test_optimizer_specs.py",),
    ),
    Mutation(
        "hf-plan-not-installed",
        "the Hugging Face callback plans but the Trainer's model keeps its own submodules",
        "autockpt/hf/callback.py",
        "            self._installed = InstalledPlan(module, entry.runner)\n",
        "            self._installed = InstalledPlan(module, HuggingFaceStep(module))\n",
        ("tests/hf/test_trainer_callback.py",),
    ),
    Mutation(
        "hf-plan-not-in-checkpoints",
        "the Hugging Face callback's checkpoint state leaves its plan out",
        "autockpt/hf/callback.py",
        '"attributes": {"plans_json": plans or self.plans_json}',
        '"attributes": {"plans_json": []}',
        ("tests/hf/test_trainer_callback.py",),
    ),
    Mutation(
        "hf-checkpointing-left-on",
        "with args.gradient_checkpointing and MemoryPlan both, the model's own checkpointing stays on",
        "autockpt/hf/callback.py",
        "                turn_off()\n",
        "                pass\n",
        ("tests/hf/test_trainer_callback.py",),
    ),
    Mutation(
        "batch-norm-laid-out-as-meta",
        "a fake batch norm keeps the meta kernel's layout, so the copy a later op makes of a "
        "transposed input goes uncounted (PatchTST under-predicted)",
        "autockpt/planner/core/memory_tracker.py",
        "            out = self._size_oracle.relaid(func, args, kwargs, out)\n",
        "            pass\n",
        ("tests/planner/core/test_memory_tracker.py",),
    ),
    Mutation(
        "calibration-floor-over-small-room",
        "calibration never goes below two vectors of 64K floats, so a budget of half a MiB "
        "(PatchTST at its minimum) is overrun while planning calibrates",
        "autockpt/planner/timing/calibration.py",
        "MIN_CALIBRATION_SIZES = (16, 1024)\n",
        "MIN_CALIBRATION_SIZES = (64, 65_536)\n",
        ("tests/planner/timing/test_time_model.py",),
    ),
    Mutation(
        "distribution-checks-on-fake-tensors",
        "torch.distributions' argument checks stay on while the forward runs on fake tensors, so "
        "a model that builds a distribution in forward is measured on real copies",
        "autockpt/planner/core/fake_mode.py",
        "        torch.distributions.Distribution.set_default_validate_args(False)\n",
        "        pass\n",
        ("tests/planner/test_user_steps.py",),
    ),
    Mutation(
        "distribution-checks-left-off",
        "planning leaves torch.distributions' argument checks off after it, so the user's own "
        "steps no longer check a distribution's arguments",
        "autockpt/planner/core/fake_mode.py",
        "        finally:\n"
        "            torch.distributions.Distribution.set_default_validate_args(self._checks_before.pop())\n",
        "        finally:\n            self._checks_before.pop()\n",
        ("tests/planner/test_user_steps.py",),
    ),
    Mutation(
        "cudnn-rnn-backward-not-faked",
        "planning's fake mode leaves cuDNN's RNN backward to torch, which runs the real kernel on "
        "stand-ins and fails: no recurrent model plans on a GPU",
        "autockpt/planner/core/fake_mode.py",
        "        if func is _CUDNN_RNN_BACKWARD:  # NOTE [cuDNN's RNN on fake tensors]\n",
        "        if False:\n",
        ("tests/planner/core/test_cudnn_rnn_fake.py",),
    ),
    Mutation(
        "cudnn-rnn-reserve-left-empty",
        "cuDNN's reserve space is measured as torch's fake forward gives it, empty, so a "
        "recurrent model's activations on a GPU are predicted short",
        "autockpt/planner/core/fake_mode.py",
        '            if bound["train"]:\n',
        "            if False:\n",
        ("tests/planner/core/test_cudnn_rnn_fake.py",),
    ),
    Mutation(
        "validation-batch-whole",
        "validation runs each batch whole without autograd, so a region the plan chunks makes "
        "its whole batch's intermediates at once and the run goes over its budget",
        "autockpt/training/forecasts/evaluate.py",
        '    pieces, every_piece = setup.plan.inference_pieces, setup.parallelism == "fsdp"\n',
        '    pieces, every_piece = 1, setup.parallelism == "fsdp"\n',
        ("tests/training/test_validation_budget.py",),
    ),
    Mutation(
        "inference-pieces-ignore-chunks",
        "a plan's inference pieces count its micro-batches only, so validation runs a chunked "
        "region's whole batch at once",
        "autockpt/planner/plan_types.py",
        "        return self.num_micro_batches * max(chunks, default=1)\n",
        "        return self.num_micro_batches\n",
        ("tests/training/test_validation_budget.py",),
    ),
    Mutation(
        "test-windows-scored-by-the-last-epoch",
        "the end of a run scores the test windows with the last epoch's weights, not the best "
        "checkpoint's that predict uses",
        "autockpt/training/forecasts/held_out.py",
        "        model.load_state_dict(best)\n",
        "        pass\n",
        ("tests/training/test_train.py", "tests/training/test_held_out.py"),
    ),
    Mutation(
        "predict-scores-the-whole-file-only",
        "predict scores every window of the file as one, the ones the model trained on mixed "
        "with the ones it never saw",
        "autockpt/training/forecasts/scores_by_part.py",
        '    cuts = saved.get("split_cuts_ns")\n',
        "    cuts = None\n",
        ("tests/training/test_baselines.py", "tests/cli/test_cli.py"),
    ),
    Mutation(
        "predict-parts-by-the-last-forecast-bar",
        "a window whose forecast bars straddle a split cut is put with the later part, so "
        "windows partly trained on count as never seen",
        "autockpt/training/forecasts/scores_by_part.py",
        "        part_of = torch.from_numpy(split_labels(batch.decoder_time_ns[:, 0].numpy(), self.cuts))\n",
        "        part_of = torch.from_numpy(split_labels(batch.decoder_time_ns[:, -1].numpy(), self.cuts))\n",
        ("tests/training/test_baselines.py", "tests/training/test_scores_by_part.py"),
    ),
    Mutation(
        "split-cut-never-when-test-is-empty",
        "with no test share the test cut is the largest time there is, so predict counts a "
        "later file's bars as validated on",
        "tft/data/splits.py",
        "        cuts.append(int(distinct_times[index]) if index < len(distinct_times) else after_the_file)\n",
        "        cuts.append(int(distinct_times[index]) if index < len(distinct_times) else never)\n",
        ("tests/training/test_scores_by_part.py",),
    ),
    Mutation(
        "print-plan-gives-the-fields",
        "print(plan) shows pydantic's fields, not the table autockpt plan prints",
        "autockpt/plan_report.py",
        "read_plans_with(report)  # print(plan) gives this table (NOTE [The plan as text])\n",
        "\n",
        ("tests/cli/test_report.py",),
    ),
    Mutation(
        "refusal-names-two-floors",
        "a refusal names its minimum and then a budget 5% above it to raise to: two floors",
        "autockpt/planner/solve/refusal.py",
        '    raise_to = f"raise the budget to at least {format_bytes(minimum_bytes)}"\n',
        '    raise_to = f"raise the budget to at least {format_bytes(minimum_bytes * 1.05)}"\n',
        ("tests/planner/solve/test_refusal.py",),
    ),
    Mutation(
        "minimum-of-recompute-alone-unsaid",
        "the plan's line gives the minimum of recompute alone as if every option had been searched",
        "autockpt/planner/solve/staged_search.py",
        "            minimum_searched=MINIMUM_SEARCHED[self.stages_reached - 1],\n",
        '            minimum_searched="every option",\n',
        ("tests/planner/test_plan.py",),
    ),
    Mutation(
        "text-times-not-settled-by-the-file",
        "a file whose times are stored as ISO text is refused until the user names the column",
        "tft/data/role_inference.py",
        "            stamped = _text_times(path, schema)\n",
        "            stamped = []\n",
        ("tests/cli/test_first_hour.py",),
    ),
    Mutation(
        "split-dates-read-on-utc",
        "split dates written without a zone are read on UTC's clock whatever --timezone says, "
        "so a Chicago desk's test period starts six hours early",
        "tft/data/splits.py",
        "        zone = ZoneInfo(timezone) if timezone else UTC\n",
        "        zone = UTC\n",
        ("tests/tft/test_split_dates.py", "tests/cli/test_first_hour.py"),
    ),
    Mutation(
        "row-cache-kept-for-other-split-dates",
        "a row cache fitted with one split's training rows is reused for a split by other "
        "dates, so its scales come from rows the new split validates on",
        "tft/data/streamed/row_cache.py",
        "    return meta.given_roles == given and meta.fitted_on == _fitted_on(split)\n",
        "    return meta.given_roles == given\n",
        ("tests/tft/test_split_dates.py",),
    ),
    Mutation(
        "split-date-outside-the-file-taken",
        "a split date past the file's last bar is taken, leaving the test part empty without a word",
        "tft/data/splits.py",
        "        if not first < start <= last:\n",
        "        if start <= first:\n",
        ("tests/tft/test_split_dates.py", "tests/cli/test_first_hour.py"),
    ),
    Mutation(
        "planning-lines-on-any-stderr",
        "autockpt.plan writes its stage lines to stderr in a file, a pipe or a notebook too",
        "autockpt/planner/entry.py",
        "        return stderr_lines() if on_a_terminal(sys.stderr) else None\n",
        "        return stderr_lines()\n",
        ("tests/planner/test_plan_progress.py",),
    ),
    Mutation(
        "spinner-under-quiet",
        "--quiet still shows the spinner of planning's stages, between its JSON lines",
        "autockpt/cli/console.py",
        "    if quiet or not writes_to_terminal(sys.stdout):\n",
        "    if not writes_to_terminal(sys.stdout):\n",
        ("tests/cli/test_waiting.py",),
    ),
    Mutation(
        "row-cache-build-in-silence",
        "a row cache's build says nothing while it reads the file three times over",
        "tft/data/streamed/file_scan.py",
        "            if rows_read is not None:\n",
        "            if rows_read is not None and first < 0:\n",
        ("tests/tft/test_streamed_windows.py",),
    ),
    Mutation(
        "warm-up-forgotten-at-a-chunk-edge",
        "a streamed symbol forgets at each chunk's edge which inputs it has seen a value of, so "
        "a real NaN after the warm-up is dropped as one, with its windows",
        "tft/data/warmup.py",
        "            self.seen[code] = seen[last]\n",
        "            self.seen.pop(code, None)\n",
        ("tests/tft/test_warmup.py",),
    ),
    Mutation(
        "streamed-warm-up-kept",
        "a file streamed past --max-host-memory keeps its indicators' warm-up rows and is "
        "refused for their NaNs",
        "tft/data/streamed/file_scan.py",
        "        cold = ~self.warmup.warm(table, ext_local[keep], ext_codes[keep])\n",
        "        cold = self.warmup.warm(table, ext_local[keep], ext_codes[keep]) | True\n",
        ("tests/tft/test_warmup.py",),
    ),
    Mutation(
        "killed-build-left-on-disk",
        "the partial row cache a build killed with kill -9 left stays on disk for good",
        "autockpt/training/options/data_source.py",
        "    removed = remove_stale_builds(folder, any_name=cache is None)\n",
        "    removed: list[tuple[Path, int]] = []\n",
        ("tests/tft/test_stale_builds.py",),
    ),
    Mutation(
        "a-running-build-removed",
        "a run removes the partial cache another process is still building",
        "tft/data/streamed/row_cache.py",
        "        os.kill(pid, 0)\n",
        "        raise ProcessLookupError\n",
        ("tests/tft/test_stale_builds.py",),
    ),
    Mutation(
        "folder-rows-in-file-order",
        "a folder's files are read in path order without putting the rows in time order, so "
        "daily files named or listed out of order are refused as unsorted bars",
        "tft/data/sources/parquet_folder.py",
        "    order = np.lexsort((time_ns, codes))\n",
        '    order = np.argsort(codes, kind="stable")\n',
        ("tests/tft/test_parquet_folder.py",),
    ),
    Mutation(
        "same-bar-in-two-files-unnamed",
        "the same bar in two files of a folder is refused as a repeated row of one table, "
        "naming no file",
        "tft/data/sources/parquet_folder.py",
        "    if not same.any():\n",
        "    if True:\n",
        ("tests/tft/test_parquet_folder.py",),
    ),
    Mutation(
        "folder-schemas-not-promoted",
        "a column stored as integers in one file and floats in another ends the read with "
        "a traceback",
        "tft/data/sources/parquet_folder.py",
        '        unified = pa.unify_schemas([unified, schema], promote_options="permissive")\n',
        '        unified = pa.unify_schemas([unified, schema], promote_options="default")\n',
        ("tests/tft/test_parquet_folder.py",),
    ),
    Mutation(
        "predict-builds-a-second-cache",
        "predict on the run's own file builds a second row cache beside the run folders "
        "instead of reading the one the run named with --data-cache",
        "autockpt/training/forecasts/predict.py",
        "            cache=Path(run_cache) if run_cache and same_file else None,\n",
        "            cache=None,\n",
        ("tests/training/test_predict_cache.py",),
    ),
    Mutation(
        "pattern-base-is-its-last-folder",
        "a glob pattern's files are looked for below its last folder, so a pattern with a "
        "wildcard in a folder's name (symbol=*/*.parquet) matches nothing",
        "tft/data/sources/data_source.py",
        '    return Path(*parts[:fixed]) if fixed else Path(".")\n',
        "    return path.parent\n",
        ("tests/tft/test_data_patterns.py",),
    ),
    Mutation(
        "several-data-paths-read-the-first",
        "several data paths (an unquoted pattern the shell expanded, or unrelated files) read "
        "the first path's files alone, without a word",
        "tft/data/sources/data_source.py",
        "        for path in self.paths:\n",
        "        for path in self.paths[:1]:\n",
        ("tests/tft/test_several_paths.py",),
    ),
    Mutation(
        "several-data-paths-cached-by-their-order",
        "the same data paths given in another order are another dataset: a second row cache "
        "built, and predict does not reuse the run's",
        "tft/data/sources/data_source.py",
        "        return DataSource(tuple(sorted({path.resolve() for path in self.paths})))\n",
        "        return DataSource(tuple(path.resolve() for path in self.paths))\n",
        ("tests/tft/test_several_paths.py",),
    ),
    Mutation(
        "several-data-paths-keys-below-the-first",
        "the hive keys of several paths are read below the first path's folder, so the shell's "
        "expansion of bars/symbol=*/*.parquet loses its symbol column",
        "tft/data/sources/data_source.py",
        "        folders = [str(_folder_of(path).absolute()) for path in self.paths]\n",
        "        folders = [str(_folder_of(path).absolute()) for path in self.paths[:1]] * 2\n",
        ("tests/tft/test_several_paths.py",),
    ),
    Mutation(
        "cache-grows-only-from-its-own",
        "predict on the run's folder and a new day's files beside it builds a new row cache from "
        "every row, where the run's cache holds all but the new day's",
        "tft/data/streamed/row_cache.py",
        "        elif meta is None and floor is not None:\n",
        "        elif False:\n",
        ("tests/tft/test_cache_grown_from_another.py",),
    ),
    Mutation(
        "cache-grown-from-another-encoded-otherwise",
        "a cache grows from one beside it whose scales were fitted on other rows, so the new "
        "dataset's rows are encoded with scales it was not asked for",
        "tft/data/streamed/row_cache.py",
        "        if meta is None or not _same_encoding(meta, roles, normalizer, split):\n",
        "        if meta is None:\n",
        ("tests/tft/test_cache_grown_from_another.py",),
    ),
    Mutation(
        "cache-grown-from-another-takes-the-fewest-files",
        "of the caches beside it a new one grows from the one of the fewest files, reading "
        "again what another holds encoded",
        "tft/data/streamed/row_cache.py",
        "        if best is None or files > len(best[1].source.files()):\n",
        "        if best is None or files < len(best[1].source.files()):\n",
        ("tests/tft/test_cache_grown_from_another.py",),
    ),
    Mutation(
        "changed-file-rebuilds-the-whole-cache",
        "a late fix to one contract's file encodes every contract's rows again",
        "tft/data/streamed/row_cache.py",
        "            grown = grow_cache(path, folder, meta, source, floor, reading) or reencode_touched(\n",
        "            grown = grow_cache(path, folder, meta, source, floor, reading) or None and (\n",
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "reencoded-symbol-read-from-its-changed-files-alone",
        "a touched symbol is encoded again from the changed files alone, so its rows in the "
        "other files are lost and its series starts at the changed file",
        "tft/data/streamed/updates/cache_reencode.py",
        "    holding = [own[name] for name, bars in file_symbols.items() if set(bars) & set(touched)]\n",
        "    holding = fresh\n",
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "reencoded-symbols-miss-the-removed-files",
        "the symbols of a removed file are not touched, so the cache keeps its rows",
        "tft/data/streamed/updates/cache_reencode.py",
        "    read_again = [*(meta.file_symbols[name] for name in [*changed, *removed]), *fresh_bars.values()]\n",
        "    read_again = [*(meta.file_symbols[name] for name in changed), *fresh_bars.values()]\n",
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "reencoded-past-the-floor",
        "a changed training day of a split by dates is encoded again with the scales fitted on "
        "the rows it replaced",
        "tft/data/streamed/updates/cache_reencode.py",
        "    if any(first < floor_ns for bars in read_again for first in bars.values()):\n",
        "    if False:\n",
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "reencoded-warmup-counts-kept",
        "the warm-up rows a re-encoded symbol lost stay in the column table's counts",
        "tft/data/streamed/updates/cache_reencode.py",
        "                meta.warmup_rows, walker.warmup.warmup_counts_by_symbol(symbols), again\n",
        "                meta.warmup_rows, {}, set()\n",
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "reencoded-unknown-counts-kept",
        "the unknown categories of a re-encoded symbol's new rows are not counted",
        "tft/data/streamed/updates/cache_reencode.py",
        "                meta.unknown_rows, counts_by_symbol(symbols, unknown), again\n",
        "                meta.unknown_rows, {}, set()\n",
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "reencoded-distinct-times-kept",
        "the distinct times of a cache re-encoded are the old ones, so a split by shares cuts "
        "at times no bar has now",
        "tft/data/streamed/updates/cache_reencode.py",
        "    distinct = _count_distinct_times(partial, num_rows, chunk_rows)\n",
        "    distinct = meta.distinct_times\n"
        '    __import__("shutil").copy(folder / DISTINCT_TIMES_FILE, partial / DISTINCT_TIMES_FILE)\n',
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "reencoded-static-change-kept",
        "a static column whose value changes in a changed file is re-encoded as a new code "
        "within the contract, where a build refuses the column as static",
        "tft/data/streamed/updates/cache_reencode.py",
        "    if not _statics_constant(partial, width, new_bounds, touched, chunk_rows):\n",
        "    if False:\n",
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "grown-cache-forgets-its-new-files-symbols",
        "a cache grown by new files does not keep their symbols, so a later change to any file "
        "rebuilds the whole cache",
        "tft/data/streamed/updates/cache_growth.py",
        '            "file_symbols": {**meta.file_symbols, **order.file_symbols()},\n',
        '            "file_symbols": meta.file_symbols,\n',
        ("tests/tft/test_cache_reencoded.py",),
    ),
    Mutation(
        "bracketed-file-name-read-as-a-pattern",
        "a file whose name holds a bracket (bars[2024].parquet) is read as a glob pattern that "
        "matches nothing",
        "tft/data/sources/data_source.py",
        "    return _WILDCARD.search(str(path)) is not None and not path.exists()\n",
        "    return _WILDCARD.search(str(path)) is not None\n",
        ("tests/tft/test_data_patterns.py",),
    ),
    Mutation(
        "distinct-times-held-in-memory",
        "a build holds every distinct time in memory until the pass ends, so its memory grows "
        "with the rows (8 bytes a time)",
        "tft/data/streamed/distinct_times.py",
        "        if self._held_times >= self.block_times:\n",
        "        if self._held_times < 0:\n",
        ("tests/tft/test_distinct_times.py",),
    ),
    Mutation(
        "merged-blocks-cut-at-the-larger-last-time",
        "two runs' blocks are merged up to the larger of their last times, so a time of the "
        "next block can come before one already written",
        "tft/data/streamed/distinct_times.py",
        "                limit = min(a[-1], b[-1])\n",
        "                limit = max(a[-1], b[-1])\n",
        ("tests/tft/test_distinct_times.py",),
    ),
    Mutation(
        "planning-peak-leaves-out-whole-batch-runs",
        "the planning peak a plan reports leaves out the plans timed at the whole batch, the "
        "largest real steps planning ran",
        "autockpt/planner/pipeline.py",
        "            peak, room.step_bytes, room.optimizer_bytes, costs.stopwatch.whole_batch_peak_bytes\n",
        "            peak, room.step_bytes, room.optimizer_bytes\n",
        ("tests/planner/solve/test_whole_plan_timing.py",),
    ),
    Mutation(
        "whole-batch-plans-timed-on-the-samples-timed",
        "a plan to be timed at the whole batch runs on the few samples the plain step is timed "
        "at, so its time stands for a fraction of the batch",
        "autockpt/planner/timing/real_batch.py",
        "        if samples > self.batch_size:  # the caller's whole batch, as training runs it\n",
        "        if False:\n",
        ("tests/planner/solve/test_whole_plan_timing.py",),
    ),
    Mutation(
        "models-own-checkpoints-unsaid",
        "a forward's own non-reentrant checkpoint calls are traced through without a word, so "
        "the plan's plain step is silently the model without them",
        "autockpt/planner/trace/autograd_regions.py",
        "                    node.meta[USER_CHECKPOINT_META] = checkpoints[0]\n",
        "                    pass\n",
        ("tests/planner/trace/test_autograd_regions.py",),
    ),
    Mutation(
        "segment-runners-share-their-code",
        "every segment runner runs one class's code, so dynamo counts each segment's compile as "
        "a recompile of the same code and runs the segments past the eighth eagerly",
        "autockpt/planner/runtime/segment_runners.py",
        "        return super().__new__(runner_class(index))\n",
        "        return super().__new__(cls)\n",
        ("tests/planner/test_compiled_segments.py",),
    ),
    Mutation(
        "planned-forwards-share-their-code",
        "the planned modules of a process share their forward's code, so the ninth compiled "
        "in a process runs its forward eagerly past dynamo's recompile limit",
        "autockpt/planner/runtime/planned_graph.py",
        "        self.__class__ = class_of_its_own(\n",
        "        self.__class__ = (lambda *_: PlannedForward)(\n",
        ("tests/planner/test_compiled_segments.py",),
    ),
    Mutation(
        "segment-code-copies-equal",
        "each runner's code is copied but keeps its name, so the copies compare equal and dynamo "
        "takes one segment's lambda for every segment's where it resumes a frame",
        "autockpt/planner/runtime/segment_runners.py",
        '        co_name=f"{code.co_name}_{label}",\n',
        "",
        ("tests/planner/test_compiled_segments.py",),
    ),
    Mutation(
        "compiled-search-keeps-its-first-timing",
        "the compiled search times its fastest candidates again but keeps their first timings, "
        "taken seconds or minutes apart, so a candidate slowed once by another process is "
        "passed over",
        "autockpt/planner/compiled_search.py",
        "        candidate.step_s = min(seconds)\n",
        "        candidate.step_s = candidate.step_s\n",
        ("tests/planner/test_compiled_segments.py",),
    ),
    Mutation(
        "compiled-retiming-in-one-order",
        "timing in rounds (the compiled search's second timing, the eager whole-plan timing) "
        "runs the steps in the same order every round, so one always follows the same other "
        "and pays for what it left",
        "autockpt/planner/solve/whole_plan_timing.py",
        "        for index in [*range(rounds % len(runs), len(runs)), *range(rounds % len(runs))]:\n",
        "        for index in range(len(runs)):\n",
        ("tests/planner/test_compiled_segments.py",),
    ),
    Mutation(
        "folder-streamed-in-path-order",
        "a folder past --max-host-memory is streamed in its files' path order, so daily files "
        "whose names do not sort by date are refused as unsorted bars",
        "tft/data/streamed/read_order.py",
        "    order = _topological(path, files, _edges(path, files, stretches), first_bar)\n",
        "    order = list(range(len(files)))\n",
        ("tests/tft/test_streamed_folder.py",),
    ),
    Mutation(
        "streamed-folder-overlap-not-refused",
        "a symbol's bars overlapping in two files of a streamed folder end in a row order "
        "error that names neither file",
        "tft/data/streamed/read_order.py",
        "            if before.last_ns >= after.first_ns:\n",
        "            if False:\n",
        ("tests/tft/test_streamed_folder.py",),
    ),
    Mutation(
        "chunk-error-names-the-folder",
        "a bad value in a streamed folder is named by the folder and a row of no file",
        "tft/data/streamed/file_scan.py",
        "                yield Chunk(DataSource.of(file), first, pa.Table.from_batches([batch]))\n",
        "                yield Chunk(order.root, first, pa.Table.from_batches([batch]))\n",
        ("tests/tft/test_streamed_folder.py",),
    ),
    Mutation(
        "folder-cache-kept-after-a-file-added",
        "a streamed folder's row cache is reused after a new day's file is added, so the run "
        "trains without it",
        "tft/data/streamed/cache_meta.py",
        "                size_bytes=sum(part.size_bytes for part in parts),\n"
        "                mtime_ns=max(part.mtime_ns for part in parts),\n"
        "                parts=parts,\n",
        "                size_bytes=0,\n                mtime_ns=0,\n",
        ("tests/tft/test_streamed_folder.py",),
    ),
    Mutation(
        "new-day-rebuilds-the-cache",
        "a streamed folder that gained a day's file rebuilds its whole row cache, reading and "
        "encoding every bar again",
        "tft/data/streamed/row_cache.py",
        "            grown = grow_cache(path, folder, meta, source, floor, reading) or reencode_touched(\n",
        "            grown = None or reencode_touched(\n",
        ("tests/tft/test_cache_growth.py",),
    ),
    Mutation(
        "grown-cache-forgets-the-last-bar",
        "a grown cache starts each symbol's new rows with no bar before them, so the new day's "
        "first log return is dropped and its rows are not the build's",
        "tft/data/streamed/updates/cache_growth.py",
        "        walker.carry[code] = (time_ns, value, -1)\n",
        "        pass\n",
        ("tests/tft/test_cache_growth.py",),
    ),
    Mutation(
        "grown-cache-blocks-left-in-place",
        "a grown cache copies each symbol's old rows to their old places, so the new rows of "
        "one symbol overwrite the next symbol's",
        "tft/data/streamed/updates/cache_rewrite.py",
        '            files.copy_rows(name, reused / f"{name}.bin", span, int(new_bounds[code]))\n',
        '            files.copy_rows(name, reused / f"{name}.bin", span, int(bounds[code]))\n',
        ("tests/tft/test_cache_growth.py", "tests/tft/test_cache_reencoded.py"),
    ),
    Mutation(
        "split-by-shares-grows-with-old-scales",
        "a run fitting its scales on a split by shares grows the cache of a folder that gained "
        "a day, keeping scales fitted on training rows that have moved",
        "tft/data/streamed/row_cache.py",
        "    return split[1][0] if split[1] is not None else None\n",
        "    return split[1][0] if split[1] is not None else NO_FLOOR\n",
        ("tests/tft/test_cache_growth.py",),
    ),
    Mutation(
        "cache-grown-with-a-given-normaliser-still-says-fitted",
        "a cache grown with the run's normaliser still says it was fitted on a split of the "
        "folder, so a new run fitting on the grown folder reuses scales of the old rows",
        "tft/data/streamed/updates/cache_rewrite.py",
        "            fitted_here = floor_ns != NO_FLOOR  # a run's own fit by dates still describes it\n",
        "            fitted_here = True\n",
        ("tests/tft/test_cache_growth.py",),
    ),
    Mutation(
        "window-starts-held-per-window",
        "a part's windows are held as an array of every start, 8 bytes a window (480 MB for "
        "60M bars), as before the runs",
        "tft/data/splits.py",
        "    return StartRuns(np.asarray(firsts), np.asarray(counts)), longest\n",
        "    runs = StartRuns(np.asarray(firsts), np.asarray(counts))\n"
        "    runs.every = np.asarray(runs)  # type: ignore[attr-defined]\n"
        "    return runs, longest\n",
        ("tests/tft/test_window_memory.py",),
    ),
    Mutation(
        "shuffle-made-as-an-array",
        "each batch's shuffled positions are taken from an array of every position, 8 bytes "
        "a window",
        "tft/data/batch.py",
        "        drawn = np.arange(start, stop, step, dtype=np.int64)\n",
        "        drawn = np.arange(self.count, dtype=np.int64)[start:stop:step]\n",
        ("tests/tft/test_window_memory.py",),
    ),
    Mutation(
        "footer-read-on-every-ask",
        "a folder's footers are read again each time a load asks for its schema or rows "
        "(four and more reads a file)",
        "tft/data/sources/parquet_folder.py",
        "    return _footer_of(str(path), stat.st_size, stat.st_mtime_ns)\n",
        "    return pq.read_metadata(path)\n",
        ("tests/tft/test_streamed_folder.py",),
    ),
    Mutation(
        "refusal-measures-one-lowest-choice",
        "a refusal measures one choice at the chain model's lowest peak, the cheapest, and "
        "names 550 KiB where a 488 KiB plan exists",
        "autockpt/planner/solve/chain_solver.py",
        "    return [cheapest] if cheapest.choice == lowest.choice else [cheapest, lowest]\n",
        "    return [cheapest]\n",
        ("tests/planner/test_plan.py",),
    ),
    Mutation(
        "plan-minimum-left-the-estimate",
        "a plan gives the chain model's minimum (3.50 MiB on the sample; 25.10 MiB on a bf16 MLP "
        "whose search stopped at chunks, where planning at it is refused) where a refusal names "
        "the measured one (3.46 MiB; 27.84 MiB)",
        "autockpt/planner/solve/staged_search.py",
        "            minimum_peak_bytes=search.measured_minimum_bytes(),\n",
        "            minimum_peak_bytes=search.minimum_peak_bytes(),\n",
        ("tests/cli/test_report.py", "tests/planner/test_plan.py"),
    ),
    Mutation(
        "a-date-is-taken-for-a-bar-time",
        "a text column of dates alone counts as the bars' times, so an export with a date "
        "beside its time column has its timestamp asked for",
        "tft/data/role_inference.py",
        '    if len(values) == 0 or not pc.all(pc.match_substring(values, ":")).as_py():\n',
        "    if len(values) == 0:\n",
        ("tests/cli/test_first_hour.py",),
    ),
    Mutation(
        "timestamp-not-settled-by-the-file",
        "a file with one timestamp-typed column under another name is refused until the user "
        "names it",
        "tft/data/role_inference.py",
        '            update["timestamp"] = stamped[0]\n',
        "            pass\n",
        ("tests/cli/test_first_hour.py",),
    ),
    Mutation(
        "symbol-not-settled-by-repeats",
        "contracts interleaved by time with no column called symbol are read as one series and "
        "refused for repeated timestamps",
        "tft/data/role_inference.py",
        "    return telling[0] if telling else None\n",
        "    return None\n",
        ("tests/cli/test_first_hour.py",),
    ),
    Mutation(
        "role-problems-one-at-a-time",
        "each missing role column is reported alone, one run per problem",
        "tft/data/role_inference.py",
        "        problems.append(f\"no {role} column '{name}': {fix} {how_to_name(option)}\")\n",
        "        raise _error(path, f\"no {role} column '{name}': {fix} {how_to_name(option)}\")\n",
        ("tests/cli/test_first_hour.py",),
    ),
    Mutation(
        "text-times-without-zone-read-as-utc",
        "ISO text with no time zone is read as UTC without asking whose clock it is",
        "tft/data/timestamps.py",
        "        if column.type.tz is None and roles.timezone is None:\n",
        "        if False:\n",
        ("tests/tft/test_timestamps.py",),
    ),
    Mutation(
        "epoch-unit-always-nanoseconds",
        "integer epochs are read as nanoseconds whatever their size",
        "tft/data/timestamps.py",
        "    for unit, per_unit in EPOCH_UNITS.items():\n",
        '    for unit, per_unit in [("ns", 1)]:\n',
        ("tests/tft/test_timestamps.py",),
    ),
    Mutation(
        "split-flag-not-passed-to-the-data",
        "--split is shown but the data is still cut 70/15/15",
        "autockpt/training/setup/prepare.py",
        "            split=config.split,\n",
        "",
        ("tests/cli/test_first_hour.py",),
    ),
    Mutation(
        "predict-reports-no-progress",
        "predict forecasts every window without telling its progress callback",
        "autockpt/training/forecasts/predict.py",
        "                progress(done, len(windows))\n",
        "                pass\n",
        ("tests/cli/test_cli.py",),
    ),
    Mutation(
        "warning-at-a-line-inside-the-planner",
        "the forced plan's over-budget warning names a line inside autockpt, not the user's call",
        "autockpt/errors.py",
        "    while frame_ is not None and os.path.abspath(frame_.f_code.co_filename).startswith(package):\n",
        "    while False:\n",
        ("tests/planner/test_plan.py",),
    ),
    Mutation(
        "report-is-not-the-table",
        "autockpt.report(plan) gives the plan's raw model, not the table the command line prints",
        "autockpt/plan_report.py",
        "soft_wrap=True)\n    print_plan(console, plan, budget_given=True)\n",
        "soft_wrap=True)\n    console.print(repr(plan))\n",
        ("tests/cli/test_report.py",),
    ),
    Mutation(
        "warm-up-rows-kept",
        "an indicator's leading NaNs per symbol are refused as bad data instead of dropped",
        "tft/data/windows.py",
        "    if warm.any():  # NOTE [Warm-up rows]\n",
        "    if False:\n",
        ("tests/tft/test_warmup.py",),
    ),
    Mutation(
        "cache-not-put-back-for-recompute",
        "a link that writes the cache it is given recomputes with the cache as backward finds "
        "it (every layer's keys in it), not as its forward did",
        "autockpt/planner/runtime/held_state.py",
        "        before.put_back()\n",
        "        pass\n",
        ("tests/planner/trace/test_python_state.py",),
    ),
    Mutation(
        "cache-left-as-recompute-wrote-it",
        "after a recompute the cache holds what the recompute wrote, not what forward left",
        "autockpt/planner/runtime/held_state.py",
        "            now.put_back()\n",
        "            pass\n",
        ("tests/planner/trace/test_python_state.py",),
    ),
    Mutation(
        "loss-chunks-weighted-by-positions",
        "the chunks of a loss that ignores labels are weighted by their positions, not by "
        "their labelled positions (gradients wrong where prompts or padding are ignored)",
        "autockpt/planner/runtime/chunked_loss.py",
        '        if self.reduction == "mean":',
        '        if self.reduction != "sum":',
        ("tests/planner/test_loss_chunks.py",),
    ),
    Mutation(
        "loss-chunks-probe-sees-few-targets",
        "the loss probe tries the targets only at the first positions, so a loss that masks "
        "padding by a rule of its own is chunked",
        "autockpt/planner/measure/loss_positions.py",
        "    trials = [*planted, *given] if labelled else given\n",
        "    trials = [planted[0], given[0]] if labelled else given[:1]\n",
        ("tests/planner/test_loss_chunks.py",),
    ),
    Mutation(
        "loss-chunks-not-run-by-training-step",
        "training_step runs a plan's loss whole although the plan counted it in chunks",
        "autockpt/planner/training_step.py",
        "    if plan is None or plan.loss_chunks is None:",
        "    if True:",
        ("tests/planner/test_loss_chunks.py",),
    ),
    Mutation(
        "malloc-trims-past-2-gib",
        "the trainer turns malloc's trimming off with the largest int as its threshold, so a "
        "step that frees more than 2 GiB gives its pages back and faults them in again",
        "autockpt/training/host/host_tuning.py",
        "            (_M_TRIM_THRESHOLD, _NEVER_TRIM),\n",
        "            (_M_TRIM_THRESHOLD, 2**31 - 1),\n",
        ("tests/training/test_host_tuning.py",),
    ),
    Mutation(
        "threads-timed-at-the-processs-count",
        "the planner times the real model at the threads the process had when planning began, "
        "not at the count chosen from the plain step, which training runs with",
        "autockpt/planner/pipeline.py",
        "    chosen = request.cpu_threads\n",
        "    chosen = None\n",
        (
            "tests/planner/test_decided_budget.py",
            "tests/training/test_train.py::test_a_run_plans_in_the_process_it_trains_in",
        ),
    ),
    Mutation(
        "budget-decided-from-the-placeholder",
        "a budget given as a function of the plain step is called with the undecided budget's "
        "bytes instead of the plain step's",
        "autockpt/planner/pipeline.py",
        "    budget, request = budget_decided(budget, request, budget.shown_bytes(kept.peak_bytes))\n",
        "    budget, request = budget_decided(budget, request, budget.usable_bytes)\n",
        ("tests/planner/test_decided_budget.py",),
    ),
    Mutation(
        "chunked-loss-decides-a-budget-of-its-own",
        "where the loss run whole fits nothing, the plan with the loss in chunks decides its "
        "budget from its own, smaller, plain step",
        "autockpt/planner/loss_chunks.py",
        "        budget, request = budget_decided(budget, request, refused.unplanned_bytes)\n",
        "",
        ("tests/planner/test_decided_budget.py",),
    ),
    Mutation(
        "module-chain-estimated",
        "a model torch.fx does not trace is planned on the time model's estimates alone, its "
        "plans never timed (dict_batch's predicted 1.41x, measured 2.08x)",
        "autockpt/planner/pipeline.py",
        "        return estimated, ModuleCosts(chain_watch, estimated)\n",
        "        return estimated, estimated\n",
        ("tests/planner/timing/test_module_stopwatch.py",),
    ),
    Mutation(
        "module-chain-timed-on-the-callers-model",
        "a module chain's steps are timed on the caller's model itself, so a forward that "
        "writes its own Python state (a step counter) runs for every timed step",
        "autockpt/planner/timing/module_stopwatch.py",
        "        copied = parameter_sharing_copy(spec.model)\n",
        "        copied = spec.model\n",
        ("tests/planner/timing/test_module_stopwatch.py",),
    ),
    Mutation(
        "planning-peak-leaves-out-module-chain-runs",
        "the planning peak a plan reports leaves out a module chain's timed runs",
        "autockpt/planner/pipeline.py",
        "    if isinstance(costs, (MeasuredCosts, ModuleCosts)) and costs.stopwatch.spent_s > 0:\n",
        "    if isinstance(costs, MeasuredCosts) and costs.stopwatch.spent_s > 0:\n",
        ("tests/planner/timing/test_module_stopwatch.py",),
    ),
    Mutation(
        "own-checkpoints-timed-against-the-traced-step",
        "a model that calls torch.utils.checkpoint itself is timed against the traced graph's "
        "plain step, which recomputes nothing, not the step the user runs",
        "autockpt/planner/pipeline.py",
        "    own = spec.model if own_checkpoint_calls(traced.graph_module.graph) else None\n",
        "    own = None\n",
        ("tests/planner/timing/test_own_checkpoints.py",),
    ),
    Mutation(
        "own-step-reported-plans-timed-against-the-traced",
        "the model's own step is the plain step the plan reports, but its plans are timed "
        "against the traced graph's",
        "autockpt/planner/timing/stopwatch.py",
        "        return self.own_model or self.traced.graph_module\n",
        "        return self.traced.graph_module\n",
        ("tests/planner/timing/test_own_checkpoints.py",),
    ),
    Mutation(
        "plan-reports-a-plain-step-timed-apart",
        "a plan timed whole is reported beside a plain step timed apart from its rounds",
        "autockpt/planner/pipeline.py",
        "        builder.costs.unplanned_step_s() if chosen.timed_plain_s is None else chosen.timed_plain_s\n",
        "        builder.costs.unplanned_step_s()\n",
        ("tests/planner/timing/test_module_stopwatch.py",),
    ),
    Mutation(
        "whole-plan-timing-failure-ends-planning",
        "a plan that fails to run whole (a model refusing a piece of its batch) ends planning "
        "with the model's error instead of leaving the solver's sums",
        "autockpt/planner/solve/staged_search.py",
        "        except Exception as error:  # noqa: BLE001 - a plan that cannot be timed is estimated\n",
        "        except ZeroDivisionError as error:\n",
        ("tests/planner/timing/test_module_stopwatch.py",),
    ),
    Mutation(
        "shared-tensor-cut-by-its-size",
        "training_step cuts a batch by its dim-0 sizes alone: at a last batch the size of a "
        "shared tensor, that tensor is cut into the micro-batches (wrong gradients)",
        "autockpt/planner/training_step.py",
        "    leaves = plan.batch_leaves if plan is not None else None\n",
        "    leaves = None\n",
        (
            "tests/planner/core/test_batch_split.py::"
            "test_a_last_batch_the_size_of_a_shared_tensor_is_cut_as_the_plan_was",
        ),
    ),
    Mutation(
        "batch-flags-held-for-another-structure",
        "the plan's flags of the batch's leaves are used on a batch of another structure "
        "(dict keys in another order)",
        "autockpt/planner/core/batch_split.py",
        "    if str(spec) != structure or len(leaves) != len(flags):\n",
        "    if len(leaves) != len(flags):\n",
        ("tests/planner/core/test_batch_split.py",),
    ),
    Mutation(
        "fitting-plans-timed-on-a-line-of-small-pieces",
        "a plan that fits at the whole batch but can run on the samples timed is timed there "
        "and read off their line, whose pieces of a few samples stand for it 13-30% under",
        "autockpt/planner/solve/staged_search.py",
        "        whole = runner.fits_whole(found[1], self.real_room_bytes)\n        candidates",
        "        whole = not runner.can_run(found[0]) and runner.fits_whole(\n"
        "            found[1], self.real_room_bytes\n        )\n        candidates",
        ("tests/planner/solve/test_whole_plan_timing.py",),
    ),
    Mutation(
        "forward-pieces-blind-to-the-forward",
        "the pieces validation cuts a batch into are measured without the forward's own "
        "intermediates: a batch whose forward overruns the budget whole runs whole",
        "autockpt/planner/measure/inference_forward.py",
        "            peak = tracker.peak_bytes + earlier + joined + as_float\n",
        "            peak = earlier + joined + as_float\n",
        ("tests/training/test_validation_budget.py",),
    ),
    Mutation(
        "plan-holds-for-any-shape",
        "a plan is taken to hold for a batch larger than the one it was made for: a padded "
        "batch longer than the first runs with the first batch's plan, over the budget",
        "autockpt/planner/core/batch_split.py",
        "            mine is None or theirs is None or _no_larger(theirs, mine)\n",
        "            True\n",
        (
            "tests/planner/test_shape_planner.py",
            "tests/hf/test_padded_batches.py",
            "tests/lightning/test_varying_shapes.py",
        ),
    ),
    Mutation(
        "training-step-runs-any-shape",
        "training_step runs a batch larger than its plan's without a word",
        "autockpt/planner/training_step.py",
        "    _check_shapes(plan, inputs, targets)\n",
        "",
        ("tests/planner/test_shape_planner.py",),
    ),
    Mutation(
        "bucket-not-grown",
        "a new shape is planned at its own size, not its bucket's: every longer batch of the "
        "bucket plans again",
        "autockpt/plans_by_shape.py",
        "        return shapes.resized(sizes) if sizes else shapes\n",
        "        return shapes\n",
        (
            "tests/planner/test_shape_planner.py",
            "tests/hf/test_padded_batches.py",
            "tests/lightning/test_varying_shapes.py",
        ),
    ),
    Mutation(
        "declared-maximum-ignored",
        "max_shape is not planned for at the first batch: a run with a declared maximum "
        "plans again for each longer batch",
        "autockpt/plans_by_shape.py",
        "        if maximum is not None and not self.planned:\n",
        "        if False:\n",
        (
            "tests/planner/test_shape_planner.py",
            "tests/hf/test_padded_batches.py",
            "tests/lightning/test_varying_shapes.py",
        ),
    ),
    Mutation(
        "replanning-never-off",
        "replan=False plans a longer batch anyway instead of refusing it",
        "autockpt/plans_by_shape.py",
        "        if self.planned and not self.following.replan:\n",
        "        if False:\n",
        (
            "tests/planner/test_shape_planner.py",
            "tests/hf/test_padded_batches.py",
            "tests/lightning/test_varying_shapes.py",
        ),
    ),
    Mutation(
        "mid-run-planning-blind-to-live-state",
        "planning between steps runs its real copies as if the run's optimizer state were not "
        "alive beside them: the step that plans goes over the budget",
        "autockpt/planner/pipeline.py",
        "    live_bytes = live_state_bytes(request.optimizer)\n",
        "    live_bytes = 0\n",
        ("tests/planner/test_shape_planner.py",),
    ),
    Mutation(
        "micro-batches-past-a-small-batch",
        "a batch smaller than the plan's count of micro-batches runs an empty piece (a NaN "
        "loss for a mean)",
        "autockpt/planner/training_step.py",
        "        pieces = min(pieces, batch)",
        "        pieces = pieces",
        ("tests/planner/test_shape_planner.py",),
    ),
    Mutation(
        "loss-chunks-blind-to-the-shift",
        "a loss that shifts its labels runs each chunk on its own terms' positions only, so "
        "its slice drops a term at every chunk's end (NOTE [Losses that shift their labels])",
        "autockpt/planner/runtime/chunked_loss.py",
        "            length = terms + rule.shift\n",
        "            length = terms\n",
        (
            "tests/planner/test_loss_forms.py::test_each_form_of_the_loss_runs_in_chunks_under_half_the_peak_with_the_plain_gradients",
        ),
    ),
    Mutation(
        "labelled-counts-not-shifted",
        "a shifted loss's chunks are weighted by the labels at their own positions, not at the "
        "positions a term reads its label from",
        "autockpt/planner/runtime/chunked_loss.py",
        "labelled.narrow(self.dim, s + self.shift, n)",
        "labelled.narrow(self.dim, s, n)",
        (
            "tests/planner/test_loss_forms.py::test_each_form_of_the_loss_runs_in_chunks_under_half_the_peak_with_the_plain_gradients",
        ),
    ),
    Mutation(
        "loss-chunks-blind-to-other-gradients",
        "a loss needing gradients for more than the scores (a penalty on the parameters) is "
        "chunked, and those gradients are dropped (NOTE [The loss sees the scores alone])",
        "autockpt/planner/runtime/chunked_loss.py",
        "            found.append(leaf)\n",
        "            pass\n",
        (
            "tests/planner/test_loss_forms.py::test_a_penalty_on_the_parameters_is_not_chunked_and_training_step_refuses_it",
        ),
    ),
    Mutation(
        "loss-probe-compares-values-alone",
        "the probe takes a loss whose chunks add up to its value, although a term of no value "
        "and a gradient (a straight-through estimator's) is weighted otherwise in chunks "
        "(NOTE [Probing in float64])",
        "autockpt/planner/measure/loss_positions.py",
        "        and torch.allclose(got, want, rtol=rounding, atol=rounding * 0.1 * scale)\n",
        "        and bool(scale)\n",
        (
            "tests/planner/test_loss_forms.py::test_a_loss_that_does_not_add_up_over_positions_says_why",
        ),
    ),
    Mutation(
        "data-dependent-ops-end-planning",
        "nonzero, masked_select and unique raise on planning's fake tensors, as torch's own "
        "fake mode does (NOTE [Data-dependent sizes on fake tensors])",
        "autockpt/planner/core/fake_mode.py",
        "        if func in _DATA_DEPENDENT:",
        "        if func in ():",
        (
            "tests/planner/test_data_dependent.py",
            "tests/planner/test_loss_forms.py::test_data_dependent_ops_on_fake_tensors_are_made_at_their_largest",
        ),
    ),
    Mutation(
        "nonzero-made-small",
        "a fake nonzero keeps one element, not every one: the step after a mask is measured "
        "smaller than a real batch can make it",
        "autockpt/planner/core/fake_mode.py",
        "            return empty((source.numel(), source.dim()), torch.int64)",
        "            return empty((1, source.dim()), torch.int64)",
        (
            "tests/planner/test_loss_forms.py::test_data_dependent_ops_on_fake_tensors_are_made_at_their_largest",
        ),
    ),
    Mutation(
        "planning-moves-the-host-streams",
        "planning's real runs of the model move NumPy's and Python's random streams (Wav2Vec2's "
        "feature mask), so a planned run's draws are not the plain run's",
        "autockpt/planner/core/host_settings.py",
        "    with torch.random.fork_rng(devices=forked_devices(device)), host_random_kept():",
        "    with torch.random.fork_rng(devices=forked_devices(device)):",
        (
            "tests/planner/test_data_dependent.py::test_wav2vec2_for_ctc_plans_at_half_its_peak_with_the_plain_gradients",
        ),
    ),
    Mutation(
        "hf-own-loss-split-unchecked",
        "the Trainer callback takes any model's loss for its loss_function on its logits, "
        "without comparing the two on a real run (NOTE [The model's own loss in chunks])",
        "autockpt/hf/own_loss.py",
        "        torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(whole, split, strict=True)",
        "        True for a, b in zip(whole, split, strict=True)",
        ("tests/hf/test_own_loss_chunks.py",),
    ),
    Mutation(
        "hf-head-left-aside",
        "after a training call whose loss ran in chunks the head is not put back: evaluation "
        "and the saved model get the features for logits",
        "autockpt/hf/own_loss.py",
        "        parent._modules[name] = head\n",
        "",
        (
            "tests/hf/test_own_loss_chunks.py::test_the_models_own_loss_runs_in_chunks_under_a_budget_its_whole_loss_exceeds",
        ),
    ),
    Mutation(
        "hf-own-loss-never-chunked",
        "the Trainer callback plans the model's own loss whole, as before (the logits the floor)",
        "autockpt/hf/callback.py",
        "        split = own_loss_split(model, batch) if self.allow_loss_chunks else None\n",
        "        split = None\n",
        (
            "tests/hf/test_own_loss_chunks.py::test_the_models_own_loss_runs_in_chunks_under_a_budget_its_whole_loss_exceeds",
        ),
    ),
    Mutation(
        "hf-ranks-plan-each",
        "under several ranks every rank plans for itself: the ranks' plans differ",
        "autockpt/plans_by_shape.py",
        "    if world_size == 1 or not torch.distributed.is_initialized():\n        return make()",
        "    if True:\n        return make()",
        ("tests/hf/test_trainer_ranks.py",),
    ),
    Mutation(
        "verify-without-autocast",
        "the plan's check step runs in float32 though the plan was measured under autocast: "
        "its activations look twice as large and a plan that fits is planned again",
        "autockpt/planner/verify.py",
        "            if autocast_dtype is not None\n",
        "            if False\n",
        ("tests/planner/test_verify.py",),
    ),
    Mutation(
        "out-of-memory-recovered-inside-except",
        "the trainer re-plans inside the except block, with the failed step's tensors held by "
        "the traceback (NOTE [Recovering outside the except block])",
        "autockpt/training/loop/memory_retry.py",
        "                raise\n        # Out of the except block",
        "                raise\n            recover()\n        # Out of the except block",
        ("tests/training/test_memory_retry.py",),
    ),
    Mutation(
        "optimizer-step-retried-after-writing",
        "an optimizer step that ran out of memory after updating its parameters is run again: "
        "they are updated twice (NOTE [Retrying an optimizer step])",
        "autockpt/training/loop/memory_retry.py",
        "            if written:\n",
        "            if False:\n",
        ("tests/training/test_memory_retry.py",),
    ),
    Mutation(
        "optimizer-retry-keeps-half-made-state",
        "an optimizer step retried after running out while making its state keeps the state "
        "half made, and the retry fails or skips it (NOTE [Retrying an optimizer step])",
        "autockpt/training/loop/memory_retry.py",
        "        _drop_state_made_since(optimizer, versions)\n        recover()\n",
        "        recover()\n",
        ("tests/training/test_memory_retry.py",),
    ),
    Mutation(
        "optimizer-retry-without-gradients",
        "the trainer's recovery from an optimizer step that ran out of memory drops the "
        "gradients: the retried step skips every parameter, silently",
        "autockpt/training/loop/train.py",
        "        if not keep_gradients:\n",
        "        if True:\n",
        ("tests/training/test_memory_retry.py",),
    ),
    Mutation(
        "context-stand-in-on-a-card",
        "a CUDA budget takes the 512 MiB stand-in for the context though the card could be "
        "measured (NOTE [What the first card must measure])",
        "autockpt/planner/core/step_budget.py",
        "    return DeviceReserve(context_bytes, CUDA_HEADROOM_FRACTION, True)\n",
        "    return stand_in\n",
        ("tests/planner/core/test_step_budget.py",),
    ),
    Mutation(
        "plan-hides-where-its-context-came-from",
        "the plan's breakdown says the CUDA context was a stand-in where it was measured",
        "autockpt/planner/pipeline.py",
        "            context_measured=budget.context_measured,\n",
        "            context_measured=False,\n",
        ("tests/cli/test_report.py",),
    ),
    Mutation(
        "meter-keeps-the-last-steps-slack",
        "the trainer reports the allocator's slack of its last step, not the largest",
        "autockpt/training/loop/step_memory.py",
        "        self.slack = slack if self.slack is None else max(self.slack, slack)\n",
        "        self.slack = slack\n",
        ("tests/training/test_step_memory.py",),
    ),
    Mutation(
        "sample-misses-short-contracts",
        "the windows spread over a part give a contract with few windows none: a contract "
        "listed late is left out of its score (NOTE [Scores in proportion])",
        "autockpt/training/forecasts/scoring_sample.py",
        "        share = min(int(count), max(1, round(cap * int(count) / total)))\n",
        "        share = min(int(count), round(cap * int(count) / total))\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "test-sample-follows-the-run",
        "the test windows' sample is sized by the run, as validation's is: two runs on the same "
        "data and split score different test windows, and their scores do not compare",
        "autockpt/training/loop/run_time.py",
        "        self.test = held_out_sample(data.test.run_counts, config.test_windows)\n",
        "        self.test = validation_sample(\n"
        "            data.test.run_counts,\n"
        "            config.test_windows,\n"
        "            windows_per_epoch=steps_per_epoch * setup.global_batch_size,\n"
        "        )\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "test-windows-asked-ignored",
        "--test-windows is ignored: the test part is scored on the default sample whatever "
        "the user asked (all, or a count)",
        "autockpt/training/forecasts/scoring_sample.py",
        "    return _sample(run_counts, TEST_WINDOWS if asked is None else asked)\n",
        "    return _sample(run_counts, TEST_WINDOWS)\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "progress-line-every-batch",
        "a long scoring under --quiet prints a progress line for every batch, thousands a "
        "minute, instead of one every few seconds",
        "autockpt/training/host/progress.py",
        "        if finished or now - self._last.get(what, -math.inf) >= PROGRESS_LINE_EVERY_S:\n",
        "        if True:\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "quiet-scoring-silent",
        "a quiet run says nothing while it scores its validation and test windows",
        "autockpt/training/host/progress.py",
        "    def progress(self, record: Record) -> None:\n        self._progress_lines(record)\n",
        "    def progress(self, record: Record) -> None:\n        del record\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "expected-time-leaves-out-the-steps",
        "the run's expected time leaves its training steps out",
        "autockpt/training/loop/run_time.py",
        "        train_s=steps * step_s,\n",
        "        train_s=0.0,\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "summary-counts-the-sample-as-the-part",
        "the summary says a sampled score took every window of its part",
        "autockpt/training/forecasts/scoring_sample.py",
        '            f"{part}_windows_of": self.total,\n',
        '            f"{part}_windows_of": self.count,\n',
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "standard-error-without-correction",
        "the loss's standard error is taken from its batches without Bessel's correction: "
        "too small, most where the batches are few",
        "autockpt/training/forecasts/evaluate.py",
        "    return math.sqrt(max(spread, 0.0) * batches / (batches - 1)) / num_windows\n",
        "    return math.sqrt(max(spread, 0.0)) / num_windows\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "predict-silent-off-a-terminal",
        "predict and interpret say nothing while they work in a file or a pipe (a scheduler's "
        "log waits without a word)",
        "autockpt/cli/console.py",
        "        yield scoring_progress(description, ProgressLines(line))\n",
        "        yield None\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "progress-rate-counts-the-wait-before",
        "a scoring's rate counts the wait before its first batch (predict's row cache build): "
        "the time left it says is many times the scoring's own",
        "autockpt/training/host/progress.py",
        "        if since > 0 and done_since > 0:\n",
        "        if False:\n",
        ("tests/training/test_scores_in_proportion.py",),
    ),
    Mutation(
        "decoded-option-loses-its-chunks",
        "decoding a chain option drops its chunks: a plan chosen and measured in chunks runs "
        "each region whole",
        "autockpt/planner/solve/chain_decoding.py",
        "        chunks = option.action.num_chunks\n",
        "        chunks = 1\n",
        ("tests/planner/test_plan.py",),
    ),
    Mutation(
        "simulated-saved-tensor-never-released",
        "a segment recomputed is simulated as keeping what its forward saved for backward: "
        "recompute saves nothing in the chain's profiles, and the planner recomputes less",
        "autockpt/planner/simulate/recompute_simulation.py",
        "            add(*absent[index], -stored.size_bytes)\n",
        "            add(*absent[index], 0)\n",
        ("tests/planner/simulate/test_recompute_simulation.py",),
    ),
    Mutation(
        "simulated-rerun-left-out",
        "a recomputed segment's backward is simulated without the rerun of its forward: its "
        "backward peak reads low, and the chain offers plans that do not fit",
        "autockpt/planner/simulate/recompute_simulation.py",
        "        reruns[position] = (backward_first, max(accumulate(rerun), default=0))\n",
        "        reruns[position] = (backward_first, 0)\n",
        ("tests/planner/simulate/test_recompute_simulation.py",),
    ),
    Mutation(
        "simulated-cast-weights-released-early",
        "under autocast a weight's cast is simulated as freed after its last read, while "
        "autocast's cache holds it to the end of the loss",
        "autockpt/planner/simulate/recompute_simulation.py",
        "            read = backward_start if stored.cast_weight else stored.last_read + 1\n",
        "            read = stored.last_read + 1\n",
        ("tests/planner/simulate/test_recompute_simulation.py",),
    ),
    Mutation(
        "simulated-checkpoint-inputs-not-held",
        "a recomputed segment's inputs are simulated as freed when the kept step frees them, "
        "while the checkpoint holds them until its backward",
        "autockpt/planner/simulate/recompute_simulation.py",
        "        add(freed, until, record.storages[index].size_bytes)\n",
        "        add(freed, until, 0)\n",
        ("tests/planner/simulate/test_recompute_simulation.py",),
    ),
    Mutation(
        "in-place-writes-simulated",
        "a segment that writes in place into another segment's storage is simulated as if "
        "it did not (aliasing the simulation does not model)",
        "autockpt/planner/simulate/step_record.py",
        "                    self.record.unsure |= {self._segment, *written}\n",
        "                    self.record.unsure |= set()\n",
        ("tests/planner/simulate/test_recompute_simulation.py",),
    ),
    Mutation(
        "plan-timed-whole-again",
        "a plan a stage timed whole is run again when a later stage or the final choice asks "
        "for it (tft-225: one plan timed three times a planning, 6.5 s each)",
        "autockpt/planner/solve/whole_plan_timing.py",
        "if k not in self._timed}",
        "if True}",
        (
            "tests/planner/solve/test_whole_plan_timing.py::"
            "test_each_plan_is_timed_whole_once_a_planning",
        ),
    ),
    Mutation(
        "recurrent-backward-unattributed-simulated",
        "a segment holding a recurrent layer is simulated although the kept step attributed "
        "its backward to none of its ops (an LSTM model's step read 82 KiB over, its rerun "
        "left out)",
        "autockpt/planner/simulate/recompute_simulation.py",
        "    unsure = record.unsure | (record.needs_own_backward - backward_ops.keys())\n",
        "    unsure = record.unsure\n",
        (
            "tests/planner/simulate/test_recompute_simulation.py::"
            "test_what_the_simulation_does_not_model_is_measured",
        ),
    ),
    Mutation(
        "chunks-sized-from-the-whole-budget",
        "a row cache's chunks are sized from the whole --max-host-memory, as if the process "
        "held nothing: the build's passes go past the budget (NOTE [Chunks sized by what is "
        "left])",
        "tft/data/streamed/streamed_windows.py",
        "    left = max(max_host_bytes - resident_bytes(), max_host_bytes // 4)\n",
        "    left = max_host_bytes\n",
        ("tests/tft/test_chunk_rows.py",),
    ),
    Mutation(
        "retried-step-draws-other-masks",
        "a step retried after running out of memory draws other random numbers (dropout "
        "masks) than the failed one",
        "autockpt/training/loop/memory_retry.py",
        "        torch.set_rng_state(cpu_state)\n",
        "",
        ("tests/training/test_memory_retry.py",),
    ),
    Mutation(
        "cuda-rng-of-device-zero",
        "a CUDA device named without an index forks device 0's random stream, not the current "
        "device's",
        "autockpt/planner/core/host_settings.py",
        "    return [device.index if device.index is not None else torch.cuda.current_device()]",
        "    return [device.index or 0]",
        ("tests/planner/core/test_host_settings.py",),
    ),
    Mutation(
        "adamw-probe-per-parameter-on-cuda",
        "the optimizer probe on fake CUDA parameters takes torch's per-parameter path, which a "
        "card does not, and misses the foreach kernels' temporaries",
        "autockpt/planner/measure/fake_step.py",
        '                    group["foreach"] = True\n',
        "                    pass\n",
        ("tests/planner/test_optimizer_specs.py",),
    ),
    Mutation(
        "budget-not-capped-on-cuda",
        "on a card larger than the budget the allocator is not capped: a step over the budget "
        "runs and is seen only afterwards",
        "autockpt/training/loop/step_memory.py",
        "    torch.cuda.set_per_process_memory_fraction(fraction, device)\n",
        "",
        ("tests/training/test_step_memory.py",),
    ),
    Mutation(
        "check-step-counts-the-cache",
        "the CUDA check step resets the peak with earlier work's cached blocks still reserved, "
        "and counts them as the step's",
        "autockpt/planner/verify.py",
        "        torch.cuda.empty_cache()\n        torch.cuda.reset_peak_memory_stats(device)",
        "        torch.cuda.reset_peak_memory_stats(device)",
        ("tests/planner/test_verify.py",),
    ),
    Mutation(
        "gpu-check-blind-to-replans",
        "the GPU check passes a planned run that re-planned on the card (a plan that "
        "under-predicted its step)",
        "benchmarks/gpu_check_steps.py",
        "        held = visible is not None and visible <= card and _no_replans(summary)",
        "        held = visible is not None and visible <= card",
        ("tests/test_gpu_check.py::test_a_planned_run_that_re_planned_fails_the_check",),
    ),
    Mutation(
        "auto-precision-takes-emulated-bf16",
        "--precision auto picks bf16 on a card that only emulates it (slower than fp32)",
        "autockpt/training/options/settings.py",
        "torch.cuda.is_bf16_supported(including_emulation=False)",
        "torch.cuda.is_bf16_supported()",
        ("tests/training/test_cuda_settings.py",),
    ),
    Mutation(
        "resume-on-fewer-gpus-raises",
        "a run saved on more GPUs than the machine has sets every saved device's random state",
        "autockpt/training/setup/runs.py",
        'zip(range(torch.cuda.device_count()), state["cuda"], strict=False)',
        'enumerate(state["cuda"])',
        ("tests/training/test_cuda_settings.py",),
    ),
    Mutation(
        "autocast-cache-held-through-backward",
        "a step run whole inside torch.autocast keeps every cast weight alive through backward "
        "(NOTE [Autocast's weight cache])",
        "autockpt/planner/training_step.py",
        "    torch.clear_autocast_cache()\n    loss.backward()",
        "    loss.backward()",
        ("tests/planner/test_autocast_weights.py",),
    ),
)


def copy_repo(destination: Path) -> Path:
    """The working tree (uncommitted changes included) in ``destination/repo``."""
    target = destination / "repo"
    shutil.copytree(REPO, target, ignore=shutil.ignore_patterns(*IGNORED))
    return target


def environment(copy: Path) -> dict[str, str]:
    """The environment the tests run in (NOTE [Running the copy])."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return env


def check_imports_from(copy: Path) -> None:
    """Fail unless ``autockpt``, ``tft`` and ``tests`` import from the copy."""
    probe = "import autockpt, tft, tests; print(autockpt.__file__, tft.__file__, tests.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=copy,
        env=environment(copy),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    outside = [path for path in found if not Path(path).resolve().is_relative_to(copy.resolve())]
    if outside:
        raise SystemExit(f"the copy's packages are not the ones imported: {outside}")


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    """pytest in the copy: on ``tests``, slow ones included, or with none given the README's
    test command (slow and GPU tests left out); stops at the first failure. (exit code, last
    lines)."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    if tests:
        command += ["-m", "not gpu", *tests]
    try:
        result = subprocess.run(
            command,
            cwd=copy,
            env=environment(copy),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {TIMEOUT_S} s"
    lines = (result.stdout + result.stderr).strip().splitlines()
    failures = [line for line in lines if line.startswith(("E ", "FAILED", "ERROR"))]
    return result.returncode, "\n".join([*failures[:3], *lines[-1:]])


def plant(copy: Path, mutation: Mutation) -> str | None:
    """Apply ``mutation`` in the copy; returns the original text, or None when stale."""
    path = copy / mutation.path
    original = path.read_text()
    if original.count(mutation.old) != 1:
        return None
    path.write_text(original.replace(mutation.old, mutation.new))
    return original


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="planted bugs to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the planted bugs and exit")
    parser.add_argument(
        "--no-control", action="store_true", help="skip the run of the tests without any bug"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show how each caught bug failed the tests too"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="run only the tests named for each bug (slow ones included), not the README's "
        "test command",
    )
    args = parser.parse_args(argv)
    if args.list:
        for mutation in MUTATIONS:
            print(f"{mutation.name:30} {mutation.path:32} {mutation.why}")
        return 0
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"no planted bug named {', '.join(sorted(unknown))}; see --list")
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    with tempfile.TemporaryDirectory(prefix="autockpt-mutations-") as scratch:
        copy = copy_repo(Path(scratch))
        check_imports_from(copy)
        if not args.no_control:
            tests: tuple[str, ...] = ()
            if args.quick:
                named = (t for m in chosen for t in m.tests if m.name != "canary")
                tests = tuple(dict.fromkeys(named))
            code, tail = run_tests(copy, tests)
            if code != 0:
                print(f"control run failed without any planted bug (exit {code}):\n{tail}")
                return 1
            what = f"{len(tests)} test selections" if tests else "the README's test command"
            print(f"control: {what} passes without a planted bug", flush=True)
        rows, ok = [], True
        for mutation in chosen:
            started = time.perf_counter()
            original = plant(copy, mutation)
            if original is None:
                verdict, tail = "STALE", f"the text to replace is not once in {mutation.path}"
            else:
                try:
                    code, tail = run_tests(copy, mutation.tests if args.quick else ())
                finally:
                    (copy / mutation.path).write_text(original)
                # pytest exits 1 when a test failed; 0 means the bug went unnoticed, and
                # anything else (no tests collected, usage error, timeout) proves nothing.
                verdict = {0: "MISSED", 1: "caught"}.get(code, f"ERROR {code}")
            ok = ok and verdict == "caught"
            seconds = time.perf_counter() - started
            rows.append((mutation.name, verdict, seconds))
            print(f"{mutation.name:30} {verdict:8} {seconds:6.0f} s  {mutation.why}", flush=True)
            if verdict != "caught" or args.verbose:
                print("    " + tail.replace("\n", "\n    "))
    caught = sum(verdict == "caught" for _, verdict, _ in rows)
    print(f"{caught} of {len(rows)} planted bugs caught")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
