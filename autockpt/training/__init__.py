"""The training application: settings, data preparation, the loop, the run folder, ranks.

It trains the bundled Temporal Fusion Transformer on Parquet bars under a budget, using the
planner (:mod:`autockpt.planner`) as any user of the library would.
"""
