"""The training application: it trains the bundled Temporal Fusion Transformer on Parquet bars
under a budget, using the planner (:mod:`autockpt.planner`) as any user of the library would.

Its sub-packages, each importing only those before it: ``options`` (what a run is asked to do),
``host`` (the process, its ranks, its progress), ``setup`` (data, model, plan, run folder),
``forecasts`` (scores, forecasts, interpretation) and ``loop`` (the trainer).
"""
