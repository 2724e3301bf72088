"""A run made ready to train: data, model and plan prepared, the naive forecasts it is scored
against, its run folder and its checkpoints."""
