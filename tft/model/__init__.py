"""The Temporal Fusion Transformer: its configuration, layers, network and quantile loss."""
