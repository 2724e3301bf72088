"""The process a run trains in: its host's tuning, its ranks under torchrun, and the progress it
reports."""
