"""What a model forecasts and how well: validation scores against the naive forecasts,
forecasts written for a file, and what the model learned (interpretation)."""
